"""The first source frame outside torch and the trace machinery: where a user's code called the op.

Walking frames costs a few microseconds per op, so the capture calls this only when asked
(TraceOptions.source). The skip decision is cached per code file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import FrameType

_TORCH_DIR = ""
_THIS_DIR = os.path.dirname(os.path.abspath(__file__))
# The capture's own files; the rest of engine/trace (the planted bugs, notably) is user code.
_MACHINERY = frozenset(
    [
        os.path.join(_THIS_DIR, name)
        for name in ("capture.py", "source.py", "modstack.py", "simulate.py", "devtime.py", "health.py", "script.py")
    ]
    + [os.path.join(os.path.dirname(_THIS_DIR), "userapi.py")]
)
_skip_cache: dict[str, bool] = {}


def _torch_dir() -> str:
    global _TORCH_DIR  # set once, lazily: importing torch here at module import would be wasted
    if not _TORCH_DIR:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    return _TORCH_DIR


def _skipped(filename: str) -> bool:
    skip = _skip_cache.get(filename)
    if skip is None:
        path = os.path.abspath(filename)
        skip = (
            path.startswith(_torch_dir())
            or path in _MACHINERY
            or filename.startswith("<frozen")
            or os.sep + "contextlib.py" in path
            or os.sep + "functools.py" in path
        )
        _skip_cache[filename] = skip
    return skip


def caller_site(depth: int = 2) -> tuple[str, int] | None:
    """(filename, line) of the first frame outside torch and the trace machinery, or None."""
    frame: FrameType | None = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _skipped(filename):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None


_ROOT = Path(_THIS_DIR).parent.parent  # the checkout: engine/ lives directly under it
_short_cache: dict[str, str] = {}


def short_path(filename: str) -> str:
    """A path relative to the checkout (or the working directory) when under it, else as is."""
    short = _short_cache.get(filename)
    if short is None:
        short = filename
        for root in (_ROOT, Path.cwd()):
            try:
                short = str(Path(filename).resolve().relative_to(root.resolve()))
                break
            except ValueError:
                continue
        _short_cache[filename] = short
    return short


def format_site(site: tuple[str, int] | None) -> str | None:
    return None if site is None else f"{short_path(site[0])}:{site[1]}"
