"""Console output of `opscope bench`: the progress bar and the summary table (rich)."""
from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from typing import IO, Iterator

from rich.markup import escape

from engine.bench.stats import summarize
from engine.results import Metric, RunResult


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return "—"
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"


def _row(m: Metric) -> list[str]:
    if m.status != "ok":
        return [m.name, m.unit, "failed", "", "", "", m.error or ""]
    s = summarize(m.samples)
    ci = f"{_fmt(s.ci_low)} – {_fmt(s.ci_high)}" if s.n else ""
    note = f"noisy (IQR {s.noise_pct:.0f}%)" if s.noisy else ""
    if s.n and s.n < 10:
        note = (note + "; " if note else "") + f"{s.n} samples"
    return [m.name, m.unit, _fmt(s.median), f"±{s.ci_halfwidth_pct:.1f}%" if s.n > 1 else "", ci, str(s.n), note]


def summary_table(result: RunResult, run_id, out: IO[str] = sys.stdout) -> None:
    from rich.console import Console
    from rich.table import Table

    title = escape(f"{result.kind} — {result.status}") + (f" — saved as run {run_id}" if run_id is not None else " — not saved")
    table = Table(title=title, title_justify="left")
    for col, justify in (("metric", "left"), ("unit", "left"), ("median", "right"), ("± CI", "right"),
                         ("95% CI of median", "right"), ("n", "right"), ("notes", "left")):
        table.add_column(col, justify=justify, no_wrap=col in ("metric", "unit"))
    for m in result.metrics:
        table.add_row(*(escape(cell) for cell in _row(m)))
    console = Console(file=out, width=max(120, Console(file=out).width))
    console.print(table)
    _print_peaks(console, result)
    if result.error:
        console.print(f"[bold]run {result.status}:[/bold] {escape(result.error)}")


def _print_peaks(console, result: RunResult) -> None:
    """Which peaks MFU/MBU divided by, and a warning when a ratio above 100% shows a peak too low."""
    peaks = result.settings.get("suite_params", {}).get("peaks") or {}
    for key, label, unit in (("flop_s", "MFU", "FLOP/s"), ("bytes_s", "MBU", "B/s")):
        if peaks.get(key):
            source = escape(str(peaks[key.replace("_s", "_source")]))
            console.print(f"{label} peak: {_fmt(peaks[key])} {unit} ({source})")
    over = [m.name for m in result.metrics if m.name.endswith((".mfu", ".mbu")) and m.samples
            and sorted(m.samples)[len(m.samples) // 2] > 100]
    if over:
        console.print(f"[bold]warning:[/bold] {', '.join(over)} above 100%: the peak it divides by is too "
                      f"low (measured on a busy machine?); run `opscope bench matmul` and "
                      f"`opscope bench bandwidth` on a quiet machine to replace it")


@contextmanager
def progress_bar(label: str) -> Iterator:
    """A rich progress bar on stderr; yields the runner's progress callback (done, total, eta_s)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]{task.description}"), BarColumn(),
               TextColumn("{task.completed:.1f}/{task.total:.0f} points"), TimeElapsedColumn(),
               TextColumn("ETA {task.fields[eta]}"))
    with Progress(*columns, transient=True, console=_stderr_console()) as bar:
        task = bar.add_task(label, total=1, eta="?")

        def update(done: float, total: int, eta_s: float | None) -> None:
            eta = "?" if eta_s is None else f"{eta_s:.0f}s"
            bar.update(task, completed=done, total=total, eta=eta)
        yield update


def _stderr_console():
    from rich.console import Console

    return Console(file=sys.stderr)
