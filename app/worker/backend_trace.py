"""The worker's trace of a plugin backend's model (MLX): through the backend's own op hook, as
`opscope trace --backend mlx` does, never around it.

The torch tracer's placement report (fallbacks, transfers, storms) comes from torch's dispatcher;
a plugin's model issues no torch ops. Its trace is the backend's op stream (each call with its
device or stream, shapes and host time) sent as the same op columns, with a report the panel shows
in its own words.
"""

from __future__ import annotations

import bisect
import math
import re
import tempfile
import threading
from pathlib import Path

from opscope.app.worker.protocol import TraceRequest

BATCH_ROWS = 4000
CLEAN = "clean"  # the one variant a plugin backend runs: the planted ones are torch modules


def run_backend_trace(loaded, name: str, req: TraceRequest, send, cancel: threading.Event) -> dict:
    from opscope.engine import ConfigError, GenerationConfig, backend_ops, get_backend

    if req.variant != CLEAN or req.simulate:
        raise ConfigError(
            f"the {name} backend traces its own ops: planted variants and the simulated accelerator "
            f"trace torch ops; choose variant 'clean' and target 'as loaded', or load the model on torch"
        )
    config = GenerationConfig(max_tokens=req.tokens, ignore_eos=True)
    trace = backend_ops.trace_backend_generation(get_backend(name), loaded, req.prompt, config, req.max_events)
    _send_columns(columns(trace, backend_ops.op_starts(trace)), send, cancel)
    path = Path(tempfile.mkdtemp(prefix="opscope-trace-")) / "trace.perfetto.json"
    backend_ops.write_chrome_trace(trace, path)
    return {
        "report": report(backend_ops.as_dict(trace), name),
        "perfetto_path": str(path),
        "variant": req.variant,
        "simulated": False,
        "tokens": trace.tokens,
        "ops": trace.ops,
        "stored": len(trace.events),
        "run_id": None,
        "run_name": None,
    }


def report(summary: dict, name: str) -> dict:
    """engine.trace.backend_ops.as_dict with the keys the Trace panel reads for every trace."""
    return dict(
        summary,
        target=", ".join(summary["devices"]) or "-",
        unit="token",
        findings=[],
        notes=[
            f"each op is one {name} call, timed on the host from the previous op's return to its own; "
            "a lazy backend (MLX) only records the op in its graph there, so the compute shows up "
            "on the syncs (eval, array.item) that wait for it",
            f"placement checks (fallbacks, transfers, storms) read torch's dispatcher and do not "
            f"apply to the {name} backend",
            "not saved as a run: saved model traces are torch placement traces (`opscope trace diff`)",
        ],
    )


def columns(trace, starts: list[int]) -> dict[str, list]:
    """The op table's columns (app/worker/trace.py COLUMNS) for a backend's OpEvents; step = the
    tokens already out when the op returned (0: the prompt's prefill)."""
    from opscope.engine import backend_ops

    events, t0 = trace.events, trace.start_ns
    return {
        "seq": [e.seq for e in events],
        "op": [e.op for e in events],
        "kind": ["sync" if e.op in backend_ops.SYNC_OPS else "op" for e in events],
        "direction": [""] * len(events),
        "device": [e.device for e in events],
        "module": [""] * len(events),
        "source": [""] * len(events),
        "step": [bisect.bisect_right(trace.token_ns, e.t_ns) for e in events],
        "t_us": [(s - t0) / 1e3 for s in starts],
        "dur_us": [max(e.t_ns - s, 0) / 1e3 for e, s in zip(events, starts)],
        "bytes": [_bytes(e.input_shapes, e.input_dtypes) + _bytes(e.output_shapes, e.output_dtypes) for e in events],
        "shapes": [" ".join("x".join(map(str, s)) for s in e.input_shapes) for e in events],
    }


def _bytes(shapes, dtypes) -> int:
    """The arrays' sizes from their shapes and dtype names ("float32": 4 bytes, "bool": 1)."""
    return sum(math.prod(s) * _itemsize(d) for s, d in zip(shapes, dtypes))


def _itemsize(dtype: str) -> int:
    bits = re.search(r"(\d+)$", dtype)
    return max(int(bits.group(1)) // 8, 1) if bits else 1


def _send_columns(cols: dict[str, list], send, cancel: threading.Event) -> None:
    total = len(cols["seq"])
    for lo in range(0, total, BATCH_ROWS):
        if cancel.is_set():
            return
        hi = min(lo + BATCH_ROWS, total)
        send("batch", done=hi, total=total, columns={k: v[lo:hi] for k, v in cols.items()})
