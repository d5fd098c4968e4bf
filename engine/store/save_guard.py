"""A run store that may fail (a full disk, a file-size limit, a store made read-only meanwhile)
without taking the measurements with it: `opscope bench` (plain and ``--ab``) measures through this
sink, prints its results table, and only then reports the save error (one line, exit 2):

    with saving(args.db, args.no_save) as store:      # a store that cannot even open fails here
        run_id, result = run_suite(..., store, ...)
    summary_table(result, run_id if saved(store) else None)
    raise_unsaved(store)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opscope.engine.core.errors import StoreError

log = logging.getLogger(__name__)


class SaveGuard:
    """Forwards the RunSink calls (begin_run, add_metric, finish_run, add_telemetry, …) to
    ``store`` until one fails; keeps that error in ``error`` and ignores the store from then on.
    The measurement goes on: every result stays in the RunResult the suite returns."""

    def __init__(self, store):
        self.store = store
        self.error: BaseException | None = None

    def _call(self, name: str, *args) -> Any:
        if self.error is not None:
            return None
        try:
            return getattr(self.store, name)(*args)
        except (StoreError, OSError) as e:
            log.debug("run store %s failed; the run goes on unsaved", name, exc_info=True)
            self.error = e
            return None

    def begin_run(self, result) -> Any:
        return self._call("begin_run", result)

    def add_metric(self, run_id, metric) -> None:
        self._call("add_metric", run_id, metric)

    def finish_run(self, run_id, status: str, error: str | None = None) -> None:
        self._call("finish_run", run_id, status, error)

    def close(self) -> None:
        """Closes the store even after a failure (an error here is kept if it is the first)."""
        try:
            self.store.close()
        except (StoreError, OSError) as e:
            self.error = self.error or e

    def __getattr__(self, name: str):  # the store's optional parts (add_telemetry, add_markers)
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr
        return lambda *args: self._call(name, *args)


@contextmanager
def saving(db: str | None, no_save: bool = False) -> Iterator[SaveGuard | None]:
    """The guarded run store a bench command measures into (None with --no-save), opened before
    anything is measured (a store that cannot even be opened fails first, in one line, with no
    table), closed after the measurement (also when it fails)."""
    if no_save:
        yield None
        return
    from opscope.engine.store.access import open_store

    guard = SaveGuard(open_store(db, write=True))
    try:
        yield guard
    finally:
        guard.close()


def saved(guard: SaveGuard | None) -> bool:
    """Whether the runs went to the store: their ids may be shown."""
    return guard is not None and guard.error is None


def raise_unsaved(guard: SaveGuard | None) -> None:
    """After the results are printed: the one line saying why they are not saved (exit 2)."""
    if guard is not None and guard.error is not None:
        sys.stdout.flush()  # the table first, then the line, even through a pipe
        raise guard.error
