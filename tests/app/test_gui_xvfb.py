"""The real window on a real X server (Xvfb), walked with xdotool by packaging/xvfb_walk.sh.

Deselected by default (marker `xvfb`, like `bundle`): it needs Xvfb, xdotool and ImageMagick and
takes minutes. `make xvfb-walk` runs it; the screenshots land in build/xvfb-walk/ to look at.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.xvfb, pytest.mark.gui]

ROOT = Path(__file__).resolve().parents[2]
WALK = ROOT / "packaging" / "xvfb_walk.sh"
SHOTS = (
    "01-start",
    "02-chat-streaming",
    "03-chat-reply",
    "04-trace-empty",
    "05-trace-finding",
    "06-bench-empty",
    "07-bench-done",
    "08-runs",
    "09-settings",
    "10-store-dialog",
    "11-dark-runs",
    "12-dark-trace",
    "13-dark-chat",
)


def _image(path: Path):
    from PySide6.QtGui import QImage

    image = QImage(str(path))
    assert not image.isNull(), f"{path} is not an image"
    return image


def _differs(a, b) -> bool:
    """Two screenshots differ in more than a few pixels (a step changed what the screen shows)."""
    changed = sum(a.pixel(x, y) != b.pixel(x, y) for x in range(0, 1400, 7) for y in range(0, 900, 7))
    return changed > 200


def _walk(out: Path, timeout_s: float) -> tuple[int, str]:
    """Run the walk in its own process group: on a timeout the window, its worker and Xvfb go too."""
    env = dict(os.environ, OPSCOPE=str(Path(sys.executable).parent / "opscope"))
    env.pop("QT_QPA_PLATFORM", None)
    walk = subprocess.Popen(
        ["bash", str(WALK), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = walk.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(walk.pid, signal.SIGTERM)
        output, _ = walk.communicate()
        return -1, f"the walk took over {timeout_s:.0f} s\n{output}"
    return walk.returncode, output


# A first start builds the fast-path kernels (minutes on a busy 2-core machine): room for that.
@pytest.mark.timeout(1800)
def test_the_window_walked_on_xvfb_shows_every_step(qapp):
    out = Path(os.environ.get("OPSCOPE_XVFB_OUT") or ROOT / "build" / "xvfb-walk")
    code, output = _walk(out, timeout_s=1700)
    assert code == 0, f"{output}\n{(out / 'gui.log').read_text()[-3000:]}"
    log = (out / "gui.log").read_text()
    assert "Traceback" not in log and "crashed" not in log, log[-3000:]  # every step ran on a live engine
    images = {name: _image(out / f"{name}.png") for name in SHOTS}
    assert all(i.width() == 1400 and i.height() == 900 for i in images.values())
    steps = list(images.values())
    assert all(_differs(a, b) for a, b in zip(steps, steps[1:]))  # every click changed the screen
    dark = images["12-dark-trace"].pixelColor(700, 450).lightness()
    light = images["05-trace-finding"].pixelColor(700, 450).lightness()
    assert dark < 90 < light
