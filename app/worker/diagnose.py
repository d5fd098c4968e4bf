"""The worker's diagnose job: one bounded diagnosis of the loaded model (engine.diagnose), its lines
as the CLI prints them, and its summary; saved as a run of kind ``diagnosis`` when a store is given."""

from __future__ import annotations

from pathlib import Path

from opscope.app.worker.protocol import DiagnoseRequest


def run_diagnose(loaded, req: DiagnoseRequest) -> dict:
    from opscope.engine import ConfigError, DiagnosisPlan, diagnose_model, render_diagnosis, save_trace_run

    if not hasattr(loaded, "model"):
        raise ConfigError("diagnose needs a torch model: switch the backend to torch")
    if req.tokens < 2 or req.trace_tokens < 2:
        raise ConfigError("diagnose needs at least 2 decode tokens, timed and traced")
    plan = DiagnosisPlan(
        prompt_tokens=req.prompt_tokens,
        tokens=req.tokens,
        trace_tokens=req.trace_tokens,
        variant=req.variant,
        simulate=req.simulate == "meta",
        dtype=str(loaded.dtype).removeprefix("torch."),
    )
    d, run = diagnose_model(loaded, plan, Path(str(loaded.source.path)).name)
    result = {"lines": render_diagnosis(d).splitlines(), "summary": d.summary(), "run_id": None}
    if req.save:
        result["run_id"], result["run_name"] = save_trace_run(run, req.db_url)
    return result
