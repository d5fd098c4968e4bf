"""The worker's diagnose job: one bounded diagnosis of the loaded model (engine.diagnose), its lines
as the CLI prints them, and its summary; saved as a run of kind ``diagnosis`` when a store is given.

Each stage of the measurement is sent as progress as it begins; Stop cancels the job at the next
stage or decode step (Cancelled, "diagnosis cancelled; nothing was saved"): a cancelled diagnosis
is never saved, in part or whole."""

from __future__ import annotations

import threading
from pathlib import Path

from opscope.app.worker.protocol import DiagnoseRequest


def run_diagnose(loaded, req: DiagnoseRequest, send, cancel: threading.Event) -> dict:
    from opscope.engine import ConfigError, DiagnosisStages, diagnose_model, render_diagnosis, save_trace_run

    if not hasattr(loaded, "model"):
        raise ConfigError("diagnose needs a torch model: switch the backend to torch")
    if req.tokens < 2 or req.trace_tokens < 2:
        raise ConfigError("diagnose needs at least 2 decode tokens, timed and traced")
    stages = DiagnosisStages(cancel, lambda stage: send("progress", stage=stage))
    d, run = diagnose_model(loaded, _plan(loaded, req), Path(str(loaded.source.path)).name, stages=stages)
    stages.check()  # Stop pressed after the last stage: still nothing saved
    result = {"lines": render_diagnosis(d).splitlines(), "summary": d.summary(), "run_id": None}
    if req.save:
        result["run_id"], result["run_name"] = save_trace_run(run, req.db_url)
    return result


def _plan(loaded, req: DiagnoseRequest):
    from opscope.engine import DiagnosisPlan

    return DiagnosisPlan(
        prompt_tokens=req.prompt_tokens,
        tokens=req.tokens,
        trace_tokens=req.trace_tokens,
        variant=req.variant,
        simulate=req.simulate == "meta",
        dtype=str(loaded.dtype).removeprefix("torch."),
    )
