"""What the trace records: one OpEvent per aten op, plus the settings a trace ran with.

OpEvent is a slotted class, not a dataclass: the capture builds one per op on the hot path, and
positional construction of a slotted class is the cheapest object Python offers after a tuple.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Op kinds (classification, engine.trace.classify).
ON_TARGET = "on_target"  # ran on the target device
FALLBACK = "fallback"  # computed on a device other than the target
TRANSFER = "transfer"  # a cross-device copy (direction H2D / D2H / D2D)
SYNC = "sync"  # the host waits for a value: .item(), data-dependent output shapes
MIXED = "mixed"  # compute whose inputs live on different devices: an implicit copy
HOST = "host"  # bookkeeping on host tensors (views, lifting Python data): no compute
KINDS = (ON_TARGET, FALLBACK, TRANSFER, SYNC, MIXED, HOST)

H2D, D2H, D2D = "H2D", "D2H", "D2D"
DIRECTIONS = (H2D, D2H, D2D)

SOURCE_OFF, SOURCE_FINDINGS, SOURCE_ALL = "off", "findings", "all"


@dataclass(frozen=True)
class TraceOptions:
    """How a trace captures.

    ``source``: "off" records no source lines; "findings" records them only for ops that are not
    on the target (cheap: a clean model pays nothing, a buggy one gets file:line for every finding);
    "all" records them for every op. ``hooks``: "model" registers module hooks on the traced
    model only, "global" uses torch's process-wide module hooks (also names modules it was not
    given, by class). ``max_events``: events stored; counters keep counting past it.
    ``storm_min_count``/``storm_tiny_bytes``: a storm is at least that many transfers or syncs of
    at most that many bytes, from one source, inside one step.
    """

    target: str = "cpu"
    source: str = SOURCE_FINDINGS
    hooks: str = "model"
    max_events: int = 200_000
    device_time: bool = True  # CUDA targets: time ops with CUDA events (no per-op synchronize)
    storm_min_count: int = 16
    storm_tiny_bytes: int = 4096


class OpEvent:
    """One aten op as it ran. Devices, dtypes and shapes are tuples over tensor inputs/outputs."""

    __slots__ = ("seq", "op", "module", "source", "in_devices", "out_devices", "in_dtypes",
                 "out_dtypes", "in_shapes", "out_shapes", "bytes_read", "bytes_written", "t_ns",
                 "dur_ns", "step", "kind", "direction", "pinned", "device_dur_ns")

    def __init__(self, seq, op, module, source, in_devices, out_devices, in_dtypes, out_dtypes,
                 in_shapes, out_shapes, bytes_read, bytes_written, t_ns, dur_ns, step, kind,
                 direction, pinned=None, device_dur_ns=None):
        self.seq, self.op, self.module, self.source = seq, op, module, source
        self.in_devices, self.out_devices = in_devices, out_devices
        self.in_dtypes, self.out_dtypes = in_dtypes, out_dtypes
        self.in_shapes, self.out_shapes = in_shapes, out_shapes
        self.bytes_read, self.bytes_written = bytes_read, bytes_written
        self.t_ns, self.dur_ns, self.step = t_ns, dur_ns, step
        self.kind, self.direction, self.pinned = kind, direction, pinned
        self.device_dur_ns = device_dur_ns

    @property
    def device(self) -> str:
        """The device the op ran on: its first output's, else its first input's, else 'cpu'."""
        devs = self.out_devices or self.in_devices
        return devs[0] if devs else "cpu"

    @property
    def bytes_moved(self) -> int:
        return self.bytes_written if self.kind == TRANSFER else 0

    def as_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self.__slots__}
        for name in ("in_devices", "out_devices", "in_dtypes", "out_dtypes"):
            d[name] = list(d[name])
        d["in_shapes"] = [list(s) for s in self.in_shapes]
        d["out_shapes"] = [list(s) for s in self.out_shapes]
        return d

    def __repr__(self) -> str:
        return (f"OpEvent(#{self.seq} {self.op} {self.kind}{' ' + self.direction if self.direction else ''}"
                f" {self.in_devices}->{self.out_devices} module={self.module!r} source={self.source!r})")
