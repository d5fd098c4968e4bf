"""The trace timeline: one lane per device (plus transfers and syncs), each op a bar.

Each lane is a few curves drawn with connect="pairs" (a segment per op), so 100k ops are a handful
of draw calls rather than 100k graphics items. Bars are coloured by op name (as Perfetto colours
slices), so back-to-back ops read as a pattern rather than one solid bar; fallbacks, transfers and
syncs keep their warning colours. Hovering a bar shows the op's fields, clicking it selects it
(``opClicked``, the panel selects its table row), ``select`` highlights ops chosen elsewhere, and a
drag along the time axis zooms to the dragged span (Nsight's select-to-zoom).
"""

from __future__ import annotations

import zlib

import numpy as np
import pyqtgraph as pg
from opscope.app.trace.ops_model import KIND_COLORS
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtWidgets import QToolTip

LANE_WIDTH_PX = 10
EMPTY_TITLE = "No trace yet: each op will show here as a bar on its device's lane"
HINT = "drag to zoom into a span, right-click → View All"
# Distinct, mid-lightness hues that read on both themes; an op name always gets the same one.
OP_PALETTE = (
    "#4c78a8",
    "#72b7b2",
    "#54a24b",
    "#b279a2",
    "#9d755d",
    "#4f6d9a",
    "#88d27a",
    "#6f4e7c",
    "#3d9970",
    "#8c6bb1",
)
SELECTED_COLOR = "#ffd400"


def op_color(op: str, kind: str) -> str:
    """Fallbacks, transfers, syncs and mixed-device ops in their warning colours; others by name."""
    return KIND_COLORS.get(kind) or OP_PALETTE[zlib.crc32(op.encode()) % len(OP_PALETTE)]


