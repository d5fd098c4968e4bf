"""One benchmark run from start to finish: plan the suite, fingerprint the environment, measure
every point, commit each point to the store as soon as it is measured, and close the run.

This is the function the CLI and the GUI's worker call. The store is any object with
``begin_run(RunResult) -> id``, ``add_metric(id, Metric)`` and ``finish_run(id, status, error)``
(engine.store.RunStore); without one the RunResult is only returned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from opscope.engine.bench.measure.memory import peak_unit_note
from opscope.engine.bench.measure.options import BenchOptions, SuitePlan
from opscope.engine.bench.measure.quality import worst
from opscope.engine.bench.measure.runner import Budget, ProgressFn, budget_line, run_points
from opscope.engine.bench.suites import get_suite
from opscope.engine.core import fingerprint
from opscope.engine.core.errors import Cancelled
from opscope.engine.core.results import Metric, RunResult

log = logging.getLogger(__name__)


class RunSink(Protocol):
    def begin_run(self, result: RunResult) -> Any: ...

    def add_metric(self, run_id: Any, metric: Metric) -> None: ...

    def finish_run(self, run_id: Any, status: str, error: str | None = None) -> None: ...


def _apply_threads(opts: BenchOptions) -> None:
    if opts.threads:
        import torch

        torch.set_num_threads(opts.threads)


def _status(outcomes) -> tuple[str, str | None]:
    invalid = [o for o in outcomes if o.invalid]
    if invalid:  # a result that failed its own check (e.g. loss not decreasing) fails the run
        return "failed", f"{invalid[0].point.name}: {invalid[0].error}"
    if outcomes and not any(o.ok for o in outcomes):
        return "failed", f"every point failed; first: {outcomes[0].point.name}: {outcomes[0].error}"
    return "completed", None


def _new_result(suite: str, opts: BenchOptions, plan: SuitePlan, name: str, tags, notes: str) -> RunResult:
    settings = opts.as_settings() | {
        "suite": suite,
        "suite_params": plan.settings,
        "planned_points": plan.n_points,  # with the run's duration: the next run's estimate (bench.estimate)
        "peak_memory": peak_unit_note(opts.device),
    }
    fp = fingerprint.collect(settings, plan.model_source)
    return RunResult(
        kind=suite, name=name, tags=list(tags), notes=notes, settings=settings, fingerprint=fp, status="running"
    )


@contextmanager
def _recording(recorder, result: RunResult, sink, run_id) -> Iterator[None]:
    """Telemetry and phase markers over the measurement, saved even when it is cancelled."""
    if recorder is None:
        yield
        return
    recorder.start()
    try:
        yield
    finally:
        recorder.stop()
        own = list(result.markers)  # a plan's own markers, saved already by _measure
        recorder.attach(result)
        if sink is not None and hasattr(sink, "add_telemetry"):
            sink.add_telemetry(run_id, result.telemetry)
            sink.add_markers(run_id, result.markers)
        result.markers = own + result.markers


def _measure(plan: SuitePlan, opts: BenchOptions, result: RunResult, sink, run_id, cancel, progress, on_metric) -> None:
    def add(metric: Metric) -> None:
        result.metrics.append(metric)
        if sink is not None:
            sink.add_metric(run_id, metric)  # committed now: a crash keeps every finished point
        if on_metric is not None:
            on_metric(metric)

    cfg = opts.runner_config()
    budget = Budget.for_run(cfg, plan.n_points)
    for outcome in run_points(plan.points, cfg, cancel=cancel, progress=progress, total=plan.n_points, budget=budget):
        plan.outcomes.append(outcome)
        for metric in outcome.metrics:
            add(metric)
    keep_budget(budget, cfg, [result], sink, [run_id])
    if plan.finish is not None:
        finished = (
            plan.finish(plan.outcomes, progress=progress)
            if plan.finish_reports_progress
            else plan.finish(plan.outcomes)
        )
        for metric in finished:
            add(metric)
    if plan.markers:  # the plan's own (every rank's collectives), beside the recorder's phases
        result.markers.extend(plan.markers)
        if sink is not None and hasattr(sink, "add_markers"):
            sink.add_markers(run_id, plan.markers)


def keep_budget(budget: Budget | None, cfg, results: list[RunResult], sink, run_ids: list) -> None:
    """A run under a time budget says what the budget did: in its settings (runner.budget) and,
    when points were cut short, in one line added to its notes (saved, and printed by the CLI)."""
    if budget is None:
        return
    record = budget.record()
    line = budget_line(record, cfg.min_reps)
    for result, run_id in zip(results, run_ids, strict=True):
        result.settings.setdefault("runner", {})["budget"] = record
        if line:
            result.notes = f"{result.notes}\n{line}".strip()
            if sink is not None and run_id is not None and hasattr(sink, "set_notes"):
                sink.set_notes(run_id, result.notes)


def _finish(sink, run_id, result: RunResult, status: str, error: str | None) -> None:
    result.status, result.error = status, error
    result.quality = worst(m.quality for m in result.metrics if m.status == "ok")
    if sink is not None:
        sink.finish_run(run_id, status, error)


def _measure_and_close(
    plan: SuitePlan, opts: BenchOptions, result: RunResult, sink, run_id, cancel, progress, recorder, on_metric
) -> None:
    try:
        with _recording(recorder, result, sink, run_id):
            _measure(plan, opts, result, sink, run_id, cancel, progress, on_metric)
    except (Cancelled, KeyboardInterrupt) as e:
        _finish(sink, run_id, result, "aborted", "cancelled by the user")
        raise Cancelled("benchmark cancelled; the points measured so far are saved") from e
    except Exception as e:  # close the run with the reason before the error reaches the user
        _finish(sink, run_id, result, "failed", f"{type(e).__name__}: {e}")
        raise
    _finish(sink, run_id, result, *_status(plan.outcomes))


def run_suite(
    suite: str,
    opts: BenchOptions,
    sink: RunSink | None = None,
    *,
    name: str = "",
    tags: tuple[str, ...] | list[str] = (),
    notes: str = "",
    params: Any = None,
    cancel: threading.Event | None = None,
    progress: ProgressFn | None = None,
    model: Any = None,
    recorder: Any = None,
    on_metric: Callable[[Metric], None] | None = None,
) -> tuple[Any, RunResult]:
    """Runs ``suite``; returns (run id or None, the RunResult). Cancellation (the event or Ctrl-C)
    closes the run as "aborted" with what was measured so far, then propagates. ``model``: an
    already loaded model for the suites that need one (the GUI's, or a test's). ``recorder``: an
    engine.telemetry Recorder whose series and phase markers are saved with the run. ``on_metric``
    sees each metric as soon as it is measured (a live chart)."""
    module = get_suite(suite)
    _apply_threads(opts)
    needs_model = getattr(module, "NEEDS_MODEL", False)
    plan = module.plan(opts, params, model=model) if needs_model else module.plan(opts, params)
    try:
        result = _new_result(suite, opts, plan, name, tags, notes)
        run_id = sink.begin_run(result) if sink is not None else None
        _measure_and_close(plan, opts, result, sink, run_id, cancel, progress, recorder, on_metric)
        return run_id, result
    finally:
        if plan.close is not None:
            plan.close()
