"""What kind of thing a model path is, decided from ``stat`` and the first bytes, before any reader
opens it: a named pipe would block ``open``, /dev/zero would map endless zeros, and a pickle would
run code when loaded."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from opscope.engine.errors import NotARegularFile, Truncated, UnsafeFormat

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_regular_file(path: Path) -> int:
    """The size of ``path`` in bytes; NotARegularFile for a pipe, device, socket or directory,
    Truncated for an empty file."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise NotARegularFile(path, f"is {kind}, not a model file")
    size = os.stat(path).st_size
    if size == 0:
        raise Truncated(path, "file is empty (0 bytes)")
    return size


def is_pickle(head: bytes) -> bool:
    """A pickle stream (protocol 2+) or a zip archive, the container torch.save writes."""
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head[:4] == b"PK\x03\x04"


def refuse_pickle(path: Path) -> UnsafeFormat:
    return UnsafeFormat(path, "holds pickle weights (PyTorch .bin/.pt), which this engine refuses to load")
