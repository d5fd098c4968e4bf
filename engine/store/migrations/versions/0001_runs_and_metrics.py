"""First schema: runs, their tags, and metrics with raw samples.

Revision ID: 0001
Revises:
Create Date: 2026-11-21

Types are spelled out here, not imported from engine.store.schema: a migration must keep meaning
what it meant when it was written. JSON blobs are TEXT (see engine/store/schema.py for why).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    _create_runs()
    _create_run_tags()
    _create_metrics()


def _create_runs() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(100), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("settings", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("owner_host", sa.String(255), nullable=True),
        sa.Column("owner_pid", sa.Integer(), nullable=True),
        sa.Column("owner_started_s", sa.Float(), nullable=True),
        sa.UniqueConstraint("name", name="uq_runs_name"),
    )
    op.create_index("ix_runs_kind", "runs", ["kind"])
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_index("ix_runs_created_at", "runs", ["created_at"])


def _create_run_tags() -> None:
    op.create_table(
        "run_tags",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("tag", sa.String(100), nullable=False),
        sa.UniqueConstraint("run_id", "tag", name="uq_run_tags_run_id_tag"),
    )
    op.create_index("ix_run_tags_run_id", "run_tags", ["run_id"])
    op.create_index("ix_run_tags_tag", "run_tags", ["tag"])


def _create_metrics() -> None:
    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("unit", sa.String(50), nullable=False),
        sa.Column("higher_is_better", sa.Boolean(), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("samples", sa.Text(), nullable=False),
    )
    op.create_index("ix_metrics_run_id", "metrics", ["run_id"])


def downgrade() -> None:
    op.drop_table("metrics")
    op.drop_table("run_tags")
    op.drop_table("runs")
