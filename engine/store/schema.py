"""The run store's tables (SQLAlchemy 2.x ORM).

Blobs (raw samples, telemetry values, fingerprints, settings) are JSON in TEXT columns rather than
the databases' JSON types: nobody queries inside them, Python's json round-trips every float
exactly (NaN and infinities included, which PostgreSQL's JSON type rejects), and the same bytes work
on every backend. Anything a user filters on (name, kind, status, tags, time) is a real column.

Every change here needs a migration in engine/store/migrations/versions (tests compare the two).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

RUN_STATUSES = ("running", "completed", "failed", "aborted")


def _json_default(value: Any) -> Any:
    # Paths, tuples inside sets, numpy scalars, enums: store their text rather than fail a whole run.
    if hasattr(value, "item"):
        return value.item()
    return str(value)


class JsonText(TypeDecorator):
    """Any JSON-able value, stored as text."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect) -> str | None:
        return None if value is None else json.dumps(value, default=_json_default, sort_keys=True)

    def process_result_value(self, value: str | None, dialect) -> Any:
        return None if value is None else json.loads(value)


class UTCDateTime(TypeDecorator):
    """Aware datetimes in, aware UTC datetimes out; stored naive in UTC so SQLite (which has no
    time zones) and PostgreSQL hold the same value."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the run store; use an aware one")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("name", name="uq_runs_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(100), index=True)
    status: Mapped[str] = mapped_column(String(20), index=True)
    notes: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    settings: Mapped[dict] = mapped_column(JsonText)
    fingerprint: Mapped[dict] = mapped_column(JsonText)
    # Who is writing a running run: lets the next open tell a crashed writer (aborted) from a live
    # one in another process (left alone).
    owner_host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    owner_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    owner_started_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    trace_summary: Mapped[dict | None] = mapped_column(JsonText, nullable=True)
    # worst of its metrics' quality (engine.bench.quality); NULL for runs saved before it existed
    quality: Mapped[str | None] = mapped_column(String(20), nullable=True)

    tags: Mapped[list[TagRow]] = relationship(cascade="all, delete-orphan", passive_deletes=True, order_by="TagRow.tag")
    metrics: Mapped[list[MetricRow]] = relationship(
        cascade="all, delete-orphan", passive_deletes=True, order_by="MetricRow.position"
    )
    telemetry: Mapped[list[TelemetryRow]] = relationship(
        cascade="all, delete-orphan", passive_deletes=True, order_by="TelemetryRow.id"
    )
    markers: Mapped[list[MarkerRow]] = relationship(
        cascade="all, delete-orphan", passive_deletes=True, order_by="MarkerRow.id"
    )


class TagRow(Base):
    __tablename__ = "run_tags"
    __table_args__ = (UniqueConstraint("run_id", "tag", name="uq_run_tags_run_id_tag"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    tag: Mapped[str] = mapped_column(String(100), index=True)


class MetricRow(Base):
    __tablename__ = "metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)  # order within the run, as the suite produced it
    name: Mapped[str] = mapped_column(String(200))
    unit: Mapped[str] = mapped_column(String(50))
    higher_is_better: Mapped[bool] = mapped_column()
    params: Mapped[dict] = mapped_column(JsonText)
    status: Mapped[str] = mapped_column(String(20))
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    samples: Mapped[list] = mapped_column(JsonText)  # raw, one per repetition
    quality: Mapped[str | None] = mapped_column(String(20), nullable=True)  # "ok" | "noisy" | "disturbed"
    load: Mapped[dict | None] = mapped_column(JsonText, nullable=True)  # foreign load per sample, re-runs


class TelemetryRow(Base):
    __tablename__ = "telemetry_series"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    unit: Mapped[str] = mapped_column(String(50))
    t_ns: Mapped[list] = mapped_column(JsonText)  # engine.clock.now_ns of each sample
    values: Mapped[list] = mapped_column(JsonText)


class MarkerRow(Base):
    __tablename__ = "phase_markers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    phase: Mapped[str] = mapped_column(String(100))
    edge: Mapped[str] = mapped_column(String(20))
    t_ns: Mapped[int] = mapped_column(BigInteger)
    attrs: Mapped[dict] = mapped_column(JsonText)
