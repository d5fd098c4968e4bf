"""Every rank on one time axis: clock alignment, per-rank spans, stragglers, and a Chrome/Perfetto
trace with one process track per rank.

Ranks on rank 0's machine share its ``CLOCK_MONOTONIC`` (same boot id): their timestamps are used
as they are. A rank on another machine is moved onto rank 0's clock by the offset read right
after a barrier (each rank's ``monotonic_ns`` gathered at once), good to the barrier's exit skew.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


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
            spans.append(
                {
                    "name": f"{p.collective} {p.mode}",
                    "start_ns": s + off,
                    "end_ns": e + off,
                    "args": {"size_bytes": p.size_bytes, "rep": i, "calls": p.inner},
                }
            )
    return spans


def chrome_trace(
    spans_by_rank: dict[int, list[dict[str, Any]]], title: str = "opscope ranks", thread: str = "collectives"
) -> dict:
    """Chrome trace JSON (Perfetto opens it): one process per rank, named "rank N", sorted by rank,
    its spans on one thread (spans inside another nest under it). A span's "cat" defaults to
    "collective"."""
    starts = [s["start_ns"] for spans in spans_by_rank.values() for s in spans]
    t0 = min(starts) if starts else 0
    events: list[dict] = []
    for rank in sorted(spans_by_rank):
        pid = rank + 1  # pid 0 is dropped by some viewers
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": rank}})
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "thread_name", "args": {"name": thread}})
        for s in spans_by_rank[rank]:
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": 0,
                    "name": s["name"],
                    "cat": s.get("cat", "collective"),
                    "ts": (s["start_ns"] - t0) / 1e3,
                    "dur": (s["end_ns"] - s["start_ns"]) / 1e3,
                    "args": s.get("args", {}),
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


def write_chrome_trace(spans_by_rank: dict[int, list[dict[str, Any]]], path: Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(spans_by_rank)))
    return path


def imbalance(per_rank_times_s: dict[int, Iterable[float]]) -> dict[str, Any]:
    """Per-rank median time of one point; the slowest rank and the spread between ranks.

    ``spread_pct`` = (slowest − fastest) / fastest of the per-rank medians: 0 when every rank
    finishes together; a straggler shows as one rank far above the others."""
    import statistics

    medians = {r: statistics.median(list(ts)) for r, ts in per_rank_times_s.items()}
    slow = max(medians, key=medians.__getitem__)
    fast = min(medians, key=medians.__getitem__)
    spread = (medians[slow] - medians[fast]) / medians[fast] * 100 if medians[fast] > 0 else 0.0
    return {"median_s": medians, "slowest_rank": slow, "fastest_rank": fast, "spread_pct": spread}


# -- tensor-parallel decode: each rank's forwards and all_reduces ---------------------------------
# A rank's spans (engine.distributed.tp.CommMeter.spans): {"forwards": [(start_ns, end_ns, tokens)],
# "all_reduces": [(start_ns, end_ns, bytes)], "dropped": n}, plus "offset_ns" onto rank 0's clock
# once gathered (tp_worker.Driver.read_spans). Every figure below and the trace come from these.
MAX_ALLREDUCE_MARKERS = 50_000  # all_reduce spans saved as markers per run (the newest), all ranks


def decode_steps(spans: dict[str, Any]) -> list[dict[str, Any]]:
    """Each single-token forward (a decode step) with the time spent inside the all_reduces it
    contains and that time's share (percent) of the step."""
    ars, out, j = spans["all_reduces"], [], 0
    for start, end, tokens in spans["forwards"]:
        while j < len(ars) and ars[j][0] < start:
            j += 1
        inside = 0
        while j < len(ars) and ars[j][1] <= end:
            inside += ars[j][1] - ars[j][0]
            j += 1
        if tokens == 1 and end > start:
            out.append(
                {
                    "start_ns": start,
                    "step_ns": end - start,
                    "allreduce_ns": inside,
                    "allreduce_pct": 100.0 * inside / (end - start),
                }
            )
    return out


def forward_name(tokens: int) -> str:
    return "decode step" if tokens == 1 else f"prefill {tokens} tok"


