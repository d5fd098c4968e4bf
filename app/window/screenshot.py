"""`opscope gui --screenshot PATH`: open the window as usual, wait until the engine is idle (the
model loaded or failed to), write a PNG of the whole window and quit.

Dialogs the window has open (a failed model load opens one) are painted over the window at their
place, so the picture is what a person sees. Exit code 0, or 2 with one line on stderr when the
file cannot be written.
"""

from __future__ import annotations

import os
import sys

from PySide6.QtCore import QObject, QPoint, QTimer
from PySide6.QtGui import QImage, QImageWriter, QPainter
from PySide6.QtWidgets import QApplication, QDialog, QWidget

POLL_MS = 100
SETTLE_POLLS = 5  # idle for this many polls in a row: late layout and paint requests are done


def unwritable_reason(path: str) -> str | None:
    """Why ``path`` cannot be written, checked before the window opens; None when it can."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"the folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"no permission to write in {folder}"
    if os.path.isdir(path):
        return "it is a folder"
    return None


def grab_window(window: QWidget) -> QImage:
    """The window as rendered, with its visible dialogs painted on top where they sit."""
    image = window.grab().toImage()
    painter = QPainter(image)
    for dialog in window.findChildren(QDialog):
        if dialog.isVisible():
            painter.drawImage(_place(window, dialog), dialog.grab().toImage())
    painter.end()
    return image


def _place(window: QWidget, dialog: QWidget) -> QPoint:
    at = dialog.mapToGlobal(QPoint(0, 0)) - window.mapToGlobal(QPoint(0, 0))
    inside = (0 <= at.x() <= window.width() - dialog.width()) and (0 <= at.y() <= window.height() - dialog.height())
    if inside:
        return at
    # Offscreen platforms may leave a dialog at (0, 0) of the screen: centre it, as a window manager would.
    return QPoint(max((window.width() - dialog.width()) // 2, 0), max((window.height() - dialog.height()) // 3, 0))


def save_png(image: QImage, path: str) -> str | None:
    """Write ``image`` as PNG; the reason when that failed, else None."""
    writer = QImageWriter(path, b"png")
    if writer.write(image):
        return None
    return writer.errorString() or "the image could not be written"


class ScreenshotWhenIdle(QObject):
    """Waits for the window's engine to go idle, then saves the window and quits with the exit code."""

    def __init__(self, window, path: str) -> None:
        super().__init__(window)
        self.window, self.path = window, path
        window.save_layout_on_close = False  # a picture is no reason to change the user's layout
        self._idle_polls = 0
        self._timer = QTimer(self, interval=POLL_MS, timeout=self._poll)
        self._timer.start()

    def _poll(self) -> None:
        client = self.window.client
        idle = not client.busy and client.state in ("idle", "crashed", "stopped")
        self._idle_polls = self._idle_polls + 1 if idle else 0
        if self._idle_polls < SETTLE_POLLS:
            return
        self._timer.stop()
        error = save_png(grab_window(self.window), self.path)
        if error:
            print(f"opscope: error: cannot write the screenshot to {self.path}: {error}", file=sys.stderr)
        QApplication.instance().exit(2 if error else 0)
