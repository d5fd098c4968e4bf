"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``), nvitop style.

``Nvml`` is the one wrapper every NVML call goes through: it initializes lazily, and ``query``
returns the value or ``NA`` (``GPU_LOST`` when the device fell off the bus), logging each kind of
failure once per function. Nothing from NVML ever raises past it. Functions are looked up on the
``pynvml`` module at call time, so tests can monkeypatch the real module.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from opscope.engine.telemetry.base import NA, LogOnce, Source, _NotAvailable, to_float

log = logging.getLogger(__name__)


class _GpuLost(_NotAvailable):
    """NA that also says the device is gone (NVML_ERROR_GPU_IS_LOST): stop querying it."""

    _instance = None

    def __repr__(self) -> str:
        return "N/A (GPU lost)"

    def __reduce__(self):
        return (_GpuLost, ())


GPU_LOST = _GpuLost()

# Failures that mean "this field is not reported here": expected, logged at debug level.
_EXPECTED = (
    "NVMLError_NotSupported",
    "NVMLError_NoPermission",
    "NVMLError_FunctionNotFound",
    "NVMLLibraryMismatchError",
)


class Nvml:
    """Lazy NVML session. ``init()`` is idempotent and thread-safe; ``reason`` says why it failed."""

    def __init__(self) -> None:
        self._lib: Any = None
        self._state = "new"  # "new" | "ok" | "failed" | "closed"
        self.reason = ""
        self._lock = threading.Lock()
        self._once = LogOnce(log)  # per session: each failing (function, error) logged once

    @property
    def ok(self) -> bool:
        return self._state == "ok"

    def init(self) -> bool:
        with self._lock:
            if self._state == "new":
                self._state, self.reason = self._try_init()
            return self._state == "ok"

    def _try_init(self) -> tuple[str, str]:
        try:
            import pynvml
        except ImportError:
            return "failed", "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            # The normal state of a machine without an NVIDIA driver: say it once, carry on.
            log.info("NVML unavailable: %s", e)
            return "failed", f"NVML: {e}"
        except Exception as e:  # e.g. a broken driver install raising OSError
            log.warning("NVML init failed unexpectedly: %r", e)
            return "failed", f"NVML: {e!r}"
        self._lib = pynvml
        return "ok", ""

    def shutdown(self) -> None:
        with self._lock:
            if self._state == "ok":
                self.call_quiet("nvmlShutdown")
            self._state = "closed"

    def query(self, func: str, *args: Any) -> Any:
        """``pynvml.<func>(*args)``, or NA / GPU_LOST. Never raises."""
        if self._state != "ok":
            return NA
        fn = getattr(self._lib, func, None)
        if fn is None:  # a call newer than this nvidia-ml-py (e.g. clock events before 12.535)
            self._once((func, "missing"), logging.DEBUG, "NVML %s: not in this nvidia-ml-py; reported as N/A", func)
            return NA
        try:
            return fn(*args)
        except Exception as e:  # every NVML failure becomes N/A for this field
            return self._failed(func, e)

    def call_quiet(self, func: str, *args: Any) -> Any:
        try:
            return getattr(self._lib, func)(*args)
        except Exception as e:
            log.debug("%s failed: %s", func, e)
            return NA

    def _failed(self, func: str, e: Exception) -> Any:
        kind = type(e).__name__
        if kind == "NVMLError_GpuIsLost":
            return GPU_LOST
        level = logging.DEBUG if kind in _EXPECTED else logging.WARNING
        self._once((func, kind), level, "NVML %s: %s (%s); reported as N/A", func, e, kind)
        return NA


# series suffix -> unit, in the order the monitor shows them
GPU_FIELDS = {
    "util_pct": "%",
    "mem_util_pct": "%",
    "mem_used_bytes": "bytes",
    "mem_total_bytes": "bytes",
    "power_w": "W",
    "power_limit_w": "W",
    "temp_c": "C",
    "sm_clock_mhz": "MHz",
    "mem_clock_mhz": "MHz",
    "pcie_tx_bytes_s": "bytes/s",
    "pcie_rx_bytes_s": "bytes/s",
    "clock_event_reasons": "bitmask",
    "proc_mem_bytes": "bytes",
}


