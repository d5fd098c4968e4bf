"""The JSON Object Format of the Trace Event Format (Chrome/Perfetto traces), as a validator for
tests: every exported trace must load in the importers."""

from __future__ import annotations

import math

# Trace Event Format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
# required fields per phase, and the value types the importers accept.
_REQUIRED = {
    "X": ("name", "ts", "dur", "pid", "tid"),
    "B": ("name", "ts", "pid", "tid"),
    "E": ("ts", "pid", "tid"),
    "i": ("name", "ts", "pid", "tid", "s"),
    "s": ("name", "cat", "id", "ts", "pid", "tid"),
    "f": ("name", "cat", "id", "ts", "pid", "tid"),
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
        assert any(
            e["ph"] == "X"
            and e["pid"] == end["pid"]
            and e["tid"] == end["tid"]
            and e["ts"] <= end["ts"] <= e["ts"] + e["dur"]
            for e in events
        ), f"unbound flow end {end}"
