"""RunStore: save runs as they happen, read them back, manage them.

Writing is incremental so a crash loses nothing already measured: ``begin_run`` commits a
``running`` row, ``add_metric`` commits each point on its own, ``finish_run`` closes the run. On
the next open, runs whose writing process has died are marked ``aborted`` (see engine/store/owner).

Runs are addressed by id (int, or a string of digits) or by their unique name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from opscope.engine.core.errors import ConfigError, RunNotFoundError, StoreError
from opscope.engine.core.results import RUN_NAME_MAX_CHARS, Metric, RunResult, TelemetrySeries
from opscope.engine.store import convert, db, owner
from opscope.engine.store.convert import RunInfo, StoredRun
from opscope.engine.store.schema import RUN_STATUSES, MetricRow, RunRow, TagRow
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

RunRef = int | str
_FINAL_STATUSES = tuple(s for s in RUN_STATUSES if s != "running")


def _now() -> datetime:
    return datetime.now(UTC)


def _quality(metrics) -> str | None:
    """A run's quality: the worst of its measured metrics' (Metric or MetricRow)."""
    from opscope.engine.bench.measure.quality import worst

    return worst(m.quality for m in metrics if m.status == "ok")


def validate_name(name: str) -> str:
    if not name or name != name.strip() or len(name) > RUN_NAME_MAX_CHARS:
        raise ConfigError(
            f"run name {name!r} is not valid: use 1-{RUN_NAME_MAX_CHARS} characters, no leading or trailing spaces"
        )
    if name.isdigit():
        raise ConfigError(f"run name {name!r} is all digits and would read as a run id; add a letter")
    return name


def validate_tags(tags: Iterable[str]) -> list[str]:
    tags = list(tags)
    for tag in tags:
        if not tag or tag != tag.strip():
            raise ConfigError(f"tag {tag!r} is not valid: give some text without leading or trailing spaces")
    return tags


class RunStore:
    """One database of runs. Open with ``RunStore.open(url)``; close (or use ``with``) when done."""

    def __init__(self, engine: Engine, url: str):
        self._engine = engine
        self.url = url
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._open_runs: set[int] = set()  # begun here, not finished yet
        self.created = False  # set by open(): this process created the SQLite file

    @classmethod
    def open(cls, url: str | os.PathLike | None = None, create: bool = True) -> RunStore:
        """Open (creating or migrating as needed) the database at ``url``; see engine.store.db.
        ``create=False``: a missing SQLite file raises db.StoreMissingError instead of being created.
        ``store.created`` says whether this call created the SQLite file."""
        resolved = db.resolve_url(url)
        created = db.missing_sqlite_file(resolved) is not None
        engine = db.create_db_engine(resolved, create=create)
        try:
            db.migrate(engine)
            store = cls(engine, resolved)
            store.created = created
            store.abort_stale_runs()
        except BaseException:
            engine.dispose()
            raise
        return store

    def close(self) -> None:
        for run_id in sorted(self._open_runs):
            self.finish_run(run_id, "aborted", "the run store was closed before the run finished")
        self._engine.dispose()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def display_url(self) -> str:
        return db.display_url(self.url)

    @property
    def location(self) -> str:
        """A SQLite store's file path, else its URL without the password."""
        return db.location(self.url)

    @contextmanager
    def _transaction(self, what: str) -> Iterator[Session]:
        """A session in one committed transaction; database failures become StoreError."""
        try:
            with self._sessions() as session, session.begin():
                yield session
        except SQLAlchemyError as e:
            raise db.store_error(self.url, what, e) from e

    # --- writing ---------------------------------------------------------------------------

    def begin_run(self, result: RunResult) -> int:
        """Create the run as ``running`` (committed at once) with whatever ``result`` already holds."""
        run_id = self._insert(result, status="running")
        self._open_runs.add(run_id)
        return run_id

    def save(self, result: RunResult) -> int:
        """Save a finished run in one transaction, with ``result.status`` as its status."""
        if result.status not in RUN_STATUSES:
            raise StoreError(f"run status {result.status!r} is not one of {', '.join(RUN_STATUSES)}")
        return self._insert(result, status=result.status)

    def _insert(self, result: RunResult, status: str) -> int:
        explicit = bool(result.name)
        validate_tags(result.tags)
        base = validate_name(result.name) if explicit else f"{result.kind}-{_now():%Y%m%d-%H%M%S}"
        for attempt in range(1, 100):
            name = base if attempt == 1 else f"{base}-{attempt}"
            try:
                return self._insert_named(result, status, name)
            except StoreError as e:
                if not isinstance(e.__cause__, IntegrityError) or self._find_id(name) is None:
                    raise
                if explicit:
                    raise ConfigError(
                        f"a run named {name!r} already exists in {self.display_url}; "
                        f"choose another --name or rename the old run"
                    ) from e
        raise StoreError(f"could not find a free run name after {base!r}-99; name the run explicitly")

    def _insert_named(self, result: RunResult, status: str, name: str) -> int:
        me = owner.current_owner() if status == "running" else None
        row = RunRow(
            name=name,
            kind=result.kind,
            status=status,
            notes=result.notes or "",
            error=result.error,
            created_at=result.started_at or _now(),
            finished_at=None if status == "running" else result.finished_at or _now(),
            settings=dict(result.settings),
            fingerprint=dict(result.fingerprint),
            owner_host=me and me.host,
            owner_pid=me and me.pid,
            owner_started_s=me and me.started_s,
            trace_summary=result.trace_summary,
            quality=None if status == "running" else _quality(result.metrics),
            tags=[TagRow(tag=t) for t in dict.fromkeys(result.tags)],
            metrics=[convert.metric_row(m, i) for i, m in enumerate(result.metrics)],
            telemetry=[convert.telemetry_row(t) for t in result.telemetry],
            markers=[convert.marker_row(m) for m in result.markers],
        )
        with self._transaction(f"save run {name!r}") as s:
            s.add(row)
            s.flush()
            return row.id

    def import_run(self, stored: StoredRun) -> int:
        """Insert a run read from another store as it was: same name, status, times, quality and data
        (``opscope runs push``). The name must be free here; the caller decides what to skip."""
        info, result = stored.info, stored.result
        row = self._insert_named(result, info.status, validate_name(info.name))
        with self._transaction(f"keep the times of run {info.name!r}") as s:
            copied = s.get(RunRow, row)
            copied.created_at, copied.finished_at, copied.quality = info.created_at, info.finished_at, info.quality
        return row

    def _running_row(self, s: Session, run_id: int) -> RunRow:
        row = s.get(RunRow, run_id)
        if row is None:
            raise RunNotFoundError(f"no saved run with id {run_id} in {self.display_url}")
        if row.status != "running":
            log.warning("run %d is %s; adding data to it anyway", run_id, row.status)
        return row

    def add_metric(self, run_id: int, metric: Metric) -> None:
        """Append one metric (one benchmark point) to a run and commit it."""
        with self._transaction(f"add metric {metric.name!r} to run {run_id}") as s:
            self._running_row(s, run_id)
            last = s.scalar(select(func.max(MetricRow.position)).where(MetricRow.run_id == run_id))
            row = convert.metric_row(metric, 0 if last is None else last + 1)
            row.run_id = run_id
            s.add(row)

    def add_telemetry(self, run_id: int, series: Iterable[TelemetrySeries]) -> None:
        """Append telemetry, committed at once. A recorder may flush a long series in chunks: chunks
        with the same name and unit read back as one series, in the order they were added."""
        with self._transaction(f"add telemetry to run {run_id}") as s:
            row = self._running_row(s, run_id)
            row.telemetry.extend(convert.telemetry_row(t) for t in series)

    def add_markers(self, run_id: int, markers: Iterable[Any]) -> None:
        """Phase markers (engine.results.Marker or engine.markers.Marker) on the engine clock."""
        with self._transaction(f"add markers to run {run_id}") as s:
            row = self._running_row(s, run_id)
            row.markers.extend(convert.marker_row(m) for m in markers)

    def set_trace_summary(self, run_id: int, summary: dict | None) -> None:
        with self._transaction(f"set the trace summary of run {run_id}") as s:
            self._running_row(s, run_id).trace_summary = summary

    def finish_run(self, run_id: int, status: str = "completed", error: str | None = None) -> None:
        if status not in _FINAL_STATUSES:
            raise StoreError(f"cannot finish run {run_id} as {status!r}: use one of {', '.join(_FINAL_STATUSES)}")
        with self._transaction(f"finish run {run_id}") as s:
            row = s.get(RunRow, run_id)
            if row is None:
                raise RunNotFoundError(f"no saved run with id {run_id} in {self.display_url}")
            row.status, row.error, row.finished_at = status, error, _now()
            row.quality = _quality(row.metrics)
            row.owner_host = row.owner_pid = row.owner_started_s = None
        self._open_runs.discard(run_id)

    def abort_stale_runs(self) -> list[int]:
        """Mark ``aborted`` every running run whose writer process is gone; returns their ids."""
        aborted = []
        with self._transaction("abort runs left running by a crash") as s:
            for row in s.scalars(select(RunRow).where(RunRow.status == "running")):
                who = owner.Owner(row.owner_host, row.owner_pid, row.owner_started_s) if row.owner_pid else None
                if owner.is_alive(who) is False:
                    row.status, row.finished_at = "aborted", _now()
                    row.error = (
                        f"the process writing this run (pid {row.owner_pid} on {row.owner_host}) "
                        f"ended without finishing it"
                    )
                    aborted.append(row.id)
        for run_id in aborted:
            log.warning("run %d was left running by a process that died; marked aborted", run_id)
        return aborted

    # --- reading and managing ------------------------------------------------------------------

    def _find_id(self, name: str) -> int | None:
        with self._transaction(f"look up run {name!r}") as s:
            return s.scalar(select(RunRow.id).where(RunRow.name == name))

    def resolve(self, ref: RunRef) -> int:
        """The id of the run named or numbered ``ref``; RunNotFoundError when there is none."""
        if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit()):
            with self._transaction(f"look up run {ref}") as s:
                if s.get(RunRow, int(ref)) is not None:
                    return int(ref)
            raise RunNotFoundError(
                f"no saved run with id {ref} in {self.display_url} (`opscope runs list` shows the saved runs)"
            )
        run_id = self._find_id(ref)
        if run_id is None:
            raise RunNotFoundError(
                f"no saved run named {ref!r} in {self.display_url} (`opscope runs list` shows the saved runs)"
            )
        return run_id

    def load(self, ref: RunRef) -> StoredRun:
        run_id = self.resolve(ref)
        with self._transaction(f"read run {ref}") as s:
            row = s.get(RunRow, run_id)
            return StoredRun(convert.run_info(row), convert.run_result(row))

    def get(self, ref: RunRef) -> RunResult:
        return self.load(ref).result

    def info(self, ref: RunRef) -> RunInfo:
        run_id = self.resolve(ref)
        with self._transaction(f"read run {ref}") as s:
            return convert.run_info(s.get(RunRow, run_id))

    def list(
        self,
        *,
        kind: str | None = None,
        status: str | None = None,
        tag: str | None = None,
        name_contains: str | None = None,
        limit: int | None = None,
    ) -> list[RunInfo]:
        """Runs matching every filter given, newest first."""
        counts = select(MetricRow.run_id, func.count(MetricRow.id).label("n")).group_by(MetricRow.run_id).subquery()
        query = (
            select(RunRow, func.coalesce(counts.c.n, 0))
            .outerjoin(counts, counts.c.run_id == RunRow.id)
            .order_by(RunRow.created_at.desc(), RunRow.id.desc())
        )
        if kind:
            query = query.where(RunRow.kind == kind)
        if status:
            query = query.where(RunRow.status == status)
        if tag:
            query = query.where(RunRow.tags.any(TagRow.tag == tag))
        if name_contains:
            query = query.where(RunRow.name.contains(name_contains, autoescape=True))
        if limit:
            query = query.limit(limit)
        with self._transaction("list runs") as s:
            return [convert.run_info(row, n) for row, n in s.execute(query)]

    def delete(self, ref: RunRef) -> RunInfo:
        info = self.info(ref)
        with self._transaction(f"delete run {ref}") as s:
            s.delete(s.get(RunRow, info.id))
        return info

    def rename(self, ref: RunRef, new_name: str) -> RunInfo:
        validate_name(new_name)
        run_id = self.resolve(ref)
        existing = self._find_id(new_name)
        if existing is not None and existing != run_id:
            raise ConfigError(f"a run named {new_name!r} already exists (id {existing}); choose another name")
        with self._transaction(f"rename run {ref}") as s:
            s.get(RunRow, run_id).name = new_name
        return self.info(run_id)

    def tag(self, ref: RunRef, add: Iterable[str] = (), remove: Iterable[str] = ()) -> RunInfo:
        add = validate_tags(add)
        run_id = self.resolve(ref)
        with self._transaction(f"tag run {ref}") as s:
            row = s.get(RunRow, run_id)
            gone, have = set(remove), {t.tag for t in row.tags}
            row.tags = [t for t in row.tags if t.tag not in gone]
            row.tags.extend(TagRow(tag=t) for t in dict.fromkeys(add) if t not in have and t not in gone)
        return self.info(run_id)

    def set_notes(self, ref: RunRef, notes: str) -> RunInfo:
        run_id = self.resolve(ref)
        with self._transaction(f"set notes of run {ref}") as s:
            s.get(RunRow, run_id).notes = notes
        return self.info(run_id)

    def export(self, ref: RunRef) -> dict:
        """Everything about one run as a JSON-able dict (see engine.store.convert.export_dict)."""
        return convert.export_dict(self.load(ref))
