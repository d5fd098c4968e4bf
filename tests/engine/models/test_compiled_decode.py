"""Half-precision activations policy and the torch.compile'd decode step (engine.models.compiled).

The compiled step must give the eager model's logits (float32: within 1e-4; it reorders float sums),
and only batch-1 single-token decode with a cache may reach it. A tiny random Llama keeps the
compile to seconds; the real model's compiled figures are in benchmarks/engine_bench.py.
"""

from __future__ import annotations

import pytest
import torch
from opscope.engine.core.errors import ConfigError
from opscope.engine.models.compiled import enable_compiled_decode
from opscope.engine.models.config import ModelConfig
from opscope.engine.models.transformer import Transformer

TINY = ModelConfig(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, vocab_size=160, max_seq_len=128, tie_embeddings=True
)


class Spy:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.fn(*a, **kw)


def decode_logits(model, prompt: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Eager prefill of ``prompt`` [1,T], then ``steps`` greedy single-token steps; their logits."""
    out = []
    with torch.inference_mode():
        model.setup_cache(1, prompt.shape[1] + steps + 1)
        nxt = model(prompt, 0, last_only=True)[:, -1].argmax(-1)
        for i in range(steps):
            logits = model(nxt.view(1, 1), prompt.shape[1] + i)[:, -1]
            out.append(logits.float())
            nxt = logits.argmax(-1)
    return out


def test_half_weights_on_cpu_keep_float32_activations():
    model = Transformer.random(TINY, dtype=torch.bfloat16)
    assert model.act_dtype == torch.float32
    assert model.layers[0].attn_norm.weight.dtype == torch.float32 and model.norm.out_dtype == torch.bfloat16
    assert model.layers[0].attn.q_proj.weight.dtype == torch.bfloat16
    model.setup_cache(1, 8)
    assert model.layers[0].attn.cache.k.dtype == torch.float32
    with torch.inference_mode():
        assert model(torch.tensor([[1, 2, 3]]), 0).dtype == torch.bfloat16  # logits in the weights' dtype
    model.to(torch.float32)
    assert model.act_dtype == torch.float32 and model.norm.out_dtype is None
    assert model.layers[1].mlp_norm.weight.dtype == torch.float32


def test_bfloat16_model_tracks_float32_model():
    """bf16 weights (float32 activations) against the same weights in float32: teacher-forced top-1
    agreement over 48 positions of random tokens (stated floor 0.9) and bounded logit error."""
    ref = Transformer.random(TINY, seed=3)
    half = Transformer.random(TINY, seed=3, dtype=torch.bfloat16)
    ids = torch.randint(0, TINY.vocab_size, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = ref(ids, 0)[0], half(ids, 0)[0].float()
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree
    assert (a - b).abs().max().item() < 0.05 * a.abs().max().item()


def test_compiled_decode_matches_eager_float32():
    ref = Transformer.random(TINY, seed=1).eval()
    comp = Transformer.random(TINY, seed=1).eval()
    enable_compiled_decode(comp)
    spy = comp.decode_step.fn = Spy(comp.decode_step.fn)
    prompt = torch.tensor([[5, 17, 3, 99]])
    want, got = decode_logits(ref, prompt, 12), decode_logits(comp, prompt, 12)
    assert spy.calls == 12  # every step from position 4 on ran compiled
    assert [int(w.argmax()) for w in want] == [int(g.argmax()) for g in got]
    assert max((w - g).abs().max().item() for w, g in zip(want, got)) < 1e-4


def test_static_decode_step_equals_forward():
    """decode_static (whole cache under a mask, position as a tensor) = the dynamic forward, eagerly."""
    model = Transformer.random(TINY, seed=4).eval()
    prompt = torch.tensor([[7, 8, 9]])
    want = decode_logits(model, prompt, 6)
    got, nxt = [], None
    with torch.inference_mode():
        model.setup_cache(1, 32)
        nxt = model(prompt, 0, last_only=True)[:, -1].argmax(-1)
        for i in range(6):
            logits = model.decode_static(nxt.view(1, 1), torch.tensor([3 + i]))[:, -1]
            got.append(logits)
            nxt = logits.argmax(-1)
    assert max((w - g).abs().max().item() for w, g in zip(want, got)) < 1e-5


def test_static_compiled_step_matches_eager_on_cpu():
    """The CUDA-graph step's code path (static shapes, fullgraph) compiled for the CPU."""
    ref = Transformer.random(TINY, seed=1).eval()
    comp = Transformer.random(TINY, seed=1).eval()
    enable_compiled_decode(comp, static=True)
    spy = comp.decode_step.fn = Spy(comp.decode_step.fn)
    prompt = torch.tensor([[5, 17]])
    want, got = decode_logits(ref, prompt, 8), decode_logits(comp, prompt, 8)
    assert spy.calls == 8
    assert max((w - g).abs().max().item() for w, g in zip(want, got)) < 1e-4


def test_only_single_token_cached_decode_is_compiled():
    model = Transformer.random(TINY, seed=2).eval()
    enable_compiled_decode(model)
    spy = model.decode_step.fn = Spy(lambda *a, **kw: pytest.fail("compiled step called"))
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), 0)  # no cache: reference pass
        model.setup_cache(2, 16)
        model(torch.tensor([[1, 2, 3]]), 0)  # prefill
        model(torch.tensor([[4]]), 1)  # positions 0 and 1 are specialised by dynamo: eager
        model(torch.tensor([[4], [5]]), 3)  # a batch
        model(torch.tensor([[4]]), 3, pad=torch.tensor([0]))  # padded batch row
    model.setup_cache(1, 16)
    model(torch.tensor([[4]]), 3)  # autograd on
    assert spy.calls == 0


