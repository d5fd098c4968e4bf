"""Why is it slow? One bounded measurement (a prefill and a few dozen decode steps, or a user's
script) with the trace, the telemetry and the ceilings on, read by a table of rules into a few
findings, most important first: the bound, the evidence, the place, the fix and the expected gain.
See docs/diagnose.md.

    from opscope.engine.diagnose import ModelPlan, diagnose_model, render_text
    d, run = diagnose_model(lm, ModelPlan(tokens=32), subject="model.gguf")
    print(render_text(d))

Names are imported on first use: importing this package does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Measurement": "opscope.engine.diagnose.measurement",
    "Phase": "opscope.engine.diagnose.measurement",
    "Finding": "opscope.engine.diagnose.measurement",
    "Issue": "opscope.engine.diagnose.measurement",
    "RULES": "opscope.engine.diagnose.rules",
    "diagnose": "opscope.engine.diagnose.rules",
    "ModelPlan": "opscope.engine.diagnose.measure",
    "Stages": "opscope.engine.diagnose.measure",
    "Diagnosis": "opscope.engine.diagnose.report",
    "render_text": "opscope.engine.diagnose.report",
    "render_markdown": "opscope.engine.diagnose.report",
    "diagnose_model": "opscope.engine.diagnose.session",
    "diagnose_script": "opscope.engine.diagnose.session",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.diagnose' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
