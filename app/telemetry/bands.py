"""Phase bands drawn as one graphics item per plot.

A LinearRegionItem per band costs two InfiniteLines, signals and a paint each, and even a bare
alpha fillRect per band costs the raster engine a span per scanline: a benchmark marks every
repetition, and an hour of generations is hundreds of bands. This item keeps the bands as plain
tuples, paints them into a one-pixel-high RGBA strip (one column per device pixel) and stretches
that strip over the plot's height: one image blit per plot whatever the number of bands.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtGui import QImage


class PhaseBands(pg.GraphicsObject):
    def __init__(self, colors: dict[str, tuple[int, int, int]], alpha: int = 60) -> None:
        super().__init__()
        self.setZValue(-10)  # behind the curves
        self.bands: list[tuple[str, float, float]] = []  # (phase, x0, x1) in view coordinates
        self._rgba = {name: np.array([*rgb, alpha], dtype=np.uint8) for name, rgb in colors.items()}
        self._default = np.array([160, 160, 160, alpha], dtype=np.uint8)

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
        device = painter.transform().mapRect(rect)
        width = max(int(round(device.width())), 1)
        strip = self.strip(rect.left(), rect.right(), width)
        image = QImage(strip.data, width, 1, 4 * width, QImage.Format_RGBA8888)
        painter.save()
        painter.resetTransform()
        painter.drawImage(device, image)  # nearest-neighbour stretch: columns stay crisp
        painter.restore()

    def strip(self, x_left: float, x_right: float, width: int) -> np.ndarray:
        """[width, 4] RGBA: each pixel column coloured by the (last) band covering it."""
        strip = np.zeros((width, 4), dtype=np.uint8)
        scale = width / (x_right - x_left) if x_right > x_left else 0.0
        for phase, x0, x1 in self.bands:
            a = int(np.floor((x0 - x_left) * scale))
            b = max(int(np.ceil((x1 - x_left) * scale)), a + 1)  # a sub-pixel phase is still a 1 px line
            if b > 0 and a < width:
                strip[max(a, 0) : min(b, width)] = self._rgba.get(phase, self._default)
        return strip