def test_load_rejects_bad_compile_settings():
    from opscope.engine.api import load

    with pytest.raises(ConfigError, match="compile='always'"):
        load(compile="always")
    with pytest.raises(ConfigError, match="fastpath='off'"):
        load(compile="decode", fastpath="activations=q8")


@pytest.mark.slow
def test_default_model_compiled_decode_equals_eager(default_model_2_layers):
    """The real model, float32, plain torch, loaded from its file through load(compile=...): 8 greedy
    tokens compiled = eager. Its first 2 layers (gguf_craft.first_layers_gguf): every layer is the
    same code, which Inductor compiles layer by layer into one graph, so 2 real layers (real shapes,
    weights, tokenizer, RoPE base, tied embeddings) prove what 30 do, in a fifteenth of the compile
    time (the whole model's compile: ~35 s on 2 cores, benchmarks/engine_bench.py --compile)."""
    from opscope.engine.api import load
    from opscope.engine.generation.events import Token
    from opscope.engine.generation.generate import GenerationConfig

    path = str(default_model_2_layers)
    cfg = GenerationConfig(max_tokens=8)
    eager = load(path, fastpath="off")
    assert eager.model.config.n_layers == 2 and eager.model.config.dim == 576
    want = [e.token_id for e in eager.generate("The capital of France is", cfg) if isinstance(e, Token)]
    comp = load(path, compile="decode")
    spy = comp.model.decode_step.fn = Spy(comp.model.decode_step.fn)
    got = [e.token_id for e in comp.generate("The capital of France is", cfg) if isinstance(e, Token)]
    assert got == want and spy.calls == 7


_OTHER_PROCESS = """
import sys, torch
sys.path.insert(0, {here!r})
from test_compiled_decode import TINY, Transformer, enable_compiled_decode
enable_compiled_decode(Transformer.random(TINY, seed=1))  # what a process with a compiled step sets up
def f(x, w, g):  # the kind of graph the step's fused kernels are (a norm, a matmul, SiLU, a softmax)
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    y = h @ w
    return torch.nn.functional.silu(y) * y + torch.softmax(y, -1)
torch.manual_seed(0)
x, w, g = torch.randn(1, 64), torch.randn(64, 200), torch.randn(64)
want = f(x, w, g)  # outputs up to ~100: a float32 reorder moves them by ~1e-4, so relative to the largest
print(((torch.compile(f)(x, w, g) - want).abs().max() / want.abs().max()).item())
"""


def test_compiled_decode_is_right_after_another_vector_isa_filled_the_cache(tmp_path):
    """Inductor's on-disk cache, shared by processes that pick different vector ISAs
    (ATEN_CPU_CAPABILITY): each must still get the eager logits (without the width in the cache
    key: NaNs or a heap corruption, or vectorized code that fails to compile). On an AVX2-only CPU
    the other is "default", whose scalar loops sum in another order than eager's GEMM."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    own = torch.backends.cpu.get_cpu_capability().lower()
    other = {"avx512": "avx2", "avx2": "default"}.get(own)
    if other is None:
        pytest.skip(f"one vector ISA on this CPU ({own}): no other to fill the cache with")
    script = _OTHER_PROCESS.format(here=str(Path(__file__).parent))
    for cap in (other, own):  # the other ISA's entries first, then this CPU's own process reads them
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "ATEN_CPU_CAPABILITY": cap}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (cap, out.stderr[-3000:])
        assert float(out.stdout.split()[-1]) < 1e-5, (cap, out.stdout)  # NaN, garbage: far above
