"""Platform icon containers from resources/icons/*.png: opscope.ico (Windows) and, on macOS,
opscope.icns via `iconutil`. Run before PyInstaller on those platforms.

    QT_QPA_PLATFORM=offscreen python packaging/make_icon_files.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from opscope import resources
from PySide6.QtGui import QGuiApplication, QImage

OUT = Path(__file__).resolve().parent


def make_ico() -> Path:
    # Qt writes a multi-size .ico from one image per size when given the largest; 256 is the ICO maximum.
    image = QImage.fromData(resources.icon_png(256), "PNG")
    path = OUT / "opscope.ico"
    if not image.save(str(path), "ICO"):
        raise SystemExit("this Qt build cannot write .ico files")
    return path


def make_icns() -> Path | None:
    if not shutil.which("iconutil"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        iconset = Path(tmp) / "opscope.iconset"
        iconset.mkdir()
        for size in (16, 32, 128, 256, 512):
            (iconset / f"icon_{size}x{size}.png").write_bytes(resources.icon_png(size))
            if size * 2 in resources.ICON_SIZES:
                (iconset / f"icon_{size}x{size}@2x.png").write_bytes(resources.icon_png(size * 2))
        subprocess.run(["iconutil", "-c", "icns", str(iconset), "-o", str(OUT / "opscope.icns")], check=True)
    return OUT / "opscope.icns"


def main() -> int:
    QGuiApplication(sys.argv)
    print(make_ico())
    icns = make_icns()
    print(icns or "iconutil not found (macOS only): no .icns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