class NvmlSource(Source):
    """Every NVIDIA GPU NVML sees, one ``gpu<N>.*`` group of series per device.

    ``pids``: processes whose GPU memory is summed into ``gpu<N>.proc_mem_bytes`` (default: this
    one; the GUI passes the engine worker's pid). A process NVML does not list on a device (no CUDA
    context there, or a container whose pids are not the host's that NVML reports) reads N/A, not
    0: nothing was measured. ``pcie``: PCIe throughput costs ~20 ms per call on
    real drivers (NVML samples the counter over 20 ms), so it can be turned off for 50 Hz.
    """

    name = "nvml"

    def __init__(self, pids: set[int] | None = None, pcie: bool = True, nvml: Nvml | None = None):
        super().__init__()
        self.pids: frozenset[int] = frozenset(pids) if pids else frozenset({os.getpid()})
        self.pcie = pcie
        self.nvml = nvml or Nvml()
        self.devices: list[dict] = []  # index, name, uuid, lost
        self._handles: list[Any] = []

    def _open(self) -> None:
        if not self.nvml.init():
            # Always reported, even when the package is missing: "no NVIDIA GPU" is the one
            # line a user of a CPU machine should see.
            self._unavailable(f"no NVIDIA GPU ({self.nvml.reason})")
            return
        count = self.nvml.query("nvmlDeviceGetCount")
        if not count:
            self._unavailable("no NVIDIA GPU (NVML found no device)")
            return
        for i in range(int(count)):
            self._add_device(i)
        units = {f"gpu{d['index']}.{k}": u for d in self.devices for k, u in GPU_FIELDS.items()}
        self._ready(units)

    def _add_device(self, index: int) -> None:
        handle = self.nvml.query("nvmlDeviceGetHandleByIndex", index)
        usable = handle is not NA and handle is not GPU_LOST
        name = self.nvml.query("nvmlDeviceGetName", handle) if usable else NA
        uuid = self.nvml.query("nvmlDeviceGetUUID", handle) if usable else NA
        self.devices.append({"index": index, "name": str(name), "uuid": str(uuid), "lost": not usable})
        self._handles.append(handle if usable else None)

    def set_pids(self, pids: set[int]) -> None:
        """Sum the GPU memory of ``pids`` from the next tick on (the GUI: the engine worker's pid, which
        changes when the worker restarts; empty: no process, ``proc_mem_bytes`` reads N/A)."""
        self.pids = frozenset(pids)

    def close(self) -> None:
        self.nvml.shutdown()
        super().close()

    def status(self) -> str:
        if not self.available:
            return self.reason
        lost = [f"gpu{d['index']}" for d in self.devices if d["lost"]]
        return f"lost: {', '.join(lost)}" if lost else "ok"

    def _sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for dev, handle in zip(self.devices, self._handles):
            if dev["lost"]:
                continue  # its series read NaN from now on (History fills missing with NaN)
            values = self._sample_gpu(handle)
            if isinstance(values, _GpuLost):
                self._mark_lost(dev)
                continue
            out.update({f"gpu{dev['index']}.{k}": v for k, v in values.items()})
        return out

    def _mark_lost(self, dev: dict) -> None:
        dev["lost"] = True
        log.error(
            "gpu%d (%s) is lost (NVML_ERROR_GPU_IS_LOST); sampling the other GPUs goes on", dev["index"], dev["name"]
        )

    def _sample_gpu(self, h: Any) -> dict[str, float] | _GpuLost:
        q = self.nvml.query
        util = q("nvmlDeviceGetUtilizationRates", h)
        if util is GPU_LOST:  # the first call tells; don't spend a dozen more on a dead device
            return GPU_LOST
        raw = {
            "util_pct": _attr(util, "gpu"),
            "mem_util_pct": _attr(util, "memory"),
            **_memory(q("nvmlDeviceGetMemoryInfo", h)),
            "power_w": _scaled(q("nvmlDeviceGetPowerUsage", h), 1e-3),
            "power_limit_w": _scaled(q("nvmlDeviceGetEnforcedPowerLimit", h), 1e-3),
            "temp_c": q("nvmlDeviceGetTemperature", h, _const("NVML_TEMPERATURE_GPU", 0)),
            "sm_clock_mhz": q("nvmlDeviceGetClockInfo", h, _const("NVML_CLOCK_SM", 1)),
            "mem_clock_mhz": q("nvmlDeviceGetClockInfo", h, _const("NVML_CLOCK_MEM", 2)),
            **self._pcie(h),
            "clock_event_reasons": self._reasons(h),
            "proc_mem_bytes": self._proc_mem(q("nvmlDeviceGetComputeRunningProcesses", h)),
        }
        if any(v is GPU_LOST for v in raw.values()):
            return GPU_LOST
        return {k: to_float(v) for k, v in raw.items()}

    def _pcie(self, h: Any) -> dict[str, Any]:
        if not self.pcie:
            return {"pcie_tx_bytes_s": NA, "pcie_rx_bytes_s": NA}
        q = self.nvml.query  # NVML reports KB/s
        tx = q("nvmlDeviceGetPcieThroughput", h, _const("NVML_PCIE_UTIL_TX_BYTES", 0))
        rx = q("nvmlDeviceGetPcieThroughput", h, _const("NVML_PCIE_UTIL_RX_BYTES", 1))
        return {"pcie_tx_bytes_s": _scaled(tx, 1024), "pcie_rx_bytes_s": _scaled(rx, 1024)}

    def _reasons(self, h: Any) -> Any:
        # "clock event reasons" is the current name; drivers before r535 only have "throttle".
        value = self.nvml.query("nvmlDeviceGetCurrentClocksEventReasons", h)
        if value is NA:
            value = self.nvml.query("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return value

    def _proc_mem(self, procs: Any) -> Any:
        pids = self.pids  # one read: the GUI thread may swap the set between ticks
        if procs is NA or procs is GPU_LOST:
            return procs
        if not pids:
            return NA
        used = [p.usedGpuMemory for p in procs if p.pid in pids]
        if not used:  # not listed: no context on this device, or another PID namespace
            return NA
        if any(u is None for u in used):  # WDDM (Windows) does not report per-process memory
            return NA
        return sum(used)


def _attr(obj: Any, name: str) -> Any:
    return obj if isinstance(obj, _NotAvailable) else getattr(obj, name, NA)


def _memory(mem: Any) -> dict[str, Any]:
    return {"mem_used_bytes": _attr(mem, "used"), "mem_total_bytes": _attr(mem, "total")}


def _scaled(value: Any, factor: float) -> Any:
    return value if isinstance(value, _NotAvailable) else value * factor


def _const(name: str, default: int) -> int:
    """A pynvml constant, read lazily so importing this module does not import pynvml."""
    mod = sys.modules.get("pynvml")
    return getattr(mod, name, default) if mod else default


def describe_reasons(mask: float) -> str:
    """Short names of the clock-event (throttle) reason bits, e.g. "sw_pwr,hw_therm"."""
    if mask != mask:  # NaN
        return "N/A"
    names = [n for bit, n in _REASON_BITS if int(mask) & bit]
    return ",".join(names) if names else "none"


_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "idle"),
    (0x2, "app_clk"),
    (0x4, "sw_pwr"),
    (0x8, "hw_slow"),
    (0x10, "sync_boost"),
    (0x20, "sw_therm"),
    (0x40, "hw_therm"),
    (0x80, "pwr_brake"),
    (0x100, "display"),
)
REASON_BITS = _REASON_BITS  # (bit, short name) of every clock-event (throttle) reason, for plots
