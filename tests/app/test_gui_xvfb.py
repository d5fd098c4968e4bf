"""The real window on a real X server (Xvfb), walked with xdotool by packaging/xvfb_walk.sh: every
check it prints passes (three chat turns reusing the prefix, trace rows and bars selecting each
other, hover, both roofs, a compare at 1280x800, the dark theme).

Deselected by default (marker `xvfb`, like `bundle`): it needs Xvfb, xdotool and ImageMagick and
takes minutes. `make xvfb-walk` runs the walk itself; here the screenshots land in build/xvfb-walk/
(or $OPSCOPE_XVFB_OUT) to look at.
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
    "02-chat-turn1",
    "03-chat-turn2",
    "04-chat-turn3",
    "05-trace-row-selected",
    "06-trace-bar-clicked",
    "07-trace-hover",
    "08-roofline",
    "09-compare-1280x800",
    "10-dark-trace",
)
CHECKS = ("chat", "trace row -> timeline", "trace timeline -> row", "trace hover", "roofline", "compare", "dark theme")


def _image(path: Path):
    from PySide6.QtGui import QImage

    image = QImage(str(path))
    assert not image.isNull(), f"{path} is not an image"
    return image


def _walk(out: Path, timeout_s: float) -> tuple[int, str]:
    """Run the walk in its own process group: on a timeout the window, its worker and Xvfb go too."""
    env = dict(os.environ, PYTHON=sys.executable)
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
    for check in CHECKS:
        assert f"xvfb_walk: PASS {check}: " in output, output
    assert "FAIL" not in output
    images = {name: _image(out / f"{name}.png") for name in SHOTS}
    assert all(i.width() == 1400 and i.height() == 900 for i in images.values())
