"""Checks of what a multi-rank (`--nproc`, `--nnodes`) run leaves behind, shared by the tests of
tensor-parallel decode (test_tp.py) and of the collectives bench (test_collectives.py): the
per-rank Perfetto trace read from the file alone, the medians the CLI printed, the stored run, and
its per-rank markers replayed into the telemetry panel's rank lanes."""

from __future__ import annotations

import re
import statistics


def rank_pids(doc: dict) -> dict[int, int]:
    """{rank: pid} from the trace's process_name records, each of which must read "rank N"."""
    out = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            name = e["args"]["name"]
            assert re.fullmatch(r"rank \d+", name), f"process {e['pid']} is named {name!r}, not 'rank N'"
            assert int(name.removeprefix("rank ")) not in out, f"two processes are named {name!r}"
            out[int(name.removeprefix("rank "))] = e["pid"]
    return out


def rank_slices(doc: dict) -> dict[int, list[dict]]:
    """{rank: that rank's complete ("X") slices}, every rank of the trace present (maybe empty)."""
    pids = rank_pids(doc)
    rank_of = {pid: rank for rank, pid in pids.items()}
    out: dict[int, list[dict]] = {rank: [] for rank in pids}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            assert e["pid"] in rank_of, f"slice {e['name']!r} belongs to no rank's process (pid {e['pid']})"
            out[rank_of[e["pid"]]].append(e)
    return out


def allreduce_shares(doc: dict) -> dict[int, list[float]]:
    """Each rank's decode steps from the trace alone: the share (%) of each step's duration covered
    by the all_reduce slices nested inside it."""
    out = {}
    for rank, mine in rank_slices(doc).items():
        reduces = [e for e in mine if e["name"] == "all_reduce"]
        out[rank] = [
            100
            * sum(
                a["dur"]
                for a in reduces
                if s["ts"] - 1e-3 <= a["ts"] and a["ts"] + a["dur"] <= s["ts"] + s["dur"] + 1e-3
            )
            / s["dur"]
            for s in mine
            if s["name"] == "decode step"
        ]
    return out


def printed_medians(text: str) -> dict[int, float]:
    """{rank: median %} from the CLI's "all_reduce share of each decode step" line."""
    line = next(x for x in text.splitlines() if "all_reduce share of each decode step" in x)
    return {int(r): float(v) for r, v in re.findall(r"rank (\d+) median (\d+\.\d)%", line)}


def assert_printed_medians_are_the_traces(printed: str, doc: dict, ranks=(0, 1)) -> None:
    """The medians the CLI printed, rank by rank, are the medians of the trace's shares (printed
    to 0.1 %), and it named the imbalance between the ranks."""
    shares, medians = allreduce_shares(doc), printed_medians(printed)
    assert sorted(medians) == sorted(ranks), printed
    for rank, median in medians.items():
        assert abs(statistics.median(shares[rank]) - median) <= 0.05 + 1e-9, (rank, median)
    assert "imbalance: rank " in printed


def load_run(db: str, name: str):
    """The stored result of run ``name`` in the store at ``db``."""
    from opscope.engine.store.access import open_store

    store = open_store(db)
    try:
        return store.load(name).result
    finally:
        store.close()


def rank_lanes_panel(markers, qtbot):
    """A telemetry panel (not sampling) fed a stored run's markers, replayed so that the last one
    lands 0.1 s ago, refreshed: its rank_curves / rank_comm_curves are the lanes to check. The
    caller shuts it down."""
    from opscope.app.telemetry.model import TelemetryModel
    from opscope.app.telemetry.panel import TelemetryPanel
    from opscope.engine.core.clock import now_ns

    model = TelemetryModel(None, interval_ms=1000, history_s=60, sources=[])  # not started: we feed it
    panel = TelemetryPanel(model, refresh_ms=10_000)
    qtbot.addWidget(panel)
    panel.resize(800, 700)
    panel.show()
    shift = now_ns() - max(m.t_ns for m in markers) - 10**8
    for m in sorted(markers, key=lambda m: (m.t_ns, m.edge != "end")):
        model.on_marker({"phase": m.phase, "edge": m.edge, "t_ns": m.t_ns + shift, "attrs": m.attrs})
    panel.refresh(force=True)
    return panel


def assert_lane_of_each_rank(curve, rank: int):
    """A rank lane's curve: some finite points, all at the rank's own height; returns its (xs, ys)."""
    import numpy as np

    xs, ys = curve.getOriginalDataset()
    finite = np.isfinite(ys)
    assert finite.sum() > 0 and set(ys[finite]) == {float(rank)}, (rank, ys)
    return xs, ys
