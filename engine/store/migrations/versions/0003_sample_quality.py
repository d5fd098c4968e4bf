"""Run quality: foreign load per sample and a quality per metric and per run.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

All three columns are nullable: runs saved before this revision read back with an unknown quality.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("quality", sa.String(20), nullable=True))
    with op.batch_alter_table("metrics") as batch:
        batch.add_column(sa.Column("quality", sa.String(20), nullable=True))
        batch.add_column(sa.Column("load", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.drop_column("load")
        batch.drop_column("quality")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("quality")
