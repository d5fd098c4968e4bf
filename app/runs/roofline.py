"""The Runs panel's Roofline tab: an llm/matmul/attention run's points by arithmetic intensity
against the compute and bandwidth ceilings (engine.bench.roofline), log-log, with PNG/SVG export."""
from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from opscope.app.notify import export_guard

_ROOF_COLOURS = ("#c0392b", "#2980b9", "#8e44ad", "#16a085")
_POINT_COLOUR = "#3182ce"


class RooflineView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.roof = None
        self.plot = pg.PlotWidget()
        self.plot.setLogMode(x=True, y=True)
        self.plot.setLabel("bottom", "arithmetic intensity (FLOP/byte)")
        self.plot.setLabel("left", "FLOP/s")
        for side in ("left", "bottom"):  # log ticks are powers of ten already: no "(x1e+09)" rescaling
            self.plot.getAxis(side).enableAutoSIPrefix(False)
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        self.plot.setTitle(" ")  # the key goes here (_draw), never in a box over the points
        self.summary = QLabel("Open an llm, matmul or attention run to see its roofline.", wordWrap=True)
        self.summary.setObjectName("statsLine")
        self.export_png = QPushButton("Export PNG…", clicked=lambda: self.export_dialog("png"), enabled=False)
        self.export_svg = QPushButton("Export SVG…", clicked=lambda: self.export_dialog("svg"), enabled=False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.summary, 1)
        buttons.addWidget(self.export_png)
        buttons.addWidget(self.export_svg)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(self.plot, 1)
        col.addLayout(buttons)

    def show_run(self, stored) -> bool:
        """Draws ``stored`` (engine.store StoredRun); False (and says why) for a run it cannot place."""
        from opscope.engine.bench import roofline
        from opscope.engine.errors import EngineError

        self.plot.clear()
        self.plot.setTitle(" ")
        try:
            self.roof = roofline.from_run(stored.result)
        except EngineError as e:
            self.roof = None
            self.summary.setText(str(e))
            self.export_png.setEnabled(False)
            self.export_svg.setEnabled(False)
            return False
        self._draw(self.roof)
        self.export_png.setEnabled(True)
        self.export_svg.setEnabled(True)
        return True

    def _draw(self, roof) -> None:
        from opscope.engine.bench import roofline

        # setLogMode plots log10 of the data: give it the raw values
        keys = []
        for i, (label, pts) in enumerate(roofline.roof_lines(roof)):
            xs, ys = zip(*pts)
            self.plot.plot(list(xs), list(ys), pen=pg.mkPen(_ROOF_COLOURS[i % 4], width=2), name=label)
            keys.append(f"<span style='color:{_ROOF_COLOURS[i % 4]}'>━</span> {label}")
        foreground = pg.mkColor(pg.getConfigOption("foreground"))
        if roof.points:
            xs = [p.intensity for p in roof.points]
            ys = [p.flop_s for p in roof.points]
            self.plot.plot(xs, ys, pen=None, symbol="o", symbolSize=8, symbolBrush=_POINT_COLOUR, name="points")
            keys.append(f"<span style='color:{_POINT_COLOUR}'>●</span> measured points")
            for p in _spaced(roof.points, *self._text_decades(roof)):
                text = pg.TextItem(p.name, anchor=(0, 1), color=foreground)  # not pyqtgraph's light grey
                text.setPos(math.log10(p.intensity), math.log10(p.flop_s))
                self.plot.addItem(text)
        self.plot.setTitle("&nbsp;&nbsp;".join(keys), size="9pt")
        self.summary.setText(summary_text(roof))

    def _text_decades(self, roof) -> tuple[float, float]:
        """How many decades a character of a point's name covers across, and a line of it up."""
        from opscope.engine.bench import roofline

        (x0, x1), (y0, y1) = roofline.plot_ranges(roof)
        width_px = max(self.plot.width() - 80, 200)  # less the left axis
        height_px = max(self.plot.height() - 60, 150)  # less the bottom axis and its label
        metrics = self.plot.fontMetrics()
        return (math.log10(x1 / x0) / width_px * metrics.averageCharWidth(),
                math.log10(y1 / y0) / height_px * metrics.lineSpacing())

    def export_dialog(self, kind: str) -> None:
        if self.roof is None:
            return
        path, _ = QFileDialog.getSaveFileName(self, f"Export roofline ({kind.upper()})",
                                              f"roofline-{self.roof.run}.{kind}", f"{kind.upper()} (*.{kind})")
        if path:
            self.export(path)

    def export(self, path: str) -> None:
        """Writes the shown roofline: SVG from the engine (the same as `opscope runs roofline --out`),
        PNG from this plot."""
        from pathlib import Path

        from opscope.engine.bench import roofline

        with export_guard(self, "export the roofline", path):
            if path.lower().endswith(".svg"):
                Path(path).write_text(roofline.svg(self.roof), encoding="utf-8")
            else:
                from pyqtgraph.exporters import ImageExporter

                ImageExporter(self.plot.plotItem).export(path)


def summary_text(roof) -> str:
    """One line under the plot: each ceiling with its origin, and the ridge point."""
    from opscope.engine.units import format_rate

    parts = [f"{c.kind} ceiling: {c.basis} {format_rate(c.value, 'FLOP/s' if c.kind == 'compute' else 'B/s')} "
             f"({c.origin})" for c in roof.ceilings]
    if roof.ridge:
        parts.append(f"ridge point: {roof.ridge:.2f} FLOP/byte (below: memory-bound, above: compute-bound)")
    return " · ".join(parts + list(roof.notes))


def _spaced(points, decades_per_char: float = 0.06, line_decades: float = 0.12):
    """The points to name on the plot: a name whose text box (it starts at its point and is
    ``decades_per_char`` a character wide, ``line_decades`` tall, log10 on both axes) would print
    over one already named stays unnamed (the table lists them all)."""
    named: list[tuple[float, float, float]] = []  # x from, x to, y of each name drawn
    for p in sorted(points, key=lambda q: q.flop_s, reverse=True):
        x, y = math.log10(p.intensity), math.log10(p.flop_s)
        end = x + len(p.name) * decades_per_char
        if all(end < a or x > b or abs(y - c) >= line_decades for a, b, c in named):
            named.append((x, end, y))
            yield p
