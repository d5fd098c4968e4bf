"""Run quality: foreign CPU/GPU load recorded per sample, disturbed samples re-run, and the quality
(ok / noisy / disturbed) saved and shown by `opscope bench`, `runs list/show` and `runs compare`.

The load is real: either a real busy-loop process read through the real /proc, or fake /proc files
in tmp_path (as tests/engine/core/test_cpuload.py does) whose jiffy counters a point's step advances itself.
conftest points every test at a quiet fake /proc; the tests of real load set OPSCOPE_PROC=/proc."""

from __future__ import annotations

import io
import os
import re
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from opscope.engine.bench.measure import quality as Q
from opscope.engine.bench.measure.runner import Point, RunnerConfig, run_points
from opscope.engine.core.results import RunResult
from opscope.engine.store import RunStore
from opscope.engine.store import db as store_db

SLOW_REP_S = 0.12  # longer than quality.MIN_WINDOW_S: every repetition gets a load window of its own


def write_proc(root: Path, busy: int, own: int = 15) -> None:
    (root / "self").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy} 0 0 9999 0 0 0 0 0 0\n")
    (root / "self" / "stat").write_text(f"42 (python) R 1 42 42 0 -1 0 0 0 0 0 {own} 0 0 0 20 0 1 0 100 0 0\n")


def busy_proc_point(root: Path, disturbed_reps: int | None, value=lambda s: 5.0, name="p") -> Point:
    """A point whose step plays another process: during its first ``disturbed_reps`` calls (all when
    None) it adds 100 busy jiffies (a second of CPU, far above any threshold) to the fake /proc."""
    calls = [0]
    write_proc(root, 1000)

    def prepare():
        def step():
            calls[0] += 1
            if disturbed_reps is None or calls[0] <= disturbed_reps + 1:  # +1: the warm-up call
                write_proc(root, 1000 + 100 * calls[0])
            time.sleep(SLOW_REP_S)

        return step

    return Point(name, "ms", prepare, value=value, higher_is_better=False)


def measure(point: Point, **cfg) -> list:
    config = RunnerConfig(**({"warmup": 1, "min_reps": 3, "min_time_s": 0.0} | cfg))
    (outcome,) = run_points([point], config)
    return outcome.metrics


