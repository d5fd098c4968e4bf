"""Python's cyclic garbage collection paused over a region.

Two kinds of region want it: one that builds many objects it keeps (a model's vocabulary: 100k+
strings and tuples, where each automatic full collection walks the whole heap and frees nothing,
docs/decisions/0012-gc-paused-while-loading.md), and one whose timing a collection would distort (a
trace). Regions may nest and overlap across threads (the window loads a model in a worker while a
trace may run), so they share one count: collection resumes when the last region ends, and only if
it was on before the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
