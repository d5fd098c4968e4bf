"""Two settings of one suite measured interleaved, in one process: `opscope bench SUITE --ab FLAGS`.

Two runs taken one after the other differ by the machine's drift between them, which can hide a
change or invent one (docs/decisions/0004-ab-runs-interleaved.md). Here both settings'
plans are made up front (for model suites: both models loaded), and each point is measured with
A's and B's repetitions alternating, ABBA (engine.bench.runner.measure_pair), so whatever the
machine does lands on both sides alike. Two runs are saved, as `opscope bench` would save each,
with ``settings["interleaved"]`` naming the pair, and the comparison of B against A is returned.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from itertools import zip_longest
from typing import Any

from opscope.engine.bench.measure.memory import SHARED_AB
from opscope.engine.bench.measure.options import BenchOptions, SuitePlan
from opscope.engine.bench.measure.runner import AB_LABELS, Budget, PointOutcome, ProgressFn, measure_pair, measure_point
from opscope.engine.bench.session import RunSink, _finish, _new_result, _status, keep_budget
from opscope.engine.bench.suites import get_suite
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import Cancelled, ConfigError
from opscope.engine.core.results import Metric, RunResult

log = logging.getLogger(__name__)

ORDER = "ABBA per repetition, one process"
PEAK_MEMORY_NOTE = (
    "shared: A and B run in one process, whose peak (resident set on the CPU, allocator peak on "
    "CUDA) holds both sides' models and buffers; the .peak_mem_bytes metrics carry "
    f"memory={SHARED_AB!r} and are not per side: for one side's peak, run it alone (without --ab)"
)


@dataclass(frozen=True)
class Side:
    """One setting of an A/B run: its options, suite parameters and run name."""

    opts: BenchOptions
    params: Any
    name: str
    flags: str = ""  # what the user typed for it (B's --ab flags), saved with the run


def pair_names(base: str = "", suite: str = "") -> tuple[str, str]:
    """The two runs' names: BASE-a and BASE-b (default base: SUITE-ab-DATE-TIME)."""
    base = base or f"{suite}-ab-{datetime.now():%Y%m%d-%H%M%S}"
    return f"{base}-{AB_LABELS[0]}", f"{base}-{AB_LABELS[1]}"


def check_sides(a: Side, b: Side) -> None:
    """Both sides must be measured the same way; only what is measured may differ."""
    if a.opts.runner_config() != b.opts.runner_config():
        raise ConfigError(
            "--ab flags change how the runs are measured (--quick, --repeat, --min-time, "
            "--warmup or --load-threshold): give those once, before --ab, for both sides"
        )
    if a.opts.device != b.opts.device:
        raise ConfigError(
            f"--ab needs both sides on one device (got {a.opts.device} and {b.opts.device}): "
            f"interleaving compares settings on the same hardware"
        )


def _thread_setters(a: Side, b: Side, default: int) -> tuple[Callable[[], None] | None, Callable[[], None] | None]:
    """Hooks that set each side's torch thread count (``default`` where it names none) before its
    calls, when the sides differ."""
    if a.opts.threads == b.opts.threads:
        return None, None
    import torch

    return tuple((lambda n=s.opts.threads or default: torch.set_num_threads(n)) for s in (a, b))  # type: ignore[return-value]


def _default_threads() -> int:
    import torch

    return torch.get_num_threads()


def _plan(module, side: Side, model: Any) -> SuitePlan:
    if side.opts.threads:
        import torch

        torch.set_num_threads(side.opts.threads)
    if getattr(module, "NEEDS_MODEL", False):
        return module.plan(side.opts, side.params, model=model)
    return module.plan(side.opts, side.params)


