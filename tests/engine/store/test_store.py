"""The run store on real SQLite files: round trips, names, tags, filters, stale runs."""

from __future__ import annotations

import math
import sqlite3

import pytest
from opscope.engine.core.errors import ConfigError, RunNotFoundError, StoreError
from opscope.engine.core.markers import Marker as LiveMarker
from opscope.engine.core.results import Marker, Metric, RunResult, TelemetrySeries
from opscope.engine.store import RunStore, db


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "runs.sqlite"


@pytest.fixture
def store(db_path):
    with RunStore.open(db_path) as s:
        yield s


def full_result(name: str = "r1") -> RunResult:
    return RunResult(
        kind="llm",
        name=name,
        tags=["ci", "bf16"],
        notes="first try",
        settings={"dtype": "bfloat16", "threads": 2, "suite_params": {"pp": [512], "tg": [128]}},
        fingerprint={"cpu": {"model": "AMD EPYC", "cores": 2}, "torch": "2.13.0"},
        metrics=[
            Metric("pp512", "tok/s", [812.25, 800.5, 790.125], params={"n_prompt": 512}),
            Metric("ttft", "ms", [0.1 + 0.2, 1e-300, 123456789.123456789], higher_is_better=False),
            Metric("tg4096", "tok/s", [], status="failed", error="out of memory"),
        ],
        telemetry=[TelemetrySeries("gpu0.util_pct", "%", [10, 20, 30**12], [1.5, float("nan"), 99.0])],
        markers=[Marker("prefill", "start", 5_000_000_000_123, {"tokens": 512})],
        trace_summary={"ops": 1234, "fallbacks": []},
    )


def test_save_and_get_round_trip_is_exact(store):
    original = full_result()
    run_id = store.save(original)
    back = _nan_to_zero(store.get(run_id))
    assert back.tags == sorted(original.tags)  # tags come back sorted
    original.tags.sort()
    assert back == _nan_to_zero(original)  # every float bit-exact, big ints, nested dicts
    assert _nan_to_zero(store.get("r1")) == back  # by name too
    assert _nan_to_zero(store.get(str(run_id))) == back  # a string of digits is an id


def _nan_to_zero(result: RunResult) -> RunResult:
    """NaN != NaN: check that telemetry N/A (NaN) survived, then make results comparable."""
    values = result.telemetry[0].values
    assert math.isnan(values[1])
    values[1] = 0.0
    return result


def test_incremental_run_keeps_metric_order_and_finishes(store):
    run_id = store.begin_run(RunResult(kind="matmul", name="inc"))
    assert store.info(run_id).status == "running"
    for i in range(3):
        store.add_metric(run_id, Metric(f"m{i}", "GFLOP/s", [float(i)]))
    store.add_telemetry(run_id, [TelemetrySeries("host.cpu_pct", "%", [1, 2], [50.0, 60.0])])
    store.add_telemetry(
        run_id,
        [TelemetrySeries("host.ram_bytes", "bytes", [1], [2.0**33]), TelemetrySeries("host.cpu_pct", "%", [3], [70.0])],
    )  # a later chunk
    store.add_markers(run_id, [LiveMarker("bench_iter", "start", 7, {"i": 0}), Marker("bench_iter", "end", 9)])
    store.set_trace_summary(run_id, {"ops": 3})
    store.finish_run(run_id, "failed", "point m3: out of memory")
    info, result = store.load(run_id).info, store.get(run_id)
    assert [m.name for m in result.metrics] == ["m0", "m1", "m2"]
    assert (info.status, info.error, info.metric_count) == ("failed", "point m3: out of memory", 3)
    assert info.finished_at >= info.created_at and info.created_at.tzinfo is not None
    assert [(m.phase, m.edge, m.t_ns) for m in result.markers] == [("bench_iter", "start", 7), ("bench_iter", "end", 9)]
    assert result.trace_summary == {"ops": 3}
    assert [(t.name, t.t_ns, t.values) for t in result.telemetry] == [
        ("host.cpu_pct", [1, 2, 3], [50.0, 60.0, 70.0]),
        ("host.ram_bytes", [1], [2.0**33]),
    ]


def test_writes_to_a_missing_run_are_refused(store):
    with pytest.raises(RunNotFoundError, match="id 999"):
        store.add_metric(999, Metric("x", "ms", [1.0]))
    with pytest.raises(StoreError, match="running"):
        store.finish_run(store.save(RunResult(kind="k", name="n")), "running")


