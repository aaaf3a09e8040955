"""Divergences retired with the old table (issue 35): a divergence of the reverse direction (a row
the old table could not take during the rollback window) is about the old table, and retire ends
it, dropping the table or keeping it unsynced. It is then resolved as `retired`, no longer left
open on a finished migration.

Revision ID: 0010
Revises: 0009
"""
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE mover.divergences
        DROP CONSTRAINT divergences_resolved_how_check,
        ADD CONSTRAINT divergences_resolved_how_check
            CHECK (resolved_how IN ('equal_on_recheck', 'repaired', 'accepted', 'superseded', 'retired'))""")


def downgrade() -> None:
    # The older releases know no `retired`: closed, as a newer pass would have superseded them.
    op.execute("UPDATE mover.divergences SET resolved_how = 'superseded' WHERE resolved_how = 'retired'")
    op.execute("""
    ALTER TABLE mover.divergences
        DROP CONSTRAINT divergences_resolved_how_check,
        ADD CONSTRAINT divergences_resolved_how_check
            CHECK (resolved_how IN ('equal_on_recheck', 'repaired', 'accepted', 'superseded'))""")
