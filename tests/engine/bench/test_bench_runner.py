"""Runner semantics: warm-up excluded, min count AND min time, failed points recorded, cancel,
sync before every clock read. A deterministic fake clock replaces time; no test depends on speed."""

from __future__ import annotations

import threading

import pytest
from opscope.engine.bench.measure import runner
from opscope.engine.bench.measure.runner import Derived, Extra, Point, RunnerConfig, measure_point, run_points
from opscope.engine.core import markers
from opscope.engine.core.errors import Cancelled, ConfigError


class FakeClock:
    """Each read advances by ``step_ns``: elapsed time is a pure function of the reads made."""

    def __init__(self, step_ns: int, log: list | None = None):
        self.t = 0
        self.step_ns = step_ns
        self.log = log

    def __call__(self) -> int:
        self.t += self.step_ns
        if self.log is not None:
            self.log.append("clock")
        return self.t


def counting_point(calls: list, **kw) -> Point:
    def prepare():
        def step():
            calls.append(len(calls))
            return len(calls) - 1  # the call's index

        return step

    return Point(
        name="p",
        unit="ms",
        prepare=prepare,
        value=lambda s: s * 1e3,
        observe=lambda out: {"call_index": out},
        extras=(Extra("call_index", "n"),),
        **kw,
    )


def test_warmup_is_excluded_and_min_count_met(monkeypatch):
    monkeypatch.setattr(runner, "now_ns", FakeClock(1))  # time never matters here
    calls: list = []
    out = measure_point(counting_point(calls), RunnerConfig(warmup=3, min_reps=5, min_time_s=0))
    primary, idx = out.metrics[0], out.metrics[1]
    assert out.ok and len(calls) == 8
    assert len(primary.samples) == 5
    assert idx.samples == [3.0, 4.0, 5.0, 6.0, 7.0]  # the 3 warm-up calls are not recorded


def test_min_time_keeps_repeating_after_min_count(monkeypatch):
    # Every clock read adds 10 ms: each rep reads twice, the loop test once more.
    monkeypatch.setattr(runner, "now_ns", FakeClock(10_000_000))
    calls: list = []
    out = measure_point(counting_point(calls), RunnerConfig(warmup=0, min_reps=2, min_time_s=0.5))
    n = len(out.metrics[0].samples)
    assert n > 2, "stopped at the minimum count before the minimum time"
    assert n < 30
    assert all(s == pytest.approx(10.0) for s in out.metrics[0].samples)  # 1 interval per rep


def test_max_reps_caps_a_fast_point(monkeypatch):
    monkeypatch.setattr(runner, "now_ns", FakeClock(1))
    out = measure_point(counting_point([]), RunnerConfig(warmup=0, min_reps=2, min_time_s=100, max_reps=7))
    assert len(out.metrics[0].samples) == 7


def test_inner_loop_divides_time_per_call(monkeypatch):
    monkeypatch.setattr(runner, "now_ns", FakeClock(1000))  # each call seen as ~1 µs
    calls: list = []
    cfg = RunnerConfig(warmup=1, min_reps=2, min_time_s=0, min_rep_s=1e-4)
    out = measure_point(counting_point(calls, max_inner=50), cfg)
    assert len(calls) == 1 + 2 * 50  # inner = ceil(100 µs / 1 µs) capped at 50
    assert out.metrics[0].samples[0] == pytest.approx(1000 / 50 / 1e6)


def test_failed_point_is_recorded_and_suite_goes_on():
    def oom():
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    bad = Point("big", "GFLOP/s", prepare=oom, value=float, params={"n": 8192})
    good = Point("small", "GFLOP/s", prepare=lambda: lambda: None, value=lambda s: 1.0)
    outs = list(run_points([bad, good], RunnerConfig(warmup=0, min_reps=2, min_time_s=0)))
    assert [o.ok for o in outs] == [False, True]
    failed = outs[0].metrics[0]
    assert failed.status == "failed" and failed.samples == [] and failed.params == {"n": 8192}
    assert failed.error.startswith("out of memory:") and "2.00 GiB" in failed.error
    assert outs[1].metrics[0].samples == [1.0, 1.0]


