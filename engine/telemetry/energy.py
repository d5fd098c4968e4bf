"""Energy counters for joules per token: Intel RAPL on CPUs, NVML on NVIDIA GPUs, N/A with the reason.

- CPU: RAPL's package zones, ``/sys/class/powercap/intel-rapl:N/energy_uj`` (µJ, wrapping at
  ``max_energy_range_uj``), summed over packages; sub-zones (``intel-rapl:N:M``: core, uncore,
  dram) are inside the package figure and not added again. ``OPSCOPE_POWERCAP`` points at another
  root (tests). Since Linux 5.10 ``energy_uj`` is readable by root only (a side channel:
  CVE-2020-8694), and VMs rarely expose RAPL at all: then N/A, saying which.
- NVIDIA GPU: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded; Volta and
  later); where it is not supported, ``nvmlDeviceGetPowerUsage`` (mW) sampled every
  ``POWER_PERIOD_S`` by a thread and integrated (trapezoids) over the span.

A meter's ``read()`` gives joules on a monotonic counter, or None; ``span()`` starts a measurement
whose ``joules()`` is the energy since. The whole package or board is counted, other processes
included: J/token is what the machine spent while this ran.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

POWERCAP_ENV = "OPSCOPE_POWERCAP"
POWERCAP = Path("/sys/class/powercap")
POWER_PERIOD_S = 0.02


def powercap_root() -> Path:
    return Path(os.environ.get(POWERCAP_ENV) or POWERCAP)


class Meter:
    """An energy counter; ``available`` False with ``reason`` saying why not."""

    source = "none"
    available = False
    reason = ""

    def read(self) -> float | None:
        return None

    def span(self) -> Span:
        return Span(self)

    def close(self) -> None:
        pass


class Span:
    def __init__(self, meter: Meter) -> None:
        self.meter, self.start = meter, meter.read()

    def joules(self) -> float | None:
        """Energy since the span began; None when either reading failed."""
        now = self.meter.read()
        return None if now is None or self.start is None else max(0.0, now - self.start)


class Unavailable(Meter):
    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass
class _Zone:
    name: str
    energy: Path
    wrap_uj: int
    last_uj: int
    total_uj: int = 0  # unwrapped


class RaplMeter(Meter):
    """Sum of the RAPL package zones under the powercap root; see the module docstring."""

    source = "RAPL"

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or powercap_root()
        self.zones: list[_Zone] = []
        self.lock = threading.Lock()
        self.available, self.reason = self._open()

    def _open(self) -> tuple[bool, str]:
        packages = sorted(p for p in self.root.glob("intel-rapl:*") if p.name.count(":") == 1)
        if not packages:
            return False, (
                f"no RAPL energy counters ({self.root}/intel-rapl:* absent: a VM or a CPU "
                f"without RAPL); CPU energy is N/A"
            )
        for p in packages:
            try:
                uj = int((p / "energy_uj").read_text())
                wrap = int((p / "max_energy_range_uj").read_text()) if (p / "max_energy_range_uj").exists() else 2**32
            except PermissionError:
                return False, (
                    f"{p}/energy_uj is readable by root only (Linux ≥ 5.10); run as root or "
                    f"`sudo chmod o+r {self.root}/intel-rapl:*/energy_uj`"
                )
            except (OSError, ValueError) as e:
                return False, f"cannot read {p}/energy_uj: {e}"
            name = (p / "name").read_text().strip() if (p / "name").exists() else p.name
            self.zones.append(_Zone(name, p / "energy_uj", wrap, uj))
        return True, ""

    def read(self) -> float | None:
        if not self.available:
            return None
        with self.lock:
            try:
                for z in self.zones:
                    uj = int(z.energy.read_text())
                    z.total_uj += uj - z.last_uj if uj >= z.last_uj else uj + z.wrap_uj + 1 - z.last_uj
                    z.last_uj = uj
            except (OSError, ValueError) as e:
                log.warning("RAPL read failed: %s", e)
                return None
            return sum(z.total_uj for z in self.zones) / 1e6


class NvmlEnergyMeter(Meter):
    """One NVIDIA GPU through engine.telemetry.nvml's wrapper: the total-energy counter, else
    integrated power."""

    def __init__(
        self,
        nvml_index: int,
        nvml: Any = None,
        period_s: float = POWER_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
        uuid: str | None = None,
    ) -> None:
        from opscope.engine.telemetry.base import NA
        from opscope.engine.telemetry.nvml import Nvml

        self.NA, self.nv, self.own = NA, nvml or Nvml(), nvml is None
        self.period_s, self.clock = period_s, clock
        self.handle, self.lock = None, threading.Lock()
        self.thread: threading.Thread | None = None
        self.joules_so_far = 0.0
        self._last: tuple[float, float] | None = None
        self._stop = threading.Event()
        if not self.nv.init():
            self.reason = f"GPU energy N/A: {self.nv.reason}"
            return
        if uuid:  # the device CUDA means, whatever NVML's own numbering
            h, which = self.nv.query("nvmlDeviceGetHandleByUUID", uuid), uuid
        else:
            h, which = self.nv.query("nvmlDeviceGetHandleByIndex", nvml_index), str(nvml_index)
        if h is NA:
            self.reason = f"GPU energy N/A: NVML has no device {which}"
            return
        self.handle = h
        if self.nv.query("nvmlDeviceGetTotalEnergyConsumption", h) is not NA:
            self.available, self.source = True, "NVML total energy"
        elif self.nv.query("nvmlDeviceGetPowerUsage", h) is not NA:
            self.available, self.source = True, "NVML power, integrated"
        else:
            self.reason = "GPU energy N/A: NVML reports neither total energy nor power for this GPU"

    def read(self) -> float | None:
        if not self.available:
            return None
        if self.source == "NVML total energy":
            mj = self.nv.query("nvmlDeviceGetTotalEnergyConsumption", self.handle)
            return None if mj is self.NA else float(mj) / 1e3
        self._ensure_sampling()
        self._sample()
        with self.lock:
            return self.joules_so_far

    def _sample(self) -> None:
        mw = self.nv.query("nvmlDeviceGetPowerUsage", self.handle)
        t = self.clock()
        if mw is self.NA:
            return
        w = float(mw) / 1e3
        with self.lock:
            if self._last is not None:
                t0, w0 = self._last
                self.joules_so_far += (w0 + w) / 2 * max(0.0, t - t0)
            self._last = (t, w)

    def _ensure_sampling(self) -> None:
        if self.thread is None and self.period_s > 0:
            self.thread = threading.Thread(target=self._run, name="opscope-power", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def close(self) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout=1.0)
        if self.own:
            self.nv.shutdown()


_METERS: dict[str, Meter] = {}
_LOCK = threading.Lock()


def meter_for(device: Any) -> Meter:
    """The (shared, cached) meter for a torch device or device name: RAPL for "cpu", NVML for "cuda:N"."""
    key = str(device)
    with _LOCK:
        if key not in _METERS:
            _METERS[key] = _make(key)
        return _METERS[key]


def _make(key: str) -> Meter:
    if key == "cpu":
        return RaplMeter()
    if key.startswith("cuda"):
        index = int(key.split(":")[1]) if ":" in key else 0
        uuid = cuda_uuid(index)
        return NvmlEnergyMeter(_visible_index(index), uuid=uuid)
    return Unavailable(f"no energy counter for device {key}")


def cuda_uuid(index: int) -> str | None:
    """NVML's UUID ("GPU-…") of torch's ``cuda:index``, or None.

    CUDA numbers devices after ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) and ``CUDA_DEVICE_ORDER``
    (FASTEST_FIRST by default); NVML numbers them by PCI bus. The UUID is the same in both, so it is
    the mapping (as nvitop does). Asked from torch only when it has CUDA up already: this must not be
    the call that starts a CUDA context.
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return _visible_uuid(index)
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    except (RuntimeError, AssertionError, AttributeError) as e:  # no such device, or an old torch
        log.debug("CUDA device %d has no UUID from torch: %s", index, e)
        return _visible_uuid(index)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _visible() -> list[str]:
    return [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]


