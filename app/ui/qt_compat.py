"""Work-arounds for bugs in the Qt binding, applied once when any Qt module of the app is imported.

PySide6 6.12.0 on CPython 3.11: the binding returns ``None``, ``True`` and ``False`` without taking
a reference (as CPython 3.12's limited-API ``Py_RETURN_NONE`` does, where those objects are
immortal). Every void Qt call (``setVisible``, ``setText``, ``drawLine``: hundreds per pyqtgraph
frame) and every ``Signal.emit()`` drops one reference, and within seconds CPython deallocates
``None`` or ``True`` and aborts with "Fatal Python error: none_dealloc" / "bool_dealloc".

The fix measures the leak and, only where it is present, gives these static singletons a reserve
of references so large that no session can use it up. They are never freed anyway, so an inflated
count changes nothing else.
"""

from __future__ import annotations

import ctypes
import logging
import sys

from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)

_RESERVE = 1 << 48  # ~2.8e14 calls: a million per second for 9 years
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


def void_call_leaks_none() -> bool:
    """Whether a Qt method returning nothing drops a reference to None (measured, not assumed)."""
    probe = _Probe()
    before = sys.getrefcount(None)
    for _ in range(16):
        probe.setObjectName("probe")
    return sys.getrefcount(None) <= before - 16


def install() -> bool:
    """Apply the work-around where needed; returns whether it was applied. Idempotent."""
    global _installed
    if _installed or sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return _installed
    if emit_leaks_true() or void_call_leaks_none():
        for singleton in (None, True, False, NotImplemented, Ellipsis):
            # ob_refcnt is the first field of every PyObject in release builds of CPython 3.11.
            ctypes.c_ssize_t.from_address(id(singleton)).value += _RESERVE
        _installed = True
        log.info("the Qt binding leaks references to None/True/False: reserve added (app/ui/qt_compat.py)")
    return _installed


install()
