"""Console output of `opscope bench`: the progress bar and the summary table (rich)."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Literal

from opscope.engine.bench.ceilings.utilisation import over_ceiling, unit_label
from opscope.engine.bench.measure.quality import DISTURBED, LEGEND, run_summary
from opscope.engine.bench.measure.stats import summarize
from opscope.engine.core.results import Metric, RunResult
from opscope.engine.core.units import BYTE_UNITS, display_scale, format_rate, significant
from rich.markup import escape


def _fmt(v: float) -> str:
    return significant(v) if math.isfinite(v) else "—"


def _row(m: Metric) -> list[str]:
    problem = over_ceiling(m) if m.status == "ok" else None
    if m.status != "ok" or problem:
        why = problem or m.error or ""
        return [m.name, unit_label(m), "invalid" if why.startswith("invalid") else "failed", "", "", "", "", why]
    s = summarize(m.samples)
    scale, unit = display_scale(m.unit, s.median)
    ci = f"{_fmt(s.ci_low / scale)} – {_fmt(s.ci_high / scale)}" if s.n else ""
    note = f"noisy (IQR {s.noise_pct:.0f}%)" if s.noisy else ""
    if s.n and s.n < 10:
        note = (note + "; " if note else "") + f"{s.n} samples"
    unit = unit if m.unit in BYTE_UNITS else unit_label(m)
    note = "; ".join(n for n in (note, _load_note(m), _shared_note(m)) if n)
    return [
        m.name,
        unit,
        _fmt(s.median / scale),
        f"±{s.ci_halfwidth_pct:.1f}%" if s.n > 1 else "",
        ci,
        str(s.n),
        m.quality or "—",
        note,
    ]


def _shared_note(m: Metric) -> str:
    from opscope.engine.bench.measure.memory import SHARED_AB, SHARED_AB_NOTE

    return SHARED_AB_NOTE if m.params.get("memory") == SHARED_AB else ""


def _load_note(m: Metric) -> str:
    """Foreign load of a disturbed point, and how many of its samples were re-run."""
    load = m.load or {}
    cores = [c for c in load.get("other_cores") or [] if c is not None]
    parts = [f"others busy {max(cores):.2f} cores"] if m.quality == DISTURBED and cores else []
    if load.get("rerun"):
        parts.append(f"{load['rerun']} re-run")
    return ", ".join(parts)


def summary_table(result: RunResult, run_id, out: IO[str] | None = None) -> None:
    out = out if out is not None else sys.stdout  # now, not at import: the stream may change
    from rich.console import Console
    from rich.table import Table

    title = escape(f"{result.kind} — {result.status}") + (
        f" — saved as run {run_id}" if run_id is not None else " — not saved"
    )
    table = Table(title=title, title_justify="left")
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("metric", "left"),
        ("unit", "left"),
        ("median", "right"),
        ("± CI", "right"),
        ("95% CI of median", "right"),
        ("n", "right"),
        ("quality", "left"),
        ("notes", "left"),
    )
    for col, justify in columns:
        table.add_column(col, justify=justify, no_wrap=col in ("metric", "unit"))
    for m in result.metrics:
        table.add_row(*(escape(cell) for cell in _row(m)))
    console = Console(file=out, width=max(120, Console(file=out).width))
    console.print(table)
    for line in peak_lines(result.settings.get("suite_params", {})):
        console.print(escape(line))
    if result.settings.get("suite_params", {}).get("energy"):
        console.print(escape(f"energy: {result.settings['suite_params']['energy']}"), soft_wrap=True)
    for line in quality_lines(result):
        console.print(escape(line), soft_wrap=True)
    budget = budget_text(result)
    if budget:
        console.print(escape(budget), soft_wrap=True)
    if result.error:
        console.print(f"[bold]run {result.status}:[/bold] {escape(result.error)}")


def budget_text(result: RunResult) -> str | None:
    """--quick's line when its time budget cut points short (engine.bench.measure.runner.Budget)."""
    from opscope.engine.bench.measure.runner import budget_line

    runner = result.settings.get("runner") or {}
    return budget_line(runner.get("budget"), runner.get("min_reps", 0))


def quality_lines(result: RunResult) -> list[str]:
    """The run's quality on one line (``run quality: disturbed (...)``), then the legend."""
    return [run_summary(result.metrics, result.quality), LEGEND]


_LABELS = {"flop": ("MFU", "FLOP/s"), "bytes": ("MBU", "B/s")}


def _peak_set_lines(label: str, ps: dict) -> list[str]:
    lines = []
    for basis in ("theoretical", "measured"):
        peak = ps.get(basis)
        if peak:
            lines.append(f"{label} peak: {peak['label']} = {peak['source']}")
        elif basis == "theoretical":
            lines.append(f"{label} theoretical peak: not known for this device")
    if ps.get("note"):
        lines.append(f"{label} {ps['note']}")
    return lines


def peak_lines(suite_params: dict) -> list[str]:
    """Which peaks the run's utilisation figures divide by, and what became of a peak it measured."""
    pk = suite_params.get("peaks") or {}
    lines: list[str] = []
    for key, ps in pk.items():
        if key in _LABELS and isinstance(ps, dict):  # a model suite: {"flop": set, "bytes": set}
            lines += _peak_set_lines(_LABELS[key][0], ps)
        elif isinstance(ps, dict) and "theoretical" in ps:  # matmul: one set per dtype
            lines += _peak_set_lines(f"{key} matmul", ps)
    for key, (label, unit) in (("flop_s", _LABELS["flop"]), ("bytes_s", _LABELS["bytes"])):
        if pk.get(key):  # suites that divide by one peak (scaling, train-step)
            lines.append(f"{label} peak: {format_rate(pk[key], unit)} ({pk[key.replace('_s', '_source')]})")
    record = suite_params.get("peak_record")
    for dtype, what in record.items() if isinstance(record, dict) else [("", record)] if record else []:
        lines.append(f"measured peak{' ' + dtype if dtype else ''}: {what}")
    return lines


@contextmanager
def progress_bar(label: str) -> Iterator:
    """A rich progress bar on stderr; yields the runner's progress callback (done, total, eta_s)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.1f}/{task.total:.0f} points"),
        TimeElapsedColumn(),
        TextColumn("ETA {task.fields[eta]}"),
    )
    console = _stderr_console()
    # not on a terminal (a log, a pipe): no bar, not even the blank line rich leaves behind
    with Progress(*columns, transient=True, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task(label, total=1, eta="?")

        def update(done: float, total: int, eta_s: float | None) -> None:
            eta = "?" if eta_s is None else f"{eta_s:.0f}s"
            bar.update(task, completed=done, total=total, eta=eta)

        yield update


def _stderr_console():
    from rich.console import Console

    return Console(file=sys.stderr)
