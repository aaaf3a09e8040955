"""Shapes: each table's catalog description and its fingerprint, recorded by mover.

Revision ID: 0004
Revises: 0003
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # mover/catalog/shape.py: the description of the original table ("source", recorded at registration)
    # and of the new one ("target", recorded when mover has finished building it), both found by
    # oid whatever the swap names them; recorded again when mover renames them or an operator
    # adopts a change. The description is kept next to the fingerprint so that an error can say
    # what changed, not only that something did.
    op.execute("""
    ALTER TABLE mover.migrations
        ADD COLUMN source_shape       jsonb,
        ADD COLUMN source_fingerprint text,
        ADD COLUMN target_shape       jsonb,
        ADD COLUMN target_fingerprint text""")


def downgrade() -> None:
    op.execute("ALTER TABLE mover.migrations DROP COLUMN source_shape, DROP COLUMN source_fingerprint,"
               " DROP COLUMN target_shape, DROP COLUMN target_fingerprint")
