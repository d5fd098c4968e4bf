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
    r = subprocess.run(
        [sys.executable, "-m", "opscope.app.cli", *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 2
    assert r.stderr.strip().startswith("opscope: error: no display") and r.stderr.count("\n") == 1


def _opscope(argv, tmp_path, timeout=300):
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    return subprocess.run(
        [sys.executable, "-m", "opscope.app.cli", *argv], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.mark.gui
def test_screenshot_of_a_failed_start_is_written_and_exits_0(tmp_path):
    """`opscope gui --model BROKEN --screenshot PATH`: waits for the load to fail, writes the window
    (with its error dialog) and exits 0."""
    from PySide6.QtGui import QImage

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    shot = tmp_path / "failed-load.png"
    r = _opscope(["gui", "--model", str(bad), "--screenshot", str(shot)], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    image = QImage(str(shot))
    assert not image.isNull() and image.width() >= 800 and image.height() >= 500
    # the notification is logged too, one sentence naming the file and the defect (no class name)
    assert f"Could not load {bad} on cpu/float32: not a GGUF file" in r.stderr, r.stderr[-2000:]
    assert "BadMagic" not in r.stderr


@pytest.mark.gui
@pytest.mark.parametrize("where", ["missing-dir/shot.png", "."])
def test_screenshot_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, where):
    r = _opscope(["gui", "--screenshot", str(tmp_path / where)], tmp_path, timeout=120)
    assert r.returncode == 2
    assert r.stderr.startswith("opscope: error: cannot write the screenshot to ") and r.stderr.count("\n") == 1


def test_screenshot_option_is_taken_only_from_the_gui_command():
    from opscope.app.cli import split_screenshot

    assert split_screenshot(["gui", "--screenshot", "a.png", "-m", "m.gguf"]) == (["gui", "-m", "m.gguf"], "a.png")
    assert split_screenshot(["--db", "sqlite:///x", "--screenshot=b.png"]) == (["--db", "sqlite:///x"], "b.png")
    assert split_screenshot(["bench", "--screenshot", "x"]) == (["bench", "--screenshot", "x"], None)
