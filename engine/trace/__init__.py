"""Device-placement trace: every aten op of a region with its device, classified against a target
device, summarized in a placement report that names modules and source lines, and exported as a
Chrome trace / Perfetto JSON and JSON lines. See docs/trace.md.

    from engine.trace import TraceOptions, trace_generation, build_report, render_text
    run = trace_generation(lm, "Hello", GenerationConfig(max_tokens=8), TraceOptions(target="cuda"))
    print(render_text(build_report(run.result, run.notes)))

Names are imported on first use: importing this package does not import torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "TraceOptions": "engine.trace.events", "OpEvent": "engine.trace.events",
    "Tracer": "engine.trace.capture", "TraceResult": "engine.trace.capture",
    "trace_generation": "engine.trace.session", "trace_callable": "engine.trace.session",
    "trace_model": "engine.trace.session", "TraceRun": "engine.trace.session",
    "build_report": "engine.trace.report", "PlacementReport": "engine.trace.report",
    "Finding": "engine.trace.findings", "render_text": "engine.trace.render",
    "chrome_trace": "engine.trace.export", "write_chrome_trace": "engine.trace.export",
    "write_jsonl": "engine.trace.export", "plant": "engine.trace.variants", "VARIANTS": "engine.trace.variants",
    "trace_script": "engine.trace.script", "ScriptSpec": "engine.trace.script", "parse_command": "engine.trace.script",
    "script_report": "engine.trace.script_cli", "HealthOptions": "engine.trace.health",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.trace' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
