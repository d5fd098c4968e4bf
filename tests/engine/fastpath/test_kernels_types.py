"""Every supported GGUF type on the CPU fast path, against the ggml project's own decoders.

For each type: random blocks (uniform random quant bytes, fp16 scales in a realistic range), an odd
row count, K a multiple of the block size. References are independent: gguf.quants.dequantize for
the weights, float64 numpy for the products, the plain-torch model for the fused decode step,
llama.cpp's llama-quantize for real files. Tolerances, elementwise, with bound = |x| @ |W|^T (the
size of the sum before cancellation):
  * dequantization (SIMD and portable decoders, embedding rows): bit-exact
  * matvec and float32 GEMM (exact weights, float32 accumulation): |y - y64| <= 1e-4 * bound
  * fused decode step with mixed types vs the torch forward: |Δlogit| <= 1e-4 * max |logit|
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from opscope.engine.fastpath.kernels.build import cache_root

# The compiled kernels are a build cache, not user data: keep the real one (see test_fastpath_kernels).
os.environ.setdefault("OPSCOPE_KERNEL_CACHE", str(cache_root()))

from opscope.engine.fastpath.kernels import load_kernels, pack
from opscope.engine.fastpath.kernels.packing import RAW_TYPES, random_blocks
from opscope.engine.testing import q8

TYPES = [
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
]
SOA = {"Q4_0", "Q4_1", "Q8_0"}  # also held in the tuned structure-of-arrays layout ("auto")
CASES = [(t, "raw") for t in TYPES] + [(t, "auto") for t in sorted(SOA)]
N_ROWS = 37
REPO = Path(__file__).resolve().parents[3]
LLAMA_CPP = REPO.parent / "shared" / "tools" / "llama.cpp"


def k_for(ggml_type: str) -> int:
    return 256 * 3 if RAW_TYPES[ggml_type][1] == 256 else 32 * 5


@pytest.fixture(scope="module")
def kern():
    return load_kernels()


def blocks(ggml_type: str, n: int = N_ROWS, seed: int = 0):
    k = k_for(ggml_type)
    raw = random_blocks(ggml_type, n, k, np.random.default_rng(seed + 1000 * TYPES.index(ggml_type)))
    dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[ggml_type]).reshape(n, k).astype(np.float32)
    return raw, dense, k


def check_close(y: torch.Tensor, x: torch.Tensor, dense: np.ndarray, rel: float = 1e-4) -> None:
    xd, wd = x.reshape(-1, x.shape[-1]).double().numpy(), dense.astype(np.float64)
    err = np.abs(y.reshape(xd.shape[0], -1).double().numpy() - xd @ wd.T)
    bound = np.abs(xd) @ np.abs(wd).T
    worst = float((err / np.maximum(bound, 1e-30)).max())
    assert worst <= rel, f"error {worst:.3g} x bound exceeds {rel:g}"


@pytest.mark.parametrize("ggml_type", TYPES)
def test_random_blocks_are_valid_weights(ggml_type):
    _, dense, _ = blocks(ggml_type)
    assert np.isfinite(dense).all() and 1e-3 < np.abs(dense).max() < 10


@pytest.mark.parametrize("ggml_type,layout", CASES)
def test_dequantize_equals_ggml(kern, ggml_type, layout):
    raw, dense, k = blocks(ggml_type)
    w = pack(ggml_type, raw, (N_ROWS, k), layout=layout)
    assert w.raw == (layout == "raw" or ggml_type not in SOA)
    got = kern.dequantize(w.qs, w.d, w.m, w.qtype, k, torch.float32)
    np.testing.assert_array_equal(got.numpy(), dense)
    if w.raw:  # the portable decoders (builds without AVX-512) too
        np.testing.assert_array_equal(kern.dequantize_scalar(w.qs, w.qtype, k).numpy(), dense)


@pytest.mark.parametrize("ggml_type", TYPES)
def test_raw_weights_are_a_view_of_the_blocks(ggml_type):
    raw, _, k = blocks(ggml_type)
    w = pack(ggml_type, raw, (N_ROWS, k), layout="raw")
    assert w.qs.data_ptr() == raw.ctypes.data  # no copy
    order = np.arange(N_ROWS)[::-1].copy()
    permuted = pack(ggml_type, raw, (N_ROWS, k), row_order=order, layout="raw")
    assert torch.equal(permuted.qs, w.qs[torch.from_numpy(order)])


@pytest.mark.parametrize("ggml_type,layout", CASES)
def test_matvec_matches_float64(kern, ggml_type, layout):
    raw, dense, k = blocks(ggml_type, seed=1)
    w = pack(ggml_type, raw, (N_ROWS, k), layout=layout)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k))
    y = kern.qlinear(x, w.qs, w.d, w.m, w.qtype, 0, 1 << 30, torch.float32)
    assert y.shape == (1, N_ROWS)
    check_close(y, x, dense)


# int8-activation kernels of raw blocks (AVX-512 VNNI, AVX2 and NEON builds), activations quantized per 256
# (llama.cpp's Q8_K, the K types) or per 32 (its Q8_0/Q8_1, the 32-weight types)
Q8_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]


@pytest.mark.parametrize("ggml_type", [t for t in TYPES if t not in Q8_TYPES])
def test_q8_request_without_an_int8_kernel_runs_float32(kern, ggml_type):
    assert not kern.raw_has_q8(RAW_TYPES[ggml_type][0])
    raw, dense, k = blocks(ggml_type, seed=2)
    w = pack(ggml_type, raw, (N_ROWS, k), layout="raw")
    x = torch.randn(2, k)
    y = kern.qlinear(x, w.qs, w.d, w.m, w.qtype, 1, 1 << 30, torch.float32)
    check_close(y, x, dense)


def int8_raw(kern, ggml_type: str) -> bool:
    """Whether this build runs raw blocks of ``ggml_type`` with int8 activations: the AVX-512 VNNI,
    AVX2, AVX-VNNI and NEON variants every type of Q8_TYPES (the K types per 256, the 32-weight
    blocks per 32), the others (AVX-512 without VNNI, baseline) none."""
    return ggml_type in Q8_TYPES and bool(kern.has_vnni() or kern.has_int8_soa())


def test_the_variant_table_says_which_builds_have_int8_kernels(kern):
    """`opscope fastpath` reads Variant.int8: it must match what the library loaded here does."""
    from opscope.engine.fastpath.kernels import variants

    assert variants.chosen().int8 == all(int8_raw(kern, t) for t in Q8_TYPES)
    assert variants.chosen().int8 == bool(kern.has_int8_soa())


@pytest.mark.parametrize("n_rows", [N_ROWS, 4, 3])
@pytest.mark.parametrize("ggml_type", Q8_TYPES)
def test_q8_matvec_matches_quantized_x(kern, ggml_type, n_rows):
    """int8 activations: exactly the dequantized weights times the int8-rounded x, up to float32
    summation order (1e-6 of the bound, where the rounding of x itself is ~1e-3)."""
    raw, dense, k = blocks(ggml_type, n=n_rows, seed=7)
    w = pack(ggml_type, raw, (n_rows, k), layout="raw")
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(11))
    block = RAW_TYPES[ggml_type][1]
    x[1, :block] = 0  # an all-zero activation block (scale 0)
    x[2, block + 7] = 40.0  # one large value: the rest of its block rounds coarsely
    y = kern.qlinear(x, w.qs, w.d, w.m, w.qtype, 1, 1 << 30, torch.float32)
    if not int8_raw(kern, ggml_type):  # no int8 kernel for it here: exact float32 activations
        assert not kern.raw_has_q8(RAW_TYPES[ggml_type][0])
        check_close(y, x, dense)
        return
    assert kern.raw_has_q8(RAW_TYPES[ggml_type][0])
    xq = q8.dequantized(x.numpy(), block)
    xd, wd = x.double().numpy(), dense.astype(np.float64)
    bound = np.abs(xd) @ np.abs(wd).T
    err = np.abs(y.double().numpy() - xq @ wd.T) / np.maximum(bound, 1e-30)
    assert err.max() <= 1e-6, f"error {err.max():.3g} x bound"
    # the test can tell: the float32 x misses by far more than the tolerance
    assert (np.abs(y.double().numpy() - xd @ wd.T) / np.maximum(bound, 1e-30)).max() > 1e-5


@pytest.mark.parametrize("ggml_type,layout", CASES)
@pytest.mark.parametrize("dtype,rel", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)])
def test_gemm_matches_float64(kern, ggml_type, layout, dtype, rel):
    raw, dense, k = blocks(ggml_type, seed=3)
    w = pack(ggml_type, raw, (N_ROWS, k), layout=layout)
    x = torch.randn(1, 9, k)  # 9 rows >= gemm_min_rows
    y = kern.qlinear(x, w.qs, w.d, w.m, w.qtype, 0, 8, dtype)
    assert y.shape == (1, 9, N_ROWS) and y.dtype == torch.float32
    check_close(y, x, dense, rel)


def test_gemm_tiles_a_tall_matrix(kern):
    """More rows than one dequantized tile (8 MiB of float32): the tiles meet exactly."""
    n, k = 4000, 768
    raw = random_blocks("Q6_K", n, k, np.random.default_rng(4))
    dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K).reshape(n, k)
    w = pack("Q6_K", raw, (n, k))
    x = torch.randn(10, k)
    check_close(kern.qlinear(x, w.qs, w.d, w.m, w.qtype, 0, 8, torch.float32), x, dense)


@pytest.mark.parametrize("ggml_type,layout", CASES)
def test_embedding_rows_equal_ggml(ggml_type, layout):
    from opscope.engine.fastpath.qlinear import QuantEmbedding, ensure_op

    ensure_op()
    raw, dense, k = blocks(ggml_type, seed=5)
    emb = QuantEmbedding(pack(ggml_type, raw, (N_ROWS, k), layout=layout))
    idx = torch.tensor([[0, 36, 5], [5, 17, 2]])
    got = emb(idx)
    assert got.shape == (2, 3, k) and got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), dense[idx.numpy()])
    # .weight: free metadata, real values on use
    assert emb.weight.shape == (N_ROWS, k) and emb.weight.dtype == torch.float32 and emb.weight.device.type == "cpu"
    np.testing.assert_array_equal((emb.weight * 1).numpy(), dense)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        emb(torch.tensor([N_ROWS]))


def test_k_not_a_whole_number_of_blocks_is_rejected(kern):
    from opscope.engine.core.errors import UnsupportedModelError

    raw = random_blocks("Q4_K", 2, 256, np.random.default_rng(6))
    w = pack("Q4_K", raw, (2, 256))
    with pytest.raises(RuntimeError, match="multiple of 256"):
        kern.qlinear(torch.randn(1, 288), w.qs, w.d, w.m, w.qtype, 0, 8, torch.float32)
    with pytest.raises(UnsupportedModelError, match="multiple of 256"):
        pack("Q4_K", np.zeros((2, 162), np.uint8), (2, 288))


# -- a model whose linears mix types ------------------------------------------------------------

MIXED = [  # per layer: q, k, v, o, gate, up, down
    ("Q4_K", "Q5_0", "Q6_K", "Q8_0", "Q4_0", "IQ4_XS", "Q5_K"),
    ("Q2_K", "Q3_K", "F16", "BF16", "Q5_1", "IQ4_NL", "Q4_1"),
]


class MixedSource:
    """Raw GGUF blocks for a model, each linear its own type; a Q6_K (tied) embedding."""

    def __init__(self, model, seed: int = 0):
        from opscope.engine.fastpath import linear_names

        rng = np.random.default_rng(seed)
        self.blocks = {}
        names = linear_names(model)[:-1]  # layers.N.*; the tied head reads the embedding
        types = [t for layer in MIXED for t in layer]
        for name, kind in zip(names + ["embed"], types + ["Q6_K"]):
            n, k = model.get_submodule(name).weight.shape
            self.blocks[f"{name}.weight"] = (kind, random_blocks(kind, n, k, rng), (n, k))

    def raw_tensor(self, name: str):
        return self.blocks[name]


def mixed_pair(options):
    """(torch reference with the blocks' dequantized weights, the same model on the fast path)."""
    from opscope.engine.fastpath import apply
    from opscope.engine.models.config import ModelConfig
    from opscope.engine.models.transformer import Transformer

    cfg = ModelConfig(
        dim=256,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=512,
        vocab_size=160,
        max_seq_len=64,
        tie_embeddings=True,
    )
    ref = Transformer.random(cfg, seed=1)
    source = MixedSource(ref)
    with torch.no_grad():
        for name, (kind, raw, shape) in source.blocks.items():
            dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(shape)
            ref.get_submodule(name.removesuffix(".weight")).weight.copy_(torch.from_numpy(dense.astype(np.float32)))
    fast = Transformer.random(cfg, seed=1)
    fast.load_state_dict(ref.state_dict())
    apply(fast.eval(), source, options)
    return ref.eval(), fast


def test_fused_decode_with_mixed_types_matches_torch():
    from opscope.engine.fastpath import FastPathOptions
    from opscope.engine.fastpath.decode import fusable
    from opscope.engine.fastpath.qlinear import QuantEmbedding, QuantLinear

    ref, fast = mixed_pair(FastPathOptions(prefill_dtype="f32"))
    assert isinstance(fast.embed, QuantEmbedding) and fast.embed.ggml_type == "Q6_K"
    assert [fast.layers[1].get_submodule(p).ggml_type for p in ("attn.q_proj", "mlp.down_proj")] == ["Q2_K", "Q4_1"]
    assert isinstance(fast.lm_head, QuantLinear) and fast.lm_head.qs is fast.embed.qs  # tied: one set of blocks
    assert fusable(fast) and fast.decode_step is not None  # the fused C++ step runs decode

    from test_fastpath_model import decode_logits

    prompt, steps = list(range(3, 20)), [7, 99, 12, 150, 1, 64]
    got, want = decode_logits(fast, prompt, steps), decode_logits(ref, prompt, steps)
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def test_fused_decode_with_int8_activations_uses_the_int8_kernels(kern):
    """activations=q8: every linear whose type has an int8 kernel runs it (act_mode 1), in the
    fused step too; logits stay within the int8 rounding of the float32 ones."""
    from opscope.engine.fastpath import FastPathOptions
    from opscope.engine.fastpath.qlinear import QuantLinear

    ref, fast = mixed_pair(FastPathOptions(prefill_dtype="f32", activations="q8"))
    modes = {m.ggml_type: m.act_mode for m in fast.modules() if isinstance(m, QuantLinear)}
    # raw types: where this build has an int8 kernel for them; the repacked SOA types: VNNI or AVX2
    q8 = {t for t in Q8_TYPES if int8_raw(kern, t)}
    assert modes == {t: int(t in q8 or (t in SOA and kern.has_int8_soa())) for t in modes}
    from test_fastpath_model import decode_logits

    prompt, steps = list(range(3, 20)), [7, 99, 12, 150, 1, 64]
    got, want = decode_logits(fast, prompt, steps), decode_logits(ref, prompt, steps)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 5e-2 * scale
    if kern.has_int8_soa():  # the int8 kernels ran: not the float32 result
        assert (got - want).abs().max().item() > 1e-4 * scale


# -- unsupported types ----------------------------------------------------------------------------


def test_unsupported_type_names_the_tensor(tmp_path):
    from opscope.engine.core.errors import UnsupportedModelError
    from opscope.engine.formats.gguf_source import GGUFSource

    path = tmp_path / "iq2.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (
        ("block_count", 1),
        ("embedding_length", 256),
        ("feed_forward_length", 512),
        ("attention.head_count", 4),
        ("vocab_size", 8),
        ("context_length", 64),
    ):
        w.add_uint32(f"llama.{key}", value)
    w.add_tensor(
        "token_embd.weight", np.zeros((8, 66), np.uint8), raw_shape=(8, 66), raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS
    )
    for name, shape in (
        ("attn_q", (256, 256)),
        ("attn_k", (256, 256)),
        ("attn_v", (256, 256)),
        ("attn_output", (256, 256)),
        ("ffn_gate", (512, 256)),
        ("ffn_up", (512, 256)),
        ("ffn_down", (256, 512)),
        ("attn_norm", (256,)),
        ("ffn_norm", (256,)),
    ):
        w.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, np.float32))  # a complete model but for the type
    w.add_tensor("output_norm.weight", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match=r"token_embd\.weight.*IQ2_XXS.*re-quantize.*Q4_K"):
        GGUFSource(path)


