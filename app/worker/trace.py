"""The worker's trace job: trace one generation, stream the op rows, return the placement report.

Ops travel as column batches (a few thousand rows per message) so that neither side holds the
GIL or the GUI event loop for long on one message. The Perfetto JSON is written here, where the
trace lives, to a temp file whose path the GUI copies on "Export".
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from opscope.app.worker.protocol import TraceRequest

BATCH_ROWS = 4000
COLUMNS = ("seq", "op", "kind", "direction", "device", "module", "source", "step", "t_us", "dur_us", "bytes", "shapes")


def run_trace(loaded, req: TraceRequest, send, cancel: threading.Event) -> dict:
    from opscope.engine import (
        ConfigError,
        GenerationConfig,
        TraceOptions,
        build_report,
        trace_generation,
        write_chrome_trace,
    )

    if req.tokens < 1:
        raise ConfigError(f"trace tokens must be at least 1, got {req.tokens}")
    backend = getattr(loaded, "backend_name", "torch")
    if backend != "torch":  # an MLX model has .model too, but no torch ops for the placement tracer
        from opscope.app.worker.backend_trace import run_backend_trace

        return run_backend_trace(loaded, backend, req, send, cancel)
    simulate = req.simulate == "meta"
    target = "meta" if simulate else str(loaded.device)
    options = TraceOptions(target=target, max_events=req.max_events)
    config = GenerationConfig(max_tokens=req.tokens, ignore_eos=True)
    run = trace_generation(loaded, req.prompt, config, options, variant=req.variant, simulate=simulate)
    notes = list(run.notes)
    if target == "cpu":
        notes.append(
            "the target is the host (cpu), so a fallback to the CPU cannot show: choose "
            "'simulated accelerator' to see placement as on a GPU"
        )
    placement = build_report(run.result, notes)
    report = placement.as_dict()
    _send_rows(run.result, send, cancel)
    path = Path(tempfile.mkdtemp(prefix="opscope-trace-")) / "trace.perfetto.json"
    write_chrome_trace(run.result, path, report)
    saved = save_model_trace(loaded, req, run.result, placement) if req.save else (None, None)
    return {
        "report": report,
        "perfetto_path": str(path),
        "variant": req.variant,
        "simulated": simulate,
        "tokens": run.result.tokens,
        "ops": run.result.stats.ops,
        "stored": len(run.result.events),
        "run_id": saved[0],
        "run_name": saved[1],
    }


def save_model_trace(loaded, req: TraceRequest, result, placement) -> tuple[int, str]:
    """The model's trace as a run (kind "trace"), as a script's trace is saved: listed in Runs and
    comparable with `opscope trace diff` (a model trace from the Trace panel was not kept)."""
    from types import SimpleNamespace

    from opscope.engine import RunResult, trace_runs

    label = f"model {req.variant}: {req.prompt[:40]!r}"
    shim = SimpleNamespace(
        spec=SimpleNamespace(label=label, args=[]),
        step_source="generated tokens",
        step_ms=[],
        outcome=SimpleNamespace(wall_ns=0, exit_code=0, error=None),
        result=result,
        losses=[],
        roots=[],
    )
    settings = {
        "script": label,
        "variant": req.variant,
        "prompt": req.prompt,
        "tokens": req.tokens,
        "target": placement.target,
        "model": str(getattr(loaded.source, "path", "")),
    }
    run = RunResult(kind=trace_runs.RUN_KIND, settings=settings, trace_summary=trace_runs.summary(shim, placement))
    return trace_runs.save(run, req.db_url)


def _send_rows(result, send, cancel: threading.Event) -> None:
    events, start = result.events, result.start_ns
    total = len(events)
    for lo in range(0, total, BATCH_ROWS):
        if cancel.is_set():
            return
        chunk = events[lo : lo + BATCH_ROWS]
        send("batch", done=lo + len(chunk), total=total, columns=_columns(chunk, start))


def _columns(chunk, start_ns: int) -> dict[str, list]:
    return {
        "seq": [e.seq for e in chunk],
        "op": [e.op for e in chunk],
        "kind": [e.kind for e in chunk],
        "direction": [e.direction or "" for e in chunk],
        "device": [e.device for e in chunk],
        "module": [e.module or "" for e in chunk],
        "source": [e.source or "" for e in chunk],
        "step": [e.step for e in chunk],
        "t_us": [(e.t_ns - start_ns) / 1e3 for e in chunk],
        "dur_us": [e.dur_ns / 1e3 for e in chunk],
        "bytes": [e.bytes_read + e.bytes_written for e in chunk],
        "shapes": [" ".join("x".join(map(str, s)) for s in e.in_shapes) for e in chunk],
    }
