"""The worker's benchmark job: run a suite through engine.bench.session.run_suite, saving every
point to the run store as it is measured, and stream progress and finished points to the GUI."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
import typing
from typing import Any

from opscope.app.worker.protocol import BenchRequest, LoadRequest
from opscope.engine import build_params, param_doc

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 0.1  # the runner reports fractional progress often; the GUI needs ~10 Hz


def suite_catalog() -> list[dict]:
    """Every suite with its description and parameters (name, kind, default, quick value, and the
    suite's label with unit, unit and help for each)."""
    from opscope.engine import SUITES, get_suite

    out = []
    for name in SUITES:
        try:
            module = get_suite(name)
        except Exception as e:  # a suite that cannot import is listed with the reason
            out.append({"name": name, "description": f"unavailable: {e}", "params": [], "needs_model": False})
            continue
        quick = getattr(module, "QUICK", None)
        out.append(
            {
                "name": name,
                "description": getattr(module, "DESCRIPTION", ""),
                "needs_model": bool(getattr(module, "NEEDS_MODEL", False)),
                "params": _param_fields(module.Params, quick),
            }
        )
    return out


def _param_fields(params_cls, quick) -> list[dict]:
    hints = typing.get_type_hints(params_cls)
    fields = []
    for f in dataclasses.fields(params_cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        doc = param_doc(f)  # the suite's own description of the field: the form's label and tooltip
        fields.append(
            {
                "name": f.name,
                "kind": _kind(hints.get(f.name), default),
                "default": _plain(default),
                "quick": _plain(getattr(quick, f.name, default)),
                "label": doc.text,
                "unit": doc.unit,
                "help": doc.help,
            }
        )
    return fields


def _kind(hint, default) -> str:
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, tuple):
        inner = {type(v) for v in default}
        return "tuple_int" if inner <= {int} and default else "tuple_str" if inner <= {str} else "json"
    for t, kind in ((int, "int"), (float, "float"), (str, "str")):
        if isinstance(default, t):
            return kind
    return "json"


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


class _ProgressSink:
    """The run store, plus a message to the GUI for every point as it is saved, plus the run's
    telemetry window and phase markers saved just before the run is closed."""

    def __init__(self, store, send, recorder=None) -> None:
        self.store, self.send, self.recorder = store, send, recorder

    def begin_run(self, result):
        run_id = self.store.begin_run(result)
        self.send("progress", run_id=run_id, name=result.name, done=0, total=None, eta_s=None)
        return run_id

    def add_metric(self, run_id, metric) -> None:
        self.store.add_metric(run_id, metric)
        self.send(
            "progress",
            point={
                "name": metric.name,
                "unit": metric.unit,
                "samples": list(metric.samples),
                "params": dict(metric.params),
                "status": metric.status,
                "error": metric.error,
                "higher_is_better": metric.higher_is_better,
            },
        )

    def add_markers(self, run_id, markers) -> None:
        """A suite's own markers (every rank's collectives), saved as `opscope bench` saves them."""
        self.store.add_markers(run_id, list(markers))

    def finish_run(self, run_id, status: str, error: str | None = None) -> None:
        if self.recorder is not None:
            self.recorder.stop()
            try:
                self.store.add_telemetry(run_id, _finite(self.recorder.telemetry()))
                self.store.add_markers(run_id, list(self.recorder.markers))
            except Exception as e:  # telemetry is a bonus; the measured points must still be closed
                log.warning("could not save telemetry of run %s: %s", run_id, e)
        self.store.finish_run(run_id, status, error)


def _finite(series: list) -> list:
    """Series without their N/A samples (NaN is not JSON; a field a device never reports is dropped)."""
    out = []
    for s in series:
        keep = [(t, v) for t, v in zip(s.t_ns, s.values) if math.isfinite(v)]
        if keep:
            s.t_ns, s.values = [t for t, _ in keep], [v for _, v in keep]
            out.append(s)
    return out


def _throttled_progress(send):
    last = [0.0]

    def progress(done: float, total: int, eta_s: float | None) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL_S or done >= total:
            last[0] = now
            send("progress", done=done, total=total, eta_s=eta_s)

    return progress


def run_bench(loaded, spec: LoadRequest | None, req: BenchRequest, send, cancel: threading.Event) -> dict:
    from opscope.engine import BenchOptions, RunStore, get_suite, run_suite

    module = get_suite(req.suite)
    spec = spec or LoadRequest()
    opts = BenchOptions(
        device=spec.device,
        dtype=spec.dtype,
        quick=req.quick,
        model=spec.model,
        backend=spec.backend,
        threads=spec.threads,
        attention=spec.attention,
    )
    params = build_params(module, req.params, req.quick)
    if req.ab is not None:
        return run_bench_ab(opts, params, req, send, cancel)
    # The loaded model is reused when the suite drives one: no second copy in memory.
    model = loaded if getattr(module, "NEEDS_MODEL", False) and hasattr(loaded, "model") else None
    sampler, recorder = _telemetry()
    try:
        with RunStore.open(req.db_url) as store:
            sink = _ProgressSink(store, send, recorder)
            run_id, result = run_suite(
                req.suite,
                opts,
                sink,
                name=req.name,
                tags=req.tags,
                params=params,
                cancel=cancel,
                progress=_throttled_progress(send),
                model=model,
            )
            name = store.info(run_id).name
    finally:
        if sampler is not None:
            sampler.stop()
    return {
        "run_id": run_id,
        "name": name,
        "status": result.status,
        "error": result.error,
        "metrics": len(result.metrics),
    }


class _ABSink:
    """Both runs of an A/B pair: the plain sink, each point message tagged with its side ("a" or "b")."""

    def __init__(self, store, send) -> None:
        self.send = send
        self.plain = _ProgressSink(store, self._tagged)
        self.sides: dict = {}  # run id -> "a" | "b", in the order the pair's runs begin
        self._side: str | None = None  # the side of the metric being saved now

    def _tagged(self, kind: str, **msg) -> None:
        if "point" in msg:
            msg["point"] = dict(msg["point"], ab=self._side)
        self.send(kind, **msg)

    def begin_run(self, result):
        run_id = self.plain.begin_run(result)
        self.sides[run_id] = "ab"[len(self.sides)]
        return run_id

    def add_metric(self, run_id, metric) -> None:
        self._side = self.sides.get(run_id)
        self.plain.add_metric(run_id, metric)

    def add_markers(self, run_id, markers) -> None:
        self.plain.add_markers(run_id, markers)

    def finish_run(self, run_id, status: str, error: str | None = None) -> None:
        self.plain.finish_run(run_id, status, error)


def run_bench_ab(opts, params, req: BenchRequest, send, cancel: threading.Event) -> dict:
    """`opscope bench SUITE --ab FLAGS` for the GUI: both sides interleaved (engine.bench.ab), two
    runs saved, and B against A as `opscope runs compare` prints it."""
    from opscope.engine import RunStore, Side, ab_side, compare, override_cli_params, pair_names, run_ab
    from opscope.engine import render_comparison as render

    b_opts, b_pairs = ab_side(opts, req.suite, req.ab or "")
    names = pair_names(req.name, req.suite)
    sides = (Side(opts, params, names[0]), Side(b_opts, override_cli_params(params, b_pairs), names[1], req.ab or ""))
    with RunStore.open(req.db_url) as store:
        runs = run_ab(
            req.suite, sides, _ABSink(store, send), tags=req.tags, cancel=cancel, progress=_throttled_progress(send)
        )
        comparison = render(compare([store.load(run_id) for run_id, _ in runs]), "text")
    (a_id, a), (b_id, b) = runs
    status = "completed" if a.status == b.status == "completed" else "failed"
    return {
        "run_id": b_id,
        "run_ids": [a_id, b_id],
        "name": f"{a.name} / {b.name}",
        "status": status,
        "error": a.error or b.error,
        "metrics": len(a.metrics) + len(b.metrics),
        "comparison": comparison,
    }


def _telemetry():
    """A sampler in this process (host, GPUs and this process's allocators) and a recorder over
    the run; (None, None) if telemetry cannot start, which never stops a benchmark."""
    try:
        from opscope.engine import Recorder, Sampler

        sampler = Sampler(interval_ms=100, history_s=4 * 3600).start()
        return sampler, Recorder(sampler).start()
    except Exception as e:
        log.warning("benchmark telemetry unavailable: %s", e)
        return None, None
