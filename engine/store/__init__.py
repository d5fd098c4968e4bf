"""The run store: every run saved (SQLite by default, any SQLAlchemy URL), read back, compared.

    from engine.store import RunStore
    with RunStore.open() as store:          # or RunStore.open("postgresql+psycopg://...")
        run_id = store.begin_run(RunResult(kind="llm", settings=..., fingerprint=...))
        store.add_metric(run_id, metric)    # committed at once: a crash keeps it
        store.finish_run(run_id, "completed")
"""
from engine.store.convert import RunInfo, StoredRun
from engine.store.db import default_db_url, resolve_url
from engine.store.runstore import RunStore

__all__ = ["RunInfo", "RunStore", "StoredRun", "default_db_url", "resolve_url"]
