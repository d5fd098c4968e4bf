"""What the trace records: one OpEvent per aten op, plus the settings a trace ran with.

OpEvent is a slotted class, not a dataclass: the capture builds one per op on the hot path, and
positional construction of a slotted class is the cheapest object Python offers after a tuple.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
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
    at most that many bytes, from one source, inside one step. The same byte bound separates the
    engine's per-step I/O (a few token ids) from activations crossing devices. ``pause_gc``: hold Python's cyclic
    garbage collector while tracing, as timeit does: each stored event is a tracked object, and
    collections triggered by them would otherwise scan the whole growing trace again and again.
    """

    target: str = "cpu"
    source: str = SOURCE_FINDINGS
    hooks: str = "model"
    max_events: int = 200_000
    device_time: bool = True  # CUDA targets: time ops with CUDA events (no per-op synchronize)
    storm_min_count: int = 16
    storm_tiny_bytes: int = 64  # a few elements: per-element loops move 1-8 bytes at a time
    pause_gc: bool = True


class OpEvent:
    """One aten op as it ran. Devices (strings), dtypes (torch.dtype) and shapes (torch.Size) are
    tuples over the op's tensor inputs and outputs; byte counts are derived from them on demand."""

    __slots__ = (
        "seq",
        "op",
        "role",
        "module",
        "source",
        "in_devices",
        "out_devices",
        "in_dtypes",
        "out_dtypes",
        "in_shapes",
        "out_shapes",
        "t_ns",
        "dur_ns",
        "step",
        "kind",
        "direction",
        "pinned",
        "device_dur_ns",
    )

    def __init__(
        self,
        seq,
        op,
        role,
        module,
        source,
        in_devices,
        out_devices,
        in_dtypes,
        out_dtypes,
        in_shapes,
        out_shapes,
        t_ns,
        dur_ns,
        step,
        kind,
        direction,
        pinned=None,
        device_dur_ns=None,
    ):
        self.seq, self.op, self.role, self.module, self.source = seq, op, role, module, source
        self.in_devices, self.out_devices = in_devices, out_devices
        self.in_dtypes, self.out_dtypes = in_dtypes, out_dtypes
        self.in_shapes, self.out_shapes = in_shapes, out_shapes
        self.t_ns, self.dur_ns, self.step = t_ns, dur_ns, step
        self.kind, self.direction, self.pinned = kind, direction, pinned
        self.device_dur_ns = device_dur_ns

    @property
    def device(self) -> str:
        """The device the op ran on: its first output's, else its first input's, else 'cpu'."""
        devs = self.out_devices or self.in_devices
        return devs[0] if devs else "cpu"

    @property
    def bytes_read(self) -> int:
        if self.role == "scalar":  # .item() reads one element
            return self.in_dtypes[0].itemsize if self.in_dtypes else 0
        return 0 if self.role == "view" else _nbytes(self.in_dtypes, self.in_shapes)

    @property
    def bytes_written(self) -> int:
        if self.role == "scalar":
            return self.bytes_read
        return 0 if self.role == "view" else _nbytes(self.out_dtypes, self.out_shapes)

    def as_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self.__slots__}
        d["in_devices"], d["out_devices"] = list(self.in_devices), list(self.out_devices)
        d["in_dtypes"] = [dtype_name(t) for t in self.in_dtypes]
        d["out_dtypes"] = [dtype_name(t) for t in self.out_dtypes]
        d["in_shapes"] = [list(s) for s in self.in_shapes]
        d["out_shapes"] = [list(s) for s in self.out_shapes]
        d["bytes_read"], d["bytes_written"] = self.bytes_read, self.bytes_written
        return d

    def __repr__(self) -> str:
        return (
            f"OpEvent(#{self.seq} {self.op} {self.kind}{' ' + self.direction if self.direction else ''}"
            f" {self.in_devices}->{self.out_devices} module={self.module!r} source={self.source!r})"
        )


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _nbytes(dtypes, shapes) -> int:
    return sum(prod(shape) * dtype.itemsize for dtype, shape in zip(dtypes, shapes))