class _Pair:
    """The two runs being written: results, store ids, and adding a side's metrics."""

    def __init__(self, suite: str, sides: tuple[Side, Side], plans: list[SuitePlan], sink, tags, notes):
        self.sides, self.plans, self.sink = sides, plans, sink
        self.results: list[RunResult] = []
        for i, (side, plan) in enumerate(zip(sides, plans)):
            result = _new_result(suite, side.opts, plan, side.name, tags, notes)
            result.settings["interleaved"] = {
                "pair": [s.name for s in sides],
                "role": AB_LABELS[i],
                "order": ORDER,
                "b_flags": sides[1].flags,
                "peak_memory": PEAK_MEMORY_NOTE,
            }
            self.results.append(result)
        self.ids = [sink.begin_run(r) if sink is not None else None for r in self.results]

    def add(self, i: int, metric: Metric) -> None:
        if metric.name.endswith(".peak_mem_bytes"):  # one process for both sides: marked, never per side
            metric = dataclasses.replace(metric, params={**metric.params, "memory": SHARED_AB})
        self.results[i].metrics.append(metric)
        if self.sink is not None:
            self.sink.add_metric(self.ids[i], metric)  # committed now: a crash keeps every finished point

    def add_outcome(self, i: int, outcome: PointOutcome) -> None:
        self.plans[i].outcomes.append(outcome)  # before the next point: a plan's generator reads them
        for metric in outcome.metrics:
            self.add(i, metric)

    def close(self, status: str, error: str | None) -> None:
        for i, result in enumerate(self.results):
            _finish(self.sink, self.ids[i], result, status, error)


def _measure(pair: _Pair, cfg, cancel, progress: ProgressFn | None, before) -> None:
    total = max(p.n_points for p in pair.plans)
    start = now_ns()

    def report(done: float) -> None:
        if progress is not None:
            elapsed = (now_ns() - start) / 1e9
            progress(done, total, elapsed / done * (total - done) if done > 0 else None)

    report(0.0)
    budget = Budget.for_run(cfg, total)  # --quick: one budget for both sides
    for k, (pa, pb) in enumerate(zip_longest(iter(pair.plans[0].points), iter(pair.plans[1].points))):

        def tick(f: float, k: int = k) -> None:
            report(k + f)

        if pa is not None and pb is not None and pa.name == pb.name:
            for i, outcome in enumerate(measure_pair((pa, pb), cfg, cancel, tick, before, budget)):
                pair.add_outcome(i, outcome)
        else:  # a point only one side has (or a different one): measured alone, not compared
            for i, point in enumerate((pa, pb)):
                if point is not None:
                    pair.add_outcome(i, measure_point(point, cfg, cancel, tick, budget))
        report(float(k + 1))
    keep_budget(budget, cfg, pair.results, pair.sink, pair.ids)
    for i, plan in enumerate(pair.plans):
        for metric in plan.finish(plan.outcomes) if plan.finish else []:
            pair.add(i, metric)


def run_ab(
    suite: str,
    sides: tuple[Side, Side],
    sink: RunSink | None = None,
    *,
    tags: tuple[str, ...] | list[str] = (),
    notes: str = "",
    cancel: threading.Event | None = None,
    progress: ProgressFn | None = None,
    model: Any = None,
) -> list[tuple[Any, RunResult]]:
    """Runs ``suite`` under both sides' settings, interleaved; returns [(run id, result)] for A, B.
    Cancellation closes both runs as "aborted" with what was measured, then propagates. ``model``
    (a loaded model) serves both sides: only for sides that differ in suite parameters, not in how
    the model is loaded; without it each side loads its own."""
    check_sides(*sides)
    module = get_suite(suite)
    plans: list[SuitePlan] = []
    threads = _default_threads()  # before a side's --threads changes it
    try:
        for side in sides:
            plans.append(_plan(module, side, model))
        pair = _Pair(suite, sides, plans, sink, tags, notes)
        try:
            _measure(pair, sides[0].opts.runner_config(), cancel, progress, _thread_setters(*sides, threads))
        except (Cancelled, KeyboardInterrupt) as e:
            pair.close("aborted", "cancelled by the user")
            raise Cancelled("benchmark cancelled; the points measured so far are saved") from e
        except Exception as e:
            pair.close("failed", f"{type(e).__name__}: {e}")
            raise
        for i, result in enumerate(pair.results):
            _finish(sink, pair.ids[i], result, *_status(plans[i].outcomes))
        return list(zip(pair.ids, pair.results))
    finally:
        for plan in plans:
            if plan.close is not None:
                plan.close()
