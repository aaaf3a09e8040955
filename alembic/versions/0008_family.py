"""Families (issue 27): a migration that moves several tables together. Each table of the family is
a migration row of its own (its own id, so its own change logs, ranges, shapes and divergences),
tied to the family's head row by family_id (the head's id, the head's own row included) and
ordered by family_position (0 for the head: the plan's [migration] source, then its [[also]]
tables in order). NULL in both for a migration of one table.

Revision ID: 0008
Revises: 0007
"""
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE mover.migrations ADD COLUMN family_id bigint REFERENCES mover.migrations (id),"
               " ADD COLUMN family_position integer,"
               " ADD CONSTRAINT migrations_family_position CHECK ((family_id IS NULL) = (family_position IS NULL))")
    op.execute("CREATE UNIQUE INDEX migrations_family_order ON mover.migrations (family_id, family_position)"
               " WHERE family_id IS NOT NULL")


def downgrade() -> None:
    op.execute("DROP INDEX mover.migrations_family_order")
    op.execute("ALTER TABLE mover.migrations DROP COLUMN family_position, DROP COLUMN family_id")
