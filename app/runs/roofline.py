"""The Runs panel's Roofline tab: an llm/matmul/attention run's points by arithmetic intensity
against the compute and bandwidth ceilings (engine.bench.roofline), log-log, with PNG/SVG export."""

from __future__ import annotations

import math
import os
import re

import pyqtgraph as pg
from opscope.app.ui.notify import export_guard
from opscope.app.ui.widgets import engineering_log_axis, wrapped_key
from PySide6.QtCore import QRectF, QTimer, Signal
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

_ROOF_COLOURS = ("#c0392b", "#2980b9", "#8e44ad", "#16a085")
_POINT_COLOUR = "#3182ce"


class RooflineView(QWidget):
    computed = Signal(bool)  # what compute() asked for came back: drawn (True), or not (False: said why)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.roof = None
        self.labels: list[pg.TextItem] = []  # the points' names on the plot
        self._drawn = None  # the roofline drawn (its points are named again after a resize)
        self._job = None  # the engine job computing the roofline to show next (compute)
        self._keys: list[tuple[str, str]] = []  # (html, plain text) of each line of the key
        self._rekey_timer = QTimer(self, singleShot=True, interval=0, timeout=self._rekey)
        # Ticks read "300 GFLOP/s" and "10" (FLOP/byte, named once in the axis title), as a
        # profiler prints them, not pyqtgraph's "3·10¹¹".
        self.plot = pg.PlotWidget(
            axisItems={"left": engineering_log_axis("left", "FLOP/s"), "bottom": engineering_log_axis("bottom")}
        )
        self.plot.setLogMode(x=True, y=True)
        self.plot.setLabel("bottom", "arithmetic intensity (FLOP/byte)")
        self.plot.setLabel("left", "attained performance")
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        self.plot.setTitle(" ")  # the key goes here (_draw), never in a box over the points
        self.summary = QLabel("Open an llm, matmul or attention run to see its roofline.", wordWrap=True)
        self.summary.setObjectName("statsLine")
        self.export_png = QPushButton("Export PNG…", clicked=lambda: self.export_dialog("png"), enabled=False)
        self.export_svg = QPushButton("Export SVG…", clicked=lambda: self.export_dialog("svg"), enabled=False)
        # The caption spans the width under the plot (beside the buttons, a narrow tab wrapped it
        # into a column taller than the plot); the plot keeps room for its decades.
        self.summary.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.plot.setMinimumHeight(140)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.export_png)
        buttons.addWidget(self.export_svg)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(self.plot, 1)
        col.addWidget(self.summary)
        col.addLayout(buttons)

    def show_run(self, stored, store=None) -> bool:
        """Draws ``stored`` (engine.store StoredRun); False (and says why) for a run it cannot place.
        Computes here, on the calling thread (it may import torch): the GUI uses compute()."""
        from opscope.engine import EngineError, roofline

        try:
            roof = roofline.from_run(stored.result, store, probe=True)  # a memory roof, always
        except EngineError as e:
            self._clear(str(e))
            return False
        self.show_roof(roof)
        return True

    def compute(self, client, db_url: str | None, run_id: int):
        """Has the engine worker read run ``run_id`` and compute its roofline (the store read and the
        torch import stay off the GUI thread: even a GUI-side thread's import of torch holds the GIL
        long enough to freeze the window). Says "computing roofline…" until it comes back, then draws
        it, or says why not on the caption; ``computed`` tells which. Returns the engine Job."""
        from opscope.app.worker.protocol import RooflineRequest

        self._job = job = client.submit(RooflineRequest(run_id, db_url))
        waits = "; it waits for the engine's current job" if client.ahead_of(job) is not None else ""
        self.summary.setText(f"computing roofline… (run {run_id}, in the engine{waits})")
        job.finished.connect(lambda result, j=job: self._computed(j, result))
        job.failed.connect(lambda kind, message, j=job: self._compute_failed(j, run_id, kind, message))
        return job

    def _computed(self, job, result: dict) -> None:
        from opscope.engine import ROOFLINE_SUITES as SUITES
        from opscope.engine import Roofline

        if job is not self._job:  # a later request superseded this one
            return
        self._job = None
        if result.get("roofline") is None:
            self._clear(
                f"run “{result.get('name')}” is a {result.get('run_kind')} run: a roofline places "
                f"{', '.join(SUITES)} points"
            )
            self.computed.emit(False)
            return
        self.show_roof(Roofline.from_dict(result["roofline"]))
        self.computed.emit(True)

    def _compute_failed(self, job, run_id: int, kind: str, message: str) -> None:
        if job is not self._job:
            return
        self._job = None
        self._clear(f"roofline: cannot compute run {run_id}'s: {kind}: {message}")
        self.computed.emit(False)

    def show_roof(self, roof) -> None:
        """Draws ``roof`` (an engine.bench.roofline Roofline already computed)."""
        self.plot.clear()
        self.plot.setTitle(" ")
        self._keys = []
        self.roof = roof
        self._draw(roof)
        self.export_png.setEnabled(True)
        self.export_svg.setEnabled(True)

    def _clear(self, why: str) -> None:
        self.plot.clear()
        self.labels, self._drawn = [], None
        self.plot.setTitle(" ")
        self._keys = []
        self.roof = None
        self.summary.setText(why)
        self.summary.setToolTip(why)
        self.export_png.setEnabled(False)
        self.export_svg.setEnabled(False)

    def _draw(self, roof) -> None:
        from opscope.engine import roofline

        self.labels, self._drawn = [], roof

        # setLogMode plots log10 of the data: give it the raw values
        keys = []
        for i, (label, pts) in enumerate(roofline.roof_lines(roof)):
            xs, ys = zip(*pts)
            self.plot.plot(list(xs), list(ys), pen=pg.mkPen(_ROOF_COLOURS[i % 4], width=2), name=label)
            text = _with_values(label, roof)
            keys.append((f"<span style='color:{_ROOF_COLOURS[i % 4]}'>━</span> {text}", f"━ {text}"))
        if roof.points:
            xs = [p.intensity for p in roof.points]
            ys = [p.flop_s for p in roof.points]
            self.plot.plot(xs, ys, pen=None, symbol="o", symbolSize=8, symbolBrush=_POINT_COLOUR, name="points")
            shared = shared_prefix([p.name for p in roof.points])
            what = f"measured points: {shared}…" if shared else "measured points"  # their names less it
            keys.append((f"<span style='color:{_POINT_COLOUR}'>●</span> {what}", f"● {what}"))
            self._place_labels()
        self._keys = keys
        self._set_key()
        self.summary.setText(summary_text(roof, short=True))
        self.summary.setToolTip(summary_text(roof))

    def _set_key(self) -> None:
        """The key in the title row, wrapped to the plot's width (never pushing the plot past the tab)."""
        font = self.plot.font()
        font.setPointSize(9)
        metrics = QFontMetrics(font)
        key = wrapped_key(self._keys, max(self.plot.width() - 100, 120), metrics.horizontalAdvance)
        self.plot.setTitle(key, size="9pt")
        # pyqtgraph fixes the title row at 30 px (two lines): a third was cut off at the top
        height = (key.count("<br>") + 1) * metrics.lineSpacing() + 8
        self.plot.getPlotItem().titleLabel.setMaximumHeight(height)
        self.plot.getPlotItem().layout.setRowFixedHeight(0, height)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self._keys:  # after the event, never inside a paint (grab) that resized the widget
            self._rekey_timer.start()

    def _rekey(self) -> None:
        self._set_key()
        self._place_labels()
        # the plot was fitted to the view under the old key's width: fit it again once laid out
        QTimer.singleShot(0, lambda: self.plot.plotItem.setGeometry(QRectF(self.plot.viewport().rect())))

    def _place_labels(self) -> None:
        """Name the points where the plot is now (its range and size): again after a resize."""
        for label in self.labels:
            self.plot.removeItem(label)
        self.labels = []
        points = self._drawn.points if self._drawn is not None else []
        if not points:
            return
        foreground = pg.mkColor(pg.getConfigOption("foreground"))  # not pyqtgraph's light grey
        for name, x, y, anchor in placed_labels(points, self._text_size(), shared_prefix([p.name for p in points])):
            text = pg.TextItem(name, anchor=anchor, color=foreground)
            text.setPos(x, y)
            self.plot.addItem(text)
            self.labels.append(text)

    def _text_size(self):
        """text → (width, height) of its label in decades (log10 units) on each axis, from the
        view's range and size in pixels now, and the label's own font and padding."""
        vb = self.plot.getPlotItem().getViewBox()
        vb.updateAutoRange()  # the range the roofs and points will be shown in
        (x0, x1), (y0, y1) = vb.viewRange()
        width_px, height_px = max(vb.width(), 200.0), max(vb.height(), 150.0)
        probe = pg.TextItem("x")  # held: its text item dies with it
        metrics = QFontMetrics(probe.textItem.font())
        pad = 6  # TextItem's document margins around the text
        return lambda text: (
            (metrics.horizontalAdvance(text) + 2 * pad) * (x1 - x0) / width_px,
            (metrics.lineSpacing() + 2 * pad) * (y1 - y0) / height_px,
        )

    def export_dialog(self, kind: str) -> None:
        if self.roof is None:
            return
        path, _ = QFileDialog.getSaveFileName(
            self, f"Export roofline ({kind.upper()})", f"roofline-{self.roof.run}.{kind}", f"{kind.upper()} (*.{kind})"
        )
        if path:
            self.export(path)

    def export(self, path: str) -> None:
        """Writes the shown roofline: SVG from the engine (the same as `opscope runs roofline --out`),
        PNG from this plot."""
        from pathlib import Path

        from opscope.engine import roofline

        with export_guard(self, "export the roofline", path):
            if path.lower().endswith(".svg"):
                Path(path).write_text(roofline.svg(self.roof), encoding="utf-8")
            else:
                from pyqtgraph.exporters import ImageExporter

                ImageExporter(self.plot.plotItem).export(path)


