"""Ctrl-C and SIGTERM close the window, the way its close button does (panels and the engine worker
shut down, the layout saved), then the command prints one line and exits 130/143.

engine.cli's handlers raise KeyboardInterrupt wherever Python runs next, which in a window is any
Qt slot (a paint, a timer): the slot's caller printed "Internal error: KeyboardInterrupt" and the
window stayed open. And while Qt's event loop sleeps in C++, no Python runs to see a signal at
all. So while the window is open the signals only record themselves, and signal.set_wakeup_fd
writes a byte to a socket a QSocketNotifier watches: the loop wakes, and the close is posted as
an ordinary event (the napari/IPython pattern).
"""

from __future__ import annotations

import logging
import signal
import socket

from PySide6.QtCore import QObject, QSocketNotifier, QTimer

log = logging.getLogger(__name__)

STOPS = (signal.SIGINT, signal.SIGTERM)
READY_MESSAGE = "window open; Ctrl-C or SIGTERM closes it"


class CloseOnSignal(QObject):
    """While installed, SIGINT/SIGTERM call ``close()`` (once) from the event loop; ``signum`` says
    which one came. A signal the parent set to be ignored (a background job) stays ignored."""

    def __init__(self, close, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.signum: int | None = None
        self._close = close
        self._reader, self._writer = socket.socketpair()
        for sock in (self._reader, self._writer):
            sock.setblocking(False)
        self._wakeup_before = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._notifier = QSocketNotifier(self._reader.fileno(), QSocketNotifier.Read, self)
        self._notifier.activated.connect(self._drain)
        self._handlers_before = {
            sig: signal.signal(sig, self._on_signal) for sig in STOPS if signal.getsignal(sig) is not signal.SIG_IGN
        }
        QTimer.singleShot(0, lambda: log.info(READY_MESSAGE))  # the loop runs and listens

    def _on_signal(self, signum: int, _frame) -> None:
        if self.signum is None:  # a second Ctrl-C while the window closes changes nothing
            self.signum = signum
            QTimer.singleShot(0, self._close)

    def _drain(self) -> None:
        """The byte only woke the loop (Python has run the handler by now); empty the socket."""
        try:
            while self._reader.recv(512):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def uninstall(self) -> None:
        """Put back the handlers and the wakeup fd that were there before."""
        for sig, handler in self._handlers_before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        signal.set_wakeup_fd(self._wakeup_before)
        self._notifier.setEnabled(False)
        self._reader.close()
        self._writer.close()

    @property
    def exit_code(self) -> int | None:
        return None if self.signum is None else 128 + self.signum

    @property
    def line(self) -> str:
        return "terminated" if self.signum == signal.SIGTERM else "interrupted"
