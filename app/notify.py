"""The one funnel every user-facing error and notice goes through (napari's habit).

Models and workers report here; the main window shows the latest notice in its notice bar and
the status bar, and the log keeps every one. Nothing pops up a modal dialog on its own: a modal
box in the middle of a generation would block the very event loop the app promises to keep free.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMessageBox, QPushButton, QWidget

from app import qt_compat  # noqa: F401  (must run before any emit)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Notice:
    level: str  # "error" | "warning" | "info"
    message: str  # what failed, on which object, what to do
    details: str = ""  # a traceback or the worker's last output


class Notifier(QObject):
    posted = Signal(object)  # Notice

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.history: list[Notice] = []

    def post(self, level: str, message: str, details: str = "") -> None:
        notice = Notice(level, message, details)
        self.history.append(notice)
        getattr(log, "info" if level == "info" else "warning")("%s: %s", level, message)
        self.posted.emit(notice)

    def error(self, message: str, details: str = "") -> None:
        self.post("error", message, details)

    def info(self, message: str, details: str = "") -> None:
        self.post("info", message, details)


class NoticeBar(QFrame):
    """A dismissible line above the panels showing the latest notice, with its details on demand."""

    dismissed = Signal()

    def __init__(self, notifier: Notifier, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("noticeBar")
        self.notice: Notice | None = None
        self.text = QLabel(objectName="noticeText", wordWrap=True)
        self.details_button = QPushButton("Details…", clicked=self._show_details)
        close = QPushButton("Dismiss", clicked=self.dismiss)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.details_button)
        layout.addWidget(close)
        notifier.posted.connect(self.show_notice)
        self.hide()

    def show_notice(self, notice: Notice) -> None:
        self.notice = notice
        self.setProperty("level", notice.level)
        self.style().unpolish(self)  # re-read the stylesheet: the level property changed
        self.style().polish(self)
        self.text.setText(notice.message)
        self.details_button.setVisible(bool(notice.details))
        self.show()

    def dismiss(self) -> None:
        self.notice = None
        self.hide()
        self.dismissed.emit()

    def _show_details(self) -> None:
        if self.notice is not None:
            box = QMessageBox(QMessageBox.Warning, "OpScope", self.notice.message, parent=self)
            box.setDetailedText(self.notice.details)
            box.open()  # window-modal but asynchronous: the event loop keeps running