class TraceTimeline(pg.PlotWidget):
    opClicked = Signal(int)  # the model row (index into the op columns) of the bar clicked

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(120)
        plot = self.getPlotItem()
        plot.setLabel("bottom", f"time since the trace started ({HINT})", units="s")
        plot.setMouseEnabled(y=False)
        plot.showGrid(x=True, alpha=0.2)
        plot.getViewBox().setMouseMode(pg.ViewBox.RectMode)  # a drag zooms to the dragged span
        self.lanes: list[str] = []
        self.columns: dict[str, np.ndarray] = {}
        self.lane_rows: list[np.ndarray] = []  # per lane: model rows sorted by start time
        self.selected: np.ndarray = np.empty(0, dtype=np.int64)
        self.hover_text = ""
        self._highlight: pg.PlotDataItem | None = None
        plot.setTitle(EMPTY_TITLE)  # an empty 0..1 plot says why it is empty
        self.scene().sigMouseClicked.connect(self._on_mouse_clicked)
        plot.getViewBox().sigRangeChangedManually.connect(self._keep_lanes_in_view)

    def show_ops(self, columns: dict[str, np.ndarray]) -> None:
        self.clear()
        self._highlight, self.selected, self.columns = None, np.empty(0, dtype=np.int64), columns
        self.getPlotItem().setTitle(None if len(columns["t_us"]) else "The trace recorded no ops")
        t0, t1 = self._spans(columns)
        lane_of = np.where(
            columns["kind"] == "transfer", "transfer", np.where(columns["kind"] == "sync", "sync", columns["device"])
        )
        self.lanes = sorted(set(lane_of.tolist()), key=lambda n: (n in ("transfer", "sync"), n))
        self.lane_rows = []
        for y, lane in enumerate(self.lanes):
            rows = np.flatnonzero(lane_of == lane)
            rows = rows[np.argsort(t0[rows], kind="stable")]
            self.lane_rows.append(rows)
            self._draw_lane(y, rows, t0, t1)
        axis = self.getPlotItem().getAxis("left")
        axis.setTicks([[(y, lane) for y, lane in enumerate(self.lanes)]])
        axis.setWidth(max(60, 8 * max((len(lane) for lane in self.lanes), default=0)))  # labels never dropped
        self._keep_lanes_in_view()
        if len(t0):  # the ops, not the seconds a script spent starting before its first op
            self.setXRange(float(t0.min()), float(t1.max()), padding=0.01)

    @staticmethod
    def _spans(columns) -> tuple[np.ndarray, np.ndarray]:
        t0 = np.asarray(columns["t_us"], dtype=float) / 1e6
        return t0, t0 + np.maximum(np.asarray(columns["dur_us"], dtype=float), 0.05) / 1e6  # sub-pixel ops show

    def _draw_lane(self, y: int, rows: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> None:
        """One curve per colour on the lane: op names share a handful of hues."""
        colors = np.array([op_color(str(self.columns["op"][r]), str(self.columns["kind"][r])) for r in rows])
        for color in dict.fromkeys(colors.tolist()):
            pick = rows[colors == color]
            xs = np.column_stack([t0[pick], t1[pick]]).ravel()
            pen = pg.mkPen(color, width=LANE_WIDTH_PX)
            pen.setCapStyle(Qt.FlatCap)  # adjacent ops stay distinct bars
            curve = self.plot(xs, np.full(len(xs), float(y)), connect="pairs", pen=pen)
            curve.setDownsampling(auto=False)

    def _keep_lanes_in_view(self, *_args) -> None:
        """Zooming is along time only: the lanes always fill the height."""
        self.setYRange(-0.8, max(len(self.lanes), 1) - 0.2, padding=0)

    # -- hover and selection --------------------------------------------------------------------
    def op_at(self, x: float, y: float) -> int | None:
        """The model row of the op drawn at data coordinates (x s, y lane), or None."""
        lane = int(round(y))
        if not self.lane_rows or not 0 <= lane < len(self.lanes) or abs(y - lane) > 0.4:
            return None
        rows = self.lane_rows[lane]
        t0, t1 = self._spans({k: self.columns[k][rows] for k in ("t_us", "dur_us")})
        i = int(np.searchsorted(t0, x, side="right")) - 1
        slack = self._pixel_s() * 2  # a bar narrower than a pixel can still be hit
        for j in (i, i + 1, i - 1):
            if 0 <= j < len(rows) and t0[j] - slack <= x <= t1[j] + slack:
                return int(rows[j])
        return None

    def _pixel_s(self) -> float:
        (x0, x1), _ = self.getPlotItem().getViewBox().viewRange()
        return (x1 - x0) / max(self.getPlotItem().getViewBox().width(), 1.0)

    def mouseMoveEvent(self, ev) -> None:
        """Every move updates the hover, not the scene's sigMouseMoved: the scene drops a move that
        comes within 10 ms of the one before (pyqtgraph's mouseRateLimit), so the last position of
        a quick movement was lost and the tooltip stayed on an op the mouse had left."""
        super().mouseMoveEvent(ev)
        self._on_mouse_moved(self.mapToScene(ev.position().toPoint()))

    def _on_mouse_moved(self, pos: QPointF) -> None:
        point = self.getPlotItem().getViewBox().mapSceneToView(pos)
        row = self.op_at(point.x(), point.y()) if self.columns else None
        self.hover_text = self.describe(row) if row is not None else ""
        if self.hover_text:
            QToolTip.showText(self.viewport().mapToGlobal(self.mapFromScene(pos)), self.hover_text, self)
        else:
            QToolTip.hideText()

    def _on_mouse_clicked(self, event) -> None:
        if event.button() != Qt.LeftButton:
            return
        point = self.getPlotItem().getViewBox().mapSceneToView(event.scenePos())
        row = self.op_at(point.x(), point.y()) if self.columns else None
        if row is not None:
            self.select([row])
            self.opClicked.emit(row)

    def describe(self, row: int) -> str:
        """The hover text of an op: what it is, where it ran, when and for how long."""
        c = self.columns
        lines = [
            f"{str(c['op'][row]).removeprefix('aten.')}  ({c['kind'][row]} on {c['device'][row]})",
            f"start {float(c['t_us'][row]):,.1f} µs · duration {float(c['dur_us'][row]):,.1f} µs",
        ]
        for key, label in (("module", "module"), ("source", "source"), ("shapes", "inputs")):
            if str(c[key][row]):
                lines.append(f"{label}: {c[key][row]}")
        return "\n".join(lines)

    def select(self, rows, reveal: bool = True) -> None:
        """Outline the ops at model ``rows`` (a table row, a finding's ops); with ``reveal``, pan
        so that the first one is in view when it is not."""
        self.selected = np.asarray(sorted(rows), dtype=np.int64)
        if self._highlight is not None:
            self.removeItem(self._highlight)
            self._highlight = None
        if not len(self.selected) or not self.columns:
            return
        t0, t1 = self._spans({k: self.columns[k][self.selected] for k in ("t_us", "dur_us")})
        lane_index = {lane: y for y, lane in enumerate(self.lanes)}
        ys = np.array([lane_index[self._lane_of(r)] for r in self.selected], dtype=float)
        pen = pg.mkPen(SELECTED_COLOR, width=LANE_WIDTH_PX + 6)
        pen.setCapStyle(Qt.SquareCap)  # a selected sub-pixel op still shows
        self._highlight = self.plot(np.column_stack([t0, t1]).ravel(), np.repeat(ys, 2), connect="pairs", pen=pen)
        self._highlight.setZValue(-1)  # an outline behind the bar
        if reveal:
            self._reveal(float(t0.min()), float(t1.max()))

    def _lane_of(self, row: int) -> str:
        kind = str(self.columns["kind"][row])
        return kind if kind in ("transfer", "sync") else str(self.columns["device"][row])

    def _reveal(self, start: float, end: float) -> None:
        (x0, x1), _ = self.getPlotItem().getViewBox().viewRange()
        if x0 <= start and end <= x1:
            return
        width = x1 - x0
        if end - start > width:  # a span wider than the view: show it whole
            self.setXRange(start, end, padding=0.02)
        else:
            middle = (start + end) / 2
            self.setXRange(middle - width / 2, middle + width / 2, padding=0)

    def visible_span(self) -> tuple[float, float]:
        (x0, x1), _ = self.getPlotItem().getViewBox().viewRange()
        return x0, x1
