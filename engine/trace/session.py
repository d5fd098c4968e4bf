"""Trace a region: a generation, a benchmark step, or any callable.

Tracing stays outside the engine: the Tracer (a dispatch mode) is entered around the iteration of
``LoadedModel.generate(...)``, and each Token event the generation yields starts the next step.

On a machine without the target accelerator, ``trace_generation(..., simulate=True)`` runs a
stand-in copy of the model on the meta device under FakeTensorMode (engine.trace.simulate).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import InsufficientMemory
from opscope.engine.core.units import format_bytes
from opscope.engine.generation.events import Finished, Token
from opscope.engine.trace.capture import Tracer, TraceResult
from opscope.engine.trace.events import TraceOptions
from opscope.engine.trace.variants import CLEAN, plant

log = logging.getLogger(__name__)

SIMULATION_NOTE = (
    "simulated accelerator: the model ran on the meta device under FakeTensorMode, so "
    "placement and transfers are real but times are host dispatch times and token ids are "
    "placeholders"
)


@dataclass
class TraceRun:
    result: TraceResult
    variant: str = CLEAN
    simulated: bool = False
    finished: Finished | None = None
    notes: list[str] = field(default_factory=list)


def trace_callable(
    fn: Callable[..., Any], *args, options: TraceOptions | None = None, model=None, **kwargs
) -> tuple[Any, TraceResult]:
    """Run ``fn(*args, **kwargs)`` under a tracer; returns (its value, the trace)."""
    tracer = Tracer(options, model=model)
    with tracer:
        value = fn(*args, **kwargs)
    return value, tracer.result()


def _drive(tracer: Tracer, events: Iterator) -> Finished | None:
    finished = None
    with tracer:
        for event in events:
            if isinstance(event, Token):
                tracer.mark_token(event.t_ns)
            elif isinstance(event, Finished):
                finished = event
    return finished


TWIN_SLACK = 1.25  # the twin's weights plus its activations, KV cache and the allocator's slack
TWIN_KEPT_SHARE = 0.10  # a twin whose weights take at most this part of RAM is kept for the next trace


def twin_weight_bytes(lm) -> int:
    """The plain torch model's weights in ``lm``'s dtype: every quantized matrix of the fast path at
    full size (a tied head and embedding once), and the parameters it holds as they are."""
    import torch

    itemsize = torch.empty((), dtype=getattr(torch, lm.options.dtype)).element_size()
    seen, n = set(), 0
    for mod in lm.model.modules():
        qs = getattr(mod, "qs", None)
        if isinstance(qs, torch.Tensor) and hasattr(mod, "ggml_type") and qs.data_ptr() not in seen:
            seen.add(qs.data_ptr())
            n += math.prod(mod.shape)
    n += sum(p.numel() for p in lm.model.parameters())
    return n * itemsize


def torch_twin(lm):
    """The plain torch model of ``lm``: placement is a property of torch ops, and the CPU fast path
    runs decode as one opaque C++ call that a dispatch mode cannot look into. A GGUF's twin is built by
    engine.fastpath.loader.plain_twin (the plain model's weights bit for bit, decoded by the kernels).
    Its weights are the file's at full size (a 1.2 B Q4_K_M file in float32: 5 GB beside the fast
    path's 0.8), so it is loaded only where memory holds it (else InsufficientMemory, saying what it
    needs), and kept on the lm for the next trace only while under TWIN_KEPT_SHARE of RAM (release_twin)."""
    if getattr(getattr(lm, "options", None), "fastpath", "off") == "off":
        return lm
    twin = getattr(lm, "_trace_twin", None)
    if twin is None:
        import psutil
        from opscope.engine.api import load

        need, free = twin_weight_bytes(lm), psutil.virtual_memory().available
        if need * TWIN_SLACK > free:
            raise InsufficientMemory(
                f"tracing {Path(str(lm.source.path)).name} runs its plain torch model beside the fast path: "
                f"{format_bytes(need, 3)} of {lm.options.dtype} weights, ~{format_bytes(need * TWIN_SLACK, 3)} "
                f"with its working memory, and {format_bytes(free, 3)} is free; trace a smaller model, or free "
                "memory first"
            )
        o = lm.options
        if hasattr(lm.source, "raw_tensor"):  # a GGUF: its blocks decoded by the kernels, ~10x gguf's numpy
            from opscope.engine.fastpath.loader import plain_twin

            twin = plain_twin(lm)
        else:
            twin = load(
                lm.source.path, device=o.device, dtype=o.dtype, attention=o.attention, threads=o.threads, fastpath="off"
            )
        lm._trace_twin = twin
    return twin


def release_twin(lm) -> None:
    """Drop ``lm``'s twin after a trace unless it is small enough to keep (TWIN_KEPT_SHARE of RAM)."""
    import psutil

    twin = getattr(lm, "_trace_twin", None)
    if twin is not None and twin_weight_bytes(lm) > TWIN_KEPT_SHARE * psutil.virtual_memory().total:
        lm._trace_twin = None


