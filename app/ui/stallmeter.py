"""Measure how long the GUI event loop goes without running (a stall), for tests and benchmarks.

A QTimer ticks every ``interval_ms``; each gap between ticks beyond the interval is time the loop
could not run. On a machine shared with other busy processes, part of a gap is the OS keeping the
runnable GUI thread off the CPU, which no code in the app can avoid; on Linux that part is read
from /proc/thread-self/schedstat (time spent waiting on a run queue) and reported separately, so
``max_blocked_ms`` is what the app itself caused.
"""

from __future__ import annotations

import time
from pathlib import Path

from opscope.app.ui import qt_compat  # noqa: F401  (must run before any emit)
from PySide6.QtCore import QObject, QTimer

_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def runqueue_wait_ns() -> int | None:
    """Nanoseconds this thread has spent runnable but waiting for a CPU (Linux), else None."""
    try:
        return int(_SCHEDSTAT.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None


class StallMeter(QObject):
    def __init__(self, interval_ms: int = 10, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.gaps_ms: list[float] = []
        self.blocked_ms: list[float] = []  # gap minus the run-queue wait inside it
        self._timer = QTimer(self, interval=interval_ms, timeout=self._tick)
        self._last = (0.0, 0)

    def start(self) -> StallMeter:
        self.gaps_ms.clear()
        self.blocked_ms.clear()
        self._last = (time.perf_counter(), runqueue_wait_ns() or 0)
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.stop()

    def _tick(self) -> None:
        now, wait = time.perf_counter(), runqueue_wait_ns() or 0
        gap_ms = (now - self._last[0]) * 1e3
        self.gaps_ms.append(gap_ms)
        self.blocked_ms.append(max(gap_ms - (wait - self._last[1]) / 1e6, 0.0))
        self._last = (now, wait)

    @property
    def max_gap_ms(self) -> float:
        return max(self.gaps_ms, default=0.0)

    @property
    def max_blocked_ms(self) -> float:
        return max(self.blocked_ms, default=0.0)

    def summary(self) -> str:
        gaps = sorted(self.gaps_ms)
        median = gaps[len(gaps) // 2] if gaps else 0.0
        return (
            f"{len(gaps)} ticks, median gap {median:.1f} ms, longest gap {self.max_gap_ms:.0f} ms, "
            f"longest blocked by the app {self.max_blocked_ms:.0f} ms (the rest: waiting for a CPU)"
        )
