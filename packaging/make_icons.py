"""Render resources/opscope.svg to the PNG sizes in resources/icons/ (run after editing the SVG).

QT_QPA_PLATFORM=offscreen python packaging/make_icons.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from opscope import resources
from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer


def render(svg: bytes, size: int) -> QImage:
    image = QImage(size, size, QImage.Format_ARGB32)
    image.fill(Qt.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.Antialiasing)
    QSvgRenderer(QByteArray(svg)).render(painter)
    painter.end()
    return image


def main() -> int:
    QGuiApplication(sys.argv)
    out = Path(resources.__file__).parent / "icons"
    out.mkdir(exist_ok=True)
    svg = resources.read_bytes("opscope.svg")
    for size in resources.ICON_SIZES:
        render(svg, size).save(str(out / f"opscope-{size}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
