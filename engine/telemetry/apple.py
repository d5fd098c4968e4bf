"""Apple Silicon's unified memory as the system sees it: the process's physical footprint (what
Activity Monitor's "Memory" column and jetsam count: resident plus compressed, GPU buffers
included, which RSS misses on unified memory) and the system's memory-pressure level.

- ``apple.footprint_bytes``: ``proc_pid_rusage(pid, RUSAGE_INFO_V2).ri_phys_footprint`` (libproc).
- ``apple.memory_pressure``: ``kern.memorystatus_vm_pressure_level`` (sysctl): 1 normal, 2 warning,
  4 critical, as the kernel reports it.

macOS only; elsewhere the source is unavailable and says so (N/A). MLX's own allocator counters
(``mx.get_active_memory``...) are the ``mlx`` source (engine.telemetry.allocators).
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

from opscope.engine.telemetry.base import Source

RUSAGE_INFO_V2 = 2
PRESSURE_SYSCTL = b"kern.memorystatus_vm_pressure_level"


class _RusageInfoV2(ctypes.Structure):
    # <sys/resource.h> struct rusage_info_v2, up to ri_phys_footprint and the fields after it
    _fields_ = [("ri_uuid", ctypes.c_uint8 * 16)] + [
        (n, ctypes.c_uint64)
        for n in (
            "ri_user_time",
            "ri_system_time",
            "ri_pkg_idle_wkups",
            "ri_interrupt_wkups",
            "ri_pageins",
            "ri_wired_size",
            "ri_resident_size",
            "ri_phys_footprint",
            "ri_proc_start_abstime",
            "ri_proc_exit_abstime",
            "ri_child_user_time",
            "ri_child_system_time",
            "ri_child_pkg_idle_wkups",
            "ri_child_interrupt_wkups",
            "ri_child_pageins",
            "ri_child_elapsed_abstime",
            "ri_diskio_bytesread",
            "ri_diskio_byteswritten",
        )
    ]


class AppleMemorySource(Source):
    name = "apple"

    def __init__(self, pid: int | None = None) -> None:
        super().__init__()
        self.pid = pid or os.getpid()
        self._libproc: Any = None  # ctypes.CDLL once open() found macOS
        self._libc: Any = None

    def _open(self) -> None:
        if sys.platform != "darwin":
            self._unavailable(
                f"process footprint and memory pressure: N/A on {sys.platform} "
                f"(macOS kernel counters; RSS is in the host series)"
            )
            return
        self._libproc = ctypes.CDLL("/usr/lib/libproc.dylib", use_errno=True)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._ready({"apple.footprint_bytes": "bytes", "apple.memory_pressure": "level"})

    def _sample(self) -> dict[str, float]:
        return {"apple.footprint_bytes": self._footprint(), "apple.memory_pressure": self._pressure()}

    def _footprint(self) -> float:
        info = _RusageInfoV2()
        rc = self._libproc.proc_pid_rusage(self.pid, RUSAGE_INFO_V2, ctypes.byref(info))
        return float(info.ri_phys_footprint) if rc == 0 else float("nan")

    def _pressure(self) -> float:
        level, size = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
        rc = self._libc.sysctlbyname(PRESSURE_SYSCTL, ctypes.byref(level), ctypes.byref(size), None, 0)
        return float(level.value) if rc == 0 else float("nan")
