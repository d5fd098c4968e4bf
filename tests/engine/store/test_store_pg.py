"""The run store on a real PostgreSQL server: the session's one server (tests/conftest.py `pg_server`,
Debian's postgresql package; `make test` installs it). Skipped only when the server binaries are absent."""

from __future__ import annotations

import math

import pytest
from opscope.engine.core.errors import ConfigError, RunNotFoundError
from opscope.engine.core.results import Marker, Metric, RunResult, TelemetrySeries
from opscope.engine.store import RunStore, db
from opscope.engine.store.compare import compare

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_round_trip_and_management_on_postgres(pg_url):
    result = RunResult(
        kind="llm",
        name="pg-run",
        tags=["pg"],
        settings={"dtype": "float32"},
        fingerprint={"cpu": "x"},
        metrics=[
            Metric("pp512", "tok/s", [1 / 3, 2.5e-310, 1e300]),
            Metric("oom", "ms", [], status="failed", error="out of memory"),
        ],
        telemetry=[TelemetrySeries("gpu0.power_w", "W", [2**62], [float("nan")])],
        markers=[Marker("decode", "end", 2**62 + 1, {"tokens": 128})],
        trace_summary={"ops": 1},
    )
    with RunStore.open(pg_url) as store:
        run_id = store.save(result)
        back = store.get("pg-run")
        assert math.isnan(back.telemetry[0].values[0])
        back.telemetry[0].values = result.telemetry[0].values = [0.0]
        assert back == result
        with pytest.raises(ConfigError, match="already exists"):
            store.save(RunResult(kind="llm", name="pg-run"))
        assert store.tag(run_id, add=["b"]).tags == ("b", "pg")
        assert [r.name for r in store.list(tag="b")] == ["pg-run"]
        store.delete(run_id)
        with pytest.raises(RunNotFoundError):
            store.get(run_id)


def test_incremental_writes_stale_runs_and_compare_on_postgres(pg_url):
    with RunStore.open(pg_url) as store:
        ids = []
        for name, scale in (("a", 1.0), ("b", 2.0)):
            run_id = store.begin_run(RunResult(kind="matmul", name=name, settings={"scale": scale}))
            store.add_metric(run_id, Metric("mm", "GFLOP/s", [scale * v for v in range(100, 112)]))
            store.finish_run(run_id)
            ids.append(run_id)
        cmp = compare([store.load(i) for i in ids])
        delta = cmp.sections[0].rows[0].deltas[0]
        assert delta.delta_pct == pytest.approx(100.0) and delta.significant
    writer = RunStore.open(pg_url)  # a second writer whose process we pretend has died
    dead = writer.begin_run(RunResult(kind="matmul", name="dead"))
    engine = db.create_db_engine(pg_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE runs SET owner_started_s = 1.0 WHERE name = 'dead'")
    engine.dispose()
    with RunStore.open(pg_url) as store:
        info = store.info(dead)
        assert info.status == "aborted" and "ended without finishing" in info.error
    writer.close()


def test_first_revision_database_upgrades_in_place_on_postgres(pg_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from opscope.engine.store.schema import Base

    engine = db.create_db_engine(pg_url)
    db.migrate(engine, "0001")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO runs (name, kind, status, notes, created_at, settings, fingerprint) "
            "VALUES ('old', 'llm', 'completed', '', '2026-01-02 03:04:05', '{}', '{}')"
        )
    engine.dispose()
    with RunStore.open(pg_url) as store:
        assert store.info("old").status == "completed"
        run_id = store.save(RunResult(kind="llm", name="new", markers=[Marker("prefill", "start", 1)]))
        assert store.get(run_id).markers[0].phase == "prefill"
    engine = db.create_db_engine(pg_url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": db.VERSION_TABLE})
        assert compare_metadata(ctx, Base.metadata) == []
    engine.dispose()
