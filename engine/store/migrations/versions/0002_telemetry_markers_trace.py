"""Telemetry series, phase markers and trace summaries attached to runs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("trace_summary", sa.Text(), nullable=True))

    op.create_table(
        "telemetry_series",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("unit", sa.String(50), nullable=False),
        sa.Column("t_ns", sa.Text(), nullable=False),
        sa.Column("values", sa.Text(), nullable=False),
    )
    op.create_index("ix_telemetry_series_run_id", "telemetry_series", ["run_id"])

    op.create_table(
        "phase_markers",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("phase", sa.String(100), nullable=False),
        sa.Column("edge", sa.String(20), nullable=False),
        sa.Column("t_ns", sa.BigInteger(), nullable=False),
        sa.Column("attrs", sa.Text(), nullable=False),
    )
    op.create_index("ix_phase_markers_run_id", "phase_markers", ["run_id"])


def downgrade() -> None:
    op.drop_table("phase_markers")
    op.drop_table("telemetry_series")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("trace_summary")
