"""Capture every aten op inside a region with a TorchDispatchMode.

    tracer = Tracer(TraceOptions(target="cuda"), model=loaded.model)
    with tracer:
        for event in loaded.generate(prompt, config):
            if isinstance(event, Token):
                tracer.mark_token(event.t_ns)
    result = tracer.result()

Each op is classified as it runs (engine.trace.classify) so that counters stay exact past the
event cap. The dispatch mode is thread-local: only ops of the entering thread are seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import ConfigError
from opscope.engine.core.gcpause import gc_paused
from opscope.engine.trace import classify as cls
from opscope.engine.trace.aggregate import TraceStats
from opscope.engine.trace.devtime import DeviceTimer, cuda_timer
from opscope.engine.trace.events import (
    D2H,
    H2D,
    HOST,
    ON_TARGET,
    SOURCE_ALL,
    SOURCE_FINDINGS,
    SOURCE_OFF,
    TRANSFER,
    OpEvent,
    TraceOptions,
)
from opscope.engine.trace.modstack import ModuleStack
from opscope.engine.trace.source import caller_site, format_site
from torch.utils._python_dispatch import TorchDispatchMode

log = logging.getLogger(__name__)

_Tensor = torch.Tensor
_IGNORE = ("", None, -1)
_MASK_DTYPES = (torch.bool, torch.uint8)
_PLAIN_ROLES = (cls.ROLE_COMPUTE, cls.ROLE_VIEW)
_QUIET = (ON_TARGET, HOST)  # kinds that get no source line in "findings" mode


class _DeviceNames(dict):
    """torch.device → "cuda:0", computed once per device."""

    def __missing__(self, device) -> str:
        name = self[device] = str(device)
        return name


@dataclass
class TraceResult:
    options: TraceOptions
    events: list[OpEvent]
    stats: TraceStats
    dropped: int  # ops counted but not stored (past max_events)
    markers: list = field(default_factory=list)  # engine.markers.Marker seen while tracing
    token_ns: list[int] = field(default_factory=list)  # when each generated token arrived
    start_ns: int = 0
    end_ns: int = 0
    device_timed: int = 0  # ops with a CUDA device time
    step_unit: str = "token"  # what ends a step: a generated token, or a step of a user's script

    @property
    def tokens(self) -> int:
        return len(self.token_ns)


def _tensors(args, kwargs) -> list:
    found = []
    for group in (args, kwargs.values()) if kwargs else (args,):
        for a in group:
            if isinstance(a, _Tensor):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                found.extend(b for b in a if isinstance(b, _Tensor))
    return found


def _outputs(out) -> list:
    if isinstance(out, _Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o for o in out if isinstance(o, _Tensor)]
    return []


def _is_pinned(t) -> bool | None:
    try:
        return bool(t.is_pinned())
    except Exception:  # fake and meta tensors cannot say
        return None


class Tracer(TorchDispatchMode):
    """Records, classifies and counts every aten op run while it is entered."""

    def __init__(self, options: TraceOptions | None = None, model=None, device_timer: DeviceTimer | None = None):
        super().__init__()
        self.options = options or TraceOptions()
        if self.options.source not in (SOURCE_OFF, SOURCE_FINDINGS, SOURCE_ALL):
            raise ConfigError(f"unknown source-line mode {self.options.source!r}: expected off, findings or all")
        self.is_target = cls.DeviceMatcher(self.options.target)
        self.modules = ModuleStack(model, self.options.hooks)
        self.events: list[OpEvent] = []
        self.stats = TraceStats(self.options.storm_tiny_bytes)
        self.step = self.seq = self.dropped = 0
        self.markers: list = []
        self.token_ns: list[int] = []
        self._timer = device_timer
        self._own_timer = device_timer is None
        self._op_info: dict = {}
        self._dev = _DeviceNames()
        self._sites: dict = {}
        self._max_events = self.options.max_events
        self._all_sources = self.options.source == SOURCE_ALL
        self._off_target_sources = self.options.source == SOURCE_FINDINGS
        self._unsubscribe: Callable[[], None] | None = None
        self._gc_pause: AbstractContextManager[None] = nullcontext()
        self.start_ns = self.end_ns = self.device_timed = 0
        self._suspended = False

    # -- region -----------------------------------------------------------------------------
    def __enter__(self):
        if self._own_timer and self.options.device_time:
            self._timer = cuda_timer(self.options.target, self.options.max_events)
        self.modules.install()
        self._unsubscribe = markers.subscribe(self.markers.append)
        self._gc_pause = gc_paused() if self.options.pause_gc else nullcontext()
        self._gc_pause.__enter__()
        self.start_ns = now_ns()
        return super().__enter__()

    def __exit__(self, exc_type, exc, tb):
        try:
            return super().__exit__(exc_type, exc, tb)
        finally:
            self.end_ns = now_ns()
            self._gc_pause.__exit__(None, None, None)
            self.modules.remove()
            if self._unsubscribe:
                self._unsubscribe()
            self._resolve_device_time()

    def _resolve_device_time(self) -> None:
        self.device_timed = self._timer.resolve() if self._timer else 0
        if self.device_timed:
            for ev in self.events:
                self.stats.add_device_time(ev)

    def mark_token(self, t_ns: int | None = None) -> None:
        """A token was generated: ops from now on belong to the next step."""
        self.token_ns.append(now_ns() if t_ns is None else t_ns)
        self.step += 1

    mark_step = mark_token  # a user's script: each step (opscope.step(), optimizer.step()) ends one

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Ops run inside are not recorded: the trace's own bookkeeping (training-health reads)."""
        was, self._suspended = self._suspended, True
        try:
            yield
        finally:
            self._suspended = was

    def result(self) -> TraceResult:
        return TraceResult(
            self.options,
            self.events,
            self.stats,
            self.dropped,
            self.markers,
            self.token_ns,
            self.start_ns,
            self.end_ns,
            self.device_timed,
        )

    # -- hot path ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        info = self._op_info.get(func)
        if info is None:
            info = self._learn(func)
        if info is _IGNORE or self._suspended:
            return func(*args, **kwargs)
        timer = self._timer
        start = timer.start() if timer is not None else None
        t0 = now_ns()
        out = func(*args, **kwargs)
        t1 = now_ns()
        ev = self._record(info, args, kwargs, out, t0, t1)
        if timer is not None:
            timer.stop(ev, start)
        return out

    def _learn(self, func) -> tuple:
        name = str(func)  # "aten.mm.default"
        role = cls.op_role(name.rsplit(".", 1)[0], bool(getattr(func, "is_view", False)))
        info = _IGNORE if role is None else (name, role, _arg_index(func, "non_blocking"))
        self._op_info[func] = info
        return info

    def _record(self, info, args, kwargs, out, t0: int, t1: int) -> OpEvent:
        name, role, nb_index = info
        names = self._dev
        ins = _tensors(args, kwargs)
        outs = _outputs(out)
        in_d = tuple([names[t.device] for t in ins])
        out_d = tuple([names[t.device] for t in outs])
        in_sh = tuple([t.shape for t in ins])
        kind = None
        if role in _PLAIN_ROLES:  # the common case: one device, the target; decided inline
            devices = set(in_d)
            devices.update(out_d)
            if len(devices) == 1 and self.is_target(in_d[0] if in_d else out_d[0]):
                kind, direction = ON_TARGET, ""
        if kind is None:
            kind, direction = self._classify(role, name, in_d, in_sh, out_d, ins)
        source = self._source() if self._all_sources or (self._off_target_sources and kind not in _QUIET) else None
        stack = self.modules.stack
        ev = OpEvent(
            self.seq,
            name,
            role,
            stack[-1] if stack else "",
            source,
            in_d,
            out_d,
            tuple([t.dtype for t in ins]),
            tuple([t.dtype for t in outs]),
            in_sh,
            tuple([t.shape for t in outs]),
            t0,
            t1 - t0,
            self.step,
            kind,
            direction,
        )
        self.seq += 1
        blocking = self._transfer_details(ev, name, nb_index, args, kwargs, out) if kind == TRANSFER else False
        self.stats.add(ev, blocking)
        if len(self.events) < self._max_events:
            self.events.append(ev)
        else:
            self.dropped += 1
        return ev

    def _classify(self, role, name, in_d, in_sh, out_d, ins) -> tuple[str, str]:
        in_scalar = tuple([not shape and d == "cpu" for d, shape in zip(in_d, in_sh)])
        copy_ends = _copy_ends(name, in_d, out_d) if role == cls.ROLE_COPY else None
        bool_index = role == cls.ROLE_INDEX and any(t.dtype in _MASK_DTYPES for t in ins[1:])
        return cls.classify(role, in_d, in_scalar, out_d, self.is_target, copy_ends, bool_index)

    def _source(self) -> str | None:
        site = caller_site(1)
        if site is None:
            return None
        text = self._sites.get(site)
        if text is None:
            text = self._sites[site] = format_site(site)
        return text

    def _transfer_details(self, ev: OpEvent, name: str, nb_index: int, args, kwargs, out) -> bool:
        """Sets pinned (host side of the copy) and says whether the host blocks on it."""
        src, dst = _copy_tensors(name, args, out)
        non_blocking = args[nb_index] if 0 <= nb_index < len(args) else kwargs.get("non_blocking", False)
        host_side = src if ev.direction == H2D else dst if ev.direction == D2H else None
        if isinstance(host_side, _Tensor):
            ev.pinned = _is_pinned(host_side)
        return ev.direction == D2H and not non_blocking


def _arg_index(func, arg_name: str) -> int:
    """Position of a schema argument (e.g. non_blocking), -1 when the op has none or kwarg-only."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == arg_name:
            return -1 if arg.kwarg_only else i
    return -1


def _copy_tensors(name: str, args, out) -> tuple:
    """(source, destination) tensors of a copy op."""
    if name.startswith("aten.copy_"):
        return args[1], args[0]
    if name.startswith("aten._copy_from"):
        return args[0], args[1]
    return args[0], out  # _to_copy, to.*


def _copy_ends(name: str, in_d: tuple, out_d: tuple) -> tuple[str, str] | None:
    """(source device, destination device) of a copy op."""
    if name.startswith(("aten._to_copy", "aten.to.")) and in_d and out_d:
        return in_d[0], out_d[0]
    if name.startswith("aten.copy_") and len(in_d) >= 2:
        return in_d[1], in_d[0]
    if len(in_d) >= 2:  # _copy_from(self, dst)
        return in_d[0], in_d[1]
    return None
