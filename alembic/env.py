"""Alembic environment for mover's control schema. Run through `mover init` (mover/state/control.py),
which hands over an open connection in config.attributes["connection"]."""

from alembic import context
from sqlalchemy import text

config = context.config
connection = config.attributes["connection"]

context.configure(
    connection=connection,
    target_metadata=None,
    version_table="alembic_version",
    version_table_schema="mover",
    transactional_ddl=True,
)

with context.begin_transaction():
    # Two `mover init` at once: the second waits here, then finds nothing left to do.
    connection.execute(text("SELECT pg_advisory_xact_lock(hashtext('mover.init'))"))
    connection.execute(text("CREATE SCHEMA IF NOT EXISTS mover"))
    context.run_migrations()
