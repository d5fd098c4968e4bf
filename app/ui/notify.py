"""The one funnel every user-facing error and notice goes through (napari's notification manager).

Everything that fails reports to a ``Notifier``: engine jobs and a crashed worker (the window
forwards ``EngineClient.jobFailed``/``crashed``), exports (``export_guard``), and exceptions nobody
caught, on any thread (``install_excepthooks``). The main window shows each notice in its
``NotificationArea`` (cards in the lower right corner of the window, over the panels, with the
reason and a "Details…" view of the traceback) and logs it. A notice marked ``modal`` (a failure the
user must act on, such as a model that did not load) opens a window-modal dialog instead of a card, with
``open()``: asynchronous, so the event loop keeps running behind it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from opscope.app.ui import qt_compat  # noqa: F401  (must run before any emit)
from PySide6.QtCore import QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMessageBox, QPushButton, QVBoxLayout, QWidget

log = logging.getLogger(__name__)

MAX_CARDS = 4  # older cards give way: the latest failures matter most
INFO_LIFETIME_MS = 8000  # info notices leave on their own; errors stay until dismissed


@dataclass(frozen=True)
class Notice:
    level: str  # "error" | "warning" | "info"
    message: str  # what failed, on which object, what to do
    details: str = ""  # a traceback or the worker's last output
    modal: bool = False  # the user must act on it: the window also opens a dialog
    title: str = ""  # the dialog's title for modal notices


class Notifier(QObject):
    """Collects notices from any thread and delivers them on the GUI thread (``posted``)."""

    posted = Signal(object)  # Notice
    _relay = Signal(object)  # crosses threads: a queued connection when emitted off the GUI thread

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.history: list[Notice] = []
        self._relay.connect(self._deliver)

    def post(self, level: str, message: str, details: str = "", *, modal: bool = False, title: str = "") -> Notice:
        notice = Notice(level, message, details, modal, title)
        self._relay.emit(notice)
        return notice

    def error(self, message: str, details: str = "", *, modal: bool = False, title: str = "") -> Notice:
        return self.post("error", message, details, modal=modal, title=title)

    def warning(self, message: str, details: str = "") -> Notice:
        return self.post("warning", message, details)

    def info(self, message: str, details: str = "") -> Notice:
        return self.post("info", message, details)

    def _deliver(self, notice: Notice) -> None:
        self.history.append(notice)
        getattr(log, "info" if notice.level == "info" else "warning")("%s: %s", notice.level, notice.message)
        self.posted.emit(notice)


class NoticeCard(QFrame):
    """One notice: the one-line reason, "Details…" (the traceback) and "Dismiss"."""

    dismissed = Signal(object)  # this card

    def __init__(self, notice: Notice, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.notice = notice
        self.setObjectName("noticeBar")  # styled by resources/*.qss
        self.setProperty("level", notice.level)
        self.setAutoFillBackground(True)  # an overlay: the panels must not show through
        self.text = QLabel(
            notice.message, objectName="noticeText", wordWrap=True, textInteractionFlags=Qt.TextSelectableByMouse
        )
        self.details_button = QPushButton("Details…", clicked=self.show_details)
        self.details_button.setVisible(bool(notice.details))
        self.dismiss_button = QPushButton("Dismiss", clicked=self.dismiss)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        layout.addWidget(self.text, 1, Qt.AlignVCenter)
        layout.addWidget(self.details_button, 0, Qt.AlignTop)
        layout.addWidget(self.dismiss_button, 0, Qt.AlignTop)
        self.details_box: QMessageBox | None = None

    def show_details(self) -> QMessageBox:
        self.details_box = details_dialog(self.window(), self.notice, "Details")
        self.details_box.open()
        return self.details_box

    def dismiss(self) -> None:
        self.dismissed.emit(self)


def details_dialog(parent: QWidget, notice: Notice, title: str = "") -> QMessageBox:
    """A dialog with the notice's headline (its title, when it has one), its reason and, behind
    "Show Details…", the traceback."""
    icon = QMessageBox.Critical if notice.level == "error" else QMessageBox.Information
    box = QMessageBox(
        icon, f"OpScope — {title or notice.level}", notice.title or notice.message, QMessageBox.Ok, parent
    )
    box.setTextInteractionFlags(Qt.TextSelectableByMouse)
    if notice.title:
        box.setInformativeText(notice.message)
    if notice.details:
        box.setDetailedText(notice.details)
    return box


class NotificationArea(QWidget):
    """The window's notification area: a stack of cards floating in its lower right corner above
    the status bar (where napari shows its notifications), newest at the bottom."""

    changed = Signal()

    def __init__(self, notifier: Notifier, host: QWidget) -> None:
        super().__init__(host)
        self.setObjectName("notificationArea")
        self.host = host
        self.cards: list[NoticeCard] = []
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        notifier.posted.connect(self.add)
        host.installEventFilter(self)  # follow the window's size
        self.hide()

    @property
    def latest(self) -> NoticeCard | None:
        return self.cards[-1] if self.cards else None

    def add(self, notice: Notice) -> NoticeCard | None:
        if notice.modal:  # the window shows it in a dialog: a card too would say it twice
            return None
        card = NoticeCard(notice, self)
        card.dismissed.connect(self.remove)
        self.cards.append(card)
        self._layout.addWidget(card)
        card.show()  # a layout shows a new child of a visible parent only on the next event loop pass
        while len(self.cards) > MAX_CARDS:
            self.remove(self.cards[0])
        if notice.level == "info":
            QTimer.singleShot(INFO_LIFETIME_MS, card, card.dismiss)
        self._relayout()
        return card

    def remove(self, card: NoticeCard) -> None:
        if card in self.cards:
            self.cards.remove(card)
            card.hide()
            card.deleteLater()
            self._relayout()

    def dismiss_all(self) -> None:
        for card in list(self.cards):
            self.remove(card)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.host and event.type() in (QEvent.Resize, QEvent.Show, QEvent.LayoutRequest):
            self._place()
        return False

    def _relayout(self) -> None:
        self.setVisible(bool(self.cards))
        self._place()
        self.changed.emit()

    def _place(self) -> None:
        if not self.cards:
            return
        margin = 12
        width = max(min(620, self.host.width() - 2 * margin), 200)
        self.setFixedWidth(width)
        self._layout.activate()
        layout = self._layout
        height = layout.totalHeightForWidth(width) if layout.hasHeightForWidth() else layout.totalSizeHint().height()
        self.setFixedHeight(height)
        status = getattr(self.host, "statusBar", None)
        bottom = self.host.height() - (status().height() if callable(status) and status().isVisible() else 0)
        self.move(self.host.width() - width - margin, max(bottom - self.height() - margin, 0))
        self.raise_()


# -- exceptions nobody caught -----------------------------------------------------------------------
def install_excepthooks(notifier: Notifier) -> Callable[[], None]:
    """Route uncaught exceptions (GUI thread, Qt slots, other threads) into ``notifier``; returns
    the function that puts the previous hooks back."""
    previous_sys, previous_thread = sys.excepthook, threading.excepthook

    def sys_hook(exc_type, exc, tb) -> None:
        _report(notifier, exc_type, exc, tb, "")

    def thread_hook(args) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "a thread"
        _report(notifier, args.exc_type, args.exc_value, args.exc_traceback, f" in {name}")

    sys.excepthook, threading.excepthook = sys_hook, thread_hook

    def uninstall() -> None:
        if sys.excepthook is sys_hook:
            sys.excepthook = previous_sys
        if threading.excepthook is thread_hook:
            threading.excepthook = previous_thread

    return uninstall


def _report(notifier: Notifier, exc_type, exc, tb, where: str) -> None:
    details = "".join(traceback.format_exception(exc_type, exc, tb))
    try:
        log.error("uncaught exception%s:\n%s", where, details)
        notifier.error(
            f"Internal error{where}: {exc_type.__name__}: {exc}. The window keeps running; "
            f"the details hold the traceback (please report it).",
            details,
        )
    except Exception:  # the funnel itself failed (the window is gone): the terminal is all that is left
        sys.__excepthook__(exc_type, exc, tb)


@contextlib.contextmanager
def export_guard(widget: QWidget, what: str, path: str) -> Iterator[None]:
    """Report a failed export/save (disk full, no permission, engine error) through the window's
    notifier with what was written where, instead of an uncaught exception."""
    try:
        yield
    except Exception as e:  # OSError, EngineError, ValueError: all the same to the user here
        notifier = getattr(widget.window(), "notifier", None)
        if notifier is None:
            raise
        notifier.error(f"Could not {what} to {path}: {_reason(e)}", traceback.format_exc())


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return f"{type(error).__name__}: {error}" if not str(error) else str(error)
