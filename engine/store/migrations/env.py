"""Alembic environment for the run store, driven programmatically by engine.store.db.migrate.

The caller passes an open connection (already inside a transaction and holding the migration lock)
in ``config.attributes``; there is no alembic.ini and no logging setup here (the app owns logging).
Offline (``--sql``) mode is not supported.
"""

from __future__ import annotations

from alembic import context
from opscope.engine.store.schema import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError("run store migrations run through engine.store.db.migrate(), with a connection")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=config.attributes.get("version_table", "alembic_version"),
    render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table instead
)
with context.begin_transaction():
    context.run_migrations()
