"""Plain-text views of saved runs for the CLI: the run list and one run in detail."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opscope.engine.bench.ceilings.utilisation import PEAK_PARAMS, over_ceiling, unit_label
from opscope.engine.bench.measure.quality import DISTURBED, LEGEND, run_summary
from opscope.engine.bench.measure.stats import PERCENTILE_METHOD, summarize
from opscope.engine.core.units import display_scale
from opscope.engine.store.convert import RunInfo, StoredRun
from opscope.engine.store.render import align_columns, fmt_value


def _duration(info: RunInfo) -> str:
    d = info.duration_s
    if d is None:
        return ""
    return f"{d:.1f} s" if d < 120 else f"{d / 60:.1f} min"


def list_text(runs: Sequence[RunInfo]) -> str:
    if not runs:
        return "no saved runs\n"
    lines = [["id", "name", "kind", "status", "quality", "created (UTC)", "duration", "metrics", "tags"]]
    for r in runs:
        lines.append(
            [
                str(r.id),
                r.name,
                r.kind,
                r.status,
                r.quality or "—",
                f"{r.created_at:%Y-%m-%d %H:%M:%S}",
                _duration(r),
                str(r.metric_count),
                ", ".join(r.tags),
            ]
        )
    out = align_columns(lines)
    if any(r.quality for r in runs):
        out.append(LEGEND)
    return "\n".join(out) + "\n"


def list_dicts(runs: Sequence[RunInfo]) -> list[dict[str, Any]]:
    return [
        {
            "id": r.id,
            "name": r.name,
            "kind": r.kind,
            "status": r.status,
            "quality": r.quality,
            "tags": list(r.tags),
            "created_at": r.created_at.isoformat(),
            "finished_at": r.finished_at.isoformat() if r.finished_at else None,
            "metric_count": r.metric_count,
            "error": r.error,
            "notes": r.notes,
        }
        for r in runs
    ]


def _metric_lines(run: StoredRun) -> list[list[str]]:
    lines = [["metric", "unit", "n", "median", "95% CI", "p5", "p95", "p99", "IQR/median", "status", "quality"]]
    for m in run.result.metrics:
        s = summarize(m.samples)
        shown = {k: v for k, v in m.params.items() if k not in PEAK_PARAMS}  # the peak is in the unit
        label = m.name + (f" [{', '.join(f'{k}={v}' for k, v in sorted(shown.items()))}]" if shown else "")
        problem = over_ceiling(m) if m.status == "ok" else None
        if m.status != "ok" or s.n == 0 or problem:
            lines.append(
                [
                    label,
                    unit_label(m),
                    str(s.n),
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    problem or f"failed: {m.error or 'no samples'}",
                    "",
                ]
            )
            continue
        scale, unit = display_scale(m.unit, s.median)  # bytes in KiB/MiB/GiB; raw in exports
        unit = unit if scale != 1.0 else unit_label(m)
        v = [fmt_value(x / scale) for x in (s.median, s.ci_low, s.ci_high, s.p5, s.p95, s.p99)]
        lines.append(
            [
                label,
                unit,
                str(s.n),
                v[0],
                f"{v[1]} … {v[2]}",
                v[3],
                v[4],
                v[5],
                f"{s.noise_pct:.1f}%" + (" noisy" if s.noisy else ""),
                "ok",
                _quality_cell(m),
            ]
        )
    return lines


def _quality_cell(m) -> str:
    load = m.load or {}
    cores = [c for c in load.get("other_cores") or [] if c is not None]
    text = m.quality or "—"
    if m.quality == DISTURBED and cores:
        text += f" (others {max(cores):.2f} cores)"
    return text + (f", {load['rerun']} re-run" if load.get("rerun") else "")


def _flat_lines(title: str, data: dict[str, Any], prefix: str = "") -> list[str]:
    out = [f"{title}:"] if title else []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out += _flat_lines("", value, f"{prefix}{key}.")
        else:
            out.append(f"  {prefix}{key}: {value}")
    return out


def show_text(run: StoredRun) -> str:
    info, result = run.info, run.result
    out = [
        f"run #{info.id} {info.name}",
        f"  kind: {info.kind}",
        f"  status: {info.status}" + (f" ({info.error})" if info.error else ""),
        "  " + (run_summary(result.metrics, info.quality) if info.quality else "run quality: unknown"),
        f"  created: {info.created_at:%Y-%m-%d %H:%M:%S} UTC"
        + (f", took {_duration(info)}" if info.finished_at else ""),
    ]
    if info.tags:
        out.append(f"  tags: {', '.join(info.tags)}")
    if info.notes:
        out.append(f"  notes: {info.notes}")
    out += [""] + (align_columns(_metric_lines(run)) if result.metrics else ["no metrics"])
    out += ["", f"(percentiles: numpy '{PERCENTILE_METHOD}'; CI of the median by order statistics)", LEGEND, ""]
    out += _flat_lines("settings", result.settings) + _flat_lines("fingerprint", result.fingerprint)
    extras = [f"{len(result.telemetry)} telemetry series", f"{len(result.markers)} phase markers"]
    if result.trace_summary:
        extras.append("a trace summary")
    out += ["", "attached: " + ", ".join(extras)]
    return "\n".join(out) + "\n"
