"""A torch.compile'd decode step for the plain torch model (``load(..., compile="decode")``).

Eager decode of the default model runs ~1,200 small aten ops per token between its 211 weight
matmuls; on the CPU they cost 10-13 ms per token, a quarter of a bf16 step. Inductor fuses them
(norms, RoPE, SiLU·up, residual adds) into a few C++ kernels per layer and calls the matmuls and
attention as extern kernels, so the step gets close to its matmul-only ceiling
(benchmarks/engine_bench.py --compile both).

Only single-token, batch-1 steps with a KV cache go to the compiled step; prefill (which Inductor
made slower than eager oneDNN GEMMs: pp512 bf16 ~610 vs ~1,000 tok/s), batches, cache-less
reference passes and autograd use the model's own forward. The position is a dynamic size, so one
compiled graph serves every position from 2 on (positions 0 and 1 would each be specialised by
dynamo; those steps run eagerly). The first compiled call compiles: ~35 s for the default model on
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


class CompiledDecodeMixin:
    """Mixed into the model's class: batch-1 single-token decode with a cache runs compiled."""

    _compiled_step = None
    _compiled_once = False
    _first_compiled_pos = _FIRST_COMPILED_POS
    # dynamo specialises the size of module buffers, so each new cache size compiles the step again
    # (10-30 s): engine.generate grows a compiled model's cache in large steps
    cache_round = 2048

    def forward(self, idx, input_pos=0, *, pad=None, last_only=False):
        pos = input_pos if isinstance(input_pos, int) else None
        if (self._compiled_step is None or pos is None or pos < self._first_compiled_pos
                or not self.is_decode_step(idx, pad)):
            return super().forward(idx, input_pos, pad=pad, last_only=last_only)
        if not self._compiled_once:
            self._compiled_once = True
            log.warning("compiling the decode step (torch.compile, once per process and cache size: "
                        "~10-40 s on a small CPU); decode tok/s of this reply includes it")
        return self._compiled_step(idx, pos)


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
    """Route ``model``'s decode steps through torch.compile (in place). The graph is built at the
    first decode step, not here. ``static`` (default: on CUDA) picks the static-shape step."""
    device = model.embed.weight.device
    static = device.type == "cuda" if static is None else static
    cls = type(model)
    if not issubclass(cls, CompiledDecodeMixin):
        model.__class__ = cls = type(f"Compiled{cls.__name__}", (CompiledDecodeMixin, cls), {})
    if static:
        model._compiled_step = StaticStep(model, "reduce-overhead" if device.type == "cuda" else None)
        model._first_compiled_pos = 0
    else:
        base_forward = cls.__mro__[cls.__mro__.index(CompiledDecodeMixin) + 1].forward
        model._compiled_step = torch.compile(functools.partial(base_forward, model), dynamic=True)
        model._first_compiled_pos = _FIRST_COMPILED_POS
    log.info("decode step (%s) compiled with torch.compile at its first call", "static" if static else "dynamic")
