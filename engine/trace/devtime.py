"""Device time per op on CUDA: a pair of timing events recorded around each op on the current
stream, read once at the end of the trace after a single synchronize (a per-op synchronize would
serialize the GPU and change what is measured).

The event factory is a parameter so the logic can be tested with a stand-in that has the same API
as ``torch.cuda.Event`` (record(), synchronize(), elapsed_time(other) → ms).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class DeviceTimer:
    def __init__(self, event_factory: Callable[[], Any], synchronize: Callable[[], None], max_pairs: int):
        self._new, self._synchronize, self.max_pairs = event_factory, synchronize, max_pairs
        self._pending: list[tuple[Any, Any, Any]] = []  # (op event, start, end)

    def start(self):
        if len(self._pending) >= self.max_pairs:
            return None
        start = self._new()
        start.record()
        return start

    def stop(self, op_event, start) -> None:
        if start is None or not op_event.device.startswith("cuda"):
            return  # host ops: no GPU work between the two events
        end = self._new()
        end.record()
        self._pending.append((op_event, start, end))

    def resolve(self) -> int:
        """Fill ``device_dur_ns`` on every timed op; returns how many were timed."""
        if not self._pending:
            return 0
        self._synchronize()
        for op_event, start, end in self._pending:
            op_event.device_dur_ns = start.elapsed_time(end) * 1e6  # elapsed_time is in ms
        n = len(self._pending)
        self._pending.clear()
        return n


def cuda_timer(target: str, max_pairs: int) -> DeviceTimer | None:
    """A timer for a CUDA target when CUDA is usable here, else None (host time only)."""
    if not target.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        log.info("trace target %s: CUDA is not available, recording host time only", target)
        return None
    device = torch.device(target)
    return DeviceTimer(lambda: torch.cuda.Event(enable_timing=True), lambda: torch.cuda.synchronize(device), max_pairs)
