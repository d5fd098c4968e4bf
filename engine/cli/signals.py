"""Ctrl-C and SIGTERM as exceptions for the `opscope` command (engine.cli's main turns them into one
line and exit 130/143, after every clean-up that handles Ctrl-C has run).

Promises: no signal is lost and none is raised inside C code. While a C extension's init is on the
stack the handler only remembers the signal, and a one-shot interval timer (SIGALRM, every few ms)
raises it as soon as the init has returned. An exception Python swallows where it cannot propagate
(a weakref callback, a ``__del__``, a GC callback) reaches sys.unraisablehook: ours raises it
again the same way, from the next ordinary bytecode. The import of torch itself (and of numpy)
runs with SIGINT and SIGTERM blocked (HELD_IMPORTS, through a meta-path finder that install() puts
first; held()): a signal sent then is raised right after the import returns.

Why, and what it cost: docs/decisions/0002-signals-held-during-torch-import.md.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from types import FrameType

from opscope.engine.cli.args import Terminated

RETRY_S = 0.005  # how often a deferred signal looks again; an extension's init takes ~1 s at most
_pending: int | None = None  # the signal waiting for the extension's init to return
_alarm_before = None  # SIGALRM's handler before a deferral borrowed it
_raised: BaseException | None = None  # the exception the handler raised last
_hook_before = None  # sys.unraisablehook before install()
HELD_IMPORTS = frozenset({"torch", "numpy"})  # imported whole with SIGINT/SIGTERM held (see above)
_holding = 0  # how many held() blocks are open (nested imports)
_STOPS = (signal.SIGINT, signal.SIGTERM)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _holding:  # unblocked as a hold ends, or taken by another thread: raised once the hold is over
        _remember(signum)
        return
    if _in_extension_init(frame):
        _defer(signum)
        return
    _stop_retrying()
    _raise_now(signum, frame)


def _remember(signum: int) -> None:
    global _pending
    if _pending != signal.SIGTERM:  # SIGTERM wins over a Ctrl-C also waiting
        _pending = signum


def _defer(signum: int) -> None:
    _remember(signum)
    _retry_soon()


@contextmanager
def held():
    """SIGINT and SIGTERM wait until the block ends and are raised then (blocked in this thread, so
    no handler runs inside the C++ code of the block; one that reaches another thread is kept)."""
    global _holding
    mask = hasattr(signal, "pthread_sigmask")
    _holding += 1
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS) if mask else None
    try:
        yield
    finally:
        try:
            if (
                before is not None
            ):  # a signal blocked meanwhile is handled now, still held: remembered, not raised here,
                signal.pthread_sigmask(signal.SIG_SETMASK, before)  # inside the import system's frames
        finally:
            _holding -= 1
        if not _holding and _pending is not None and hasattr(signal, "setitimer"):
            _retry_soon()  # raised a few ms later, once the import has returned


class _HeldLoader:
    """The package's own loader, run with the signals held; exec_module puts the real loader back in
    the module (its spec and ``__loader__``) before running it."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        if name == "loader":  # an instance made without __init__ (a copy)
            raise AttributeError(name)
        return getattr(self.loader, name)

    def create_module(self, spec):
        with held():
            return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        with held():
            self.loader.exec_module(module)


class _HoldHeavyImports:
    """Meta-path finder: the import of a package in HELD_IMPORTS runs inside held()."""

    def find_spec(self, name, path=None, target=None):
        if name not in HELD_IMPORTS or self not in sys.meta_path:  # (restore() ran meanwhile)
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1 :]:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _HeldLoader(spec.loader)
                return spec
        return None


_finder = _HoldHeavyImports()


def _unraisable(info) -> None:
    """Our exception, swallowed where Python could not raise it: raise it again shortly."""
    if _raised is not None and info.exc_value is _raised:
        _defer(signal.SIGTERM if isinstance(_raised, Terminated) else signal.SIGINT)
        return
    (_hook_before or sys.__unraisablehook__)(info)


def _retry(_signum: int, frame: FrameType | None) -> None:
    if _pending is not None:
        _on_signal(_pending, frame)


def _in_extension_init(frame: FrameType | None) -> bool:
    """Whether a C extension module's init (ExtensionFileLoader create/exec) is on the stack."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("create_module", "exec_module") and "_bootstrap" in code.co_filename:
            if type(frame.f_locals.get("self")).__name__ == "ExtensionFileLoader":
                return True
        frame = frame.f_back
    return False


def _retry_soon() -> None:
    global _alarm_before
    if _alarm_before is None:
        _alarm_before = signal.signal(signal.SIGALRM, _retry) or signal.SIG_DFL
    signal.setitimer(signal.ITIMER_REAL, RETRY_S)


def _stop_retrying() -> None:
    global _pending, _alarm_before
    _pending = None
    if _alarm_before is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, _alarm_before)
        _alarm_before = None


def install() -> dict:
    """Ctrl-C and SIGTERM raise (KeyboardInterrupt, engine.cli_args.Terminated). Returns the
    handlers they replace, for restore(). A signal the parent set to be ignored (a background job
    of a script: `opscope bench … &`) stays ignored."""
    global _hook_before
    handler = _on_signal if hasattr(signal, "setitimer") else _raise_now  # Windows: no timer to retry with
    if handler is _on_signal and sys.unraisablehook is not _unraisable:
        _hook_before, sys.unraisablehook = sys.unraisablehook, _unraisable
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return {
        sig: signal.signal(sig, handler)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }


def _raise_now(signum: int, _frame) -> None:
    global _raised
    _raised = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    raise _raised


def ignore_further() -> None:
    """While the one line is printed and the command ends: a second signal changes nothing."""
    if hasattr(signal, "setitimer"):
        _stop_retrying()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def restore(previous: dict) -> None:
    if hasattr(signal, "setitimer"):
        _stop_retrying()
    if sys.unraisablehook is _unraisable:
        sys.unraisablehook = _hook_before or sys.__unraisablehook__
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for sig, handler in previous.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
