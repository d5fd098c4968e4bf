"""A telemetry source for the engine worker process, whose pid changes when the worker restarts.

engine.telemetry's HostSource watches one pid for its lifetime; the GUI's sampler lives longer
than any one worker, so this source follows the current worker instead (series ``engine.*``).
Qt-free, like every Source.
"""

from __future__ import annotations

import threading
from typing import Any

from opscope.engine import Source


class EngineProcessSource(Source):
    """Series: ``engine.rss_bytes``, ``engine.cpu_pct`` (100 = one core busy); NaN while no worker runs."""

    name = "engine-process"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._psutil: Any = None
        self._proc: Any = None

    def set_pid(self, pid: int | None) -> None:
        """Watch ``pid`` from the next tick on (None: no worker)."""
        proc = None
        if pid and self._psutil is not None:
            try:
                proc = self._psutil.Process(pid)
                proc.cpu_percent()  # primes the interval; the first real value comes next tick
            except self._psutil.Error:
                proc = None
        with self._lock:
            self._proc = proc

    def _open(self) -> None:
        try:
            import psutil
        except ImportError:
            self._unavailable("psutil is not installed (pip install psutil)", missing_package=True)
            return
        self._psutil = psutil
        self._ready({"engine.rss_bytes": "bytes", "engine.cpu_pct": "%"})

    def _sample(self) -> dict[str, float]:
        with self._lock:
            proc = self._proc
        if proc is None:
            return {}
        try:
            with proc.oneshot():
                return {"engine.rss_bytes": float(proc.memory_info().rss), "engine.cpu_pct": float(proc.cpu_percent())}
        except self._psutil.Error:  # the worker exited between ticks: NaN until the next one
            return {}
