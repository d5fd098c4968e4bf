"""Exports: Chrome trace / Perfetto JSON (Trace Event Format) and JSON lines of the raw events.

Chrome trace layout: one process track per device (pid 1, 2, ... named after the device) with the
ops that ran there as complete ("X") slices on host time; each transfer is a slice on both the
source and the destination track joined by a flow arrow ("s" → "f"); the engine track (pid 0)
carries phases (prefill/decode markers) and one instant per generated token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from opscope.engine.trace.capture import TraceResult
from opscope.engine.trace.events import MIXED, TRANSFER, OpEvent, dtype_name

ENGINE_PID, OPS_TID, TOKENS_TID = 0, 1, 2


def _us(t_ns: int, start_ns: int) -> float:
    return round((t_ns - start_ns) / 1e3, 3)


def _meta(pid: int, tid: int, kind: str, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _args(ev: OpEvent) -> dict[str, Any]:
    args = {
        "seq": ev.seq,
        "kind": ev.kind,
        "module": ev.module,
        "source": ev.source,
        "step": ev.step,
        "in": [f"{d} {dtype_name(t)}{list(s)}" for d, t, s in zip(ev.in_devices, ev.in_dtypes, ev.in_shapes)],
        "out": [f"{d} {dtype_name(t)}{list(s)}" for d, t, s in zip(ev.out_devices, ev.out_dtypes, ev.out_shapes)],
        "bytes_read": ev.bytes_read,
        "bytes_written": ev.bytes_written,
    }
    if ev.direction:
        args["direction"] = ev.direction
    if ev.pinned is not None:
        args["pinned"] = ev.pinned
    if ev.device_dur_ns is not None:
        args["device_us"] = round(ev.device_dur_ns / 1e3, 3)
    return args


class _Tracks:
    def __init__(self):
        self.pids: dict[str, int] = {}
        self.meta: list[dict] = [
            _meta(ENGINE_PID, 0, "process_name", "engine"),
            _meta(ENGINE_PID, OPS_TID, "thread_name", "phases"),
            _meta(ENGINE_PID, TOKENS_TID, "thread_name", "tokens"),
        ]

    def pid(self, device: str) -> int:
        pid = self.pids.get(device)
        if pid is None:
            pid = self.pids[device] = len(self.pids) + 1
            self.meta += [
                _meta(pid, 0, "process_name", device),
                _meta(pid, OPS_TID, "thread_name", "ops"),
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
            ]
        return pid


def _op_events(ev: OpEvent, start_ns: int, tracks: _Tracks, flow_id: int) -> list[dict]:
    ts, dur = _us(ev.t_ns, start_ns), max(round(ev.dur_ns / 1e3, 3), 0.001)
    name = ev.op.split(".", 1)[1] if "." in ev.op else ev.op
    if ev.kind not in (TRANSFER, MIXED) or not ev.in_devices or not ev.out_devices:
        return [
            {
                "ph": "X",
                "name": name,
                "cat": ev.kind,
                "ts": ts,
                "dur": dur,
                "pid": tracks.pid(ev.device),
                "tid": OPS_TID,
                "args": _args(ev),
            }
        ]
    src, dst = _ends(ev)
    label = f"{ev.direction} {name}" if ev.direction else name
    slices = [
        {
            "ph": "X",
            "name": label,
            "cat": ev.kind,
            "ts": ts,
            "dur": dur,
            "pid": tracks.pid(d),
            "tid": OPS_TID,
            "args": _args(ev),
        }
        for d in (src, dst)
    ]
    flow = {"name": label, "cat": "transfer", "id": flow_id, "tid": OPS_TID}
    return slices + [
        dict(flow, ph="s", ts=ts, pid=tracks.pid(src)),
        dict(flow, ph="f", bp="e", ts=ts, pid=tracks.pid(dst)),
    ]


def _ends(ev: OpEvent) -> tuple[str, str]:
    if ev.op.startswith("aten.copy_") and len(ev.in_devices) >= 2:
        return ev.in_devices[1], ev.in_devices[0]
    src = next((d for d in ev.in_devices if d != ev.out_devices[0]), ev.in_devices[0])
    return src, ev.out_devices[0]


def _engine_events(result: TraceResult) -> list[dict]:
    start, out, open_at = result.start_ns, [], {}
    for m in result.markers:
        key = (m.phase, tuple(sorted((k, str(v)) for k, v in m.attrs.items())))
        if m.edge == "start":
            open_at[key] = m.t_ns
        elif key in open_at:
            t0 = open_at.pop(key)
            name = str(m.attrs.get("region", m.phase))  # a user's opscope.region("name") shows by its name
            out.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": "phase",
                    "ts": _us(t0, start),
                    "dur": max(_us(m.t_ns, t0), 0.001),
                    "pid": ENGINE_PID,
                    "tid": OPS_TID,
                    "args": {k: str(v) for k, v in m.attrs.items()},
                }
            )
    for i, t in enumerate(result.token_ns):
        unit = result.step_unit
        out.append(
            {
                "ph": "i",
                "s": "p",
                "name": f"{unit} {i}",
                "cat": unit,
                "ts": _us(t, start),
                "pid": ENGINE_PID,
                "tid": TOKENS_TID,
            }
        )
    return out


def chrome_trace(result: TraceResult, report: dict | None = None) -> dict:
    """The trace as a Trace Event Format object (load it in ui.perfetto.dev or chrome://tracing)."""
    tracks, events = _Tracks(), []
    tracks.pid(result.options.target)  # the target's track first, even when nothing ran there
    for flow_id, ev in enumerate(result.events, 1):
        events += _op_events(ev, result.start_ns, tracks, flow_id)
    events += _engine_events(result)
    other = {
        "target": result.options.target,
        "tokens": result.tokens,
        "ops": result.stats.ops,
        "dropped_events": result.dropped,
        "source_lines": result.options.source,
    }
    if report is not None:
        other["report"] = report
    return {"traceEvents": tracks.meta + events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(result: TraceResult, path: Path, report: dict | None = None) -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(result, report), separators=(",", ":")))
    return path


