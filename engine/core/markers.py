"""Phase markers: the engine says when model load, prefill, decode and benchmark iterations start
and end, on the one clock, and anyone (telemetry recorder, trace, GUI) can listen.

Emitting costs one list check when nobody listens, so the generation loop can call it freely.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opscope.engine.core.clock import now_ns

log = logging.getLogger(__name__)

# Phase names used by the engine; plugins may add their own.
MODEL_LOAD = "model_load"
PREFILL = "prefill"
DECODE = "decode"
BENCH_ITER = "bench_iter"


@dataclass(frozen=True, slots=True)
class Marker:
    phase: str
    edge: str  # "start" | "end"
    t_ns: int
    attrs: dict = field(default_factory=dict)


Listener = Callable[[Marker], None]
_listeners: list[Listener] = []
_lock = threading.Lock()


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` for every marker from now on; returns the function that unsubscribes."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def emit(phase: str, edge: str, t_ns: int | None = None, **attrs: Any) -> None:
    if not _listeners:
        return
    marker = Marker(phase, edge, now_ns() if t_ns is None else t_ns, attrs)
    for listener in list(_listeners):
        try:
            listener(marker)
        except Exception:  # a listener must never break generation
            log.exception("marker listener %r failed", listener)


@contextmanager
def phase(name: str, **attrs: Any) -> Iterator[None]:
    emit(name, "start", **attrs)
    try:
        yield
    finally:
        emit(name, "end", **attrs)
