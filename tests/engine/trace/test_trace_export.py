"""Exports: the Chrome trace / Perfetto JSON is checked against the Trace Event Format (the
rules Perfetto's and Chrome's JSON importers apply), and the JSON lines against the stored events."""
from __future__ import annotations

import json
import math

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

# Trace Event Format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
# required fields per phase, and the value types the importers accept.
_REQUIRED = {
    "X": ("name", "ts", "dur", "pid", "tid"),
    "B": ("name", "ts", "pid", "tid"), "E": ("ts", "pid", "tid"),
    "i": ("name", "ts", "pid", "tid", "s"),
    "s": ("name", "cat", "id", "ts", "pid", "tid"), "f": ("name", "cat", "id", "ts", "pid", "tid"),
    "M": ("name", "pid", "args"),
}
_METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index", "process_labels"}


def validate_trace_event_format(doc: dict) -> None:
    """Raise AssertionError where ``doc`` breaks the JSON Object Format of the Trace Event Format."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    flows: dict = {}
    for ev in doc["traceEvents"]:
        ph = ev.get("ph")
        assert ph in _REQUIRED, f"unknown phase {ph!r} in {ev}"
        missing = [k for k in _REQUIRED[ph] if k not in ev]
        assert not missing, f"{ph} event lacks {missing}: {ev}"
        assert isinstance(ev["pid"], int) and isinstance(ev.get("tid", 0), int)
        if ph != "M":
            assert isinstance(ev["ts"], (int, float)) and math.isfinite(ev["ts"]) and ev["ts"] >= 0
        if ph == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0
        if ph == "M":
            assert ev["name"] in _METADATA and isinstance(ev["args"], dict)
        if ph == "i":
            assert ev["s"] in ("g", "p", "t")
        if ph in ("s", "f"):
            flows.setdefault((ev["cat"], ev["id"]), []).append(ev)
        if "args" in ev:
            assert isinstance(ev["args"], dict)
    for key, pair in flows.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], f"flow {key} is not one start and one finish"
        _assert_flow_bound(doc["traceEvents"], pair)


def _assert_flow_bound(events: list, pair: list) -> None:
    """Each flow end must fall inside a slice on its own track, or importers drop the arrow."""
    for end in pair:
        assert any(e["ph"] == "X" and e["pid"] == end["pid"] and e["tid"] == end["tid"]
                   and e["ts"] <= end["ts"] <= e["ts"] + e["dur"] for e in events), f"unbound flow end {end}"


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