def _visible_uuid(index: int) -> str | None:
    visible = _visible()
    entry = visible[index] if index < len(visible) else ""
    return entry if entry.startswith(("GPU-", "MIG-")) else None


def _visible_index(index: int) -> int:
    """NVML's index for ``cuda:index`` without torch's answer: CUDA_VISIBLE_DEVICES' entry (NVML
    numbers by PCI bus, as CUDA does under CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    visible = _visible()
    if index < len(visible) and visible[index].isdigit():
        return int(visible[index])
    return index


def reset() -> None:
    """Forget the cached meters (tests, or after the powercap permissions changed)."""
    with _LOCK:
        for m in _METERS.values():
            m.close()
        _METERS.clear()


def per_token(joules: float | None, tokens: int) -> float:
    return joules / tokens if joules is not None and tokens > 0 else float("nan")


def source_of(meter: Meter) -> str:
    """What GenerationStats.energy_source says: the counter, or "N/A: <why>"."""
    return meter.source if meter.available else f"N/A: {meter.reason}"


def with_energy(done: Any, meter: Meter, prefill_j: float | None, decode_j: float | None) -> Any:
    """A Finished event (engine.events) with J/token of prefill (over the tokens prefilled) and of
    decode (over the tokens after the first: the first comes from the prefill's logits)."""
    st = done.stats
    return with_energy_over(
        done, meter, prefill_j, st.prompt_tokens - st.cached_tokens, decode_j, st.generated_tokens - 1
    )


def with_energy_over(
    done: Any, meter: Meter, prefill_j: float | None, prefill_tokens: int, decode_j: float | None, decode_tokens: int
) -> Any:
    """A Finished event with J/token over explicit token counts (batched generation: the prompt
    tokens without padding, the tokens every row decoded after its first)."""
    from dataclasses import replace

    return replace(
        done,
        stats=replace(
            done.stats,
            prefill_j_per_token=per_token(prefill_j, prefill_tokens),
            decode_j_per_token=per_token(decode_j, decode_tokens),
            energy_source=source_of(meter),
        ),
    )


def short_reason(source: str) -> str:
    """The first clause of an "N/A: ..." energy source, for a one-line stats display."""
    reason = source.removeprefix("N/A:").strip()
    for cut in (" (", ";", ":"):
        reason = reason.split(cut, 1)[0]
    return reason.strip()


def stats_text(stats: Any) -> str:
    """ "0.0123 J/tok prefill, 0.5 J/tok decode (RAPL)", or "energy N/A: <why>" (GenerationStats or its dict)."""
    get = stats.get if isinstance(stats, dict) else (lambda k: getattr(stats, k, None))
    source = get("energy_source") or ""
    if not source or source.startswith("N/A"):
        return f"energy N/A: {source.removeprefix('N/A:').strip() or 'not measured by this backend'}"

    def fmt(v) -> str:
        return "–" if v is None or v != v else f"{v:.3g}"

    return f"{fmt(get('prefill_j_per_token'))} J/tok prefill, {fmt(get('decode_j_per_token'))} J/tok decode ({source})"