def test_step_memory_error_fails_only_that_point():
    def prepare():
        def step():
            raise MemoryError()

        return step

    out = measure_point(
        Point("m", "ms", prepare=prepare, value=float), RunnerConfig(warmup=0, min_reps=1, min_time_s=0)
    )
    assert not out.ok and out.error.startswith("out of memory")


def test_check_failure_marks_point_invalid_but_keeps_samples():
    pt = counting_point([], check=lambda ex: "loss did not decrease" if ex["call_index"][-1] > 0 else None)
    out = measure_point(pt, RunnerConfig(warmup=0, min_reps=3, min_time_s=0))
    assert out.invalid and out.error == "loss did not decrease"
    assert all(m.status == "failed" for m in out.metrics) and len(out.metrics[0].samples) == 3


def test_cancel_during_a_point_raises_cancelled():
    cancel = threading.Event()

    def prepare():
        calls = []

        def step():
            calls.append(1)
            if len(calls) == 3:
                cancel.set()

        return step

    pt = Point("c", "ms", prepare=prepare, value=float)
    with pytest.raises(Cancelled):
        list(run_points([pt, pt], RunnerConfig(warmup=0, min_reps=100, min_time_s=0), cancel=cancel))


def test_progress_reports_done_total_and_eta(monkeypatch):
    monkeypatch.setattr(runner, "now_ns", FakeClock(1000))
    seen = []
    pts = [counting_point([]) for _ in range(3)]
    list(
        run_points(
            pts, RunnerConfig(warmup=0, min_reps=2, min_time_s=0), progress=lambda d, t, e: seen.append((d, t, e))
        )
    )
    assert seen[0] == (0.0, 3, None)
    assert seen[-1][:2] == (3.0, 3) and seen[-1][2] == 0
    dones = [d for d, _, _ in seen]
    assert dones == sorted(dones) and any(0 < d < 1 for d in dones)
    assert all(e is not None and e >= 0 for d, _, e in seen if d > 0)


def test_bench_iter_markers_bracket_each_rep():
    seen = []
    unsubscribe = markers.subscribe(seen.append)
    try:
        measure_point(counting_point([]), RunnerConfig(warmup=2, min_reps=3, min_time_s=0))
    finally:
        unsubscribe()
    iters = [(m.edge, m.attrs["rep"]) for m in seen if m.phase == markers.BENCH_ITER]
    assert iters == [("start", 0), ("end", 0), ("start", 1), ("end", 1), ("start", 2), ("end", 2)]


def test_cuda_sync_precedes_every_clock_read(monkeypatch):
    # No GPU here: torch.cuda's synchronize is faked, with its real signature, to see the order.
    import torch

    log: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    monkeypatch.setattr(runner, "now_ns", FakeClock(1, log))

    def prepare():
        return lambda: log.append("step")

    measure_point(
        Point("g", "ms", prepare=prepare, value=float, device="cuda:0"),
        RunnerConfig(warmup=1, min_reps=2, min_time_s=0),
    )
    timed = [e for e in log]
    # each timed region: sync, clock, step, sync, clock (the loop's own reads need no sync)
    for i, e in enumerate(timed):
        if e == "step":
            assert timed[i - 1] == "clock" and timed[i - 2] == "sync"
            assert timed[i + 1] == "sync" and timed[i + 2] == "clock"
    assert timed.count("step") == 3


def test_derived_and_peak_memory_metrics():
    import torch

    def prepare():
        return lambda: torch.ones(4_000_000)  # 16 MB: visible in peak RSS

    pt = Point(
        "alloc",
        "ms",
        prepare=prepare,
        value=lambda s: 2.0,
        track_memory=True,
        derived=(Derived("alloc.mfu", "%", lambda v: v * 10, {"peak_source": "test"}),),
    )
    out = measure_point(pt, RunnerConfig(warmup=0, min_reps=2, min_time_s=0))
    by = {m.name: m for m in out.metrics}
    assert by["alloc.mfu"].samples == [20.0, 20.0] and by["alloc.mfu"].params["peak_source"] == "test"
    assert len(by["alloc.peak_mem_bytes"].samples) == 2 and min(by["alloc.peak_mem_bytes"].samples) > 16_000_000


def test_bad_runner_config_is_a_config_error():
    with pytest.raises(ConfigError):
        RunnerConfig(min_reps=0)
