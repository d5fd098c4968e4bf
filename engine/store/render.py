"""A Comparison as text (aligned, benchstat-like), markdown, CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from opscope.engine.bench.measure.memory import SHARED_AB
from opscope.engine.bench.measure.stats import NOISE_THRESHOLD_PCT, PERCENTILE_METHOD
from opscope.engine.core import json_output
from opscope.engine.core.units import BYTE_UNITS, format_bytes
from opscope.engine.store.compare import MIN_SAMPLES, Cell, Comparison, Delta, Row, Section

FORMATS = ("text", "markdown", "csv", "json")
FEW_MARK, NOISY_MARK, DISTURBED_MARK = "¹", "²", "³"


def fmt_value(v: float | None) -> str:
    """About four significant digits, never scientific notation for benchmark-sized numbers."""
    if v is None or not math.isfinite(v):
        return "—" if v is None else str(v)
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    if a >= 1:
        return f"{v:.3f}"
    return f"{v:.4g}"


def _ci_text(pct: float) -> str:
    if not math.isfinite(pct):
        return "± ?"
    return f"± {pct:.1f}%" if pct < 1 else f"± {pct:.0f}%"


def fmt_unit_value(v: float | None, unit: str) -> str:
    """A value of ``unit`` for reading: bytes in binary units (``683.2 MiB``), others as fmt_value."""
    return format_bytes(v) if unit in BYTE_UNITS else fmt_value(v)


def cell_text(cell: Cell, unit: str = "") -> str:
    if cell.status == "missing":
        return "—"
    if not cell.usable or cell.summary is None:
        return "invalid" if (cell.error or "").startswith("invalid") else "failed"
    marks = (
        (FEW_MARK if cell.few_samples else "")
        + (NOISY_MARK if cell.noisy else "")
        + (DISTURBED_MARK if cell.disturbed else "")
    )
    return f"{fmt_unit_value(cell.summary.median, unit)} {_ci_text(cell.summary.ci_halfwidth_pct)}{marks}"


def delta_text(delta: Delta | None) -> str:
    if delta is None:
        return ""
    if not delta.decidable:  # "~" would claim "no change"; these counts could not have shown one
        return (
            f"{delta.delta_pct:+.2f}%? n too small to decide (need ≥ {delta.need_per_side} per side, "
            f"n={delta.n_base}+{delta.n_other})"
        )
    n = f"p={delta.p_value:.3f} n={delta.n_base}+{delta.n_other}"
    return f"{delta.delta_pct:+.2f}% ({n})" if delta.significant else f"~ ({n})"


def disturbed_text(cmp: Comparison, row: Row, i: int, delta: Delta | None) -> str:
    """ " disturbed: NAME" on a change whose either side was measured under foreign load."""
    names = [run_header(cmp.runs[j]) for j in row.disturbed_pair(i)]
    return f"{' ' if delta is not None else ''}disturbed: {', '.join(names)}" if names else ""


def _direction(section: Section) -> str:
    ups = {r.higher_is_better for r in section.rows}
    if len(ups) != 1:
        return section.unit
    return f"{section.unit} ({'higher' if ups.pop() else 'lower'} is better)"


MAX_HEADER_CHARS = 24  # longer run names (auto names carry a timestamp) show as #id; the legend maps them


def run_header(run) -> str:
    return run.name if len(run.name) <= MAX_HEADER_CHARS else f"#{run.id}"


def _section_lines(cmp: Comparison, section: Section) -> list[list[str]]:
    base = run_header(cmp.runs[0])
    header = [_direction(section), base]
    sub = [""] + ["median ± CI"]
    for run in cmp.runs[1:]:
        header += [run_header(run), ""]
        sub += ["median ± CI", f"vs {base}"]
    lines = [header, sub]
    for row in section.rows:
        line = [row.label, cell_text(row.cells[0], row.unit)]
        for i, (cell, delta) in enumerate(zip(row.cells[1:], row.deltas), start=1):
            line += [cell_text(cell, row.unit), delta_text(delta) + disturbed_text(cmp, row, i, delta)]
        lines.append(line)
    if section.geomeans is not None:
        line = ["geomean", fmt_unit_value(section.geomeans[0], section.unit)]
        for g, d in zip(section.geomeans[1:], section.geomean_deltas_pct or ()):
            line += [fmt_unit_value(g, section.unit), f"{d:+.2f}%"]
        lines.append(line)
    return lines


def align_columns(lines: list[list[str]]) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]


def _diff_lines(cmp: Comparison) -> list[list[str]]:
    lines = [["what differs"] + [run_header(r) for r in cmp.runs]]
    for key, values in cmp.differences:
        lines.append([key] + [_setting_text(key, v) for v in values])
    return lines


def _setting_text(key: str, value) -> str:
    """A differing setting's value; a byte count in binary units ("388.7 MiB"), as everywhere else."""
    if value is None:
        return "—"
    named_bytes = "bytes" in key.rsplit(".", 1)[-1].split("_")  # rss_bytes, weights_bytes_per_decode_step
    if named_bytes and isinstance(value, (int, float)) and not isinstance(value, bool):
        from opscope.engine.core.units import format_bytes

        return format_bytes(value)
    return str(value)


