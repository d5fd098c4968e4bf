"""The fast path swapped into a Transformer, against the engine's plain-torch reference.

Fast tests use a tiny random Llama whose linears are random GGUF blocks (a synthetic in-memory
source with ``raw_tensor``, like Transformer.random: nothing downloaded). Slow tests use the real
default model, loaded once per module. Stated tolerances (logits of the default model, |logit| ~ 20):
  * f32 activations, f32 prefill: |Δlogit| <= 1e-3 and greedy tokens equal for 32 tokens.
  * bf16 prefill GEMM: teacher-forced top-1 agreement >= 0.9 (measured 0.97).
  * q8 activations (llama.cpp's q8_1 scheme): teacher-forced top-1 agreement >= 0.8 (benchmarks/precision.py,
    512 tokens: top-1 0.967, mean KL 4.2e-3 — llama.cpp itself: 0.953, 4.1e-3).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from opscope.engine.fastpath.kernels.build import cache_root

# The test fixtures isolate XDG dirs per test; the compiled kernels are a build cache, not user
# data: keep using the real one so a test session does not rebuild them (a minute of compiling).
os.environ.setdefault("OPSCOPE_KERNEL_CACHE", str(cache_root()))

from opscope.engine.core.errors import ConfigError
from opscope.engine.fastpath import FastPathOptions, apply, linear_names
from opscope.engine.fastpath.kernels.packing import random_blocks
from opscope.engine.fastpath.qlinear import QuantLinear
from opscope.engine.models.config import ModelConfig
from opscope.engine.models.transformer import Transformer

TINY = ModelConfig(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, vocab_size=160, max_seq_len=128, tie_embeddings=True
)


class BlocksSource:
    """A model's tensors as raw GGUF blocks: Q4_1 linears and a Q8_0 (tied) embedding/head."""

    def __init__(self, model: Transformer, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.blocks = {}
        for name in linear_names(model)[:-1] + ["embed"]:
            n, k = model.get_submodule(name).weight.shape
            kind = "Q8_0" if name == "embed" else "Q4_1"
            self.blocks[f"{name}.weight"] = (kind, random_blocks(kind, n, k, rng), (n, k))

    def raw_tensor(self, name: str):
        return self.blocks[name]


def tiny_pair(options: FastPathOptions, cfg: ModelConfig = TINY):
    """(reference model with the blocks' dequantized weights, fast-path copy of it)."""
    from opscope.engine.fastpath.kernels import dequantize_reference, pack

    ref = Transformer.random(cfg, seed=1)
    source = BlocksSource(ref)
    with torch.no_grad():
        for name, (kind, raw, shape) in source.blocks.items():
            ref.get_submodule(name.removesuffix(".weight")).weight.copy_(dequantize_reference(pack(kind, raw, shape)))
    fast = Transformer.random(cfg, seed=1)
    fast.load_state_dict(ref.state_dict())
    return ref.eval(), apply(fast.eval(), source, options)


def decode_logits(model, prompt: list[int], steps: list[int]) -> torch.Tensor:
    """Prefill ``prompt``, then decode ``steps`` one by one (teacher-forced): logits [1+len(steps), V]."""
    model.setup_cache(1, len(prompt) + len(steps) + 1)
    with torch.inference_mode():
        out = [model(torch.tensor([prompt]), 0, last_only=True)[0, -1]]
        for i, tok in enumerate(steps):
            out.append(model(torch.tensor([[tok]]), len(prompt) + i)[0, -1])
    return torch.stack(out)


# The fused step's attention reads keys in blocks (of 64 at head size 32, 100 at 20) for a chunk of
# one KV group's heads. Head size 32, 9 query heads over 3 KV heads: chunks of 3 heads with one
# thread, of 2 and 1 with two (a group split unevenly). Head size 20: no multiple of any vector width.
GQA_LONG = ModelConfig(
    dim=288, n_layers=2, n_heads=9, n_kv_heads=3, hidden_dim=96, vocab_size=160, max_seq_len=160, tie_embeddings=True
)
ODD_HEADS = ModelConfig(
    dim=160, n_layers=2, n_heads=8, n_kv_heads=2, hidden_dim=96, vocab_size=160, max_seq_len=160, tie_embeddings=True
)


@pytest.mark.parametrize(
    ("cfg", "threads"), [(GQA_LONG, 1), (GQA_LONG, 2), (ODD_HEADS, 2)], ids=["d32-t1", "d32-t2", "d20-t2"]
)
def test_fused_decode_attention_over_many_keys_matches_reference(cfg, threads):
    ref, fast = tiny_pair(FastPathOptions.from_string("prefill_dtype=f32"), cfg)
    assert fast.decode_step is not None
    prompt, steps = [int(t) for t in np.random.default_rng(3).integers(3, 160, 131)], [7, 99, 12, 150, 1, 64]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got, want = decode_logits(fast, prompt, steps), decode_logits(ref, prompt, steps)
    finally:
        torch.set_num_threads(before)
    assert (got - want).abs().max().item() <= 1e-4 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize(
    "spec", ["prefill_dtype=f32", "prefill_dtype=f32,fused_decode=0", "prefill_dtype=f32,gemm_min_rows=1000"]
)
def test_tiny_model_matches_reference(spec):
    ref, fast = tiny_pair(FastPathOptions.from_string(spec))
    assert isinstance(fast.lm_head, QuantLinear) and isinstance(fast.layers[1].mlp.down_proj, QuantLinear)
    prompt, steps = list(range(3, 40)), [7, 99, 12, 150, 1, 64]
    got, want = decode_logits(fast, prompt, steps), decode_logits(ref, prompt, steps)
    assert (got - want).abs().max().item() <= 1e-4 * max(1.0, want.abs().max().item())


def test_fused_step_is_used_and_follows_a_new_cache():
    _, fast = tiny_pair(FastPathOptions(prefill_dtype="f32"))
    from opscope.engine.fastpath.decode import FusedStep

    assert type(fast) is Transformer and isinstance(fast.decode_step, FusedStep)
    first = decode_logits(fast, [5, 6, 7], [8, 9])
    bigger = decode_logits(fast, [5, 6, 7], [8, 9, 10, 11])  # setup_cache made new buffers
    assert torch.allclose(first, bigger[:3], atol=1e-5)


def test_fused_step_profile_times_its_phases_without_changing_logits():
    import time

    _, fast = tiny_pair(FastPathOptions(prefill_dtype="f32"))
    kernel = fast.decode_step.kernel
    plain = decode_logits(fast, [5, 6, 7], [8, 9])
    t0 = time.perf_counter()  # before the kernel's own clock starts: its phases lie inside the wall time
    kernel.profile(True)
    profiled = decode_logits(fast, [5, 6, 7], [8, 9])
    wall = time.perf_counter() - t0
    prof = kernel.profile(False)
    assert set(prof) == {"qkv", "attention", "o", "gate_up", "down", "head", "other"}
    assert all(v > 0 for v in prof.values()) and sum(prof.values()) <= wall
    assert torch.equal(plain, profiled)
    decode_logits(fast, [5, 6, 7], [8, 9])  # profiling off: nothing accumulates
    assert all(v == 0 for v in kernel.profile(False).values())


def test_dense_weights_option_keeps_the_model():
    ref, fast = tiny_pair(FastPathOptions(weights="dense"))
    assert isinstance(fast.lm_head, torch.nn.Linear) and fast.decode_step is None


def test_source_without_blocks_keeps_dense_weights():
    model = Transformer.random(TINY)
    apply(model, object(), FastPathOptions())
    assert not any(isinstance(m, QuantLinear) for m in model.modules())


def test_options_parse_and_reject():
    opts = FastPathOptions.from_string("activations=q8, gemm_min_rows=4,fused_decode=off")
    assert (opts.activations, opts.gemm_min_rows, opts.fused_decode) == ("q8", 4, False)
    assert opts.as_settings()["fastpath.activations"] == "q8"
    for bad in ("activations=int4", "gemm_min_rows=0", "nope=1", "fused_decode=maybe", "gemm_min_rows=x"):
        with pytest.raises(ConfigError):
            FastPathOptions.from_string(bad)


def test_load_dtype_picks_the_fast_path_settings(monkeypatch):
    """float32 → exact fast path; bfloat16, or int8 activations → the fast path with bf16 prefill
    GEMMs where the CPU has native bf16 (float32 GEMMs where it would be emulated), int8 ones with
    int8 activations where the kernels have the int8 GEMM; a spec naming prefill_dtype keeps it;
    other dtypes/devices → plain torch."""
    import opscope.engine.fastpath.kernels as kernels
    from opscope.engine.api import fastpath_options

    gguf = "model.gguf"
    assert fastpath_options("auto", "cpu", "float32", gguf) == FastPathOptions()
    monkeypatch.setattr(kernels, "int8_prefill", lambda: True)
    assert fastpath_options("activations=q8", "cpu", "float32", gguf).prefill_dtype == "int8"
    assert fastpath_options("activations=q8", "cpu", "bf16", gguf).prefill_dtype == "int8"
    assert fastpath_options("auto", "cpu", "bfloat16", gguf).prefill_dtype != "int8"  # float32 activations
    assert fastpath_options("activations=q8,prefill_dtype=bf16", "cpu", "float32", gguf).prefill_dtype == "bf16"
    with pytest.raises(ConfigError, match="prefill_dtype=int8 needs activations=q8"):
        fastpath_options("prefill_dtype=int8", "cpu", "float32", gguf)
    monkeypatch.setattr(kernels, "int8_prefill", lambda: False)
    for native, want in ((True, "bf16"), (False, "f32")):
        monkeypatch.setattr(kernels, "native_bf16", lambda native=native: native)
        assert fastpath_options("auto", "cpu", "bfloat16", gguf) == FastPathOptions(prefill_dtype=want)
        assert fastpath_options("activations=q8", "cpu", "bf16", gguf) == FastPathOptions(
            prefill_dtype=want, activations="q8"
        )
        # int8 activations already move the logits ~5x more than bf16 prefill GEMMs do
        assert fastpath_options("activations=q8", "cpu", "float32", gguf) == FastPathOptions(
            prefill_dtype=want, activations="q8"
        )
        assert fastpath_options("activations=q8,prefill_dtype=f32", "cpu", "float32", gguf).prefill_dtype == "f32"
        assert fastpath_options("fused_decode=0", "cpu", "float32", gguf).prefill_dtype == "f32"
        assert fastpath_options("activations=q8,prefill_dtype=auto", "cpu", "float32", gguf).prefill_dtype == want
    assert fastpath_options("prefill_dtype=f32", "cpu", "bfloat16", gguf).prefill_dtype == "f32"
    assert fastpath_options("auto", "cpu", "float16", gguf) is None
    assert fastpath_options("auto", "cuda", "bfloat16", gguf) is None
    assert fastpath_options("auto", "cpu", "float32", "some/hf-directory") is None
    with pytest.raises(ConfigError, match="float32 or bfloat16"):
        fastpath_options("activations=q8", "cpu", "float16", gguf)


def test_missing_compiler_is_a_typed_error(tmp_path, monkeypatch):
    from opscope.engine.fastpath.kernels import KernelBuildError, variants
    from opscope.engine.fastpath.kernels.build import _compile

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no c++ / g++ to be found
    with pytest.raises(KernelBuildError, match="no C\\+\\+ compiler"):
        _compile("opscope_nocompiler_test", tmp_path / "build", variants.chosen())


# -- the real default model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def real():
    """(reference LoadedModel, chat prompt ids, its 32 greedy tokens, teacher-forced logits [32, V])."""
    from opscope.engine.api import load

    ref = load()
    prompt = ref.tokenizer.apply_chat_template([{"role": "user", "content": "Write a short poem about the sea."}])
    ids = ref.tokenizer.encode(prompt, add_special_tokens=False)
    want = greedy(ref, ids)
    return ref, ids, want, decode_logits(ref.model, ids, want[:-1])


def fast_model(options: FastPathOptions):
    """The default model through engine.api.load + apply (the loader has its own test below)."""
    from opscope.engine.api import load

    lm = load()
    apply(lm.model, lm.source, options)
    return lm


def fast_loaded(options: FastPathOptions):
    from opscope.engine.fastpath import load

    return load(options=options)


def greedy(lm, ids, n=32) -> list[int]:
    from opscope.engine.generation.events import Token
    from opscope.engine.generation.generate import GenerationConfig

    return [
        e.token_id for e in lm.generate(ids, GenerationConfig(max_tokens=n, ignore_eos=True)) if isinstance(e, Token)
    ]


@pytest.mark.slow
def test_real_packed_weights_equal_the_reference_weights(real):
    ref = real[0]
    lm = fast_model(FastPathOptions(fused_decode=False))
    for name in ("layers.0.attn.q_proj", "layers.3.attn.k_proj", "layers.29.mlp.down_proj", "lm_head"):
        assert torch.equal(lm.model.get_submodule(name).weight, ref.model.get_submodule(name).weight), name


@pytest.mark.slow
def test_real_greedy_32_tokens_and_logits_match_reference(real):
    _, ids, want, ref_logits = real
    lm = fast_model(FastPathOptions(prefill_dtype="f32"))
    assert greedy(lm, ids) == want
    assert (decode_logits(lm.model, ids, want[:-1]) - ref_logits).abs().max().item() <= 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("spec,floor", [("prefill_dtype=bf16", 0.9), ("activations=q8,prefill_dtype=f32", 0.8)])
def test_real_lower_precision_agreement(real, spec, floor):
    _, ids, want, ref_logits = real
    lm = fast_loaded(FastPathOptions.from_string(spec))
    got = decode_logits(lm.model, ids, want[:-1])
    agreement = (got.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    assert agreement >= floor, f"{spec}: teacher-forced top-1 agreement {agreement:.3f} < {floor}"


@pytest.mark.slow
def test_fast_loader_builds_from_blocks_and_matches_reference(real):
    from opscope.engine.fastpath import load

    _, ids, want, ref_logits = real
    lm = load(options=FastPathOptions(prefill_dtype="f32"))
    assert isinstance(lm.model.layers[0].attn.q_proj, QuantLinear) and lm.load_ms > 0
    assert greedy(lm, ids) == want
    assert (decode_logits(lm.model, ids, want[:-1]) - ref_logits).abs().max().item() <= 1e-3
