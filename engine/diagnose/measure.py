"""The bounded measurement behind a diagnosis: a model's prefill and a few dozen decode steps, or a
user's script, with the trace, the telemetry sampler and the ceilings on; returns a Measurement.

A model runs twice: once untimed by any hook (the phases' wall times: the trace's per-op hook would
inflate them) and once traced, for a few tokens (ops, placement, module times and source lines). A
script runs once, traced, with the host's stack sampled (what it does while no op runs).
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from opscope.engine.core.errors import Cancelled
from opscope.engine.diagnose import probes
from opscope.engine.diagnose.measurement import DECODE, PREFILL, STEP, Issue, Measurement, Phase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelPlan:
    """What to run on a model: a prompt of ``prompt_tokens`` synthetic ids (or ``prompt`` text) and
    ``tokens`` decode steps timed, ``trace_tokens`` of them traced."""

    prompt: str | None = None
    prompt_tokens: int = 32
    tokens: int = 32
    trace_tokens: int = 4
    variant: str = "clean"
    simulate: bool = False  # --device meta: only the trace, on a stand-in
    dtype: str = "float32"
    seed: int = 0


CANCELLED = "diagnosis cancelled; nothing was saved"


class Stages:
    """The stages of a measurement as they begin (``on_stage`` is told each one's name) and its
    cancel flag: once ``cancel`` is set the measurement stops at the next stage, or after the decode
    step that runs now, with Cancelled; what it measured so far is dropped, never saved in part."""

    def __init__(self, cancel: threading.Event | None = None, on_stage: Callable[[str], None] | None = None) -> None:
        self.cancel, self.on_stage = cancel, on_stage

    def check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(CANCELLED)

    def enter(self, stage: str) -> None:
        self.check()
        if self.on_stage is not None:
            self.on_stage(stage)


def prompt_ids(lm, plan: ModelPlan) -> list[int]:
    if plan.prompt is not None:
        return lm.tokenizer.encode(plan.prompt)
    import random

    rng = random.Random(plan.seed)  # ids from the middle of the vocabulary: no special tokens
    vocab = int(lm.config.vocab_size)
    return [rng.randrange(vocab // 4, vocab // 2) for _ in range(plan.prompt_tokens)]


def _timed(lm, ids: list[int], tokens: int, stages: Stages) -> tuple[float, list[float]]:
    """(prefill ms, decode ms per token) of one untraced generation."""
    from opscope.engine.generation.config import GenerationConfig
    from opscope.engine.generation.events import PrefillStarted, Token

    start, stamps = None, []
    stages.enter(f"timing a prefill of {len(ids)} tokens and {tokens} decode steps")
    config = GenerationConfig(max_tokens=tokens, ignore_eos=True, reuse_prefix=False)
    for ev in lm.generate(ids, config, stages.cancel):
        if isinstance(ev, PrefillStarted):
            start = ev.t_ns
        elif isinstance(ev, Token):
            stamps.append(ev.t_ns)
    stages.check()  # a cancelled generation ends early: its times are not the plan's
    prefill_ms = (stamps[0] - (start or stamps[0])) / 1e6
    return prefill_ms, [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:], strict=False)]


def _traced(lm, ids: list[int], plan: ModelPlan, target: str, stages: Stages):
    from opscope.engine.generation.config import GenerationConfig
    from opscope.engine.trace.events import TraceOptions
    from opscope.engine.trace.report import build_report
    from opscope.engine.trace.session import trace_generation

    stages.enter(f"tracing a prefill of {len(ids)} tokens and {plan.trace_tokens} decode steps")
    config = GenerationConfig(max_tokens=plan.trace_tokens, ignore_eos=True)
    options = TraceOptions(target=target, source="all")
    run = trace_generation(lm, ids, config, options, variant=plan.variant, simulate=plan.simulate, cancel=stages.cancel)
    stages.check()
    return run, build_report(run.result, run.notes)


def step_profile(events, steps: range) -> dict:
    """Phase fields over ``steps``, per step: ops, ms inside ops, the module pattern with the most
    time inside ops and its top line, the pattern issuing the most ops and its top line."""
    from opscope.engine.trace.aggregate import module_pattern

    ns = 0
    per_module: Counter = Counter()  # ns inside ops
    per_line: dict[str, Counter] = defaultdict(Counter)
    count: Counter = Counter()  # ops
    count_line: dict[str, Counter] = defaultdict(Counter)
    for ev in events:
        if ev.step in steps:
            ns += ev.dur_ns
            pattern, line = module_pattern(ev.module or ""), ev.source or ""
            per_module[pattern] += ev.dur_ns
            per_line[pattern][line] += ev.dur_ns
            count[pattern] += 1
            count_line[pattern][line] += 1
    n = max(len(steps), 1)
    top, busiest = _leader(per_module), _leader(count)
    return {
        "ops": sum(count.values()) / n,
        "op_ms": ns / 1e6 / n,
        "top_module": top,
        "top_source": _leader(per_line.get(top, Counter())),
        "busiest_module": busiest,
        "busiest_source": _leader(count_line.get(busiest, Counter())),
    }


def _leader(c: Counter) -> str:
    """The key with the largest count, a named one before the empty name."""
    named = [k for k, _ in c.most_common() if k]
    return named[0] if named else (c.most_common(1)[0][0] if c else "")


def device_busy_pct(result, steps: range) -> float | None:
    """The ops' device time (CUDA events) over the traced wall time of ``steps``; None untimed."""
    timed = [ev.device_dur_ns for ev in result.events if ev.step in steps and ev.device_dur_ns is not None]
    marks = [result.start_ns, *result.token_ns]
    if not timed or len(marks) <= steps.stop:
        return None
    wall = marks[steps.stop] - marks[steps.start]
    return 100.0 * min(sum(timed) / wall, 1.0) if wall > 0 else None


def issues(report) -> tuple[Issue, ...]:
    """The trace's findings (placement, storms, syncs, training health) as Issues."""
    out = []
    for f in report.findings:
        ev = f.evidence or {}
        out.append(
            Issue(
                f.kind,
                f.severity,
                f.title,
                ", ".join(m for m in f.modules if m)[:120],
                f.sources[0] if f.sources else "",
                f.fix,
                float(ev.get("count_per_token", 0.0)),
                float(ev.get("host_ms", 0.0)),
            )
        )
    return tuple(out)


MODEL_NEEDED, SCRIPT_NEEDED = 2, 5  # copies a step needs: an id in and one out; a few batch tensors and the loss


def _transfers(report, needed: int) -> tuple[float, float, int]:
    """(copies beyond the ``needed`` ones, bytes of all, pageable copies) per step or token."""
    count = sum(t.per_token_count for t in report.transfers)
    nbytes = sum(t.per_token_bytes for t in report.transfers)
    return max(count - needed, 0.0), nbytes, sum(t.pageable for t in report.transfers)


def _script_report(trace):
    """The placement report of a script's trace, in steps, with its training-health findings first."""
    from opscope.engine.trace.findings import SCRIPT_IO
    from opscope.engine.trace.report import build_report

    report = build_report(trace.result, [f"steps: {trace.step_source}"], unit="step", io=SCRIPT_IO)
    return replace(report, findings=list(trace.health) + list(report.findings))


def model_phases(lm, plan: ModelPlan, ids: list[int], run, stages: Stages) -> tuple[Phase, ...]:
    from opscope.engine.bench.suites.llm import pp_work, tg_work

    n = len(ids)
    events = run.result.events
    t = run.result.tokens
    pre = step_profile(events, range(1))
    dec = step_profile(events, range(1, max(t, 2)))
    busy = device_busy_pct(run.result, range(1)), device_busy_pct(run.result, range(1, max(t, 2)))
    if plan.simulate:
        return (
            Phase(PREFILL, 1, pre["op_ms"], n, **pre, device_busy_pct=busy[0]),
            Phase(DECODE, max(t - 1, 0), dec["op_ms"], 1, **dec, device_busy_pct=busy[1]),
        )
    prefill_ms, decode_ms = _timed(lm, ids, plan.tokens, stages)
    pw, tw = pp_work(lm, n, 0, plan.dtype), tg_work(lm, plan.tokens, n, plan.dtype)
    decode_wall = statistics.median(decode_ms) if decode_ms else 0.0
    return (
        Phase(PREFILL, 1, prefill_ms, n, pw["flop"] * n, pw["bytes"] * n, **pre, device_busy_pct=busy[0]),
        Phase(DECODE, len(decode_ms), decode_wall, 1, tw["flop"], tw["bytes"], **dec, device_busy_pct=busy[1]),
    )


def measure_model(lm, plan: ModelPlan, subject: str, stages: Stages | None = None) -> Measurement:
    """Diagnose-measure a loaded model (engine.api.LoadedModel); ``stages`` reports its progress
    and can cancel it (Cancelled)."""
    stages = stages or Stages()
    target = "meta" if plan.simulate else str(lm.device)
    watch = probes.LoadWatch(target)
    ids = prompt_ids(lm, plan)
    run, report = _traced(lm, ids, plan, target, stages)
    phases = model_phases(lm, plan, ids, run, stages)
    fast = getattr(getattr(lm, "options", None), "fastpath", "off") != "off"
    stages.enter("probing the compute and bandwidth ceilings")
    ceil = probes.ceilings(target, plan.dtype)
    stages.enter("measuring the host cost of one op")
    dispatch = None if fast else probes.dispatch_us(target)
    modes = None
    if fast and not plan.simulate:
        stages.enter("timing the fast path's matvecs with exact and int8 activations")
        modes = probes.matvec_modes(lm.model)
    stages.check()
    count, nbytes, pageable = _transfers(report, MODEL_NEEDED)
    cores, gpu, neighbours = watch.finish()
    notes = list(report.notes) + (
        ["timed with the CPU fast path: ops and lines are the plain torch model's"] if fast else []
    )
    return Measurement(
        subject,
        "model",
        target,
        "token",
        plan.simulate,
        phases,
        ceil.flop_s,
        ceil.flop_label,
        ceil.bytes_s,
        ceil.bytes_label,
        dispatch,
        nbytes,
        count,
        pageable,
        None,
        issues(report),
        traced_steps=max(run.result.tokens, 1),
        cores=os.cpu_count() or 1,
        other_cores=cores,
        other_gpu_procs=gpu,
        neighbours=neighbours,
        notes=tuple(notes),
        matvec_exact_ms=modes.exact_ms if modes else None,
        matvec_int8_ms=modes.int8_ms if modes else None,
        matvec_types=modes.types if modes else "",
    )


def measure_script(spec: Any, target: str) -> tuple[Measurement, Any, Any]:
    """Diagnose-measure a user's script (engine.trace.script.ScriptSpec); also returns its trace and report."""
    from opscope.engine.trace.events import TraceOptions
    from opscope.engine.trace.script import trace_script

    watch = probes.LoadWatch(target)
    with probes.StackSampler() as stacks:
        trace = trace_script(spec, TraceOptions(target=target, source="all"))
    report = _script_report(trace)
    result = trace.result
    steps = range(1, max(result.tokens, 2)) if result.tokens > 1 else range(1)
    profile = step_profile(result.events, steps)
    wall = statistics.median(trace.step_ms) if trace.step_ms else trace.outcome.wall_ns / 1e6
    since = result.token_ns[0] if result.tokens > 1 else 0
    idle, idle_line, idle_pct = stacks.idle(since)
    count, nbytes, pageable = _transfers(report, SCRIPT_NEEDED)
    cores, gpu, neighbours = watch.finish()
    m = Measurement(
        spec.label,
        "script",
        target,
        "step",
        False,
        (Phase(STEP, len(trace.step_ms) or 1, wall, 1, **profile, device_busy_pct=device_busy_pct(result, steps)),),
        dispatch_us=probes.dispatch_us(target),
        transfer_bytes_per_step=nbytes,
        transfers_per_step=count,
        pageable_transfers=pageable,
        issues=issues(report),
        traced_steps=max(result.tokens, 1),
        idle_pct=idle,
        idle_source=idle_line,
        idle_source_pct=idle_pct,
        cores=os.cpu_count() or 1,
        other_cores=cores,
        other_gpu_procs=gpu,
        neighbours=neighbours,
        notes=tuple(report.notes),
    )
    return m, trace, report


def with_notes(m: Measurement, *notes: str) -> Measurement:
    return replace(m, notes=m.notes + tuple(n for n in notes if n))
