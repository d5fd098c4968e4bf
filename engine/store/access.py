"""Opening the run store for a command or a job."""

from __future__ import annotations

from opscope.engine.core import progress


def open_store(url: str | None, write: bool = False):
    """The run store at ``url`` (default: the user's). Only a caller that saves new runs (``write``)
    creates a missing SQLite store, and says so on the progress log; the others raise
    db.StoreMissingError, creating nothing."""
    from opscope.engine.store.runstore import RunStore

    store = RunStore.open(url, create=write)
    if store.created:
        progress.log.info(f"created run store {store.location}")
    return store