def test_names_are_unique_generated_and_never_numeric(store):
    store.save(RunResult(kind="llm", name="mine"))
    with pytest.raises(ConfigError, match="already exists"):
        store.save(RunResult(kind="llm", name="mine"))
    with pytest.raises(ConfigError, match="digits"):
        store.save(RunResult(kind="llm", name="42"))
    auto = [store.info(store.save(RunResult(kind="llm"))).name for _ in range(3)]
    assert len(set(auto)) == 3 and all(n.startswith("llm-") for n in auto)


def test_unknown_runs_raise_run_not_found(store):
    with pytest.raises(RunNotFoundError, match="no saved run named 'ghost'"):
        store.get("ghost")
    with pytest.raises(RunNotFoundError, match="id 7"):
        store.info(7)


def test_list_filters_newest_first(store):
    a = store.save(RunResult(kind="llm", name="a-f32", tags=["nightly"]))
    b = store.save(RunResult(kind="matmul", name="b-mm", status="failed"))
    c = store.save(
        RunResult(
            kind="llm",
            name="c-bf16",
            tags=["nightly", "bf16"],
            metrics=[Metric("x", "ms", [1.0]), Metric("y", "ms", [2.0])],
        )
    )
    assert [r.id for r in store.list()] == [c, b, a]
    assert [r.id for r in store.list(kind="llm")] == [c, a]
    assert [r.id for r in store.list(status="failed")] == [b]
    assert [r.id for r in store.list(tag="nightly")] == [c, a]
    assert [r.id for r in store.list(name_contains="bf")] == [c]
    assert [r.id for r in store.list(name_contains="%")] == []  # LIKE wildcards are escaped
    assert [r.metric_count for r in store.list(limit=1)] == [2]


def test_tag_rename_notes_delete(store, db_path):
    run_id = store.save(full_result("old"))
    assert store.tag("old", add=["x", "ci"]).tags == ("bf16", "ci", "x")
    assert store.tag(run_id, remove=["ci"]).tags == ("bf16", "x")
    assert store.rename("old", "new").name == "new"
    store.save(RunResult(kind="llm", name="other"))
    with pytest.raises(ConfigError, match="already exists"):
        store.rename("new", "other")
    assert store.set_notes("new", "rerun on a quiet machine").notes == "rerun on a quiet machine"
    store.delete("new")
    with pytest.raises(RunNotFoundError):
        store.get(run_id)
    with sqlite3.connect(db_path) as con:  # children went with the run (ON DELETE CASCADE)
        for table in ("metrics", "run_tags", "telemetry_series", "phase_markers"):
            assert con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", (run_id,)).fetchone() == (0,)


def test_sqlite_file_uses_wal(store, db_path):
    store.save(RunResult(kind="k", name="n"))
    with sqlite3.connect(db_path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_default_location_is_the_user_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(db.DB_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert db.default_db_url() == f"sqlite:///{tmp_path / 'xdg' / 'opscope' / 'runs.sqlite'}"
    monkeypatch.setenv(db.DB_ENV_VAR, str(tmp_path / "env.sqlite"))
    with RunStore.open() as s:
        s.save(RunResult(kind="k", name="n"))
    assert (tmp_path / "env.sqlite").is_file()


def test_bad_url_is_a_store_error():
    with pytest.raises(StoreError, match="cannot open run database"):
        RunStore.open("nosuchdriver://x/y")


def _set_owner(db_path, run_id: int, **columns) -> None:
    sets = ", ".join(f"{k} = ?" for k in columns)
    with sqlite3.connect(db_path) as con:
        con.execute(f"UPDATE runs SET {sets} WHERE id = ?", (*columns.values(), run_id))


def test_open_aborts_runs_of_dead_writers_only(store, db_path):
    live = store.begin_run(RunResult(kind="llm", name="live"))
    reused = store.begin_run(RunResult(kind="llm", name="pid-reused"))
    remote = store.begin_run(RunResult(kind="llm", name="remote"))
    _set_owner(db_path, reused, owner_started_s=1.0)  # our pid, but a process that started in 1970
    _set_owner(db_path, remote, owner_host="another-host.example")
    with RunStore.open(db_path) as second:
        status = {r.name: r.status for r in second.list()}
        assert status == {"live": "running", "pid-reused": "aborted", "remote": "running"}
        assert "ended without finishing" in second.info(reused).error
    for run_id in (live, remote):
        store.finish_run(run_id)


def test_close_aborts_runs_it_began_and_did_not_finish(db_path):
    with RunStore.open(db_path) as s:
        run_id = s.begin_run(RunResult(kind="llm", name="unfinished"))
    with RunStore.open(db_path) as s:
        info = s.info(run_id)
    assert info.status == "aborted" and "closed before the run finished" in info.error
