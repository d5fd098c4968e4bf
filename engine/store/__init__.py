"""The run store: every run saved (SQLite by default, any SQLAlchemy URL), read back, compared.

    from opscope.engine.store import RunStore
    with RunStore.open() as store:          # or RunStore.open("postgresql+psycopg://...")
        run_id = store.begin_run(RunResult(kind="llm", settings=..., fingerprint=...))
        store.add_metric(run_id, metric)    # committed at once: a crash keeps it
        store.finish_run(run_id, "completed")

Names are imported on first use: `opscope` builds its parser from engine.store.commands, and every
command would otherwise pay for importing SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RunStore": "opscope.engine.store.runstore",
    "RunInfo": "opscope.engine.store.convert",
    "StoredRun": "opscope.engine.store.convert",
    "default_db_url": "opscope.engine.store.db",
    "resolve_url": "opscope.engine.store.db",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine.store' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
