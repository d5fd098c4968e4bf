"""Between the ORM rows and engine.results' dataclasses, and to the export formats."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from opscope.engine.core import json_output
from opscope.engine.core.results import Marker, Metric, RunResult, TelemetrySeries
from opscope.engine.store.schema import MarkerRow, MetricRow, RunRow, TelemetryRow

EXPORT_FORMAT = "opscope-run/1"


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A saved run's identity and state, without its data (what `runs list` shows)."""

    id: int
    name: str
    kind: str
    status: str
    tags: tuple[str, ...]
    notes: str
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    metric_count: int
    quality: str | None = None  # "ok" | "noisy" | "disturbed"; None: unknown (older runs, no samples)

    @property
    def duration_s(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.created_at).total_seconds()


@dataclass(frozen=True, slots=True)
class StoredRun:
    info: RunInfo
    result: RunResult


def run_info(row: RunRow, metric_count: int | None = None) -> RunInfo:
    return RunInfo(
        id=row.id,
        name=row.name,
        kind=row.kind,
        status=row.status,
        tags=tuple(t.tag for t in row.tags),
        notes=row.notes or "",
        created_at=row.created_at,
        finished_at=row.finished_at,
        error=row.error,
        metric_count=len(row.metrics) if metric_count is None else metric_count,
        quality=row.quality,
    )


def metric_row(metric: Metric, position: int) -> MetricRow:
    return MetricRow(
        position=position,
        name=metric.name,
        unit=metric.unit,
        higher_is_better=bool(metric.higher_is_better),
        params=dict(metric.params),
        status=metric.status,
        error=metric.error,
        samples=[float(v) for v in metric.samples],
        quality=metric.quality,
        load=metric.load,
    )


def telemetry_row(series: TelemetrySeries) -> TelemetryRow:
    return TelemetryRow(
        name=series.name, unit=series.unit, t_ns=[int(t) for t in series.t_ns], values=[float(v) for v in series.values]
    )


def marker_row(marker: Any) -> MarkerRow:
    # engine.results.Marker or engine.markers.Marker: both have phase, edge, t_ns, attrs.
    return MarkerRow(phase=marker.phase, edge=marker.edge, t_ns=int(marker.t_ns), attrs=dict(marker.attrs or {}))


def merged_telemetry(rows: list[TelemetryRow]) -> list[TelemetrySeries]:
    """Chunks of one series (a recorder flushes as it goes) joined back, in the order written."""
    series: dict[tuple[str, str], TelemetrySeries] = {}
    for t in rows:
        s = series.setdefault((t.name, t.unit), TelemetrySeries(name=t.name, unit=t.unit))
        s.t_ns.extend(t.t_ns)
        s.values.extend(t.values)
    return list(series.values())


def run_result(row: RunRow) -> RunResult:
    return RunResult(
        kind=row.kind,
        name=row.name,
        tags=[t.tag for t in row.tags],
        notes=row.notes or "",
        settings=row.settings or {},
        fingerprint=row.fingerprint or {},
        metrics=[
            Metric(
                name=m.name,
                unit=m.unit,
                samples=list(m.samples),
                higher_is_better=m.higher_is_better,
                params=m.params or {},
                status=m.status,
                error=m.error,
                quality=m.quality,
                load=m.load,
            )
            for m in row.metrics
        ],
        telemetry=merged_telemetry(row.telemetry),
        markers=[Marker(phase=m.phase, edge=m.edge, t_ns=m.t_ns, attrs=m.attrs or {}) for m in row.markers],
        trace_summary=row.trace_summary,
        status=row.status,
        error=row.error,
        quality=row.quality,
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def export_dict(stored: StoredRun) -> dict:
    """Everything about a run, JSON-able, with each metric's summary next to its raw samples."""
    from opscope.engine.bench.measure.stats import summarize

    info, result = stored.info, stored.result
    return {
        "format": EXPORT_FORMAT,
        "id": info.id,
        "name": info.name,
        "kind": info.kind,
        "status": info.status,
        "quality": info.quality,
        "error": info.error,
        "tags": list(info.tags),
        "notes": info.notes,
        "created_at": _iso(info.created_at),
        "finished_at": _iso(info.finished_at),
        "settings": result.settings,
        "fingerprint": result.fingerprint,
        "metrics": [
            {
                "name": m.name,
                "unit": m.unit,
                "higher_is_better": m.higher_is_better,
                "params": m.params,
                "status": m.status,
                "error": m.error,
                "samples": m.samples,
                "quality": m.quality,
                "load": m.load,
                "summary": summarize(m.samples).as_dict(),
            }
            for m in result.metrics
        ],
        "telemetry": [{"name": t.name, "unit": t.unit, "t_ns": t.t_ns, "values": t.values} for t in result.telemetry],
        "markers": [{"phase": m.phase, "edge": m.edge, "t_ns": m.t_ns, "attrs": m.attrs} for m in result.markers],
        "trace_summary": result.trace_summary,
    }


def export_json(stored: StoredRun) -> str:
    return json_output.dumps(export_dict(stored), indent=2, default=str)


def export_csv(stored: StoredRun) -> str:
    """One row per raw sample: what a spreadsheet or pandas wants."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["run_id", "run_name", "metric", "unit", "params", "status", "repetition", "value"])
    for m in stored.result.metrics:
        params = json.dumps(m.params, sort_keys=True, default=str)
        if not m.samples:
            writer.writerow([stored.info.id, stored.info.name, m.name, m.unit, params, m.status, "", ""])
        for i, value in enumerate(m.samples):
            writer.writerow([stored.info.id, stored.info.name, m.name, m.unit, params, m.status, i, repr(value)])
    return out.getvalue()
