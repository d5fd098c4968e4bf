"""Work-arounds for bugs in the Qt binding, applied once when any Qt module of the app is imported.

PySide6 6.12.0 on CPython 3.11: ``SignalInstance.emit()`` returns ``True`` without taking a
reference, so every Python-side emit (ours and pyqtgraph's, thousands per second while plotting)
drops one reference to ``True``. After a few hundred emits CPython deallocates ``True`` and aborts
with "Fatal Python error: bool_dealloc". CPython 3.12+ makes ``True`` immortal, which hides the bug.

The fix probes for the leak and, only where it is present, gives ``True`` a reserve of references
so large that no session can use it up. ``True`` is a static object that is never freed, so an
inflated count changes nothing else.
"""
from __future__ import annotations

import ctypes
import logging
import sys

from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)

_RESERVE = 1 << 48  # ~2.8e14 emits: a million emits per second for 9 years
_installed = False


class _Probe(QObject):
    ping = Signal()


def emit_leaks_true() -> bool:
    """Whether this binding drops a reference to True on every emit (measured, not assumed)."""
    probe = _Probe()
    before = sys.getrefcount(True)
    for _ in range(16):
        probe.ping.emit()
    return sys.getrefcount(True) <= before - 16


def install() -> bool:
    """Apply the work-around where needed; returns whether it was applied. Idempotent."""
    global _installed
    if _installed or sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return _installed
    if emit_leaks_true():
        # ob_refcnt is the first field of every PyObject in release builds of CPython 3.11.
        ctypes.c_ssize_t.from_address(id(True)).value += _RESERVE
        _installed = True
        log.info("PySide6 Signal.emit leaks references to True: reserve added (see app/qt_compat.py)")
    return _installed


install()