# -- real files re-quantized by llama.cpp -----------------------------------------------------------


# tests/engine/fastpath/test_kernel_variants.py runs this file once per CPU variant, each in its own
# pytest process: it names one folder for all of them, so llama-quantize runs once, not per variant.
REQUANTIZED_DIR_ENV = "OPSCOPE_TEST_REQUANTIZED_DIR"


@pytest.fixture(scope="session")
def requantized(tmp_path_factory, default_model_2_layers):
    """{type: path} of the default model's first 2 layers re-quantized by llama.cpp's llama-quantize:
    what is checked (each tensor type llama-quantize writes, read by the kernels, equals the dense
    path) holds layer by layer; a 2-layer Q4_K_M file holds the same four linear types."""
    tool = LLAMA_CPP / "llama-quantize"
    if not tool.is_file():
        pytest.fail(
            f"llama-quantize not found at {tool}: these tests need llama.cpp's tools (see {LLAMA_CPP}/BUILD.md)"
        )
    shared = os.environ.get(REQUANTIZED_DIR_ENV)
    out = Path(shared) if shared else tmp_path_factory.mktemp("requantized")
    paths = {}
    for kind in ("Q4_K_M", "Q4_0"):
        paths[kind] = out / f"model-{kind}.gguf"
        if paths[kind].is_file():  # written whole by an earlier variant's run (renamed into place)
            continue
        part = out / f"model-{kind}.gguf.part"
        done = subprocess.run(
            [str(tool), "--allow-requantize", str(default_model_2_layers), str(part), kind],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"llama-quantize {kind} failed: {done.stderr[-2000:]}"
        part.rename(paths[kind])
    return paths


def greedy(lm, ids, n=16) -> list[int]:
    from opscope.engine.generation.events import Token
    from opscope.engine.generation.generate import GenerationConfig

    return [
        e.token_id for e in lm.generate(ids, GenerationConfig(max_tokens=n, ignore_eos=True)) if isinstance(e, Token)
    ]


@pytest.mark.slow
# Weight bytes in memory over the file's size: Q4_0 is held as Q4_1 (20 bytes a block for 18)
@pytest.mark.parametrize(
    "kind,types,size_ratio", [("Q4_K_M", {"Q4_K", "Q5_0", "Q6_K", "Q8_0"}, 1.0), ("Q4_0", {"Q4_0"}, 20 / 18)]
)
def test_requantized_file_matches_dense_path(requantized, kind, types, size_ratio):
    from opscope.engine.api import load
    from opscope.engine.fastpath.apply import weight_bytes
    from opscope.engine.fastpath.decode import fusable
    from opscope.engine.fastpath.qlinear import QuantEmbedding, QuantLinear

    fast = load(requantized[kind], fastpath="activations=f32")  # explicitly: "auto" is plain torch where
    model = fast.model  # the CPU's kernels are slower (baseline)
    found = {m.ggml_type for m in model.modules() if isinstance(m, QuantLinear)}
    assert types <= found, f"{kind}: linear types {found}"
    assert isinstance(model.embed, QuantEmbedding) and fusable(model)
    dense = [
        n
        for n, t in list(model.named_parameters()) + list(model.named_buffers())
        if t.dim() >= 2 and t.dtype == torch.float32 and ".cache." not in n
    ]
    assert not dense, f"dense float32 weight matrices: {dense[:4]}"
    assert weight_bytes(model) <= size_ratio * fast.source.file_size_bytes
    prompt = fast.tokenizer.apply_chat_template([{"role": "user", "content": "Write a short poem about the sea."}])
    ids = fast.tokenizer.encode(prompt, add_special_tokens=False)
    want = greedy(load(requantized[kind], fastpath="off"), ids)
    assert greedy(fast, ids) == want


def test_fused_decode_reads_a_dense_embedding_as_float32_rows():
    """An embedding whose type has no kernel stays a dense float32 table; the fused step reads its
    rows through the F32 decoder."""
    from opscope.engine.fastpath import FastPathOptions, apply, linear_names
    from opscope.engine.fastpath.decode import fusable
    from opscope.engine.models.config import ModelConfig
    from opscope.engine.models.transformer import Transformer

    cfg = ModelConfig(
        dim=64, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=96, vocab_size=50, max_seq_len=32, tie_embeddings=False
    )
    ref = Transformer.random(cfg, seed=2).eval()
    rng = np.random.default_rng(7)
    src = {}
    for name in linear_names(ref):
        n, k = ref.get_submodule(name).weight.shape
        raw = random_blocks("Q8_0", n, k, rng)
        src[f"{name}.weight"] = ("Q8_0", raw, (n, k))
        dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(n, k)
        with torch.no_grad():
            ref.get_submodule(name).weight.copy_(torch.from_numpy(dense))
    src["embed.weight"] = ("IQ2_XXS", np.zeros((50, 66 * 64 // 256), np.uint8), (50, 64))

    class Source:
        def raw_tensor(self, name):
            return src[name]

    fast = Transformer.random(cfg, seed=2).eval()
    fast.load_state_dict(ref.state_dict())
    apply(fast, Source(), FastPathOptions(prefill_dtype="f32"))
    assert isinstance(fast.embed, torch.nn.Embedding) and fusable(fast) and fast.decode_step is not None
    steps = [3, 9, 41]
    with torch.inference_mode():
        out = {}
        for key, model in (("fast", fast), ("ref", ref)):
            model.setup_cache(1, 8)
            model(torch.tensor([[1, 2]]), 0)
            out[key] = torch.stack([model(torch.tensor([[t]]), 2 + i)[0, -1] for i, t in enumerate(steps)])
    assert (out["fast"] - out["ref"]).abs().max().item() <= 1e-4 * out["ref"].abs().max().item()
