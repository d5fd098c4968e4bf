"""Standard output of the `opscope` process: a write that fails is one line and a non-zero exit,
never a silent 0 (argparse drops a failed ``--help``) nor Python's "Exception ignored" at exit.

guard() puts a text stream over fd 1 whose failed writes raise StdoutError (an OSError naming
standard output, unlike a failed write to a file the command opened); engine.cli turns it into:
- a full disk (ENOSPC, EDQUOT, EFBIG), a closed descriptor (``>&-``: EBADF) or any other failure:
  ``opscope: error: cannot write to standard output: …``, exit 2;
- a reader that went away (EPIPE, ``opscope runs list | head -1``): no message, exit 141, what a
  command killed by SIGPIPE reports, as ``yes | head`` does. Python ignores SIGPIPE (its docs advise
  against restoring it: a dropped socket would kill the process), so the broken pipe arrives as an
  error and is ended here the way the docs recommend, without another error at exit.
After a failure the stream discards what is left, so the flush at exit cannot fail again.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys

EXIT_BROKEN_PIPE = 128 + getattr(signal, "SIGPIPE", 13)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, over quota, past a file-size limit


class StdoutError(OSError):
    """A write to standard output failed."""


class _Raw(io.RawIOBase):
    """fd 1 (or nothing, when it was closed at start), raising StdoutError, then discarding."""

    def __init__(self, fd: int | None):
        super().__init__()
        self.fd, self.discard = fd, False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        if self.fd is None:
            raise OSError(errno.EBADF, "standard output is closed")
        return self.fd

    def isatty(self) -> bool:
        return self.fd is not None and os.isatty(self.fd)

    def write(self, data) -> int | None:
        if self.discard:
            return len(data)
        try:
            if self.fd is None:
                raise OSError(errno.EBADF, "Bad file descriptor")
            return os.write(self.fd, data)
        except BlockingIOError:  # a non-blocking stdout that is full: BufferedWriter keeps the data
            return None
        except OSError as e:
            closed = " (it is closed)" if e.errno == errno.EBADF else ""
            raise StdoutError(e.errno, f"{e.strerror}{closed}") from None


def guard(closed_is_error: bool = True) -> None:
    """Standard output through _Raw. ``closed_is_error``: whether a process started without fd 1
    (sys.stdout None) must fail when it prints; not for the window, whose windowed launch has none."""
    old = sys.stdout
    if old is None:
        if closed_is_error:
            sys.stdout = io.TextIOWrapper(io.BufferedWriter(_Raw(None)), encoding="utf-8")
        return
    try:
        fd = old.fileno()
        old.flush()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): leave it alone
        return
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(_Raw(fd)), encoding=old.encoding, errors=old.errors, line_buffering=bool(old.line_buffering)
    )


def flush() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


def failed(e: StdoutError) -> int:
    """The exit status for a failed write to standard output, after its one line (none for EPIPE)."""
    raw = getattr(getattr(sys.stdout, "buffer", None), "raw", None)
    if isinstance(raw, _Raw):
        raw.discard = True
    if e.errno == errno.EPIPE:
        return EXIT_BROKEN_PIPE
    hint = " — free some disk space and retry" if e.errno in DISK_FULL else ""
    print(f"opscope: error: cannot write to standard output: {e.strerror}{hint}", file=sys.stderr, flush=True)
    return 2
