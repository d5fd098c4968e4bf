"""Small helpers that keep what a person reads whole at 1400x900."""

from __future__ import annotations

import os
from collections.abc import Callable

TICK_GAP_PX = 12  # room between two category labels on an axis


def category_ticks(
    names: list[str], axis_px: int, text_px: Callable[[str], int], numbers: list[int] | None = None
) -> tuple[list[str], bool]:
    """Labels for category ticks that never overlap: the names less their shared prefix when they
    fit side by side in ``axis_px``, else the row numbers ``numbers`` (1-based, as a table's row
    header shows them). Returns the labels and whether they are numbers."""
    if len(names) > 1:
        prefix = os.path.commonprefix(names)
        prefix = prefix[: prefix.rfind("_") + 1]  # cut at a word boundary: "matmul_", never "matmul_f"
        short = [n[len(prefix) :] or n for n in names]
    else:
        short = list(names)
    if sum(text_px(s) + TICK_GAP_PX for s in short) <= axis_px:
        return short, False
    return [str(i) for i in (numbers or range(1, len(names) + 1))], True


_ENG_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def engineering(value: float, unit: str = "") -> str:
    """A tick label as profilers print it: 3e11, "FLOP/s" → "300 GFLOP/s"; 1e12 → "1 TFLOP/s";
    without a unit, plain numbers ("0.1", "1", "1,000"), never "10¹¹" or "1e+03"."""
    if not unit:
        return f"{value:,.0f}" if value >= 1 else f"{value:.3g}"
    for size, prefix in _ENG_PREFIXES:
        if abs(value) >= size * 0.9995:  # 999.9e9 rounds to "1000 G" otherwise
            return f"{value / size:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def engineering_log_axis(orientation: str, unit: str = ""):
    """A pyqtgraph axis for a log10 plot whose ticks read as values with engineering prefixes."""
    import pyqtgraph as pg

    class EngineeringLogAxis(pg.AxisItem):
        def logTickStrings(self, values, scale, spacing):  # values are log10 of the data
            texts = [engineering(10.0**v * scale, unit) for v in values]
            return uncrowded(self, values, texts, lambda v: engineering(10.0**v * scale, unit))

    axis = EngineeringLogAxis(orientation)
    axis.enableAutoSIPrefix(False)  # the prefix is in each tick already
    return axis


def uncrowded(axis, values: list[float], texts: list[str], text_of: Callable[[float], str]) -> list[str]:
    """Tick labels of a log axis that never print over each other: a decade (10, 100, 1000) keeps
    its label; a tick between two (20 … 90) keeps its label only where it has room beside the
    decades and the ticks kept below it, so 60, 70, 80, 90 and 100 GFLOP/s do not print over each
    other where a decade is 160 px high. ``values`` are log10 of the data; blanked labels are ""."""
    import math

    from PySide6.QtGui import QFontMetrics

    lo, hi = sorted(axis.range)
    view = axis.linkedView()
    vertical = axis.orientation in ("left", "right")
    length = (view.height() if vertical else view.width()) if view is not None else 0.0
    if hi <= lo or length <= 0:
        return texts
    px_per_unit = length / (hi - lo)
    metrics = QFontMetrics(axis.style.get("tickFont") or axis.font())

    def room(text: str) -> float:  # half the label's extent along the axis, with a gap
        return (metrics.height() + 2) / 2 if vertical else (metrics.horizontalAdvance(text) + 8) / 2

    kept = [(float(k), text_of(float(k))) for k in range(math.ceil(lo), math.floor(hi) + 1)]  # the decades
    out = []
    for v, text in zip(values, texts):
        if abs(v - round(v)) > 1e-9 and any(abs(v - k) * px_per_unit < room(text) + room(t) for k, t in kept):
            out.append("")
            continue
        kept.append((v, text))
        out.append(text)
    return out


def shrinkable(*buttons) -> None:
    """Let push buttons narrow to their text in a small window: the Fusion style asks 80 px of
    every button, so a row of seven short ones alone would stop the window at 1024 px wide. They
    keep their usual width wherever there is room."""
    for button in buttons:
        padding = 30 if button.objectName() in ("primary", "danger") else 18  # the stylesheet's 14 px a side
        button.setMinimumWidth(button.fontMetrics().horizontalAdvance(button.text()) + padding)


def wrapped_key(
    items: list[tuple[str, str]], room_px: int, text_px: Callable[[str], int], gap: str = "&nbsp;&nbsp;&nbsp;"
) -> str:
    """A plot title's key as HTML lines no wider than ``room_px``: ``items`` are (html, plain
    text) pairs, placed in order, a new line started where the next would not fit. pyqtgraph's
    titles never wrap, and one wider than the view pushes the plot past the view's edge."""
    lines: list[list[str]] = [[]]
    width = 0
    for html, plain in _split_wide(items, room_px, text_px):
        w = text_px(plain) + (text_px("   ") if lines[-1] else 0)
        if lines[-1] and width + w > room_px:
            lines.append([])
            w = text_px(plain)
            width = 0
        lines[-1].append(html)
        width += w
    return "<br>".join(gap.join(line) for line in lines)


def _split_wide(items: list[tuple[str, str]], room_px: int, text_px: Callable[[str], int]) -> list[tuple[str, str]]:
    """An item wider than the room, "compute 640 GFLOP/s / bandwidth 7.4 GB/s", as two at its " / "
    (the second goes on the next line): left whole it ran past the plot's edge, cut."""
    out = []
    for html, plain in items:
        if text_px(plain) > room_px and " / " in plain and " / " in html:
            (h1, h2), (p1, p2) = html.split(" / ", 1), plain.split(" / ", 1)
            out += [(f"{h1} /", f"{p1} /"), (h2, p2)]
        else:
            out.append((html, plain))
    return out
