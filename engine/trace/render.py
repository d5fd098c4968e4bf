"""The placement report as plain text, for the terminal and the Trace panel's summary."""

from __future__ import annotations

from opscope.engine.core.units import count_rate, format_bytes
from opscope.engine.trace.report import GroupRow, PlacementReport

MAX_ROWS = 12


def fmt_bytes(n: float) -> str:
    return format_bytes(n, digits=3)


def render_text(report: PlacementReport, title: str = "") -> str:
    lines = _header(report, title) + _io(report) + _findings(report)
    lines += _groups("Fallbacks by module and source line", report.fallbacks)
    lines += _groups("Transfers, syncs and mixed ops by module and source line", report.off_target_groups)
    if report.unit != "token":
        lines = [line.replace("/token", f"/{report.unit}") for line in lines]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


def _header(r: PlacementReport, title: str) -> list[str]:
    head = f"Placement report{' — ' + title if title else ''}: target {r.target}"
    stored = f"{r.stored_events:,} stored" + (f", {r.dropped_events:,} past the cap" if r.dropped_events else "")
    kinds = "  ".join(f"{k} {v['count']:,} ({v['pct']:.1f}%, {v['ms']:.1f} ms)" for k, v in r.by_kind.items())
    steps = (
        f"{r.tokens} tokens generated ({r.decode_steps} decode steps)"
        if r.unit == "token"
        else f"{r.tokens} {r.unit}s ({r.decode_steps} after the first, which includes setup)"
        if r.tokens > 1
        else f"{r.tokens} {r.unit}s (the whole run is one {r.unit})"
        if r.tokens == 0
        else f"1 {r.unit}"
    )
    return [
        head,
        f"  {steps}, {r.ops:,} ops ({stored})",
        f"  on target: {r.ops_on_target_pct:.1f}% of ops, {r.time_on_target_pct:.1f}% of op time ({r.time_basis} time)",
        f"  ops by kind: {kinds}",
    ]


def _io(r: PlacementReport) -> list[str]:
    u = r.unit
    lines = ["", "Per decode step (mean):" if u == "token" else f"Per {u} (mean over the {u}s after the first):"]
    if not r.transfers:
        lines.append("  transfers: none")
    for t in r.transfers:
        mem = f", host side pinned {t.pinned} / pageable {t.pageable}" if t.pinned or t.pageable else ""
        lines.append(
            f"  {t.direction}: {count_rate(t.per_token_count)} per {u} ({fmt_bytes(t.per_token_bytes)}/{u}); "
            f"{t.count:,} in all ({fmt_bytes(t.bytes)}){mem}"
        )
    lines.append(f"  syncs (host waits for a value): {count_rate(r.syncs_per_token)} per {u}; {r.syncs:,} in all")
    lines += [f"  needed, accepted: {e}" for e in r.expected]
    return lines


def _findings(r: PlacementReport) -> list[str]:
    if r.clean and r.unit == "token":
        return [
            "",
            f"Findings: none: every compute op ran on {r.target}, and each decode step moved only "
            "what a correct engine needs (at most the input id in and the sampled id out).",
        ]
    if r.clean:
        ops = "every compute op after the setup" if r.fallbacks else "every compute op"
        return [
            "",
            f"Findings: none: {ops} ran on {r.target}, each {r.unit} moved only its input "
            "batch in and at most one value out, and no training-health check failed.",
        ]
    lines = ["", f"Findings ({len(r.findings)}):"]
    for i, f in enumerate(r.findings, 1):
        ev = f.evidence
        lines.append(f" {i}. [{f.kind}, {f.severity}] {f.title}")
        if "count" not in ev:  # a training-health finding: its evidence is a few lines of its own
            lines += [f"      {line}" for line in ev.get("lines", [])[:6]]
            lines.append(f"    fix: {f.fix}")
            continue
        lines.append(
            f"    evidence: {ev['count']:,} ops ({count_rate(ev['count_per_token'])}/{r.unit}), "
            f"{ev['host_ms']:.2f} ms host time, {fmt_bytes(ev['bytes'])} moved, "
            f"{ev['modules']} module(s) e.g. {', '.join(m or '(outside)' for m in ev['module_examples'][:3])}"
        )
        lines += [f"      {line}" for line in ev["lines"][:6]]
        lines.append(f"    fix: {f.fix}")
    return lines


def _groups(title: str, rows: list[GroupRow]) -> list[str]:
    if not rows:
        return []
    lines = ["", f"{title}:", f"  {'kind':<13} {'module':<28} {'source':<36} {'count':>7} {'/token':>7} {'ms':>8}  ops"]
    for row in rows[:MAX_ROWS]:
        kind = f"{row.kind} {row.direction}".strip()
        ops = ", ".join(op.split(".")[1] for op in list(row.ops)[:3])
        lines.append(
            f"  {kind:<13} {_tail(row.module or '(outside)', 28):<28} {_tail(row.source or '?', 36):<36} "
            f"{row.count:>7,} {count_rate(row.per_token):>7} {row.host_ms:>8.2f}  {ops}"
        )
    if len(rows) > MAX_ROWS:
        lines.append(f"  ... and {len(rows) - MAX_ROWS} more (see --json)")
    return lines


def _tail(text: str, width: int) -> str:
    """Keep the end (the line number, the leaf module) when text is too wide."""
    return text if len(text) <= width else "…" + text[-(width - 1) :]