def summary_text(roof, short: bool = False) -> str:
    """One line under the plot: each ceiling with its origin, and the ridge point; ``short``:
    each note up to its advice (the whole text is the caption's tooltip)."""
    from opscope.engine import format_rate

    parts = [
        f"{c.kind} ceiling: {c.basis} {format_rate(c.value, 'FLOP/s' if c.kind == 'compute' else 'B/s')} ({c.origin})"
        for c in roof.ceilings
    ]
    if roof.ridge:
        parts.append(f"ridge point: {roof.ridge:.2f} FLOP/byte (below: memory-bound, above: compute-bound)")
    notes = [n.split(": ", 1)[0] + " (more on hover)" if short and ": " in n else n for n in roof.notes]
    return " · ".join(parts + notes)


def _with_values(label: str, roof) -> str:
    """A roof's key with its ceilings' values, in the ticks' units: "theoretical compute 294.4
    GFLOP/s / measured bandwidth 48.00 GB/s"."""
    from opscope.engine import format_rate

    for c in roof.ceilings:
        words = f"{c.basis} {c.kind}"
        unit = "FLOP/s" if c.kind == "compute" else "B/s"
        # the first mention not already followed by a value: two ceilings may share their words
        label = re.sub(re.escape(words) + r"(?! \d)", f"{words} {format_rate(c.value, unit)}", label, count=1)
    return label


