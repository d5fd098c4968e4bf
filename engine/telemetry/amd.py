"""AMD GPUs through ``amdsmi`` (ROCm's Python bindings), where installed.

Same contract as the NVML source: lazy, one query wrapper, N/A for fields the device does not
report (amdsmi itself returns the string "N/A" for some of them), failures logged once. Written
against the amdsmi 7.0 Python API (units: VRAM in MB, power in W, clocks in MHz, temperature in
degrees C); not yet checked on AMD hardware.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from opscope.engine.telemetry.base import NA, LogOnce, Source, _NotAvailable, to_float

log = logging.getLogger(__name__)
_once = LogOnce(log)
_MB = 1024 * 1024

AMD_FIELDS = {
    "util_pct": "%",
    "mem_util_pct": "%",
    "mem_used_bytes": "bytes",
    "mem_total_bytes": "bytes",
    "power_w": "W",
    "power_limit_w": "W",
    "temp_c": "C",
    "sm_clock_mhz": "MHz",
    "mem_clock_mhz": "MHz",
    "proc_mem_bytes": "bytes",
}


class AmdSmiSource(Source):
    """One ``amd<N>.*`` group of series per AMD GPU; names match the NVIDIA ones where they exist
    (``sm_clock_mhz`` is the GFX clock)."""

    name = "amdsmi"

    def __init__(self, pids: set[int] | None = None) -> None:
        super().__init__()
        self.pids: frozenset[int] = frozenset(pids) if pids else frozenset({os.getpid()})
        self._smi: Any = None
        self._handles: list[Any] = []

    def _open(self) -> None:
        try:
            import amdsmi
        except ImportError:
            self._unavailable("no AMD GPU (amdsmi is not installed)", missing_package=True)
            return
        except OSError as e:  # the bindings load libamd_smi.so at import time
            self._unavailable(f"no AMD GPU (amdsmi: {e})")
            return
        try:
            amdsmi.amdsmi_init()
            self._handles = list(amdsmi.amdsmi_get_processor_handles())
        except amdsmi.AmdSmiException as e:
            self._unavailable(f"no AMD GPU (amdsmi: {e})")
            return
        if not self._handles:
            self._unavailable("no AMD GPU (amdsmi found no device)")
            return
        self._smi = amdsmi
        self._ready({f"amd{i}.{k}": u for i in range(len(self._handles)) for k, u in AMD_FIELDS.items()})

    def close(self) -> None:
        if self._smi is not None:
            self._query("amdsmi_shut_down")
        super().close()

    def _query(self, func: str, *args: Any) -> Any:
        try:
            return getattr(self._smi, func)(*args)
        except Exception as e:  # every amdsmi failure becomes N/A for this field
            _once((func, type(e).__name__), logging.DEBUG, "amdsmi %s: %s; reported as N/A", func, e)
            return NA

    def _sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, h in enumerate(self._handles):
            out.update({f"amd{i}.{k}": to_float(v) for k, v in self._sample_gpu(h).items()})
        return out

    def _sample_gpu(self, h: Any) -> dict[str, Any]:
        smi = self._smi
        activity = self._query("amdsmi_get_gpu_activity", h) or {}
        vram = self._query("amdsmi_get_gpu_vram_usage", h) or {}
        power = self._query("amdsmi_get_power_info", h) or {}
        gfx = self._query("amdsmi_get_clock_info", h, smi.AmdSmiClkType.GFX) or {}
        mem = self._query("amdsmi_get_clock_info", h, smi.AmdSmiClkType.MEM) or {}
        return {
            "util_pct": activity.get("gfx_activity", NA),
            "mem_util_pct": activity.get("umc_activity", NA),
            "mem_used_bytes": _times(vram.get("vram_used", NA), _MB),
            "mem_total_bytes": _times(vram.get("vram_total", NA), _MB),
            "power_w": _power(power),
            "power_limit_w": power.get("power_limit", NA),
            "temp_c": self._query(
                "amdsmi_get_temp_metric", h, smi.AmdSmiTemperatureType.EDGE, smi.AmdSmiTemperatureMetric.CURRENT
            ),
            "sm_clock_mhz": gfx.get("clk", NA),
            "mem_clock_mhz": mem.get("clk", NA),
            "proc_mem_bytes": self._proc_mem(h),
        }

    def set_pids(self, pids: set[int]) -> None:
        """Sum the GPU memory of ``pids`` from the next tick on (empty: N/A); see NvmlSource.set_pids."""
        self.pids = frozenset(pids)

    def _proc_mem(self, h: Any) -> Any:
        pids = self.pids
        procs = self._query("amdsmi_get_gpu_process_list", h) if pids else NA
        if isinstance(procs, _NotAvailable):
            return NA
        return sum(to_float(p.get("mem", 0)) for p in procs if p.get("pid") in pids)


def _power(info: dict) -> Any:
    # MI300-class parts report current_socket_power; older ones only the average.
    value = info.get("current_socket_power", NA)
    return value if to_float(value) == to_float(value) else info.get("average_socket_power", NA)


def _times(value: Any, factor: float) -> float:
    return to_float(value) * factor
