"""One diagnosis as a run: the measurement with the telemetry sampler on, its findings, and the
RunResult of kind ``diagnosis`` that keeps them (saved by the caller: engine.trace.runs.save)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from opscope.engine.core.errors import ConfigError
from opscope.engine.core.results import Metric, RunResult
from opscope.engine.diagnose.measure import ModelPlan, Stages, measure_model, measure_script
from opscope.engine.diagnose.report import Diagnosis

log = logging.getLogger(__name__)

RUN_KIND = "diagnosis"
TELEMETRY_MS = 100.0


@contextmanager
def _telemetry(interval_ms: float | None) -> Iterator[object]:
    """The telemetry sampler and a recorder around the measurement (None: off)."""
    if not interval_ms:
        yield None
        return
    from opscope.engine.telemetry.recorder import Recorder
    from opscope.engine.telemetry.sampler import Sampler

    sampler = Sampler(interval_ms=interval_ms).start()
    try:
        with Recorder(sampler) as recorder:
            yield recorder
    finally:
        sampler.stop()


def _run(d: Diagnosis, settings: dict, recorder, times) -> RunResult:
    from opscope.engine.core import fingerprint

    run = RunResult(
        kind=RUN_KIND, settings=settings, fingerprint=fingerprint.collect(settings), trace_summary=d.summary()
    )
    run.started_at, run.finished_at = times
    for p in d.measurement.phases:
        if p.wall_ms and not d.measurement.simulated:
            run.metrics.append(
                Metric(
                    f"{p.name}_ms",
                    "ms",
                    [p.wall_ms],
                    higher_is_better=False,
                    params={"passes": p.passes, "tokens": p.tokens},
                )
            )
    if recorder is not None:
        recorder.attach(run)
    return run


def diagnose_model(
    lm,
    plan: ModelPlan,
    subject: str,
    telemetry_ms: float | None = TELEMETRY_MS,
    settings: dict | None = None,
    stages: Stages | None = None,
) -> tuple[Diagnosis, RunResult]:
    """Measure a loaded model and read the rules over it; returns the diagnosis and its run (not
    saved). ``stages`` (engine.diagnose.measure.Stages) tells each stage as it begins and cancels
    the measurement when its flag is set (Cancelled)."""
    if plan.tokens < 2 or plan.trace_tokens < 2:
        raise ConfigError("a diagnosis needs at least 2 decode tokens (prefill, then decode)")
    started = datetime.now(UTC)
    with _telemetry(telemetry_ms) as recorder:
        m = measure_model(lm, plan, subject, stages)
    d = Diagnosis.of(m)
    settings = dict(
        settings or {},
        subject=subject,
        target=m.target,
        variant=plan.variant,
        prompt_tokens=m.phases[0].tokens if m.phases else 0,
        tokens=plan.tokens,
    )
    return d, _run(d, settings, recorder, (started, datetime.now(UTC)))


def diagnose_script(spec, target: str, telemetry_ms: float | None = TELEMETRY_MS):
    """Measure a user's script (engine.trace.script.ScriptSpec); returns (diagnosis, run, exit code)."""
    started = datetime.now(UTC)
    with _telemetry(telemetry_ms) as recorder:
        m, trace, _report = measure_script(spec, target)
    d = Diagnosis.of(m)
    settings = {"subject": spec.label, "args": list(spec.args), "target": target}
    return d, _run(d, settings, recorder, (started, datetime.now(UTC))), trace.outcome.exit_code


def load_summaries(refs: list[str], db: str | None = None) -> list[tuple[str, dict]]:
    """(name, summary) of each saved diagnosis; a run of another kind is refused in one line."""
    from opscope.engine.store.access import open_store

    out = []
    with open_store(db) as store:  # reading creates no store
        for ref in refs:
            stored = store.load(ref)
            s = stored.result.trace_summary
            if stored.info.kind != RUN_KIND or not s or "findings" not in s:
                raise ConfigError(
                    f"run {ref} ({stored.info.name}) is a {stored.info.kind} run, not a saved "
                    f"diagnosis (`opscope runs list --kind {RUN_KIND}` lists those)"
                )
            out.append((stored.info.name, s))
    return out
