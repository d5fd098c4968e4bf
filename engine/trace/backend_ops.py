"""Trace a generation on a plugin backend through its own ``trace_ops`` hook (engine.backends).

The torch tracer is a dispatch mode over aten ops; a plugin's model (MLX) never issues any, so the
trace goes through the backend, never around it: the backend reports each op (name, device or
stream, shapes, dtypes, issue time) and this module groups them into a per-op table. For a lazy
framework (MLX) an op returns once it is in the graph; compute lands on the syncs (``eval``,
``item``). A backend stamps an op when its call returns, so the table attributes to each op the
host time since the previous op returned.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import ConfigError
from opscope.engine.generation.events import Finished, Token

SYNC_OPS = ("eval", "array.item", "array.tolist", "synchronize")


@dataclass
class BackendTrace:
    backend: str
    events: list = field(default_factory=list)  # engine.backends.OpEvent, up to max_events
    ops: int = 0  # every op seen (events may stop at max_events)
    token_ns: list[int] = field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    finished: Finished | None = None

    @property
    def tokens(self) -> int:
        return len(self.token_ns)


def trace_backend_generation(backend, lm, prompt, config, max_events: int = 200_000) -> BackendTrace:
    """Generate with ``lm`` (``backend``'s model) while ``backend.trace_ops`` reports every op."""
    if not hasattr(backend, "trace_ops"):
        raise ConfigError(f"backend {backend.name!r} has no op trace hook; trace with --backend torch")
    trace = BackendTrace(backend.name)

    def sink(ev) -> None:
        trace.ops += 1
        if len(trace.events) < max_events:
            trace.events.append(ev)

    trace.start_ns = now_ns()
    with backend.trace_ops(sink):
        for event in lm.generate(prompt, config):
            if isinstance(event, Token):
                trace.token_ns.append(event.t_ns)
            elif isinstance(event, Finished):
                trace.finished = event
    trace.end_ns = now_ns()
    return trace


def op_table(trace: BackendTrace) -> list[dict]:
    """One row per (op, device): count, host ms since the previous op, share, an example of shapes."""
    rows: dict = defaultdict(lambda: {"count": 0, "ns": 0, "shapes": ""})
    for ev, start in zip(trace.events, op_starts(trace)):
        row = rows[ev.op, ev.device]
        row["count"] += 1
        row["ns"] += max(ev.t_ns - start, 0)
        if not row["shapes"]:
            row["shapes"] = " ".join("x".join(map(str, s)) for s in ev.input_shapes) or "-"
    total = sum(r["ns"] for r in rows.values()) or 1
    out = [
        {
            "op": op,
            "device": dev,
            "count": r["count"],
            "ms": r["ns"] / 1e6,
            "pct": 100.0 * r["ns"] / total,
            "sync": op in SYNC_OPS,
            "shapes": r["shapes"],
        }
        for (op, dev), r in rows.items()
    ]
    return sorted(out, key=lambda r: -r["ms"])


def op_starts(trace: BackendTrace) -> list[int]:
    """When each op began, taken as when the op before it returned (the first: the trace's start)."""
    return [trace.start_ns] + [ev.t_ns for ev in trace.events[:-1]]


def as_dict(trace: BackendTrace, top: int = 0) -> dict:
    table = op_table(trace)
    devices = sorted({r["device"] for r in table})
    syncs = sum(r["count"] for r in table if r["sync"])
    return {
        "backend": trace.backend,
        "tokens": trace.tokens,
        "ops": trace.ops,
        "stored_events": len(trace.events),
        "devices": devices,
        "syncs": syncs,
        "syncs_per_token": syncs / max(trace.tokens, 1),
        "wall_ms": (trace.end_ns - trace.start_ns) / 1e6,
        "ops_by_time": table[:top] if top else table,
    }


def render_text(trace: BackendTrace, top: int = 15) -> str:
    d = as_dict(trace)
    lines = [
        f"Op trace on the {d['backend']} backend: {d['ops']} ops over {d['tokens']} tokens "
        f"({d['wall_ms']:.0f} ms), device/stream: {', '.join(d['devices']) or '-'}",
        f"host syncs: {d['syncs']} ({d['syncs_per_token']:.1f} per token)",
        "host time per op, since the previous one returned (lazy ops: compute shows up on the syncs):",
        f"  {'op':<36} {'count':>7} {'ms':>9} {'%':>6}  shapes (first call)",
    ]
    for r in d["ops_by_time"][:top]:
        lines.append(f"  {r['op']:<36} {r['count']:>7} {r['ms']:>9.2f} {r['pct']:>5.1f}%  {r['shapes'][:48]}")
    if len(d["ops_by_time"]) > top:
        lines.append(f"  … {len(d['ops_by_time']) - top} more ops (--json for all)")
    return "\n".join(lines) + "\n"


def write_chrome_trace(trace: BackendTrace, path) -> None:
    """Perfetto / chrome://tracing JSON: one complete event per op, from the previous op's return to its own."""
    import json

    out = []
    for ev, start in zip(trace.events, op_starts(trace)):
        out.append(
            {
                "name": ev.op,
                "ph": "X",
                "pid": trace.backend,
                "tid": ev.device,
                "ts": (start - trace.start_ns) / 1e3,
                "dur": max(ev.t_ns - start, 0) / 1e3,
                "args": {"inputs": [list(s) for s in ev.input_shapes], "dtypes": list(ev.input_dtypes)},
            }
        )
    out += [
        {"name": "token", "ph": "i", "s": "g", "pid": trace.backend, "tid": "tokens", "ts": (t - trace.start_ns) / 1e3}
        for t in trace.token_ns
    ]
    with open(path, "w") as f:
        json.dump({"traceEvents": out, "displayTimeUnit": "ms"}, f)
