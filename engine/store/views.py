"""Plain-text views of saved runs for the CLI: the run list and one run in detail."""
from __future__ import annotations

from typing import Any, Sequence

from engine.bench.stats import PERCENTILE_METHOD, summarize
from engine.store.convert import RunInfo, StoredRun
from engine.store.render import align_columns, fmt_value


def _duration(info: RunInfo) -> str:
    d = info.duration_s
    if d is None:
        return ""
    return f"{d:.1f} s" if d < 120 else f"{d / 60:.1f} min"


def list_text(runs: Sequence[RunInfo]) -> str:
    if not runs:
        return "no saved runs\n"
    lines = [["id", "name", "kind", "status", "created (UTC)", "duration", "metrics", "tags"]]
    for r in runs:
        lines.append([str(r.id), r.name, r.kind, r.status, f"{r.created_at:%Y-%m-%d %H:%M:%S}",
                      _duration(r), str(r.metric_count), ", ".join(r.tags)])
    return "\n".join(align_columns(lines)) + "\n"


def list_dicts(runs: Sequence[RunInfo]) -> list[dict[str, Any]]:
    return [{"id": r.id, "name": r.name, "kind": r.kind, "status": r.status, "tags": list(r.tags),
             "created_at": r.created_at.isoformat(),
             "finished_at": r.finished_at.isoformat() if r.finished_at else None,
             "metric_count": r.metric_count, "error": r.error, "notes": r.notes} for r in runs]


def _metric_lines(run: StoredRun) -> list[list[str]]:
    lines = [["metric", "unit", "n", "median", "95% CI", "p5", "p95", "p99", "IQR/median", "status"]]
    for m in run.result.metrics:
        s = summarize(m.samples)
        label = m.name + (f" [{', '.join(f'{k}={v}' for k, v in sorted(m.params.items()))}]" if m.params else "")
        if m.status != "ok" or s.n == 0:
            lines.append([label, m.unit, str(s.n), "", "", "", "", "", "", f"failed: {m.error or 'no samples'}"])
            continue
        lines.append([label, m.unit, str(s.n), fmt_value(s.median),
                      f"{fmt_value(s.ci_low)} … {fmt_value(s.ci_high)}", fmt_value(s.p5), fmt_value(s.p95),
                      fmt_value(s.p99), f"{s.noise_pct:.1f}%" + (" noisy" if s.noisy else ""), "ok"])
    return lines


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
    out = [f"run #{info.id} {info.name}", f"  kind: {info.kind}", f"  status: {info.status}"
           + (f" ({info.error})" if info.error else ""),
           f"  created: {info.created_at:%Y-%m-%d %H:%M:%S} UTC" + (f", took {_duration(info)}" if info.finished_at else "")]
    if info.tags:
        out.append(f"  tags: {', '.join(info.tags)}")
    if info.notes:
        out.append(f"  notes: {info.notes}")
    out += [""] + (align_columns(_metric_lines(run)) if result.metrics else ["no metrics"])
    out += ["", f"(percentiles: numpy '{PERCENTILE_METHOD}'; CI of the median by order statistics)", ""]
    out += _flat_lines("settings", result.settings) + _flat_lines("fingerprint", result.fingerprint)
    extras = [f"{len(result.telemetry)} telemetry series", f"{len(result.markers)} phase markers"]
    if result.trace_summary:
        extras.append("a trace summary")
    out += ["", "attached: " + ", ".join(extras)]
    return "\n".join(out) + "\n"
