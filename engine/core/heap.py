"""Freed memory kept in the process's heap (glibc), so that large temporaries are reused, not
faulted in afresh.

glibc serves a block of 128 KiB or more (its threshold grows only as large blocks are freed) with
its own ``mmap`` and gives it back on ``free``, and gives the heap's top back past 128 KiB free. A
prefill allocates and frees tens of MB of temporaries per pass (activations, int8 rows, GEMM
outputs), so every pass faulted in fresh zeroed pages: 62,000 minor faults and 160 ms of system
time per 512-token pass of SmolLM2 on 2 threads (docs/decisions/cpu-variants.md, session 15).
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's largest accepted on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 512 << 20

_kept = False


def keep_freed_memory() -> bool:
    """Blocks up to 32 MiB from the heap, and the heap's free top kept up to 512 MiB, where the C
    library is glibc (elsewhere nothing changes). Process-wide, once; returns whether it holds."""
    global _kept
    if _kept:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: glibc's (find_library would spawn ldconfig)
        ok = bool(
            libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        )
    except (OSError, AttributeError) as e:
        log.debug("heap: mallopt unavailable: %s", e)
        return False
    _kept = ok
    log.debug("heap: freed blocks up to %d MiB kept for reuse: %s", MMAP_THRESHOLD >> 20, ok)
    return ok
