"""Thread pinning: one torch (OpenMP) thread per physical core, never migrated.

Batch-1 decode runs hundreds of short parallel regions per token; a thread that the scheduler
moves between cores loses its L1/L2-resident activations and arrives late at every barrier.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def physical_cores() -> list[int]:
    """One logical cpu per physical core among those this process may run on (Linux sysfs)."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    seen, cores = set(), []
    for cpu in allowed:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                key = f.read().strip()
        except OSError:
            key = str(cpu)
        if key not in seen:
            seen.add(key)
            cores.append(cpu)
    return cores


def pin_threads() -> list[int]:
    """Bind torch's threads to distinct physical cores; returns the cpu each thread got (-1: not bound)."""
    from opscope.engine.fastpath.kernels import load_kernels

    cores = physical_cores()
    bound = list(load_kernels().pin_threads(cores))
    log.info("fast path: pinned %d torch threads to cpus %s", len(bound), bound)
    return bound
