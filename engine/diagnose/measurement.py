"""What one bounded diagnose run measured, as plain frozen data: the rules (engine.diagnose.rules) read
nothing else, so each can be tested with a Measurement written by hand.

A *phase* is a repeated unit of work: a model's prefill (one pass over the prompt) and decode (one
token), or a script's step. Its figures are per pass: ``wall_ms`` is the median wall time of one pass
measured without the trace (the trace's own overhead would inflate it), ``op_ms`` the time spent
inside tensor ops and ``ops`` their count, from the traced pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PREFILL, DECODE, STEP = "prefill", "decode", "step"
SEVERITIES = ("high", "medium", "low", "info")  # most important first


@dataclass(frozen=True)
class Phase:
    name: str  # PREFILL | DECODE | STEP
    passes: int  # how many passes were timed
    wall_ms: float  # median wall time of one pass
    tokens: int = 1  # tokens per pass (a prefill's prompt length)
    flop: float | None = None  # FLOP per pass (None: not known, e.g. a script)
    bytes: float | None = None  # bytes the pass must read from memory (weights + KV cache)
    ops: float = 0.0  # tensor ops per pass
    op_ms: float | None = None  # time inside ops per pass (traced); None: not traced
    top_module: str = ""  # the module pattern with the most time inside ops
    top_source: str = ""  # its file:line
    device_busy_pct: float | None = None  # CUDA: the ops' device time over the traced pass's wall time
    # the module pattern issuing the most ops, and its line with the most: where fewer, larger ops
    # would go (by count, not time: a tiny op's time is mostly noise, one preempted op can lead)
    busiest_module: str = ""
    busiest_source: str = ""


@dataclass(frozen=True)
class Issue:
    """A trace finding (engine.trace.findings) in the diagnosis's terms."""

    kind: str  # fallback | mixed | transfer | sync | storm | health
    severity: str
    title: str
    module: str = ""
    source: str = ""
    fix: str = ""
    per_step: float = 0.0
    host_ms: float = 0.0  # host time of its ops, over the traced passes


@dataclass(frozen=True)
class Neighbour:
    pid: int
    name: str
    cores: float


@dataclass(frozen=True)
class Measurement:
    subject: str  # the model file or the script
    kind: str  # "model" | "script"
    target: str  # the device the work should run on
    unit: str = "token"  # "token" | "step"
    simulated: bool = False  # --device meta: placement is real, times are not
    phases: tuple[Phase, ...] = ()
    peak_flop_s: float | None = None
    peak_flop_label: str = ""
    peak_bytes_s: float | None = None
    peak_bytes_label: str = ""
    dispatch_us: float | None = None  # host cost of one tiny op on the target (measured now)
    transfer_bytes_per_step: float = 0.0  # H2D + D2H bytes per step/token beyond the needed I/O
    transfers_per_step: float = 0.0
    pageable_transfers: int = 0
    link_bytes_s: float | None = None  # host↔device copy bandwidth (None on a CPU target)
    issues: tuple[Issue, ...] = ()
    traced_steps: int = 0  # steps (tokens) the traced run covered: the issues' host_ms are over them
    idle_pct: float | None = None  # share of a step's wall time with no op running (scripts)
    idle_source: str = ""  # the user line the host was on meanwhile (stack samples)
    idle_source_pct: float = 0.0  # share of the idle samples on that line
    cores: int = 0  # logical CPUs of this machine
    other_cores: float | None = None  # cores other processes kept busy meanwhile (None: unknown)
    other_gpu_procs: int | None = None
    neighbours: tuple[Neighbour, ...] = ()
    notes: tuple[str, ...] = ()
    # the CPU fast path's decode matvecs (every quantized linear once) timed with exact float32 and
    # with int8 activations (engine.diagnose.probes.matvec_modes; None: not timed), their types
    matvec_exact_ms: float | None = None
    matvec_int8_ms: float | None = None
    matvec_types: str = ""

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    @property
    def total_ms(self) -> float:
        return sum(p.wall_ms * p.passes for p in self.phases) or 1.0

    def share_pct(self, p: Phase) -> float:
        """The phase's part of the measured time."""
        return 100.0 * p.wall_ms * p.passes / self.total_ms

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        d = dict(d)
        d["phases"] = tuple(Phase(**p) for p in d.get("phases", ()))
        d["issues"] = tuple(Issue(**i) for i in d.get("issues", ()))
        d["neighbours"] = tuple(Neighbour(**n) for n in d.get("neighbours", ()))
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)


@dataclass(frozen=True)
class Finding:
    rule: str
    bound: str  # compute | memory | host | data movement | placement | input pipeline | foreign load | ...
    severity: str  # SEVERITIES
    evidence: str
    place: str = ""  # module path and file:line
    fix: str = ""
    gain: str = ""
    share_pct: float = 0.0  # of the measured time it concerns: orders findings of one severity
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