def write_jsonl(result: TraceResult, out: IO[str] | Path) -> int:
    """One JSON object per line: a header, every stored op, each token, each marker. Returns lines."""
    if isinstance(out, (str, Path)):
        with open(out, "w") as f:
            return write_jsonl(result, f)
    header = {
        "type": "header",
        "target": result.options.target,
        "ops": result.stats.ops,
        "stored": len(result.events),
        "dropped": result.dropped,
        "tokens": result.tokens,
        "start_ns": result.start_ns,
        "end_ns": result.end_ns,
    }
    lines = [header] + [dict(ev.as_dict(), type="op") for ev in result.events]
    lines += [{"type": "token", "index": i, "t_ns": t} for i, t in enumerate(result.token_ns)]
    lines += [
        {
            "type": "marker",
            "phase": m.phase,
            "edge": m.edge,
            "t_ns": m.t_ns,
            "attrs": {k: str(v) for k, v in m.attrs.items()},
        }
        for m in result.markers
    ]
    for line in lines:
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
    return len(lines)


def ranks_trace(per_rank: dict[int, tuple[dict, int]]) -> dict:
    """Several ranks' Chrome traces on one time axis: one process per rank, named "rank N".

    ``per_rank``: {rank: (that rank's ``chrome_trace(result)``, its ``result.start_ns`` on rank 0's
    clock)} (engine.distributed.ranks gives each rank's offset onto rank 0's clock). A rank's own
    processes (the engine track, one per device) become threads of its process, named
    "<process> · <thread>", so Perfetto shows every rank as one collapsible track."""
    t0 = min(start for _doc, start in per_rank.values()) if per_rank else 0
    meta, events = [], []
    for rank in sorted(per_rank):
        doc, start_ns = per_rank[rank]
        pid, shift_us = rank + 1, (start_ns - t0) / 1e3
        meta += [
            _meta(pid, 0, "process_name", f"rank {rank}"),
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank}},
        ]
        tids = _RankThreads(doc["traceEvents"])
        for ev in doc["traceEvents"]:
            if ev["ph"] == "M":
                continue
            out = dict(ev, pid=pid, tid=tids.tid(ev["pid"], ev.get("tid", 0)), ts=round(ev["ts"] + shift_us, 3))
            if "id" in out:  # flow ids stay unique across ranks
                out["id"] = rank * 10**9 + int(out["id"])
            events.append(out)
        meta += [_meta(pid, tid, "thread_name", name) for tid, name in tids.names.items()]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": {"ranks": sorted(per_rank)}}


class _RankThreads:
    """(original pid, tid) of one rank's trace → a thread of the rank's process, with a name."""

    def __init__(self, events: list[dict]):
        self.procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        self.threads = {
            (e["pid"], e.get("tid", 0)): e["args"]["name"]
            for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"
        }
        self.map: dict[tuple[int, int], int] = {}
        self.names: dict[int, str] = {}

    def tid(self, pid: int, tid: int) -> int:
        key = (pid, tid)
        if key not in self.map:
            new = self.map[key] = len(self.map) + 1
            proc = self.procs.get(pid, f"process {pid}")
            self.names[new] = f"{proc} · {self.threads[key]}" if key in self.threads else proc
        return self.map[key]
