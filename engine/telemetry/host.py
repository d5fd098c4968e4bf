"""The host through psutil: CPU % (total and per core), system RAM, and one process's RSS and CPU %.

CPU % is computed here from ``psutil.cpu_times(percpu=True)`` deltas rather than with
``psutil.cpu_percent``, whose "since the last call" state is global to the process: a second
caller (the GUI, another sampler) would silently shorten our interval.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from opscope.engine.telemetry.base import LogOnce, Source

log = logging.getLogger(__name__)
_once = LogOnce(log)


class HostSource(Source):
    """Series: ``host.cpu_pct``, ``host.cpu<N>_pct``, ``host.ram_used_bytes`` (total - available),
    ``host.ram_total_bytes``, ``proc.rss_bytes``, ``proc.cpu_pct`` (100 = one core busy).

    ``pid``: the process to watch (default: this one; the GUI passes the engine worker's pid).
    """

    name = "host"

    def __init__(self, pid: int | None = None) -> None:
        super().__init__()
        self.pid = pid or os.getpid()
        self._psutil: Any = None
        self._proc: Any = None
        self._last_times: list[tuple[float, float]] = []  # per core: (busy_s, idle_s)
        self._last_cpu: dict[str, float] = {}
        self._max_cpu_pct = 100.0

    def _open(self) -> None:
        try:
            import psutil
        except ImportError:
            self._unavailable("psutil is not installed (pip install psutil)", missing_package=True)
            return
        self._psutil = psutil
        self._last_times = self._core_times()
        n_cores = len(self._last_times)
        self._max_cpu_pct = 100.0 * (psutil.cpu_count() or 1)
        try:
            self._proc = psutil.Process(self.pid)
            self._proc.cpu_percent()  # the first call only primes its interval
        except psutil.Error as e:
            log.warning("host telemetry: process %d not readable: %s", self.pid, e)
            self._proc = None
        units = {
            "host.cpu_pct": "%",
            **{f"host.cpu{i}_pct": "%" for i in range(n_cores)},
            "host.ram_used_bytes": "bytes",
            "host.ram_total_bytes": "bytes",
            "proc.rss_bytes": "bytes",
            "proc.cpu_pct": "%",
        }
        self._ready(units)

    def _sample(self) -> dict[str, float]:
        out = self._cpu()
        mem = self._psutil.virtual_memory()
        out["host.ram_used_bytes"] = float(mem.total - mem.available)
        out["host.ram_total_bytes"] = float(mem.total)
        out.update(self._process())
        return out

    def _core_times(self) -> list[tuple[float, float]]:
        cores = []
        for t in self._psutil.cpu_times(percpu=True):
            # Same accounting as psutil.cpu_percent on Linux: guest time is already in user time,
            # and iowait counts as idle.
            total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
            idle = t.idle + getattr(t, "iowait", 0.0)
            cores.append((total - idle, idle))
        return cores

    def _cpu(self) -> dict[str, float]:
        now = self._core_times()
        out: dict[str, float] = {}
        busy_sum = total_sum = 0.0
        for i, ((b0, i0), (b1, i1)) in enumerate(zip(self._last_times, now)):
            # iowait (idle here) is not monotonic on Linux (proc(5)): a drop would shrink the
            # interval and read above 100 %, so idle time never counts backwards.
            d_busy, d_idle = max(b1 - b0, 0.0), max(i1 - i0, 0.0)
            d_total = d_busy + d_idle
            out[f"host.cpu{i}_pct"] = 100.0 * d_busy / d_total if d_total > 0 else 0.0
            busy_sum, total_sum = busy_sum + d_busy, total_sum + d_total
        if total_sum <= 0 and self._last_cpu:
            # Two samples inside one clock tick (a starved sampler catching up): no new
            # information, so the last reading stands rather than a false 0 %.
            return dict(self._last_cpu)
        out["host.cpu_pct"] = 100.0 * busy_sum / total_sum if total_sum > 0 else 0.0
        self._last_times, self._last_cpu = now, dict(out)
        return out

    def _process(self) -> dict[str, float]:
        if self._proc is None:
            return {}
        try:
            with self._proc.oneshot():
                # CPU time comes in 10 ms jiffies: over a short interval one extra jiffy reads
                # as several cores' worth, so the value is clamped to what the machine has.
                cpu_pct = min(float(self._proc.cpu_percent()), self._max_cpu_pct)
                return {"proc.rss_bytes": float(self._proc.memory_info().rss), "proc.cpu_pct": cpu_pct}
        except self._psutil.NoSuchProcess:  # it exited: its fields read NaN (`opscope monitor` says so and stops)
            _once(("proc", self.pid), logging.INFO, "host telemetry: process %d exited", self.pid)
            return {}
        except self._psutil.Error as e:
            _once(("proc", self.pid), logging.WARNING, "host telemetry: process %d: %s", self.pid, e)
            return {}