def footnotes(cmp: Comparison) -> list[str]:
    notes = [
        f"median ± half-width of its {cmp.confidence:.0%} CI (order statistics; bootstrap below 6 samples); "
        f"change vs {cmp.runs[0].name!r}, two-sided Mann-Whitney U p-value; "
        f"~ = no significant difference (p > {cmp.alpha:g})"
    ]
    if cmp.has_undecidable:
        notes.append(
            f"n too small to decide: with n vs m samples the smallest p Mann-Whitney can give is "
            f"2 / C(n+m, n) (3+3: 0.1); at alpha {cmp.alpha:g} it takes at least "
            f"{cmp.min_samples_per_side} per side; rerun with --repeat 5 or more"
        )
    if cmp.has_few_samples:
        notes.append(f"{FEW_MARK} fewer than {MIN_SAMPLES} samples: wide CI, small changes cannot show as significant")
    if cmp.has_noisy:  # the legend in the marks' order: ¹ ² ³
        notes.append(
            f"{NOISY_MARK} noisy: IQR/median > {NOISE_THRESHOLD_PCT:g}% (percentiles: numpy "
            f"'{PERCENTILE_METHOD}'); rerun on a quieter machine or with more repetitions"
        )
    if cmp.has_disturbed:
        notes.append(
            f"{DISTURBED_MARK} disturbed: other processes held the CPU or GPU while these samples were "
            f"taken (engine.bench.quality); the machine's speed, not the change, may explain a difference"
        )
    if cmp.measurement == "interleaved":
        notes.append(
            f"interleaved: {cmp.runs[0].name!r} and {cmp.runs[1].name!r} were measured in one process, "
            f"their repetitions alternating ABBA (opscope bench --ab): the machine's drift fell on "
            f"both alike"
        )
    if any(r.params.get("memory") == SHARED_AB for sec in cmp.sections for r in sec.rows):
        notes.append(
            f"memory={SHARED_AB}: A and B ran in one process, so each peak memory row is that process's "
            f"peak, both sides' models and buffers together: the same for A and B, not per side; run a "
            f"side alone (without --ab) for its own peak"
        )
    return notes + [f"warning: {n}" for n in cmp.notes]


def _run_legend(cmp: Comparison) -> list[str]:
    return [
        f"#{r.id} {r.name}: {r.kind}, {r.status}, quality {r.quality or 'unknown'}, "
        f"{r.created_at:%Y-%m-%d %H:%M} UTC" + (f", tags {', '.join(r.tags)}" if r.tags else "")
        for r in cmp.runs
    ]


def to_text(cmp: Comparison) -> str:
    out = _run_legend(cmp) + [""]
    # what changed between the runs first: it is what the reader needs to interpret the numbers
    if cmp.differences:
        out += align_columns(_diff_lines(cmp)) + [""]
    else:
        out += ["settings and fingerprint: identical", ""]
    for section in cmp.sections:
        out += align_columns(_section_lines(cmp, section)) + [""]
    return "\n".join(out + footnotes(cmp)) + "\n"


