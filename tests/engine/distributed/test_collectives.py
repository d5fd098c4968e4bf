"""bench collectives: nccl-tests' bandwidth definitions (pure), a real 2-rank gloo sweep through the
CLI (every collective validated, saved, compared), and the per-rank Perfetto trace."""

from __future__ import annotations

import json

import pytest
from opscope.engine.distributed.collectives import COLLECTIVES, algbw_gb_s, bus_factor, busbw_gb_s, element_count, modes
from ranks_helpers import assert_lane_of_each_rank, load_run, rank_lanes_panel, rank_pids, rank_slices

# nccl-tests doc/PERFORMANCE.md, "Summary": the factor that turns algbw into busbw.
NCCL_TESTS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_bus_factors_are_nccl_tests(collective, n):
    assert bus_factor(collective, n) == pytest.approx(NCCL_TESTS_FACTORS[collective](n))


def test_bandwidths_of_recorded_times():
    # sendrecv_perf on 8 A100s as nccl-tests printed it: size (B), time (us), algbw = busbw (GB/s);
    # both printed rounded (time to 0.1 us, bandwidth to 0.01 GB/s), hence the 0.01 tolerance
    for size, time_us, bw in ((134217728, 1211.2, 110.81), (268435456, 1423.3, 188.60), (1073741824, 5503.4, 195.10)):
        assert algbw_gb_s(size, time_us / 1e6) == pytest.approx(bw, abs=0.01)
        assert busbw_gb_s("send_recv", 8, size, time_us / 1e6) == pytest.approx(bw, abs=0.01)
    # all_reduce of 1 GiB in 5 ms on 8 ranks: algbw 214.748 GB/s, busbw x 2*7/8 = 375.810 GB/s
    assert busbw_gb_s("all_reduce", 8, 2**30, 5e-3) == pytest.approx(375.8096384)
    assert busbw_gb_s("all_gather", 4, 2**30, 5e-3) == pytest.approx(214.7483648 * 0.75)


def test_sizes_split_into_whole_chunks_and_forms_follow_torch():
    assert element_count("all_gather", 8, 4) == 4  # never below one element per rank
    assert element_count("all_to_all", 1000, 3) == 249  # 250 floats rounded down to 3 chunks of 83
    assert element_count("all_reduce", 1000, 3) == 250
    assert modes("all_reduce") == ("in_place",) and modes("send_recv") == ("out_of_place",)
    assert modes("all_gather") == ("out_of_place", "in_place")


