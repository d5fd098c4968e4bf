"""The peaks MFU and MBU divide by, two of them, each a ceiling and named wherever it is used.

- **theoretical**: what the hardware can do at most (engine.bench.theoretical: CPU cores × clock ×
  FLOP/cycle of the ISA found at run time; NVIDIA datasheet figures at NVML's clocks). Computed
  every time, never cached.
- **measured**: the best a full, quiet run of the matmul or bandwidth suite reached on this device
  (its fastest repetition of its best size). Only a full run records it (never ``--quick``, whose
  sizes are too small), only while no other process kept the CPU busy (engine.cpuload), and only
  when it beats the stored one. It is kept per device with the fingerprint and date it was taken.
  A utilisation above 100% of it proves it was no ceiling: ``invalidate`` marks it so, and it is
  not used again until a later quiet run replaces it.

There is no quick measurement on the spot any more: a few repetitions taken while the machine was
busy gave a "peak" 20× too low, and every MFU after it read above 100%.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opscope.engine.bench.ceilings import theoretical as T
from opscope.engine.core.paths import cache_dir
from opscope.engine.core.units import format_rate

log = logging.getLogger(__name__)

_FILE = "peaks.json"
_VERSION = 2  # entries of version 1 files include quick, busy-machine figures: ignored
QUIET_MAX_OTHER_CORES = 0.1  # mean cores other processes may keep busy during a peak run
UNITS = {"matmul": "FLOP/s", "bandwidth": "B/s"}
PROC = Path("/proc")  # where other processes' CPU load is read (engine.cpuload)


@dataclass(frozen=True)
class Peak:
    value: float  # FLOP/s or bytes/s
    source: str  # how it was obtained, in words
    basis: str = "measured"  # "theoretical" | "measured"
    kind: str = "matmul"  # "matmul" | "bandwidth"
    dtype: str | None = None
    taken: str | None = None  # UTC date of a measured peak

    @property
    def label(self) -> str:
        """Short, for a table header or a unit column: "theoretical 294.4 GFLOP/s float32"."""
        what = f"{self.basis} {format_rate(self.value, UNITS[self.kind])}"
        what += f" {self.dtype}" if self.dtype else ""
        return what + (f" ({self.taken[:10]})" if self.taken else "")

    def as_params(self) -> dict[str, Any]:
        """What a utilisation metric carries: which peak it divided by."""
        return {"peak": self.label, "peak_value": self.value, "peak_basis": self.basis, "peak_unit": UNITS[self.kind]}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"label": self.label}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Peak | None:
        if not d:
            return None
        return cls(
            d["value"], d["source"], d.get("basis", "measured"), d.get("kind", "matmul"), d.get("dtype"), d.get("taken")
        )


def _key(kind: str, dtype: str | None) -> str:
    return f"{kind}:{dtype if kind != 'bandwidth' and dtype else '-'}"


def _torch_device(device: str):
    import torch

    return torch.device(device)


def device_key(device: str) -> str:
    """Which hardware a measured peak belongs to (the CPU model and thread count, or the GPU name)."""
    import torch

    dev = _torch_device(device)
    if dev.type == "cuda":
        return f"cuda|{torch.cuda.get_device_name(dev)}"
    if dev.type == "cpu":
        from opscope.engine.core.fingerprint import cpu_model

        return f"cpu|{cpu_model()}|threads={torch.get_num_threads()}"
    return dev.type


def _fingerprint(device: str) -> dict[str, Any]:
    import torch

    return {
        "device": device_key(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "host": platform.node(),
        "kernel": platform.release(),
    }


# --- theoretical ---------------------------------------------------------------------------------


def theoretical(device: str, kind: str, dtype: str | None = None) -> Peak | None:
    """The hardware's theoretical peak for ``kind`` on ``device``; None where it is not known
    (a CPU's memory bandwidth, an unknown GPU or ISA)."""
    dev = _torch_device(device)
    if dev.type == "cpu":
        return _cpu_theoretical(kind, dtype)
    if dev.type == "cuda":
        return _gpu_theoretical(dev.index or 0, kind, dtype)
    return None


def _cpu_theoretical(kind: str, dtype: str | None) -> Peak | None:
    if kind != "matmul":
        return None  # DRAM channels and speed are not readable without root: no ceiling known
    import torch

    spec = T.cpu_spec()
    found = T.cpu_flop_s(spec, dtype or "float32", torch.get_num_threads()) if spec else None
    return Peak(found[0], found[1], "theoretical", kind, dtype or "float32") if found else None


def _gpu_theoretical(index: int, kind: str, dtype: str | None, nvml: Any = None) -> Peak | None:
    clocks = T.nvml_clocks(index, nvml)
    if clocks is None:
        import torch

        clocks = T.GpuClocks(torch.cuda.get_device_name(index))  # datasheet at its boost clock
    found = T.gpu_peak(clocks, kind, dtype)
    if found is None:
        return None
    return Peak(found[0], found[1], "theoretical", kind, None if kind == "bandwidth" else dtype)


# --- measured -----------------------------------------------------------------------------------


def _load() -> dict[str, Any]:
    try:
        data = json.loads((cache_dir() / _FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("version") == _VERSION else {}


def _save(data: dict[str, Any]) -> None:
    from opscope.engine.core.fingerprint import _write_json_atomic

    _write_json_atomic(cache_dir() / _FILE, data | {"version": _VERSION})


def entry(device: str, kind: str, dtype: str | None) -> dict[str, Any] | None:
    """The stored measured peak with its fingerprint, date and invalidation, if any."""
    return _load().get("devices", {}).get(device_key(device), {}).get(_key(kind, dtype))


def measured(device: str, kind: str, dtype: str | None = None) -> Peak | None:
    """The stored measured peak, unless it was invalidated."""
    e = entry(device, kind, dtype)
    if not e or e.get("invalidated"):
        return None
    return Peak(e["value"], e["source"], "measured", kind, None if kind == "bandwidth" else dtype, e.get("taken"))


def _store(device: str, kind: str, dtype: str | None, value: float, source: str, other_cores: float | None) -> None:
    data = _load()
    entries = data.setdefault("devices", {}).setdefault(device_key(device), {})
    entries[_key(kind, dtype)] = {
        "value": value,
        "source": source,
        "taken": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": _fingerprint(device),
        "other_cores": other_cores,
        "invalidated": None,
    }
    _save(data)


def record(device: str, kind: str, dtype: str | None, value: float, source: str) -> None:
    """Stores a peak the caller vouches for (a test, a figure taken elsewhere), replacing any."""
    _store(device, kind, dtype, value, source, None)


def record_measured(
    device: str, kind: str, dtype: str | None, value: float, source: str, *, quick: bool, other_cores: float | None
) -> str:
    """Records a peak run's best figure if it may be one; returns what happened, in words.

    ``other_cores``: mean CPU cores other processes kept busy during the run (None: unknown)."""
    if quick:
        return "not recorded: a --quick run's sizes are too small to reach the peak"
    if other_cores is not None and other_cores > QUIET_MAX_OTHER_CORES:
        return (
            f"not recorded: other processes kept {other_cores:.2f} cores busy during the run "
            f"(a peak is taken only on a quiet machine, at most {QUIET_MAX_OTHER_CORES:g})"
        )
    old = measured(device, kind, dtype)
    unit = UNITS[kind]
    if old is not None and old.value >= value:
        return (
            f"kept the stored peak {format_rate(old.value, unit)} ({old.taken}): "
            f"this run reached {format_rate(value, unit)}"
        )
    _store(device, kind, dtype, value, source, other_cores)
    return f"recorded {format_rate(value, unit)} as the measured peak" + (
        " (other processes' load unknown here)" if other_cores is None else ""
    )


def load_probe():
    """Starts watching other processes' CPU load; ``.cores()`` later gives their mean busy cores
    since now (None where /proc cannot say)."""
    from opscope.engine.core.cpuload import OtherLoad

    return OtherLoad(PROC)


def invalidate(device: str, kind: str, dtype: str | None, by: str, pct: float) -> None:
    """Marks the stored measured peak as no ceiling: ``by`` reached ``pct`` percent of it."""
    data = _load()
    e = data.get("devices", {}).get(device_key(device), {}).get(_key(kind, dtype))
    if not e or e.get("invalidated"):
        return
    e["invalidated"] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": by, "pct": pct}
    log.warning(
        "%s went past the measured %s peak (%s): that peak is invalidated; "
        "run `opscope bench %s` on a quiet machine to measure a new one",
        by,
        kind,
        e["source"],
        kind,
    )
    _save(data)


def measured_note(device: str, kind: str, dtype: str | None) -> str:
    """Why there is no usable measured peak, in words (empty when there is one)."""
    e = entry(device, kind, dtype)
    if e and e.get("invalidated"):
        inv = e["invalidated"]
        return (
            f"measured peak {format_rate(e['value'], UNITS[kind])} ({e['taken'][:10]}) invalidated: "
            f"{inv['by']} went past it on {inv['at'][:10]}"
        )
    if e:
        return ""
    return f"no measured peak: run `opscope bench {kind}` (full, not --quick) on a quiet machine"


# --- what suites use ----------------------------------------------------------------------------


def get(device: str, kind: str, dtype: str | None = None) -> Peak | None:
    """One peak for ``kind`` on ``device``: the measured one if valid, else the theoretical one."""
    return measured(device, kind, dtype) or theoretical(device, kind, dtype)


def peak_set(device: str, kind: str, dtype: str | None = None) -> dict[str, Any]:
    """Both peaks of ``kind`` as run settings: {"theoretical": {...}|None, "measured": {...}|None,
    "note": why a measured one is missing or invalid}."""
    th, me = theoretical(device, kind, dtype), measured(device, kind, dtype)
    return {
        "theoretical": th.as_dict() if th else None,
        "measured": me.as_dict() if me else None,
        "note": measured_note(device, kind, dtype),
        "device": device,
    }


def model_peaks(device: str, dtype: str) -> dict[str, Any]:
    """The FLOP/s (for ``dtype``) and bytes/s peaks a model suite's MFU and MBU divide by."""
    return {"flop": peak_set(device, "matmul", dtype), "bytes": peak_set(device, "bandwidth")}