def tp_spans(spans: dict[str, Any]) -> list[dict[str, Any]]:
    """One rank's forwards and all_reduces as chrome_trace's spans, on rank 0's clock."""
    off = spans.get("offset_ns", 0)
    out = [
        {
            "name": forward_name(tokens),
            "cat": "forward",
            "start_ns": s + off,
            "end_ns": e + off,
            "args": {"tokens": tokens},
        }
        for s, e, tokens in spans["forwards"]
    ]
    out += [
        {"name": "all_reduce", "start_ns": s + off, "end_ns": e + off, "args": {"bytes": nbytes}}
        for s, e, nbytes in spans["all_reduces"]
    ]
    return out


def write_tp_trace(spans_by_rank: dict[int, dict[str, Any]], path) -> Path:
    """Every rank's forwards, each with its all_reduces nested inside, on rank 0's clock: one
    Perfetto process per rank (the collectives' exporter, chrome_trace)."""
    path = Path(path)
    doc = chrome_trace(
        {r: tp_spans(spans_by_rank[r]) for r in spans_by_rank}, "opscope tensor-parallel ranks", thread="forward"
    )
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path


def tp_markers(spans_by_rank: dict[int, dict[str, Any]]):
    """Each rank's forwards ("forward") and its newest all_reduces ("all_reduce", at most
    MAX_ALLREDUCE_MARKERS over all ranks) as start/end markers on rank 0's clock, carrying the rank."""
    from opscope.engine.core.results import Marker

    out = []
    per_rank = MAX_ALLREDUCE_MARKERS // max(1, len(spans_by_rank))
    for r in sorted(spans_by_rank):
        sp, off = spans_by_rank[r], spans_by_rank[r].get("offset_ns", 0)
        for s, e, tokens in sp["forwards"]:
            attrs = {"rank": r, "tokens": tokens}
            out += [Marker("forward", "start", s + off, attrs), Marker("forward", "end", e + off, attrs)]
        for s, e, nbytes in sp["all_reduces"][-per_rank:] if per_rank else []:
            attrs = {"rank": r, "bytes": nbytes}
            out += [Marker("all_reduce", "start", s + off, attrs), Marker("all_reduce", "end", e + off, attrs)]
    return out


def tp_report(spans_by_rank: dict[int, dict[str, Any]], backend: str = "") -> list[str]:
    """Lines for the terminal: the all_reduce share of each decode step per rank, and which rank
    the others waited for (the one computing longest: its peers idle inside the all_reduce)."""
    import statistics

    steps = {r: decode_steps(spans_by_rank[r]) for r in sorted(spans_by_rank)}
    if not any(steps.values()):
        return []
    parts = []
    for r, st in steps.items():
        shares = [s["allreduce_pct"] for s in st]
        parts.append(
            f"rank {r} median {statistics.median(shares):.1f}% (min {min(shares):.1f}%, "
            f"max {max(shares):.1f}%, {len(shares)} steps)"
            if shares
            else f"rank {r}: no decode steps"
        )
    lines = [
        f"tensor-parallel over {len(steps)} ranks{' (' + backend + ')' if backend else ''}: all_reduce "
        f"share of each decode step, from the ranks' spans (the trace's): " + "; ".join(parts)
    ]
    n = min(len(st) for st in steps.values())
    if n and len(steps) > 1:
        compute = {r: [s["step_ns"] - s["allreduce_ns"] for s in st[-n:]] for r, st in steps.items()}
        longest = [max(compute, key=lambda r: compute[r][i]) for i in range(n)]
        rank = max(set(longest), key=longest.count)
        medians = {r: statistics.median(c) for r, c in compute.items()}
        slow, fast = max(medians, key=medians.__getitem__), min(medians, key=medians.__getitem__)
        spread = (medians[slow] - medians[fast]) / medians[fast] * 100 if medians[fast] > 0 else 0.0
        lines.append(
            f"imbalance: rank {rank} computed longest (step minus all_reduce) at {longest.count(rank)} of "
            f"{n} decode steps, the other ranks waiting for it inside all_reduce; spread of the ranks' "
            f"median compute per step {spread:.0f}% (slowest rank {slow})"
        )
    dropped = sum(sp.get("dropped", 0) for sp in spans_by_rank.values())
    if dropped:
        lines.append(f"note: the oldest {dropped} forwards were dropped from the ranks' spans (memory bound)")
    return lines
