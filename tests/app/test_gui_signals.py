"""Ctrl-C in the terminal closes the window the way its close button does: one line, exit 130."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from opscope.app.window.stop_signals import READY_MESSAGE

LOG_LEVELS = ("DEBUG ", "INFO ")  # --debug's log lines (format "LEVEL name: message"), hidden without it
QT_OFFSCREEN_NOISE = "This plugin does not support propagateSizeHints()"  # the offscreen platform's own


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))
    into.put(None)


def test_ctrl_c_closes_the_window_saves_settings_and_prints_one_line(tmp_path):
    # --debug only to see the ready line; what a user sees without it is the non-log lines.
    proc = subprocess.Popen(
        [sys.executable, "-m", "opscope", "gui", "--debug"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stderr, lines), daemon=True).start()
    try:
        before = []
        while (line := lines.get(timeout=60)) is None or READY_MESSAGE not in line:
            assert line is not None, "the window ended before it was up:\n" + "\n".join(before)
            before.append(line)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)  # without the fix: KeyboardInterrupt in a slot, the window stays open
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    after = []
    while (line := lines.get(timeout=10)) is not None:
        after.append(line)
    seen = [ln for ln in after if ln.strip() and not ln.startswith(LOG_LEVELS) and ln != QT_OFFSCREEN_NOISE]
    assert (code, seen) == (130, ["opscope: interrupted"]), "\n".join(after)
    assert not [ln for ln in after if "Internal error" in ln or "Traceback" in ln or "crashed" in ln]
    ini = Path(os.environ["XDG_CONFIG_HOME"]) / "opscope" / "opscope-gui.ini"
    assert "geometry" in ini.read_text()  # closed through the window's closeEvent: its layout was saved
