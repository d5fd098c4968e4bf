"""The trace timeline: one lane per device (plus transfers and syncs), each op a bar in its colour.

Each lane is one curve drawn with connect="pairs" (a segment per op), so 100k ops are a handful of
draw calls rather than 100k graphics items.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from opscope.app.ui.theme import DEVICE_COLORS, device_color

LANE_WIDTH_PX = 10
EMPTY_TITLE = "No trace yet: each op will show here as a bar on its device's lane"


class TraceTimeline(pg.PlotWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(120)
        self.getPlotItem().setLabel("bottom", "time since the trace started", units="s")
        self.getPlotItem().setMouseEnabled(y=False)
        self.getPlotItem().showGrid(x=True, alpha=0.2)
        self.lanes: list[str] = []
        self.getPlotItem().setTitle(EMPTY_TITLE)  # an empty 0..1 plot says why it is empty

    def show_ops(self, columns: dict[str, np.ndarray]) -> None:
        self.clear()
        self.getPlotItem().setTitle(None if len(columns["t_us"]) else "The trace recorded no ops")
        t0 = columns["t_us"] / 1e6
        t1 = t0 + np.maximum(columns["dur_us"], 0.05) / 1e6  # sub-pixel ops still show
        lane_of = np.where(columns["kind"] == "transfer", "transfer",
                           np.where(columns["kind"] == "sync", "sync", columns["device"]))
        self.lanes = sorted(set(lane_of.tolist()), key=lambda n: (n in ("transfer", "sync"), n))
        for y, lane in enumerate(self.lanes):
            pick = lane_of == lane
            xs = np.column_stack([t0[pick], t1[pick]]).ravel()
            ys = np.full(len(xs), float(y))
            color = DEVICE_COLORS[lane] if lane in DEVICE_COLORS else device_color(lane)
            pen = pg.mkPen(color, width=LANE_WIDTH_PX)
            pen.setCapStyle(Qt.SquareCap)  # an op shorter than a pixel still shows as a small block
            curve = self.plot(xs, ys, connect="pairs", pen=pen, name=lane)
            curve.setDownsampling(auto=False)
        axis = self.getPlotItem().getAxis("left")
        axis.setTicks([[(y, lane) for y, lane in enumerate(self.lanes)]])
        axis.setWidth(max(60, 8 * max((len(lane) for lane in self.lanes), default=0)))  # labels never dropped
        self.setYRange(-0.8, len(self.lanes) - 0.2, padding=0)
        if len(t0):
            self.setXRange(0, float(t1.max()), padding=0.01)