def _md_table(lines: list[list[str]]) -> list[str]:
    esc = [[c.replace("|", "\\|") for c in line] for line in lines]
    return ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(esc[0])] + [
        "| " + " | ".join(line) + " |" for line in esc[1:]
    ]


def to_markdown(cmp: Comparison) -> str:
    out = [f"- {line}" for line in _run_legend(cmp)] + [""]
    if cmp.differences:
        out += _md_table(_diff_lines(cmp)) + [""]
    for section in cmp.sections:
        lines = _section_lines(cmp, section)
        # one header row: the run names, and "vs <baseline>" over the change columns
        header = [h or s for h, s in zip(lines[0], lines[1])]
        out += _md_table([header] + lines[2:]) + [""]
    return "\n".join(out + [f"{n}  " for n in footnotes(cmp)]) + "\n"


def _summary_dict(cell: Cell) -> dict[str, Any] | None:
    return None if cell.summary is None else cell.summary.as_dict()


def _row_dict(cmp: Comparison, row: Row) -> dict[str, Any]:
    return {
        "name": row.name,
        "unit": row.unit,
        "params": row.params,
        "higher_is_better": row.higher_is_better,
        "cells": [
            {
                "run_id": run.id,
                "status": c.status,
                "error": c.error,
                "few_samples": c.few_samples,
                "noisy": c.noisy,
                "quality": c.quality,
                "summary": _summary_dict(c),
            }
            for run, c in zip(cmp.runs, row.cells)
        ],
        "deltas": [
            None
            if d is None
            else {
                "run_id": run.id,
                "delta_pct": d.delta_pct,
                "p_value": d.p_value,
                "significant": d.significant,
                "worse": d.worse,
                "decidable": d.decidable,
                "min_p_value": d.min_p,
                "need_per_side": d.need_per_side,
            }
            for run, d in zip(cmp.runs[1:], row.deltas)
        ],
    }


def to_dict(cmp: Comparison) -> dict[str, Any]:
    return {
        "runs": [
            {
                "id": r.id,
                "name": r.name,
                "kind": r.kind,
                "status": r.status,
                "quality": r.quality,
                "created_at": r.created_at.isoformat(),
                "tags": list(r.tags),
            }
            for r in cmp.runs
        ],
        "alpha": cmp.alpha,
        "confidence": cmp.confidence,
        "percentile_method": PERCENTILE_METHOD,
        "sections": [
            {
                "unit": s.unit,
                "rows": [_row_dict(cmp, r) for r in s.rows],
                "geomeans": s.geomeans,
                "geomean_deltas_pct": s.geomean_deltas_pct,
            }
            for s in cmp.sections
        ],
        "differences": [{"field": k, "values": list(v)} for k, v in cmp.differences],
        "notes": list(cmp.notes),
        "measurement": cmp.measurement,
    }


def to_json(cmp: Comparison) -> str:
    return json_output.dumps(to_dict(cmp), indent=2, default=str) + "\n"


def to_csv(cmp: Comparison) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(
        [
            "metric",
            "unit",
            "params",
            "run_id",
            "run_name",
            "status",
            "n",
            "median",
            "ci_low",
            "ci_high",
            "delta_pct",
            "p_value",
            "significant",
            "decidable",
            "few_samples",
            "noisy",
            "quality",
        ]
    )
    for section in cmp.sections:
        for row in section.rows:
            params = json.dumps(row.params, sort_keys=True, default=str)
            for i, (run, cell) in enumerate(zip(cmp.runs, row.cells)):
                s, d = cell.summary, row.deltas[i - 1] if i else None
                w.writerow(
                    [
                        row.name,
                        row.unit,
                        params,
                        run.id,
                        run.name,
                        cell.status,
                        s.n if s else 0,
                        s.median if s else "",
                        s.ci_low if s else "",
                        s.ci_high if s else "",
                        d.delta_pct if d else "",
                        d.p_value if d else "",
                        d.significant if d else "",
                        d.decidable if d else "",
                        cell.few_samples,
                        cell.noisy,
                        cell.quality or "",
                    ]
                )
    return out.getvalue()


def render(cmp: Comparison, fmt: str = "text") -> str:
    renderers = {"text": to_text, "markdown": to_markdown, "csv": to_csv, "json": to_json}
    return renderers[fmt](cmp)
