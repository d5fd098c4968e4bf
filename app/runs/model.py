"""The Runs panel's model: the run store, read in the GUI process (SQLite reads are quick), with the
filters, management actions and comparison the panel offers."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from opscope.app.ui import qt_compat  # noqa: F401  (must run before any emit)
from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunRow:
    """One line of the runs table: the store's RunInfo plus model and device from its settings."""

    info: object  # engine.store.RunInfo
    model: str
    device: str


class RunsModel(QObject):
    changed = Signal()

    def __init__(self, db_url: str | None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.db_url = db_url
        self._store = None
        self._labels: dict[int, tuple[str, str]] = {}  # run id -> (model, device), read once per run

    @property
    def store(self):
        if self._store is None:
            from opscope.engine import RunStore

            self._store = RunStore.open(self.db_url)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    @property
    def display_url(self) -> str:
        from opscope.engine import store_db as db

        return db.display_url(db.resolve_url(self.db_url))

    def switch_store(self, url: str) -> str:
        """Open the store at ``url`` (an SQLite file or any SQLAlchemy URL) and show its runs. The new
        store is opened (and migrated) before the old one closes: on failure the old one stays and the
        error (an engine StoreError/ConfigError with the reason) propagates. Returns its display URL."""
        from opscope.engine import RunStore

        new = RunStore.open(url.strip())
        self.close()
        self._store, self.db_url = new, new.url
        self._labels.clear()
        self.changed.emit()
        return new.display_url

    def push(self, run_ids: list[int], url: str):
        """Copy runs to the store at ``url`` (engine.store.push); returns its PushReport."""
        from opscope.engine import RunStore, push_runs

        with RunStore.open(url.strip()) as target:
            return push_runs(self.store, run_ids, target)

    # -- reading --------------------------------------------------------------------------------
    def rows(self, *, text: str = "", kind: str = "", tag: str = "", model: str = "", device: str = "") -> list[RunRow]:
        infos = self.store.list(kind=kind or None, tag=tag or None, name_contains=text or None)
        rows = [RunRow(info, *self._label(info.id)) for info in infos]
        return [r for r in rows if (not model or r.model == model) and (not device or r.device == device)]

    def _label(self, run_id: int) -> tuple[str, str]:
        if run_id not in self._labels:
            settings = self.store.get(run_id).settings
            model = settings.get("model") or "default"
            self._labels[run_id] = (Path(str(model)).name, str(settings.get("device", "")))
        return self._labels[run_id]

    def load(self, run_id: int):
        return self.store.load(run_id)

    def compare(self, run_ids: list[int]):
        from opscope.engine import compare

        return compare([self.store.load(i) for i in run_ids])

    # -- managing -------------------------------------------------------------------------------
    def rename(self, run_id: int, name: str) -> None:
        self.store.rename(run_id, name)
        self.changed.emit()

    def set_tags(self, run_id: int, tags: list[str]) -> None:
        current = set(self.store.info(run_id).tags)
        self.store.tag(run_id, add=[t for t in tags if t not in current], remove=sorted(current - set(tags)))
        self.changed.emit()

    def delete(self, run_ids: list[int]) -> None:
        for run_id in run_ids:
            self.store.delete(run_id)
            self._labels.pop(run_id, None)
        self.changed.emit()

    def export(self, run_id: int, path: str | Path) -> Path:
        """JSON (``.json``) or CSV (``.csv``) of one run, as `opscope runs export` writes them."""
        from opscope.engine import export_csv

        path = Path(path)
        if path.suffix.lower() == ".csv":
            path.write_text(export_csv(self.store.load(run_id)), encoding="utf-8")
        else:
            path.write_text(json.dumps(self.store.export(run_id), indent=1, default=str), encoding="utf-8")
        return path
