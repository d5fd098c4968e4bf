"""Progress of a slow one-time step (the first build of the CPU kernels takes minutes): logged on
the ``opscope.progress`` logger at INFO. A library user sees it only if their logging shows INFO;
the `opscope` command shows it (show_on_stderr) as one ``opscope: …`` line on stderr, whatever its
log level, so a first run does not look hung."""

from __future__ import annotations

import logging
import sys

LOGGER = "opscope.progress"
log = logging.getLogger(LOGGER)


class _StderrLine(logging.Handler):
    """One ``opscope: message`` line on the current sys.stderr (looked up at each line: tests and
    the CLI's guards replace it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(f"opscope: {record.getMessage()}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr closed: progress is not worth failing for
            pass


def show_on_stderr() -> None:
    """The command's choice: progress lines on stderr (once, not again through the root logger)."""
    if not any(isinstance(h, _StderrLine) for h in log.handlers):
        log.addHandler(_StderrLine())
    log.setLevel(logging.INFO)
    log.propagate = False
