"""Peak memory of one benchmark repetition, per device.

CUDA: the torch caching allocator's peak (``max_memory_allocated``), reset before each rep.
CPU: the process's peak resident set (Linux ``VmHWM``), reset through ``/proc/self/clear_refs``;
it counts everything resident (weights, interpreter), so read it as "peak RSS during the rep".
Elsewhere the tracker reports nothing rather than a wrong number.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from opscope.engine.bench.measure.devsync import parse_device

log = logging.getLogger(__name__)

# An A/B run's two sides share one process (engine.bench.ab), so each rep's peak (the resident set,
# or the CUDA allocator's) holds both sides' models and buffers: the same figure for A and B, not
# either side's own. Such metrics carry params["memory"] = SHARED_AB and every table says so.
SHARED_AB = "A+B in one process"
SHARED_AB_NOTE = "shared by A and B (one process): not this side's own peak"

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class NullTracker:
    def reset(self) -> None:
        return None

    def peak_bytes(self) -> int | None:
        return None


class CudaTracker:
    def __init__(self, index: int | None):
        import torch

        self._torch = torch
        self._device = torch.device("cuda", index) if index is not None else torch.device("cuda")

    def reset(self) -> None:
        self._torch.cuda.reset_peak_memory_stats(self._device)

    def peak_bytes(self) -> int | None:
        return int(self._torch.cuda.max_memory_allocated(self._device))


class ProcRssTracker:
    """Linux peak RSS; "5" written to clear_refs resets the high-water mark (Linux >= 4.0)."""

    def reset(self) -> None:
        _CLEAR_REFS.write_text("5")

    def peak_bytes(self) -> int | None:
        m = re.search(r"VmHWM:\s+(\d+)\s*kB", _STATUS.read_text())
        return int(m.group(1)) * 1024 if m else None


def _rss_tracker() -> NullTracker | ProcRssTracker:
    try:
        tracker = ProcRssTracker()
        tracker.reset()
        if tracker.peak_bytes() is not None:
            return tracker
    except OSError as e:  # not Linux, or /proc not writable in this sandbox
        log.info("peak RSS cannot be reset here (%s): CPU peak memory not recorded", e)
    return NullTracker()


def peak_tracker(device: str):
    """A tracker with ``reset()`` and ``peak_bytes() -> int | None`` for ``device``."""
    kind, index = parse_device(device)
    if kind == "cuda":
        return CudaTracker(index)
    if kind == "cpu":
        return _rss_tracker()
    return NullTracker()


def peak_unit_note(device: str) -> str:
    """What the peak memory figures mean on ``device`` (saved in a run's settings)."""
    kind, _ = parse_device(device)
    return {
        "cuda": "torch allocator peak (max_memory_allocated) per rep",
        "cpu": "process peak RSS (VmHWM) per rep",
    }.get(kind, "not measured on this device")
