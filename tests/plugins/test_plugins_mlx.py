"""The MLX backend: parity with the torch engine, KV cache, HF directories, sampling, tracing."""

from __future__ import annotations

import json

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from opscope.engine.backends import OpEvent, get_backend  # noqa: E402
from opscope.engine.core.errors import UnsupportedModelError  # noqa: E402
from opscope.engine.generation.events import Finished, Token  # noqa: E402
from opscope.engine.generation.generate import GenerationConfig  # noqa: E402
from opscope.plugins.mlx_backend.model import MLXModelArgs, Transformer  # noqa: E402
from opscope.plugins.mlx_backend.sampling import Sampler  # noqa: E402
from opscope.plugins.mlx_backend.weights import quant_params, rename  # noqa: E402

PARITY_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,")
# Measured here: max |Δ logit| = 1.1e-4 over every position and the whole vocabulary (logits span
# about ±35). Both backends compute in float32 from the same Q4_1/Q8_0 blocks; the margin covers
# other CPUs' summation orders.
LOGIT_ATOL = 2e-3


@pytest.fixture(scope="session")
def mlx_lm():
    return get_backend("mlx").load(None, device="cpu", dtype="float32")


def greedy_ids(model, prompt, n: int) -> list[int]:
    cfg = GenerationConfig(max_tokens=n, ignore_eos=True)
    return [e.token_id for e in model.generate(prompt, cfg) if isinstance(e, Token)]


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PARITY_PROMPTS)
def test_parity_with_torch_greedy_tokens_and_logits(lm, mlx_lm, prompt):
    ids = lm.tokenizer.encode(prompt)
    torch_logits = lm.logits(ids).numpy()
    mlx_logits = mlx_lm.logits(ids)
    assert np.abs(torch_logits - mlx_logits).max() <= LOGIT_ATOL
    assert greedy_ids(mlx_lm, prompt, 16) == greedy_ids(lm, prompt, 16)


@pytest.mark.slow
def test_cached_decode_matches_a_full_forward(mlx_lm):
    ids = mlx_lm.tokenizer.encode(PARITY_PROMPTS[2])
    model = mlx_lm.model
    caches = model.new_caches()
    model(mx.array([ids[:-3]]), caches)
    for t in ids[-3:]:
        stepped = model(mx.array([[t]]), caches)[0, -1]
    full = mlx_lm.logits(ids)[-1]
    assert np.abs(np.array(stepped) - full).max() < 1e-4


@pytest.mark.slow
def test_keeps_gguf_blocks_quantized(mlx_lm):
    import mlx.nn as nn

    q = mlx_lm.model.layers[0].attn.q_proj
    assert isinstance(q, nn.QuantizedLinear) and (q.bits, q.group_size) == (4, 32)
    assert isinstance(mlx_lm.model.embed, nn.QuantizedEmbedding) and mlx_lm.model.embed.bits == 8
    stats = mlx_lm.memory_stats()
    assert stats["weights_bytes"] < 0.3 * 4 * mlx_lm.config.n_params  # far below float32 weights
    assert stats["peak_bytes"] >= stats["weights_bytes"]


@pytest.mark.slow
def test_trace_ops_sees_the_quantized_matmuls_and_the_sync(mlx_lm):
    events: list[OpEvent] = []
    with get_backend("mlx").trace_ops(events.append):
        list(mlx_lm.generate("Hi", GenerationConfig(max_tokens=2, ignore_eos=True)))
    ops = [e.op for e in events]
    n_layers = mlx_lm.config.n_layers
    assert ops.count("quantized_matmul") >= 2 * (7 * n_layers + 1)  # 7 projections + head, 2 steps
    assert "fast.scaled_dot_product_attention" in ops and "array.item" in ops
    qm = next(e for e in events if e.op == "quantized_matmul")
    assert qm.device.startswith("Stream(Device(cpu") and qm.input_dtypes[1] == "uint32"
    assert [e.seq for e in events] == list(range(len(events)))
    assert mx.quantized_matmul.__name__ == "quantized_matmul"  # restored after the trace


