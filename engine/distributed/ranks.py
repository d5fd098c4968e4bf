"""Every rank on one time axis: clock alignment, per-rank spans, stragglers, and a Chrome/Perfetto
trace with one process track per rank.

Ranks on rank 0's machine share its ``CLOCK_MONOTONIC`` (same boot id): their timestamps are used
as they are. A rank on another machine is moved onto rank 0's clock by the offset read right
after a barrier (each rank's ``monotonic_ns`` gathered at once), good to the barrier's exit skew.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        import socket

        return socket.gethostname()  # without a boot id, one host is taken as one clock


def clock_alignment(torch, dist, device) -> dict[str, Any]:
    """This rank's offset onto rank 0's clock: ``aligned_ns = own_ns + offset_ns``."""
    dist.barrier()
    now = time.monotonic_ns()
    mine = {"t_ns": now, "boot_id": _boot_id()}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    zero = everyone[0]
    same = zero["boot_id"] == mine["boot_id"]
    return {"offset_ns": 0 if same else zero["t_ns"] - now, "shares_rank0_clock": same}


def rank_spans(rank_result: dict[str, Any]) -> list[dict[str, Any]]:
    """This rank's timed reps as spans on rank 0's clock: {name, start_ns, end_ns, args}."""
    off = rank_result["clock"]["offset_ns"]
    spans = []
    for p in rank_result["points"]:
        for i, (s, e) in enumerate(p.spans_ns):
            spans.append({"name": f"{p.collective} {p.mode}", "start_ns": s + off, "end_ns": e + off,
                          "args": {"size_bytes": p.size_bytes, "rep": i, "calls": p.inner}})
    return spans


def chrome_trace(spans_by_rank: dict[int, list[dict[str, Any]]], title: str = "opscope ranks") -> dict:
    """Chrome trace JSON (Perfetto opens it): one process per rank, named "rank N", sorted by rank."""
    starts = [s["start_ns"] for spans in spans_by_rank.values() for s in spans]
    t0 = min(starts) if starts else 0
    events: list[dict] = []
    for rank in sorted(spans_by_rank):
        pid = rank + 1  # pid 0 is dropped by some viewers
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": rank}})
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "thread_name", "args": {"name": "collectives"}})
        for s in spans_by_rank[rank]:
            events.append({"ph": "X", "pid": pid, "tid": 0, "name": s["name"], "cat": "collective",
                           "ts": (s["start_ns"] - t0) / 1e3, "dur": (s["end_ns"] - s["start_ns"]) / 1e3,
                           "args": s.get("args", {})})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


def write_chrome_trace(spans_by_rank: dict[int, list[dict[str, Any]]], path: Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(spans_by_rank)))
    return path


def imbalance(per_rank_times_s: dict[int, Iterable[float]]) -> dict[str, Any]:
    """Per-rank median time of one point; the slowest rank and the spread between ranks.

    ``spread_pct`` = (slowest − fastest) / fastest of the per-rank medians: 0 when every rank
    finishes together; a straggler shows as one rank far above the others."""
    from opscope.engine.bench.stats import summarize

    medians = {r: summarize(list(ts)).median for r, ts in per_rank_times_s.items()}
    slow = max(medians, key=medians.get)
    fast = min(medians, key=medians.get)
    spread = (medians[slow] - medians[fast]) / medians[fast] * 100 if medians[fast] > 0 else 0.0
    return {"median_s": medians, "slowest_rank": slow, "fastest_rank": fast, "spread_pct": spread}
