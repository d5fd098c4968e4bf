"""Counters a trace keeps for every op, stored or not, so reports stay exact past the event cap.

On-target ops only bump a few counters; everything else is also grouped by (kind, direction,
module pattern, source line), and tiny transfers/syncs are counted per step for storm detection.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from opscope.engine.trace.events import HOST, MIXED, ON_TARGET, SYNC, TRANSFER, OpEvent

_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")
_pattern_cache: dict[str, str] = {}


def module_pattern(path: str) -> str:
    """'layers.3.attn.q_proj' → 'layers.*.attn.q_proj': the 30 copies of a layer are one place."""
    pattern = _pattern_cache.get(path)
    if pattern is None:
        pattern = _pattern_cache[path] = _LAYER_INDEX.sub("*", path)
    return pattern


@dataclass
class Group:
    """Ops of one kind from one module pattern and source line."""

    kind: str
    direction: str
    module: str  # module pattern
    source: str | None
    count: int = 0
    host_ns: int = 0
    device_ns: float = 0.0
    bytes_moved: int = 0
    blocking: int = 0  # D2H copies that make the host wait (not non_blocking)
    pinned: int = 0  # transfers whose host side is pinned memory
    pageable: int = 0  # ... pageable memory (None: the copy could not tell, e.g. fake tensors)
    ops: Counter = field(default_factory=Counter)
    modules: set = field(default_factory=set)  # exact paths, for evidence
    devices: Counter = field(default_factory=Counter)
    steps: Counter = field(default_factory=Counter)  # count per step
    step_bytes: Counter = field(default_factory=Counter)  # bytes moved per step
    first_seq: int = -1
    example: OpEvent | None = None


@dataclass
class StepCounts:
    ops: int = 0
    transfers: Counter = field(default_factory=Counter)  # direction → count
    transfer_bytes: Counter = field(default_factory=Counter)  # direction → bytes
    syncs: int = 0
    fallbacks: int = 0


class TraceStats:
    def __init__(self, tiny_bytes: int):
        self.tiny_bytes = tiny_bytes
        self.ops = 0
        self.kind_count: Counter = Counter()
        self.kind_host_ns: Counter = Counter()
        self.kind_device_ns: Counter = Counter()
        self.steps: dict[int, StepCounts] = defaultdict(StepCounts)
        self.groups: dict[tuple, Group] = {}
        self.tiny: Counter = Counter()  # (step, kind, module pattern, source) → tiny transfers/syncs

    def add(self, ev: OpEvent, blocking: bool = False) -> None:
        kind = ev.kind
        self.ops += 1
        self.kind_count[kind] += 1
        self.kind_host_ns[kind] += ev.dur_ns
        step = self.steps[ev.step]
        step.ops += 1
        if kind == ON_TARGET or kind == HOST:
            return
        self._add_off_target(ev, step, blocking)

    def _add_off_target(self, ev: OpEvent, step: StepCounts, blocking: bool) -> None:
        kind, pattern = ev.kind, module_pattern(ev.module)
        moved = ev.bytes_written if kind in (TRANSFER, MIXED) else (ev.bytes_read if kind == SYNC else 0)
        if ev.direction and kind != MIXED:  # copies, and .item() of a device tensor (a D2H read)
            step.transfers[ev.direction] += 1
            step.transfer_bytes[ev.direction] += moved
        if kind == SYNC or blocking:
            step.syncs += 1
        elif kind != TRANSFER and kind != MIXED:
            step.fallbacks += 1
        if kind in (TRANSFER, SYNC, MIXED) and moved <= self.tiny_bytes:
            self.tiny[(ev.step, kind, pattern, ev.source)] += 1
        group = self._group(ev, pattern)
        group.count += 1
        group.host_ns += ev.dur_ns
        group.bytes_moved += moved
        group.blocking += blocking
        if ev.pinned is not None:
            group.pinned += ev.pinned
            group.pageable += not ev.pinned
        group.ops[ev.op] += 1
        group.modules.add(ev.module)
        group.devices[ev.device] += 1
        group.steps[ev.step] += 1
        if moved:
            group.step_bytes[ev.step] += moved

    def _group(self, ev: OpEvent, pattern: str) -> Group:
        key = (ev.kind, ev.direction, pattern, ev.source)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(ev.kind, ev.direction, pattern, ev.source, first_seq=ev.seq, example=ev)
        return group

    def add_device_time(self, ev: OpEvent) -> None:
        """Called once CUDA event times are known (after the trace's single synchronize)."""
        if ev.device_dur_ns is None:
            return
        self.kind_device_ns[ev.kind] += ev.device_dur_ns
        if ev.kind not in (ON_TARGET, HOST):
            self.groups[(ev.kind, ev.direction, module_pattern(ev.module), ev.source)].device_ns += ev.device_dur_ns

    def syncs_total(self) -> int:
        return sum(s.syncs for s in self.steps.values())