FAST = ["--nproc", "2", "--quick", "--param", "sizes_bytes=8,65536", "--param", "reps=2"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two real 2-rank sweeps saved in one store: every collective with its per-rank trace, then
    all_reduce alone (CI time)."""
    from opscope.engine.cli.main import main

    d = tmp_path_factory.mktemp("coll")
    db, trace = str(d / "runs.db"), d / "ranks.json"
    assert main(["--db", db, "bench", "collectives", *FAST, "--name", "c-a", "--trace-out", str(trace)]) == 0
    assert main(["--db", db, "bench", "collectives", *FAST, "--name", "c-b", "--param", "collectives=all_reduce"]) == 0
    return db, trace


def test_every_collective_is_validated_and_saved_with_every_rank(two_runs):
    db, _ = two_runs
    run = load_run(db, "c-a")
    assert run.kind == "collectives" and run.status == "completed"
    points = run.settings["suite_params"]["points"]
    expected = {(c, s, m) for c in COLLECTIVES for s in (8, 65536) for m in modes(c)}
    got = {(m.params["collective"], m.params["size_bytes"], m.params["mode"]) for m in run.metrics}
    assert got == expected
    assert all(p["wrong_elements"] == 0 for p in points.values()) and len(points) == len(expected)
    busbw = [m for m in run.metrics if m.unit == "GB/s"]
    assert all(m.status == "ok" and len(m.samples) == 2 and min(m.samples) > 0 for m in busbw)
    for m in busbw:  # busbw = size / mean time x factor, from the run's own stored times
        t_us = next(x for x in run.metrics if x.name == f"{m.name}.time").samples
        assert m.samples == pytest.approx(
            [busbw_gb_s(m.params["collective"], 2, m.params["size_bytes"], t / 1e6) for t in t_us]
        )
    ranks = [x for x in run.metrics if ".rank" in x.name]
    assert {x.params["rank"] for x in ranks} == {0, 1} and len(ranks) == 2 * len(busbw)
    assert set(run.fingerprint["ranks"]) == {"0", "1"}
    assert all("torch" in fp and "host" in fp for fp in run.fingerprint["ranks"].values())


def test_two_collectives_runs_compare(two_runs, capsys):
    from opscope.engine.cli.main import main

    db, _ = two_runs
    capsys.readouterr()
    assert main(["--db", db, "runs", "compare", "c-a", "c-b"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("all_reduce_")}
    assert set(rows) >= {
        "all_reduce_8B_ip",
        "all_reduce_64KiB_ip",
        "all_reduce_64KiB_ip.time",
        "all_reduce_8B_ip.rank1.time",
    }
    assert all(line.count("±") == 2 for line in rows.values())  # A's row found B's: both have a median


def test_the_perfetto_trace_has_one_process_per_rank(two_runs):
    _, trace = two_runs
    slices = rank_slices(json.loads(trace.read_text()))
    assert sorted(slices) == [0, 1]
    n_points = sum(len(modes(c)) for c in COLLECTIVES) * 2
    assert [len(slices[r]) for r in (0, 1)] == [n_points * 2, n_points * 2]  # 2 reps of every point on each rank
    spans = slices[0] + slices[1]
    assert min(e["ts"] for e in spans) == 0 and all(e["dur"] > 0 for e in spans)


def test_one_rank_runs_every_collective_but_send_recv_and_says_why(tmp_path, capsys):
    """A one-GPU machine's `--nproc 1` (world size 1): the backend's communicator is set up and used;
    no link is crossed, so busbw is 0 while algbw (size / time) stays a rate."""
    from opscope.engine.cli.main import main

    db = str(tmp_path / "r.db")
    assert (
        main(
            [
                "--db",
                db,
                "bench",
                "collectives",
                "--nproc",
                "1",
                "--quick",
                "--name",
                "one",
                "--param",
                "sizes_bytes=65536",
                "--param",
                "reps=2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "world size 1" in out and "send_recv needs 2 ranks" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("all_reduce ")]
    assert rows and all(float(r[4]) > 0 and float(r[5]) == 0 for r in rows)  # algbw GB/s, busbw GB/s
    run = load_run(db, "one")
    assert run.status == "completed"
    assert {m.params["collective"] for m in run.metrics} == set(COLLECTIVES) - {"send_recv"}


@pytest.mark.gui
def test_a_saved_runs_ranks_are_lanes_in_the_telemetry_panel(two_runs, qtbot):
    """The stored per-rank markers of a real run, replayed ending now, draw one lane per rank."""
    import numpy as np

    db, _ = two_runs
    markers = load_run(db, "c-a").markers
    assert {m.attrs["rank"] for m in markers} == {0, 1} and {m.edge for m in markers} == {"start", "end"}
    panel = rank_lanes_panel(markers, qtbot)
    assert panel.rank_plot is not None and sorted(panel.rank_curves) == [0, 1]
    per_rank = len(markers) // 4  # start + end of every span, two ranks
    for rank, curve in panel.rank_curves.items():
        xs, ys = assert_lane_of_each_rank(curve, rank)
        finite = np.isfinite(ys)
        assert finite.sum() == 2 * per_rank
        assert np.all(xs[finite] <= 0)  # every span closed, in the past
    assert all(b == [] for b in (item.bands for item in panel.bands.values()))  # no bands from ranks
    assert not panel.grab().isNull()
    panel.shutdown()


def test_op_traces_of_two_ranks_merge_into_one_process_per_rank():
    """engine.trace's exporter: each rank's op trace (a real capture) becomes one process
    named "rank N", shifted onto the shared clock, valid Trace Event Format."""
    import torch
    from opscope.engine.core import markers
    from opscope.engine.trace.capture import Tracer
    from opscope.engine.trace.events import TraceOptions
    from opscope.engine.trace.export import chrome_trace, ranks_trace
    from trace_format import validate_trace_event_format

    tracer = Tracer(TraceOptions())
    with tracer:
        markers.emit(markers.PREFILL, "start", tokens=3)
        torch.randn(4).sum()
        markers.emit(markers.PREFILL, "end", tokens=3)
        tracer.mark_token()
    doc = chrome_trace(tracer.result())
    docs = [doc, doc]  # the same ops on both ranks; what differs is where each rank's clock starts
    merged = ranks_trace({0: (docs[0], 5_000_000), 1: (docs[1], 7_000_000)})  # rank 1 starts 2 ms later
    validate_trace_event_format(merged)
    events = merged["traceEvents"]
    pids = rank_pids(merged)
    assert pids == {0: 1, 1: 2}
    for rank, doc in enumerate(docs):
        mine = [e for e in events if e["ph"] != "M" and e["pid"] == pids[rank]]
        theirs = [e for e in doc["traceEvents"] if e["ph"] != "M"]
        assert len(mine) == len(theirs)
        assert min(e["ts"] for e in mine) == pytest.approx(min(e["ts"] for e in theirs) + 2000.0 * rank)
    threads = {
        e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pids[1]
    }
    assert {"engine · phases", "engine · tokens", "cpu · ops"} <= threads  # named after their process


@pytest.mark.slow  # two fresh interpreters, each importing torch: ~37 s on this loaded 2-core machine
def test_two_nodes_meet_at_the_endpoint_and_node_0_saves_both_ranks(tmp_path):
    """--nnodes 2: two separate `opscope` processes (two "nodes" on this host, one rank each) meet
    through the static rendezvous at --rdzv-endpoint; rank 0 gathers rank 1's samples."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "import sys; from opscope.engine.cli.main import main; sys.exit(main(sys.argv[1:]))"
    common = [
        "bench",
        "collectives",
        "--nproc",
        "1",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--quick",
        "--param",
        "sizes_bytes=8",
        "--param",
        "collectives=all_reduce,send_recv",
        "--param",
        "reps=2",
        "--dist-timeout",
        "60",
    ]
    db = str(tmp_path / "runs.db")
    nodes = [
        subprocess.Popen(
            [sys.executable, "-c", code, "--db", db, *common, "--node-rank", str(i), "--name", "mn"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in (1, 0)
    ]
    outs = [p.communicate(timeout=180)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs
    assert "node 1: 1 ranks done" in outs[0]
    assert "2 ranks, gloo" in outs[1] and "send_recv" in outs[1]
    run = load_run(db, "mn")
    assert {m.params.get("rank") for m in run.metrics if ".rank" in m.name} == {0, 1}
    assert all(m.status == "ok" and m.params["ranks"] == 2 for m in run.metrics)


def test_the_window_runs_collectives_through_the_workers_bench_job(tmp_path):
    """The Benchmarks panel's Run (app.worker_bench.run_bench with the panel's request: quick, nproc
    and the suite's other fields): real ranks, the metrics sent as they land and saved in the run."""
    import threading

    from opscope.app.worker.bench import run_bench, suite_catalog
    from opscope.app.worker.protocol import BenchRequest

    fields = {f["name"]: f for f in next(s for s in suite_catalog() if s["name"] == "collectives")["params"]}
    assert fields["nproc"]["kind"] == "int" and fields["nproc"]["quick"] == 2
    db = str(tmp_path / "runs.db")
    req = BenchRequest(
        suite="collectives",
        quick=True,
        name="win",
        db_url=db,
        params={"nproc": 2, "sizes_bytes": [8], "collectives": ["all_reduce", "send_recv"], "reps": 2},
    )
    sent = []
    out = run_bench(None, None, req, lambda kind, **msg: sent.append((kind, msg)), threading.Event())
    assert out["status"] == "completed" and out["metrics"] == 2 * 4  # busbw, time, 2 ranks' times
    points = {msg["point"]["name"] for kind, msg in sent if kind == "progress" and "point" in msg}
    assert points >= {"all_reduce_8B_ip", "send_recv_8B_oop", "send_recv_8B_oop.rank1.time"}
    run = load_run(db, "win")
    assert run.settings["suite_params"]["nproc"] == 2 and run.settings["suite_params"]["backend"] == "gloo"
    assert all(m.status == "ok" and len(m.samples) == 2 for m in run.metrics)