# -- a tiny Hugging Face directory: the rotate-half RoPE path, GQA, llama3 scaling, untied head ---
def write_tiny_hf_dir(path, seed: int = 0) -> None:
    from opscope.engine.formats.hf_source import config_from_hf, hf_name
    from opscope.engine.models.transformer import Transformer as TorchTransformer
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf_cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 64,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "eos_token_id": 0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    }
    path.mkdir()
    (path / "config.json").write_text(json.dumps(hf_cfg))
    model = TorchTransformer.random(config_from_hf(hf_cfg, path), seed=seed)
    save_file({hf_name(k): v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    vocab = {f"w{i}": i for i in range(64)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    write_tiny_hf_dir(path)
    return path


def test_hf_directory_matches_the_torch_engine(tiny_hf_dir):
    from opscope.engine.api import load

    ids = [3, 17, 42, 5, 9, 60, 2, 33] * 12  # 96 positions: past llama3's low-frequency band
    ref = load(tiny_hf_dir).logits(ids).numpy()
    got = get_backend("mlx").load(tiny_hf_dir).logits(ids)
    assert np.abs(ref - got).max() < 1e-4 * max(1.0, np.abs(ref).max())


def test_hf_directory_generates_in_bfloat16(tiny_hf_dir):
    lm = get_backend("mlx").load(tiny_hf_dir, dtype="bfloat16")
    assert lm.model.layers[0].attn.q_proj.weight.dtype == mx.bfloat16
    events = list(lm.generate("w3 w4 w5", GenerationConfig(max_tokens=3, ignore_eos=True)))
    assert isinstance(events[-1], Finished) and events[-1].stats.generated_tokens == 3


def write_tiny_metadata(w, tokens: list[str], **dims) -> None:
    for add, value in (
        (w.add_block_count, 2),
        (w.add_context_length, 256),
        (w.add_embedding_length, dims["dim"]),
        (w.add_feed_forward_length, dims["hidden"]),
        (w.add_head_count, dims["heads"]),
        (w.add_head_count_kv, dims["kv"]),
        (w.add_rope_freq_base, 10000.0),
        (w.add_layer_norm_rms_eps, 1e-6),
        (w.add_tokenizer_model, "gpt2"),
        (w.add_tokenizer_pre, "default"),
        (w.add_token_list, tokens),
        (w.add_token_types, [3] + [1] * (len(tokens) - 1)),
        (w.add_token_merges, ["a b"]),
        (w.add_eos_token_id, 0),
    ):
        add(value)


# -- a tiny GGUF with every tensor type mx.load handles: Q4_0/Q4_1/Q8_0 kept quantized, F16/BF16/F32
# dense, Qwen2-style q/k/v biases, untied output, Q/K in GGUF's interleaved-RoPE row order ---------
def write_tiny_gguf(path, seed: int = 0) -> None:
    import gguf
    from tokenizers import pre_tokenizers

    rng, Q = np.random.default_rng(seed), gguf.GGMLQuantizationType
    dim, hidden, heads, kv, hd = 64, 128, 4, 2, 16
    tokens = ["<|endoftext|>"] + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["ab"]
    w = gguf.GGUFWriter(str(path), "qwen2")
    write_tiny_metadata(w, tokens, dim=dim, hidden=hidden, heads=heads, kv=kv)

    def tensor(name, shape, qtype, scale=0.1):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(name, x if qtype == Q.F32 else x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    tensor("token_embd.weight", (len(tokens), dim), Q.Q8_0, 1.0)
    for i in range(2):
        for name, shape, qtype in (
            ("attn_norm.weight", (dim,), Q.F32),
            ("ffn_norm.weight", (dim,), Q.F32),
            ("attn_q.weight", (heads * hd, dim), Q.Q4_0),
            ("attn_q.bias", (heads * hd,), Q.F32),
            ("attn_k.weight", (kv * hd, dim), Q.Q4_1),
            ("attn_k.bias", (kv * hd,), Q.F32),
            ("attn_v.weight", (kv * hd, dim), Q.Q8_0),
            ("attn_v.bias", (kv * hd,), Q.F32),
            ("attn_output.weight", (dim, heads * hd), Q.F16),
            ("ffn_gate.weight", (hidden, dim), Q.BF16),
            ("ffn_up.weight", (hidden, dim), Q.Q4_0),
            ("ffn_down.weight", (dim, hidden), Q.F32),
        ):
            tensor(f"blk.{i}.{name}", shape, qtype)
    tensor("output_norm.weight", (dim,), Q.F32)
    tensor("output.weight", (len(tokens), dim), Q.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_of_mixed_types_matches_the_torch_engine(tmp_path):
    import mlx.nn as nn
    from opscope.engine.api import load

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    ids = list(range(1, 200, 3))
    ref = load(path).logits(ids).numpy()
    lm = get_backend("mlx").load(path)
    layer = lm.model.layers[1]
    assert isinstance(layer.attn.k_proj, nn.QuantizedLinear) and not isinstance(layer.mlp.gate_proj, nn.QuantizedLinear)
    # MLX stores Q4_0/Q8_0 offsets as float16 (-8·d, -128·d): measured 3e-4 of the logit range here
    assert np.abs(ref - lm.logits(ids)).max() <= 2e-3 * np.abs(ref).max()


# -- pieces --------------------------------------------------------------------------------------
def tiny_args(**changes) -> MLXModelArgs:
    base = dict(
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        hidden_dim=64,
        vocab_size=50,
        norm_eps=1e-5,
        rope_theta=10000.0,
        max_seq_len=1024,
        tie_embeddings=True,
        qkv_bias=True,
        rope_traditional=True,
    )
    return MLXModelArgs(**(base | changes))


def test_chunked_prefill_and_cache_growth_match_one_pass():
    mx.random.seed(0)
    model = Transformer(tiny_args())
    ids = mx.random.randint(0, 50, (1, 300))  # longer than one 256-position cache step
    full = model(ids, model.new_caches())
    caches = model.new_caches()
    parts = [model(ids[:, s:e], caches) for s, e in ((0, 100), (100, 250), (250, 299), (299, 300))]
    assert caches[0].offset == 300 and caches[0].keys.shape[2] == 512
    assert mx.allclose(mx.concatenate(parts, axis=1), full, atol=1e-4).item()


def test_quantized_layout_is_read_off_the_shapes():
    assert quant_params(words=72, groups=18, in_dims=576) == {"group_size": 32, "bits": 4}
    assert quant_params(words=144, groups=18, in_dims=576) == {"group_size": 32, "bits": 8}
    with pytest.raises(UnsupportedModelError):
        quant_params(words=70, groups=18, in_dims=576)


def test_name_tables():
    assert rename("blk.7.attn_q.scales", "gguf") == "layers.7.attn.q_proj.scales"
    assert rename("blk.0.ffn_norm.weight", "gguf") == "layers.0.mlp_norm.weight"
    assert rename("token_embd.biases", "gguf") == "embed.biases"
    assert rename("model.layers.3.self_attn.k_proj.bias", "hf") == "layers.3.attn.k_proj.bias"
    assert rename("model.layers.3.post_attention_layernorm.weight", "hf") == "layers.3.mlp_norm.weight"
    assert rename("rope_freqs.weight", "gguf") is None


def sample_many(cfg, logits, n=200) -> set[int]:
    sampler = Sampler(cfg, [0])
    return {sampler(logits).item() for _ in range(n)}


def test_sampling_options():
    logits = mx.array([[0.0, 3.0, 2.9, 1.0, -5.0]])
    assert sample_many(GenerationConfig(temperature=0), logits, 3) == {1}
    assert sample_many(GenerationConfig(temperature=1.0, top_k=2, seed=1), logits) == {1, 2}
    assert sample_many(GenerationConfig(temperature=1.0, top_p=0.5, seed=1), logits) == {1, 2}
    assert sample_many(GenerationConfig(temperature=1.0, min_p=0.5, seed=1), logits) == {1, 2}
    assert len(sample_many(GenerationConfig(temperature=1.0, seed=1), logits)) >= 3
    penalised = Sampler(GenerationConfig(repetition_penalty=2.0), [1])(logits)
    assert penalised.item() == 2  # 3.0 / 2 falls below 2.9


def test_seeded_sampling_is_reproducible():
    logits = mx.random.normal((1, 1000))
    cfg = GenerationConfig(temperature=1.0, seed=7)
    a, b = Sampler(cfg, [0]), Sampler(cfg, [0])
    assert [a(logits).item() for _ in range(10)] == [b(logits).item() for _ in range(10)]


def test_devices_explain_the_missing_gpu():
    devices = {d.name: d for d in get_backend("mlx").devices()}
    assert devices["cpu"].available
    if not devices["gpu"].available:
        assert "no GPU backend" in devices["gpu"].reason


# -- trace through the backend --------------------------------------------------------------------
@pytest.mark.slow
def test_cli_trace_runs_through_the_mlx_backend(tmp_path, capsys):
    from opscope.engine.cli.main import main

    out = tmp_path / "mlx.perfetto.json"
    assert main(["trace", "Hi", "--tokens", "2", "--backend", "mlx", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Op trace on the mlx backend: ")
    assert lines[0].endswith("device/stream: Stream(Device(cpu, 0), 0)")
    assert lines[1] == "host syncs: 2 (1.0 per token)"  # one item() per token
    assert any(line.split()[0] == "quantized_matmul" for line in lines[4:])
    trace = json.loads(out.read_text())["traceEvents"]
    assert {e["name"] for e in trace} >= {"quantized_matmul", "fast.scaled_dot_product_attention", "token"}


def test_cli_trace_names_what_mlx_cannot_trace(capsys):
    from opscope.engine.cli.main import main

    assert main(["trace", "Hi", "--backend", "mlx", "--variant", "leaky-norm"]) == 2
    assert capsys.readouterr().err.strip() == (
        "opscope: error: --backend mlx: planted variants, --jsonl and simulated devices trace torch ops; "
        "use --backend torch for them"
    )
