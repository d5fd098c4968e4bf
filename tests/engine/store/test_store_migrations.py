"""Schema migrations on real SQLite files: a database from the first revision upgrades in place,
the migrations produce exactly the ORM's schema, and an unknown (newer) schema is refused."""

from __future__ import annotations

import sqlite3

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from opscope.engine.core.errors import StoreError
from opscope.engine.core.results import Metric, RunResult, TelemetrySeries
from opscope.engine.store import RunStore, db
from opscope.engine.store.schema import Base

FIRST_REVISION = "0001"


def make_first_revision_db(url: str) -> None:
    """A database as the first released schema left it, with one finished run in it."""
    engine = db.create_db_engine(url)
    try:
        db.migrate(engine, FIRST_REVISION)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO runs (id, name, kind, status, notes, created_at, finished_at, settings, fingerprint) "
                "VALUES (1, 'old-run', 'llm', 'completed', '', '2026-01-02 03:04:05.000000', "
                '\'2026-01-02 03:05:00.000000\', \'{"dtype": "float32"}\', \'{"cpu": "x"}\')'
            )
            conn.exec_driver_sql("INSERT INTO run_tags (run_id, tag) VALUES (1, 'v0')")
            conn.exec_driver_sql(
                "INSERT INTO metrics (run_id, position, name, unit, higher_is_better, params, status, error, samples) "
                "VALUES (1, 0, 'tg128', 'tok/s', 1, '{}', 'ok', NULL, '[21.5, 22.0, 21.75]')"
            )
    finally:
        engine.dispose()


def schema_diff(url: str) -> list:
    engine = db.create_db_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": db.VERSION_TABLE})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def test_first_revision_database_upgrades_in_place(tmp_path):
    path = tmp_path / "old.sqlite"
    make_first_revision_db(f"sqlite:///{path}")
    with sqlite3.connect(path) as con:
        assert "telemetry_series" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    with RunStore.open(path) as store:
        old = store.get("old-run")
        assert old.metrics[0].samples == [21.5, 22.0, 21.75] and old.tags == ["v0"]
        assert old.settings == {"dtype": "float32"} and old.telemetry == [] and old.trace_summary is None
        assert store.info("old-run").created_at.isoformat() == "2026-01-02T03:04:05+00:00"
        new_id = store.save(
            RunResult(
                kind="llm",
                name="new-run",
                metrics=[Metric("x", "ms", [1.0])],
                telemetry=[TelemetrySeries("host.cpu_pct", "%", [1], [2.0])],
            )
        )
        assert store.get(new_id).telemetry[0].values == [2.0]
    with sqlite3.connect(path) as con:
        assert con.execute(f"SELECT version_num FROM {db.VERSION_TABLE}").fetchall() == [(db.head_revision(),)]


def test_migrations_build_exactly_the_orm_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    RunStore.open(url).close()
    assert schema_diff(url) == []


def test_reopening_an_up_to_date_database_changes_nothing(tmp_path):
    path = tmp_path / "runs.sqlite"
    with RunStore.open(path) as store:
        store.save(RunResult(kind="llm", name="a"))
    with sqlite3.connect(path) as con:
        before = con.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()
    RunStore.open(path).close()
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall() == before


def test_a_newer_unknown_schema_is_refused_with_advice(tmp_path):
    path = tmp_path / "future.sqlite"
    RunStore.open(path).close()
    with sqlite3.connect(path) as con:
        con.execute(f"UPDATE {db.VERSION_TABLE} SET version_num = '9999'")
    with pytest.raises(StoreError, match="upgrade OpScope or use another --db"):
        RunStore.open(path)


def test_concurrent_first_opens_migrate_once(tmp_path):
    # The GUI's worker and a CLI benchmark may both open a brand-new database at the same moment.
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "race.sqlite"

    def open_and_save(i: int) -> int:
        with RunStore.open(path) as store:
            return store.save(RunResult(kind="llm", name=f"run-{i}"))

    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(open_and_save, range(4)))
    assert sorted(ids) == [1, 2, 3, 4]
    assert schema_diff(f"sqlite:///{path}") == []
