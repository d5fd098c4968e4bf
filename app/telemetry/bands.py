"""Phase bands drawn as one graphics item per plot.

A LinearRegionItem per band costs two InfiniteLines, signals and a paint each; a benchmark marks
every repetition, so hundreds of bands per second would cost more than the plots. This item keeps
the bands as plain tuples and paints them in one pass of filled rectangles spanning the view.
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor


class PhaseBands(pg.GraphicsObject):
    def __init__(self, colors: dict[str, tuple[int, int, int]], alpha: int = 60) -> None:
        super().__init__()
        self.setZValue(-10)  # behind the curves
        self.bands: list[tuple[str, float, float]] = []  # (phase, x0, x1) in view coordinates
        self._brushes = {name: QColor(*rgb, alpha) for name, rgb in colors.items()}
        self._default = QColor(160, 160, 160, alpha)

    def set_bands(self, bands: list[tuple[str, float, float]]) -> None:
        self.bands = bands
        self.prepareGeometryChange()
        self.update()

    def phases_at(self, x: float) -> list[str]:
        return sorted({phase for phase, x0, x1 in self.bands if x0 <= x <= x1})

    def viewRangeChanged(self) -> None:  # pyqtgraph calls this when the view moves or zooms
        self.prepareGeometryChange()

    def boundingRect(self) -> QRectF:
        view = self.getViewBox()
        return QRectF() if view is None else view.viewRect()

    def paint(self, painter, *_args) -> None:
        view = self.getViewBox()
        if view is None or not self.bands:
            return
        rect = view.viewRect()
        painter.setPen(Qt.NoPen)
        for phase, x0, x1 in self.bands:
            painter.fillRect(QRectF(x0, rect.top(), max(x1 - x0, 0.0), rect.height()),
                             self._brushes.get(phase, self._default))
