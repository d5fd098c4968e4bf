"""Exports: the Chrome trace / Perfetto JSON is checked against the Trace Event Format (the
rules Perfetto's and Chrome's JSON importers apply), and the JSON lines against the stored events."""

from __future__ import annotations

import json

import pytest
import torch
from opscope.engine.core import markers
from opscope.engine.models.config import ModelConfig
from opscope.engine.models.transformer import Transformer
from opscope.engine.trace.capture import Tracer
from opscope.engine.trace.events import TRANSFER, TraceOptions
from opscope.engine.trace.export import chrome_trace, write_chrome_trace, write_jsonl
from opscope.engine.trace.report import build_report
from opscope.engine.trace.session import trace_model
from opscope.engine.trace.variants import LEAKY_NORM

TINY = ModelConfig(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=32, vocab_size=64, max_seq_len=32)

from trace_format import validate_trace_event_format  # noqa: E402


def _simulated_leaky_run():
    model = Transformer.random(TINY)
    run = trace_model(model, [1, 2, 3], 3, TraceOptions(target="meta"), variant=LEAKY_NORM, simulate=True)
    return run.result


@pytest.fixture(scope="module")
def leaky():
    return _simulated_leaky_run()


def test_chrome_trace_follows_the_trace_event_format(leaky, tmp_path):
    report = build_report(leaky).as_dict()
    path = write_chrome_trace(leaky, tmp_path / "trace.json", report)
    doc = json.loads(path.read_text())
    validate_trace_event_format(doc)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"engine", "meta", "cpu"}  # one track per device, plus the engine's
    transfers = sum(1 for e in leaky.events if e.kind == TRANSFER)
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "s") == transfers
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "i" and e["cat"] == "token") == 3
    assert doc["otherData"]["report"]["findings"][0]["kind"] == "fallback"


def test_validator_rejects_broken_traces(leaky):
    doc = chrome_trace(leaky)
    flow = next(e for e in doc["traceEvents"] if e["ph"] == "f")
    broken = dict(doc, traceEvents=[e for e in doc["traceEvents"] if e is not flow])
    with pytest.raises(AssertionError, match="one start and one finish"):
        validate_trace_event_format(broken)
    no_dur = dict(doc, traceEvents=[{"ph": "X", "name": "x", "ts": 0, "pid": 1, "tid": 1}])
    with pytest.raises(AssertionError, match="lacks"):
        validate_trace_event_format(no_dur)


def test_phase_markers_become_slices_on_the_engine_track():
    tracer = Tracer(TraceOptions())
    with tracer:
        markers.emit(markers.PREFILL, "start", tokens=3)
        torch.randn(4).sum()
        markers.emit(markers.PREFILL, "end", tokens=3)
        tracer.mark_token()
    doc = chrome_trace(tracer.result())
    validate_trace_event_format(doc)
    phases = [e for e in doc["traceEvents"] if e.get("cat") == "phase"]
    assert [(p["name"], p["pid"]) for p in phases] == [("prefill", 0)]


def test_jsonl_has_every_stored_event(leaky, tmp_path):
    path = tmp_path / "events.jsonl"
    n = write_jsonl(leaky, path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == n and rows[0]["type"] == "header"
    ops = [r for r in rows if r["type"] == "op"]
    assert len(ops) == len(leaky.events) == rows[0]["stored"]
    first_transfer = next(r for r in ops if r["kind"] == TRANSFER)
    assert first_transfer["direction"] in ("H2D", "D2H") and first_transfer["bytes_written"] > 0
    assert isinstance(first_transfer["in_dtypes"][0], str) and isinstance(first_transfer["in_shapes"][0], list)
    assert [r["index"] for r in rows if r["type"] == "token"] == [0, 1, 2]