@contextmanager
def busy_loop(seconds: float = 120.0):
    """A real other process keeping one core busy."""
    hog = subprocess.Popen([sys.executable, "-c", f"import time\nt=time.time()\nwhile time.time()-t<{seconds}: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        yield hog
    finally:
        hog.kill()
        hog.wait()


# --- runner: load per sample, re-runs, quality -----------------------------------------------------


def test_quiet_fake_proc_gives_ok_with_zero_load_per_sample(tmp_path, monkeypatch):
    write_proc(tmp_path, 1000)
    monkeypatch.setenv("OPSCOPE_PROC", str(tmp_path))
    point = Point("steady", "ms", lambda: lambda: sum(range(100)), value=lambda s: 2.0)
    (m,) = measure(point, min_reps=5)
    assert m.quality == "ok"
    assert m.load["other_cores"] == [0.0] * len(m.samples) and m.load["rerun"] == 0
    assert Q.worst([m.quality]) == "ok"


def test_spread_without_foreign_load_is_noisy(tmp_path, monkeypatch):
    write_proc(tmp_path, 1000)
    monkeypatch.setenv("OPSCOPE_PROC", str(tmp_path))
    values = iter([1.0, 10.0] * 50)
    point = Point("jumpy", "ms", lambda: lambda: None, value=lambda s: next(values))
    (m,) = measure(point, min_reps=6, warmup=0)
    assert m.quality == "noisy" and set(m.load["other_cores"]) == {0.0}


def test_disturbed_samples_are_rerun_and_the_clean_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_PROC", str(tmp_path))
    metrics = measure(busy_proc_point(tmp_path, disturbed_reps=2), min_reps=3)
    m = metrics[0]
    assert m.load["reps"] == 5 and m.load["disturbed_reps"] == 2 and m.load["rerun"] == 2
    assert len(m.samples) == 3 and len(m.load["dropped"]) == 2
    assert all(c >= 1.0 for c in m.load["dropped_other_cores"])  # what the re-run samples saw
    assert m.load["other_cores"] == [0.0, 0.0, 0.0]
    assert m.quality == "ok"  # the kept samples were clean


def test_load_throughout_spends_the_budget_then_keeps_all_as_disturbed(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_PROC", str(tmp_path))
    (m,) = measure(busy_proc_point(tmp_path, disturbed_reps=None), min_reps=2, rerun_factor=1.0, rerun_s=0.2)
    # re-run while either budget lasted (2 more than min_reps, 0.2 s), then stopped
    assert m.load["reps"] == m.load["disturbed_reps"] == len(m.samples) == 3
    assert m.load["rerun"] == 0 and m.quality == "disturbed"


def test_every_metric_of_a_disturbed_point_carries_its_load(tmp_path, monkeypatch):
    from opscope.engine.bench.measure.runner import Derived, Extra

    monkeypatch.setenv("OPSCOPE_PROC", str(tmp_path))
    base = busy_proc_point(tmp_path, disturbed_reps=None)
    point = Point(
        base.name,
        base.unit,
        base.prepare,
        base.value,
        observe=lambda out: {"x": [1.0, 1.0]},
        extras=(Extra("x", "n"),),
        derived=(Derived("p.double", "ms", lambda v: 2 * v),),
    )
    metrics = measure(point, min_reps=2, rerun_s=0.0)
    assert [m.name for m in metrics] == ["p", "x", "p.double"]
    assert {m.quality for m in metrics} == {"disturbed"}
    assert len(metrics[1].samples) == 2 * len(metrics[0].samples)  # two extras per repetition


def test_bad_threshold_is_a_config_error():
    from opscope.engine.core.errors import ConfigError

    with pytest.raises(ConfigError, match="disturbed_cores"):
        RunnerConfig(disturbed_cores=0)


# --- GPU: other processes through the NVML wrapper (fake NVML) ----------------------------------


def test_other_gpu_processes_exclude_ours(monkeypatch):
    pynvml = pytest.importorskip("pynvml")
    from fake_nvml import FakeGpu, FakeNvml

    me = os.getpid()
    FakeNvml([FakeGpu("H100", procs=((me, 1 << 20), (99999, 1 << 30))), FakeGpu("H100", procs=((me, 1),))]).install(
        monkeypatch
    )
    assert Q.GpuOthers(0).count() == 1
    assert Q.GpuOthers(1).count() == 0
    assert Q.SampleLoad(0.0, 1).disturbed(0.25) and not Q.SampleLoad(0.0, 0).disturbed(0.25)
    assert Q.gpu_probe("cpu") is None and Q.gpu_probe("cuda:1").index == 1
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: (_ for _ in ()).throw(pynvml.NVMLError(9)))
    assert Q.GpuOthers(0).count() is None  # no driver: unknown, not zero


def test_a_point_shorter_than_one_window_waits_the_window_out_before_its_reading(tmp_path):
    """A quick matmul point runs in ~30 ms: read over that, the foreign load was a few jiffies, 0.00
    or 2.50 cores of 2 with one core busy. close() now waits until one window has passed since the
    first reading, then reads: here the fake /proc gains 10 busy jiffies (0.1 s of one core) while
    it waits, and the samples get exactly that core."""
    write_proc(tmp_path, 1000)
    t = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(round(s, 6))
        t[0] += s
        write_proc(tmp_path, 1010)  # another process's 0.1 s of CPU while we wait

    probe = Q.LoadProbe(tmp_path, min_window_s=0.1, clock=lambda: t[0], sleep=sleep)
    t[0] += 0.03  # three repetitions in 30 ms
    for _ in range(3):
        probe.rep_done()
    probe.close()
    assert slept == [0.07]
    assert [load.other_cores for load in probe.loads] == pytest.approx([1.0] * 3)
    probe = Q.LoadProbe(tmp_path, min_window_s=0.1, clock=lambda: t[0], sleep=sleep)
    t[0] += 0.5  # a long point: no wait
    probe.rep_done()
    probe.close()
    assert slept == [0.07]


# --- the CLI with a real busy process ------------------------------------------------------------


def _bench(db: str, name: str, capsys) -> str:
    from opscope.engine.cli.main import main

    args = [
        "--db",
        db,
        "bench",
        "matmul",
        "--quick",
        "--name",
        name,
        "--param",
        "sizes=16",
        "--param",
        "dtypes=float32",
    ]
    assert main(args) == 0
    return capsys.readouterr().out


def test_busy_process_marks_samples_disturbed_reruns_and_prints_it(tmp_path, monkeypatch, capsys):
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    quiet_out = _bench(db, "quiet", capsys)  # conftest's quiet fake /proc
    monkeypatch.setenv("OPSCOPE_PROC", "/proc")
    with busy_loop():
        out = _bench(db, "busy", capsys)
    line = next(ln for ln in out.splitlines() if ln.startswith("run quality:"))
    assert re.fullmatch(
        r"run quality: disturbed \(other processes kept up to (\d+\.\d\d) cores busy during kept "
        r"samples \(threshold 0\.25\).*\)",
        line,
    ), line
    assert float(re.search(r"up to (\d+\.\d\d)", line).group(1)) >= 0.5  # the busy loop's core
    assert "quality: ok = no foreign load" in out  # the legend
    assert re.search(r"^run quality: (ok|noisy) ", quiet_out, re.M)
    with RunStore.open(db) as store:
        busy, quiet = store.load("busy"), store.load("quiet")
    m, q = busy.result.metrics[0], quiet.result.metrics[0]
    assert busy.info.quality == "disturbed" and m.quality == "disturbed"
    assert m.load["disturbed_reps"] >= 1 and max(m.load["other_cores"]) >= 0.5
    # re-run attempted: a quiet run stops at its minimum; this one kept measuring within the budget
    assert m.load["reps"] > q.load["reps"], (m.load["reps"], q.load["reps"])
    assert quiet.info.quality in ("ok", "noisy") and set(q.load["other_cores"]) == {0.0}


# --- store, list, show, compare --------------------------------------------------------------------


def _save_pair(tmp_path, monkeypatch) -> str:
    """Two saved runs of the same point: "calm" on a quiet fake /proc, "stormy" under load throughout."""
    from opscope.engine.bench.measure.quality import worst

    path = tmp_path / "runs.db"
    with RunStore.open(path) as store:
        for name, disturbed in (("calm", 0), ("stormy", None)):
            proc = tmp_path / name
            monkeypatch.setenv("OPSCOPE_PROC", str(proc))
            metrics = measure(busy_proc_point(proc, disturbed, name="tg"), min_reps=3, rerun_s=0.0)
            store.save(RunResult(kind="llm", name=name, metrics=metrics))
            assert store.info(name).quality == worst(m.quality for m in metrics)
    return str(path)


def test_quality_is_saved_listed_and_shown(tmp_path, monkeypatch):
    from opscope.engine.store.views import list_dicts, list_text, show_text

    path = _save_pair(tmp_path, monkeypatch)
    with RunStore.open(path) as store:
        runs = store.list()
        stormy = store.load("stormy")
    text = list_text(runs)
    assert re.search(r"^\d+\s+stormy\s+llm\s+completed\s+disturbed\s", text, re.M), text
    assert re.search(r"^\d+\s+calm\s+llm\s+completed\s+ok\s", text, re.M), text
    assert {d["name"]: d["quality"] for d in list_dicts(runs)} == {"calm": "ok", "stormy": "disturbed"}
    assert stormy.result.metrics[0].load["other_cores"][0] > 1.0
    shown = show_text(stormy)
    assert "  run quality: disturbed (other processes kept up to" in shown
    assert re.search(r"^tg .* ok\s+disturbed \(others \d+\.\d\d cores\)$", shown, re.M), shown


def test_compare_names_the_disturbed_side_on_the_row_and_in_the_summary(tmp_path, monkeypatch):
    from opscope.engine.store.compare import compare
    from opscope.engine.store.render import render

    path = _save_pair(tmp_path, monkeypatch)
    with RunStore.open(path) as store:
        text = render(compare([store.load("calm"), store.load("stormy")]))
    row = next(ln for ln in text.splitlines() if ln.startswith("tg "))
    assert row.endswith("disturbed: stormy"), row
    assert "³" in row
    assert re.search(r"^#\d+ stormy: llm, completed, quality disturbed,", text, re.M)
    assert "warning: disturbed: 'stormy' ran while other processes held the CPU or GPU" in text
    with RunStore.open(path) as store:
        quiet = render(compare([store.load("calm"), store.load("calm")]))
    assert "disturbed" not in quiet


def test_a_database_from_before_quality_opens_with_unknown_quality(tmp_path):
    from opscope.engine.store.views import list_text

    path = tmp_path / "old.sqlite"
    engine = store_db.create_db_engine(f"sqlite:///{path}")
    try:
        store_db.migrate(engine, "0002")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO runs (id, name, kind, status, notes, created_at, settings, fingerprint) "
                "VALUES (1, 'old', 'llm', 'completed', '', '2026-01-02 03:04:05', '{}', '{}')"
            )
            conn.exec_driver_sql(
                "INSERT INTO metrics (run_id, position, name, unit, higher_is_better, params, status, samples) "
                "VALUES (1, 0, 'tg128', 'tok/s', 1, '{}', 'ok', '[21.5, 22.0]')"
            )
    finally:
        engine.dispose()
    with RunStore.open(path) as store:
        info, old = store.info("old"), store.get("old")
    assert info.quality is None and old.metrics[0].quality is None and old.metrics[0].load is None
    assert re.search(r"^1\s+old\s+llm\s+completed\s+—\s", list_text([info]), re.M)
    with sqlite3.connect(path) as con:
        cols = {r[1] for r in con.execute("PRAGMA table_info(metrics)")}
    assert {"quality", "load"} <= cols


def test_summary_table_prints_quality_column_and_line(tmp_path, monkeypatch):
    from opscope.engine.bench.report import summary_table

    write_proc(tmp_path, 1000)
    monkeypatch.setenv("OPSCOPE_PROC", str(tmp_path))
    metrics = measure(Point("steady", "ms", lambda: lambda: None, value=lambda s: 2.0), min_reps=5)
    result = RunResult(kind="matmul", metrics=metrics, status="completed", quality=Q.worst(["ok"]))
    out = io.StringIO()
    summary_table(result, None, out)
    text = out.getvalue()
    header = next(ln for ln in text.splitlines() if "metric" in ln)
    assert "quality" in header and re.search(r"steady .* ok ", text), text
    assert "run quality: ok (other processes kept up to 0.00 cores busy during kept samples (threshold 0.25))" in text


# --- tg uses generation's decode-thread policy -----------------------------------------------------


def _threads_per_decode_call(model, run) -> list[int]:
    """torch's intra-op thread count at every single-token forward pass ``run`` makes."""
    import torch

    seen: list[int] = []

    def hook(_module, args, kwargs):
        tokens = args[0] if args else kwargs.get("tokens")
        if tokens is not None and tokens.shape[-1] == 1:
            seen.append(torch.get_num_threads())

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return seen


def test_tg_points_decode_with_the_threads_generation_uses(lm):
    import torch

    assert lm.model.decode_threads == "auto"  # else both paths would trivially agree
    have = 2  # the policy's starting point, set here: an earlier test may have left torch at 1
    before = torch.get_num_threads()
    torch.set_num_threads(have)
    try:
        _bench_and_generate_threads_agree(lm, have)
    finally:
        torch.set_num_threads(before)


def _bench_and_generate_threads_agree(lm, have):
    import torch
    from opscope.engine.bench.measure.options import BenchOptions
    from opscope.engine.bench.suites import llm
    from opscope.engine.generation.generate import GenerationConfig

    plan = llm.plan(
        BenchOptions(quick=True), llm.Params(pp=8, tg=48, depths=(0,), gen_prompt=8, gen_tokens=48), model=lm
    )
    tg = next(p for p in plan.points if p.name == "tg48")
    step = tg.prepare()
    ids = list(range(10, 18))

    def generate():
        for _ev in lm.generate(ids, GenerationConfig(max_tokens=48, temperature=0.0, ignore_eos=True)):
            pass

    with busy_loop():
        bench_threads = _threads_per_decode_call(lm.model, step)
        gen_threads = _threads_per_decode_call(lm.model, generate)
    assert torch.get_num_threads() == have  # both restore the count afterwards
    # the policy re-reads the load every 0.25 s; by the end of each run it has given a core back
    assert bench_threads[-1] == gen_threads[-1] < have, (bench_threads, gen_threads)
    assert min(bench_threads) == min(gen_threads) == 1


def test_runs_panel_lists_quality(qtbot, tmp_path, monkeypatch):
    from opscope.app.runs.model import RunsModel
    from opscope.app.runs.panel import COLUMNS, RunsPanel

    path = _save_pair(tmp_path, monkeypatch)
    panel = RunsPanel(RunsModel(f"sqlite:///{path}"))
    qtbot.addWidget(panel)
    panel.refresh()
    col = COLUMNS.index("quality")
    assert panel.table.horizontalHeaderItem(col).text() == "quality"
    shown = {panel.table.item(r, 1).text(): panel.table.item(r, col).text() for r in range(panel.table.rowCount())}
    assert shown == {"calm": "ok", "stormy": "disturbed"}
    panel.shutdown()


def test_the_run_summary_says_what_became_of_disturbed_samples():
    """A point drops its disturbed samples only when quiet re-runs replace them, else keeps them all:
    the line must not read "0 re-run" when re-runs were tried and found no quiet moment."""
    from opscope.engine.core.results import Metric

    def metric(name: str, loads: list[float], dropped: list[float]) -> Metric:
        record = Q.load_record(
            [Q.SampleLoad(c) for c in loads], 0.25, [1.0] * len(dropped), [Q.SampleLoad(c) for c in dropped]
        )
        return Metric(name, "tok/s", [1.0] * len(loads), load=record)

    kept_all = Q.run_summary([metric("a", [1.5] * 6, [])], "disturbed")
    assert "6 of 6 samples disturbed, 6 kept: too few quiet repetitions within the re-run budget" in kept_all
    replaced = Q.run_summary([metric("a", [0.0] * 5, [1.2, 1.4])], "ok")
    assert "2 of 7 samples disturbed, 2 replaced by quiet re-runs and dropped)" in replaced
    both = Q.run_summary([metric("a", [0.0] * 5, [1.2]), metric("b", [1.0] * 5, [])], "disturbed")
    assert "6 of 11 samples disturbed, 1 replaced by quiet re-runs and dropped and 5 kept" in both
