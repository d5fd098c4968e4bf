"""`opscope` without a screen says so in one line instead of Qt's abort ('reinstalling may fix')."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="DISPLAY/WAYLAND_DISPLAY are Linux's")
@pytest.mark.parametrize("argv", [[], ["gui"]])
def test_no_display_is_one_clear_line(argv):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    r = subprocess.run([sys.executable, "-m", "app.cli", *argv], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("opscope: error: no display") and r.stderr.count("\n") == 1
