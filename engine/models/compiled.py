"""A torch.compile'd decode step for the plain torch model (``load(..., compile="decode")``).

Eager decode of the default model runs ~1,200 small aten ops per token between its 211 weight
matmuls; on the CPU they cost 10-13 ms per token, a quarter of a bf16 step. Inductor fuses them
(norms, RoPE, SiLU·up, residual adds) into a few C++ kernels per layer and calls the matmuls and
attention as extern kernels, so the step gets close to its matmul-only ceiling
(benchmarks/engine_bench.py --compile both).

Only single-token, batch-1 steps with a KV cache go to the compiled step; prefill (which Inductor
made slower than eager oneDNN GEMMs: pp512 bf16 ~610 vs ~1,000 tok/s), batches, cache-less
reference passes and autograd use the model's own forward (``plain_forward``); the step is set
through ``Transformer.set_decode_step``. The position is a dynamic size, so one compiled graph
serves every position from 2 on (positions 0 and 1 would each be specialised by dynamo; those
steps run eagerly). The first compiled call compiles: ~35 s for the default model on
a 2-core CPU, ~12 s when Inductor's on-disk cache is warm.

On CUDA the step is the static one (``Transformer.decode_static``: the position is a device tensor,
attention reads the whole cache under a mask), compiled with ``mode="reduce-overhead"`` so that
Inductor captures it once as a CUDA graph and replays it every token (gpt-fast's scheme): one
launch per token instead of ~1,200, and no host sync but the sampled id. On the CPU the dynamic
step is faster (attention reads only the used prefix); ``static=True`` selects the static one there
too (tests check it against eager on the CPU).
"""

from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger(__name__)

COMPILE_MODES = ("off", "decode")
_FIRST_COMPILED_POS = 2  # dynamo specialises integer inputs 0 and 1; keep them out of the graph


class CompiledStep:
    """The model's decode step (``Transformer.set_decode_step``) through torch.compile: ``fn`` is the
    compiled function; positions below ``first_pos`` are declined (None) and run eagerly."""

    # dynamo specialises the size of module buffers, so each new cache size compiles the step again
    # (10-30 s): engine.generate grows the cache of a model with this step in large steps
    cache_round = 2048

    def __init__(self, fn, first_pos: int):
        self.fn, self.first_pos = fn, first_pos
        self.compiled_once = False

    def __call__(self, idx: torch.Tensor, pos: int) -> torch.Tensor | None:
        if pos < self.first_pos:
            return None
        if not self.compiled_once:
            self.compiled_once = True
            log.warning(
                "compiling the decode step (torch.compile, once per process and cache size: "
                "~10-40 s on a small CPU); decode tok/s of this reply includes it"
            )
        return self.fn(idx, pos)


class StaticStep:
    """decode_static compiled with fixed shapes; the position goes in through one device tensor
    written in place (a fill kernel, no host→device copy to wait for)."""

    def __init__(self, model, mode: str | None):
        self.model = model
        self.pos = torch.zeros(1, dtype=torch.long, device=model.embed.weight.device)
        self.step = torch.compile(model.decode_static, mode=mode, fullgraph=True, dynamic=False)

    def __call__(self, idx, pos: int):
        self.pos.fill_(pos)
        return self.step(idx, self.pos)


def enable_compiled_decode(model, static: bool | None = None) -> None:
    """Route ``model``'s decode steps through torch.compile (``model.set_decode_step``). The graph is
    built at the first decode step, not here. ``static`` (default: on CUDA) picks the static-shape step."""
    device = model.embed.weight.device
    static = device.type == "cuda" if static is None else static
    if device.type == "cpu":
        _key_cache_by_vector_width()
    if static:
        step = CompiledStep(StaticStep(model, "reduce-overhead" if device.type == "cuda" else None), 0)
    else:
        step = CompiledStep(
            torch.compile(functools.partial(type(model).plain_forward, model), dynamic=True), _FIRST_COMPILED_POS
        )
    model.set_decode_step(step)
    log.info("decode step (%s) compiled with torch.compile at its first call", "static" if static else "dynamic")


def _key_cache_by_vector_width() -> None:
    """Inductor's on-disk cache does not tell apart the CPU vector ISAs it generates code for
    (ATEN_CPU_CAPABILITY picks one; torch 2.11-2.15): a graph compiled capped at AVX2 and read back
    by an uncapped AVX-512 process, or the reverse, computed NaNs or corrupted the heap, and code
    vectorized for AVX2 read back under ATEN_CPU_CAPABILITY=default failed to compile. Setting
    ``cpp.simdlen`` to the width Inductor would pick anyway makes the width part of the cache key
    (docs/decisions/0011-inductor-cache-keyed-by-vector-width.md)."""
    try:
        from torch._inductor import config, cpu_vec_isa

        if config.cpp.simdlen is None:
            isa = cpu_vec_isa.pick_vec_isa()
            if isa:
                config.cpp.simdlen = isa.bit_width()
    except (ImportError, AttributeError) as e:  # a torch without these: its own default
        log.debug("inductor's vector width left to torch: %s", e)
