"""`opscope bench SUITE --ab FLAGS`: two settings measured interleaved (ABBA) in one process, two runs
saved, and `runs compare` saying whether two runs were interleaved or taken one after the other.

Behaviour only (order, saved runs, wording); the timing claims (a planted 10 % flagged, A/A pairs
not) are in tests/engine/bench/test_bench_agreement.py behind the perf marker."""

from __future__ import annotations

import json

import pytest
from opscope.engine.bench.measure.runner import Point, RunnerConfig, interleaved_order, measure_pair
from opscope.engine.cli.main import main
from opscope.engine.core import markers
from opscope.engine.store import RunStore

CFG = RunnerConfig(warmup=1, min_reps=6, min_time_s=0.0, max_reps=6)
TINY = ["--quick", "--param", "sizes=32", "--param", "dtypes=float32"]


def _logging_point(
    name: str, label: str, log: list[str], fail_prepare: bool = False, fail_after: int | None = None
) -> Point:
    def prepare():
        if fail_prepare:
            raise RuntimeError(f"{label} cannot be prepared")

        def step():
            log.append(label)
            if fail_after is not None and log.count(label) > fail_after:
                raise RuntimeError(f"{label} broke")
            return None

        return step

    return Point(name, "1/s", prepare, value=lambda s: 1.0 / s)


def test_the_order_alternates_abba_so_neither_side_always_runs_first():
    assert interleaved_order(3) == [0, 1, 1, 0, 0, 1]


def test_repetitions_are_timed_alternately_abba_after_both_warm_ups():
    log: list[str] = []
    seen: list[tuple[str, int]] = []
    unsubscribe = markers.subscribe(
        lambda m: (
            seen.append((m.attrs["ab"], m.attrs["rep"]))
            if m.phase == markers.BENCH_ITER and m.edge == "start"
            else None
        )
    )
    try:
        a, b = measure_pair((_logging_point("p", "A", log), _logging_point("p", "B", log)), CFG)
    finally:
        unsubscribe()
    assert log == ["A", "B"] + list("ABBAABBAABBA")  # one warm-up each, then 6 rounds
    assert seen[:4] == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    assert a.ok and b.ok and len(a.metrics[0].samples) == len(b.metrics[0].samples) == 6


def test_a_side_that_cannot_be_prepared_fails_alone_and_the_other_is_measured():
    log: list[str] = []
    a, b = measure_pair((_logging_point("p", "A", log), _logging_point("p", "B", log, fail_prepare=True)), CFG)
    assert a.ok and len(a.metrics[0].samples) == 6
    assert not b.ok and "B cannot be prepared" in b.error and b.metrics[0].status == "failed"


def test_a_side_failing_mid_way_fails_and_the_other_is_measured_again_alone():
    log: list[str] = []
    a, b = measure_pair((_logging_point("p", "A", log, fail_after=3), _logging_point("p", "B", log)), CFG)
    assert not a.ok and "A broke" in a.error
    assert b.ok and len(b.metrics[0].samples) == 6


def _compare(db, capsys, *refs: str, fmt: str = "text") -> str:
    capsys.readouterr()
    assert main(["--db", db, "runs", "compare", *refs, "--format", fmt]) == 0
    return capsys.readouterr().out


@pytest.mark.usefixtures("one_torch_thread")
def test_bench_ab_saves_two_interleaved_runs_and_prints_b_against_a(db, capsys):
    assert main(["--db", db, "bench", "matmul", *TINY, "--name", "pair", "--ab", "--param planted_slowdown=2"]) == 0
    out = capsys.readouterr().out
    assert "interleaved: 'pair-a' and 'pair-b' were measured in one process" in out
    assert "sequential:" not in out
    with RunStore.open(db) as store:
        a, b = store.get("pair-a"), store.get("pair-b")
    assert a.settings["interleaved"]["pair"] == b.settings["interleaved"]["pair"] == ["pair-a", "pair-b"]
    assert (a.settings["interleaved"]["role"], b.settings["interleaved"]["role"]) == ("a", "b")
    assert b.settings["interleaved"]["b_flags"] == "--param planted_slowdown=2"
    assert (a.settings["suite_params"]["planted_slowdown"], b.settings["suite_params"]["planted_slowdown"]) == (1, 2)
    na, nb = (len(next(m for m in r.metrics if m.name == "matmul_float32_32").samples) for r in (a, b))
    assert na == nb >= 5
    doc = json.loads(_compare(db, capsys, "pair-a", "pair-b", fmt="json"))
    assert doc["measurement"] == "interleaved"
    assert [d["field"] for d in doc["differences"]] == ["settings.suite_params.planted_slowdown"]


@pytest.mark.usefixtures("one_torch_thread")
def test_an_unsaved_pair_is_compared_as_a_and_b_not_as_two_runs_numbered_0(db, capsys):
    assert main(["--db", db, "bench", "matmul", *TINY, "--no-save", "--ab", ""]) == 0
    out = capsys.readouterr().out
    assert "interleaved: 'A' and 'B' were measured in one process" in out and "sequential:" not in out
    assert "change vs 'A'" in out and " vs A" in out  # the columns say A and B, not "#0" twice


@pytest.mark.usefixtures("one_torch_thread")
def test_compare_says_plainly_that_two_separate_runs_were_sequential(db, capsys):
    for name in ("one", "two"):
        assert main(["--db", db, "bench", "matmul", *TINY, "--name", name]) == 0
    out = _compare(db, capsys, "one", "two")
    line = next(ln for ln in out.splitlines() if ln.startswith("warning: sequential:"))
    assert "measured one after the other" in line and "not interleaved" in line
    assert "drift" in line and "'one' " in line and "'two' " in line and "--ab 'FLAGS'" in line
    assert json.loads(_compare(db, capsys, "one", "two", fmt="json"))["measurement"] == "sequential"


def test_ab_flags_that_change_how_runs_are_measured_are_refused(db, capsys):
    for flags, word in (("--repeat 3", "--repeat"), ("--name other", "--name"), ("--quick --ab x", "--ab")):
        capsys.readouterr()
        assert main(["--db", db, "bench", "matmul", *TINY, "--ab", flags]) == 2
        err = capsys.readouterr().err
        assert word in err and len(err.strip().splitlines()) == 1, err  # one line, no store created
    assert main(["--db", db, "bench", "matmul", *TINY, "--ab", "--fastpath 'off"]) == 2
    assert "quote it as one shell word" in capsys.readouterr().err


def test_sides_with_different_thread_counts_each_run_with_their_own():
    import torch
    from opscope.engine.bench.ab import Side, _thread_setters
    from opscope.engine.bench.measure.options import BenchOptions

    seen: dict[str, set[int]] = {"A": set(), "B": set()}

    def point(label: str) -> Point:
        def prepare():
            return lambda: seen[label].add(torch.get_num_threads())

        return Point("p", "1/s", prepare, value=lambda s: 1.0 / s)

    before = _thread_setters(Side(BenchOptions(), None, "x-a"), Side(BenchOptions(threads=1), None, "x-b"), default=2)
    a, b = measure_pair((point("A"), point("B")), CFG, before=before)
    assert a.ok and b.ok and seen == {"A": {2}, "B": {1}}
