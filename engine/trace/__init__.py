"""Device-placement trace: every aten op of a region with its device, classified against a target
device, summarized in a placement report that names modules and source lines, and exported as a
Chrome trace / Perfetto JSON and JSON lines. See docs/trace.md.

    from opscope.engine.trace import TraceOptions, trace_generation, build_report, render_text
    run = trace_generation(lm, "Hello", GenerationConfig(max_tokens=8), TraceOptions(target="cuda"))
    print(render_text(build_report(run.result, run.notes)))

Names are imported on first use: importing this package does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TraceOptions": "opscope.engine.trace.events",
    "OpEvent": "opscope.engine.trace.events",
    "Tracer": "opscope.engine.trace.capture",
    "TraceResult": "opscope.engine.trace.capture",
    "trace_generation": "opscope.engine.trace.session",
    "trace_callable": "opscope.engine.trace.session",
    "trace_model": "opscope.engine.trace.session",
    "TraceRun": "opscope.engine.trace.session",
    "build_report": "opscope.engine.trace.report",
    "PlacementReport": "opscope.engine.trace.report",
    "Finding": "opscope.engine.trace.findings",
    "render_text": "opscope.engine.trace.render",
    "chrome_trace": "opscope.engine.trace.export",
    "write_chrome_trace": "opscope.engine.trace.export",
    "write_jsonl": "opscope.engine.trace.export",
    "plant": "opscope.engine.trace.variants",
    "VARIANTS": "opscope.engine.trace.variants",
    "trace_script": "opscope.engine.trace.script",
    "ScriptSpec": "opscope.engine.trace.script",
    "parse_command": "opscope.engine.trace.script",
    "script_report": "opscope.engine.cli.commands.trace_script",
    "HealthOptions": "opscope.engine.trace.health",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.trace' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
