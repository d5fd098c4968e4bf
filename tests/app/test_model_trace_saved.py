"""Issue 28: a model trace from the Trace panel is a run in the store, as a script's trace is."""

from __future__ import annotations

import threading


def test_a_model_trace_is_saved_as_a_run(lm_plain, tmp_path):
    from opscope.app.worker.protocol import TraceRequest
    from opscope.app.worker.trace import run_trace
    from opscope.engine.store import RunStore

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    req = TraceRequest(prompt="The capital of France is", tokens=2, variant="leaky-norm", simulate="meta", db_url=url)
    result = run_trace(lm_plain, req, lambda *_a, **_k: None, threading.Event())
    with RunStore.open(url) as store:
        (info,) = store.list(kind="trace")
        stored = store.load(info.id).result
    assert (result["run_id"], result["run_name"]) == (info.id, info.name)
    summary = stored.trace_summary
    assert summary["script"] == "model leaky-norm: 'The capital of France is'" and summary["target"] == "meta"
    assert summary["ops"] == result["ops"] and len(summary["findings"]) == len(result["report"]["findings"]) >= 1
