"""The run estimate (engine.bench.estimate): points counted as the suites' plans count them, the quick
budget as a bound, and history only from this machine with the same quick setting."""

from __future__ import annotations

import dataclasses

from opscope.engine.bench.estimate import duration_text, estimate_run, last_run_here, planned_points


def test_points_are_counted_as_the_plans_count_them():
    assert planned_points("llm", {"pp": 64, "depths": [0, 64]}) == 5
    assert planned_points("matmul", {"dtypes": ["float32", "bfloat16"], "sizes": [128, 256, 512]}) == 6
    assert planned_points("batch", {"batches": [1, 2, 4], "prompt": 16}) == 3
    assert planned_points("train-step", {"dim": 64}) == 1


def test_the_quick_budget_bounds_an_estimate_from_history():
    est = estimate_run("bandwidth", {"sizes_bytes": [1] * 10}, True, last=(100.0, 5))
    assert (est.seconds, est.capped, est.guess) == (80.0, True, False)  # 60 s + each point's setup
    full = estimate_run("bandwidth", {"sizes_bytes": [1] * 10}, False, last=(100.0, 5))
    assert (full.seconds, full.capped) == (200.0, False)
    assert [duration_text(s) for s in (2, 41, 80, 200, 4300)] == [
        "about 5 s",
        "about 40 s",
        "about 1 min",
        "about 3 min",
        "about 1 h 12 min",
    ]


def test_history_is_this_machines_with_the_same_quick_setting(tmp_path):
    from opscope.engine import BenchOptions, RunStore, run_suite

    with RunStore.open(str(tmp_path / "runs.sqlite")) as store:
        run_id, result = run_suite("bandwidth", BenchOptions(quick=True, threads=1), store)
        took = store.info(run_id).duration_s
        assert last_run_here(store, "bandwidth", True) == (took, 1)
        assert last_run_here(store, "bandwidth", False) is None
        other = dataclasses.replace(result, fingerprint={**result.fingerprint, "host": {"hostname": "elsewhere"}})
        store.save(other)  # newer, from another machine: not this one's history
        assert last_run_here(store, "bandwidth", True) == (took, 1)