# Where a name may go around its point, in order: above right, below right, above left, below
# left (pyqtgraph TextItem anchors: the corner of the text at the point).
_ANCHORS = ((0, 1), (0, 0), (1, 1), (1, 0))


def shared_prefix(names: list[str]) -> str:
    """The start every point's name shares, up to a word ("matmul_float32_"), said once in the key:
    six names of 18 characters each on a rising line left no room for one of them at 1280x800."""
    if len(names) < 2:
        return ""
    prefix = os.path.commonprefix(names)
    prefix = prefix[: prefix.rfind("_") + 1]  # "matmul_float32_", never "matmul_float32_1"
    return prefix if all(len(n) > len(prefix) for n in names) else ""


def placed_labels(points, size, prefix: str = ""):
    """[(text, x, y, anchor)] naming every point (log10 coordinates) less the ``prefix`` all names
    share: points that coincide share one label ("pp64, pp64@d64"); each label takes the first
    corner around its point where its box (``size(text)`` → width, height in decades) overlaps no
    label placed yet nor another point; a label that fits nowhere is left out (the table lists
    every point)."""
    char_w, line_h = size("x")
    groups: list[list] = []
    for p in sorted(points, key=lambda q: q.flop_s, reverse=True):
        x, y = math.log10(p.intensity), math.log10(p.flop_s)
        near = next((g for g in groups if abs(g[1] - x) < char_w and abs(g[2] - y) < line_h / 2), None)
        if near is not None:
            near[0].append(p.name.removeprefix(prefix))
        else:
            groups.append([[p.name.removeprefix(prefix)], x, y])
    dots = [(x, y) for _names, x, y in groups]
    boxes: list[tuple[float, float, float, float]] = []
    out = []
    for names, x, y in groups:
        text = ", ".join(names)
        w, h = size(text)
        for ax, ay in _ANCHORS:
            box = (x - ax * w, x + (1 - ax) * w, y - (1 - ay) * h, y + ay * h)
            if not any(_overlap(box, b) for b in boxes) and not any(
                box[0] < dx < box[1] and box[2] < dy < box[3] for dx, dy in dots if (dx, dy) != (x, y)
            ):
                boxes.append(box)
                out.append((text, x, y, (ax, ay)))
                break
    return out


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]