def trace_generation(
    lm,
    prompt: str | list[int],
    config,
    options: TraceOptions | None = None,
    *,
    variant: str = CLEAN,
    simulate: bool = False,
    cancel: threading.Event | None = None,
) -> TraceRun:
    """Trace one generation of ``lm`` (an engine.api.LoadedModel) with a planted-bug variant; a set
    ``cancel`` ends the generation after its current step (``finished.stop_reason`` "cancelled")."""
    twin = torch_twin(lm)
    try:
        options = options or TraceOptions(target=str(twin.device))
        if simulate:
            return _trace_simulated(twin, prompt, config, options, variant, cancel)
        with plant(twin.model, variant):
            tracer = Tracer(options, model=twin.model)
            # the whole generation, not a 1-token prefill over a prefix left in the KV cache
            finished = _drive(tracer, twin.generate(prompt, _no_reuse(config), cancel))
        return TraceRun(tracer.result(), variant, False, finished)
    finally:
        del twin
        release_twin(lm)


def _no_reuse(config):
    from dataclasses import replace

    return replace(config, reuse_prefix=False) if hasattr(config, "reuse_prefix") else config


def _trace_simulated(lm, prompt, config, options: TraceOptions, variant: str, cancel=None) -> TraceRun:
    """The engine's own generation loop on a stand-in when fake tensors allow it (some constructs,
    like torch.Generator(device="meta"), they refuse); else a greedy loop with the same per-step
    protocol (prompt uploaded once, sampled id kept on the device, one .item() per token)."""
    from dataclasses import replace

    from opscope.engine.generation.generate import generate

    ids = lm.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    config = replace(config, ignore_eos=True, stop=())  # placeholder ids must not end the run early
    try:
        return _trace_stand_in(lm.model, options, variant, lambda m: generate(m, lm.tokenizer, ids, config, cancel))
    except Exception as e:
        log.info("engine loop cannot run on the %s stand-in: %s", options.target, e)
        run = trace_model(lm.model, ids, config.max_tokens, options, variant=variant, simulate=True)
        run.notes.append(
            f"engine.generate cannot run on the {options.target} stand-in ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:120]}); the trace drove the model with an equivalent greedy loop"
        )
        return run


def _trace_stand_in(model, options: TraceOptions, variant: str, events: Callable) -> TraceRun:
    from opscope.engine.trace.simulate import simulated_device, to_device_stand_in

    stand_in = to_device_stand_in(model, options.target)
    with plant(stand_in, variant), simulated_device():
        tracer = Tracer(options, model=stand_in)
        finished = _drive(tracer, events(stand_in))
    return TraceRun(tracer.result(), variant, True, finished, [SIMULATION_NOTE])


def trace_model(
    model, ids: list[int], max_tokens: int, options: TraceOptions, *, variant: str = CLEAN, simulate: bool = False
) -> TraceRun:
    """Trace greedy generation straight on an engine model (no tokenizer needed: tiny test models,
    benchmarks, stand-ins)."""
    if simulate:
        return _trace_stand_in(model, options, variant, lambda m: greedy_events(m, ids, max_tokens))
    with plant(model, variant):
        tracer = Tracer(options, model=model)
        _drive(tracer, greedy_events(model, ids, max_tokens))
    return TraceRun(tracer.result(), variant, False)


def greedy_events(model, ids: list[int], max_tokens: int) -> Iterator[Token]:
    """Greedy decoding with the engine's per-step protocol, yielding one Token per step."""
    import torch
    from opscope.engine.generation.generate import ensure_cache

    n = len(ids)
    ensure_cache(model, 1, n + max_tokens)
    with torch.inference_mode():
        # Built on the host, then copied: torch.tensor(..., device=) cannot make fake tensors.
        x = torch.tensor([ids], dtype=torch.long).to(model.embed.weight.device)  # [1, T]
        nxt = model(x, 0, last_only=True)[:, -1].argmax(dim=-1)  # [1]
        for i in range(max_tokens):
            yield Token(i, int(nxt.item()), "", now_ns())
            if i + 1 == max_tokens:
                break
            nxt = model(nxt.view(1, 1), n + i)[:, -1].argmax(dim=-1)
