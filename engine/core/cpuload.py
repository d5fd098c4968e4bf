"""How many CPU cores other processes keep busy (Linux /proc), and decode threads that leave them be.

Batch-1 decode on the CPU runs a hundred short parallel regions per token; when another process
holds one of the cores, every region waits for the descheduled worker, so decode gives a core back
while others use it (measurements: docs/decisions/0003-decode-threads-yield-to-busy-cores.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Reading:
    busy: int  # jiffies all cpus spent busy (user, nice, system, irq, softirq)
    own: int  # jiffies this process spent (utime + stime), and its children it waited for (cutime + cstime)
    t: float  # monotonic seconds


class OtherLoad:
    """Cores kept busy by *other* processes between two readings; None where /proc is missing."""

    def __init__(self, proc: Path = Path("/proc"), clock: Callable[[], float] = time.monotonic):
        self.proc, self.clock = proc, clock
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.n_cpus = os.cpu_count() or 1
        self._last = self._read()

    def _read(self) -> _Reading | None:
        try:
            cpu = (self.proc / "stat").read_text().split("\n", 1)[0].split()
            own = (self.proc / "self" / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in cpu[1:8])
        # a child we started and reaped (llama-bench in the peers suite) worked for us, not against us
        mine = sum(int(v) for v in own[11:15])
        return _Reading(user + nice + system + irq + softirq, mine, self.clock())

    def cores(self) -> float | None:
        """Busy cores of other processes since the previous call (or construction)."""
        now, last = self._read(), self._last
        self._last = now
        return self.between(last, now)

    def reading(self) -> _Reading | None:
        """A reading to pass to ``between`` later (leaves ``cores()``'s window alone); None without /proc."""
        return self._read()

    def between(self, last: _Reading | None, now: _Reading | None) -> float | None:
        """Busy cores of other processes from reading ``last`` to ``now``; None when unknown."""
        if now is None or last is None or now.t <= last.t:
            return None
        others = (now.busy - last.busy) - (now.own - last.own)
        return max(0.0, others / self.hz / (now.t - last.t))


class LoadAwareThreads:
    """Decode threads = the cores others leave free (at least 1, at most ``max_threads``),
    re-read every ``period_s`` of decoding; ``step()`` is called once per token."""

    def __init__(
        self,
        max_threads: int,
        set_threads: Callable[[int], None],
        load: OtherLoad | None = None,
        period_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_threads, self.set_threads, self.period_s, self.clock = max_threads, set_threads, period_s, clock
        self.load = load or OtherLoad()
        self.threads = max_threads
        self._next = clock() + period_s

    def step(self) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.period_s
        others = self.load.cores()
        if others is None:
            return
        want = max(1, min(self.max_threads, int(self.load.n_cpus - others + 0.5)))
        if want != self.threads:
            log.debug("decode threads %d -> %d (other processes busy on %.2f cores)", self.threads, want, others)
            self.set_threads(want)
            self.threads = want
