"""One word for each thing: the control schema's "chunks" become "ranges", and a migration
stopped by Ctrl-C or SIGTERM is "interrupted" (it was "paused", the word of `mover pause`).

Revision ID: 0005
Revises: 0004
"""
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Catalog-only renames: nothing is rewritten, and a migration in flight resumes with its
# ranges as they were (the rows keep their numbers, bounds, owners and leases).
_RENAMES = (
    "ALTER TABLE mover.chunks RENAME TO ranges",
    "ALTER TABLE mover.ranges RENAME COLUMN chunk_no TO range_no",
    "ALTER TABLE mover.ranges RENAME CONSTRAINT chunks_pkey TO ranges_pkey",
    "ALTER INDEX mover.chunks_claimable RENAME TO ranges_claimable",
    "ALTER TABLE mover.frontiers RENAME COLUMN next_chunk_no TO next_range_no",
    "ALTER TABLE mover.workers RENAME COLUMN chunk_rows TO range_rows",
)
_STATES = "'pending', 'running', {}, 'waiting', 'failed', 'done', 'aborted'"


def _rename_state(old: str, new: str) -> None:
    op.execute("ALTER TABLE mover.migrations DROP CONSTRAINT migrations_state_check")
    op.execute(f"UPDATE mover.migrations SET state = '{new}' WHERE state = '{old}'")
    op.execute("ALTER TABLE mover.migrations ADD CONSTRAINT migrations_state_check"
               f" CHECK (state IN ({_STATES.format(repr(new))}))")


def upgrade() -> None:
    for statement in _RENAMES:
        op.execute(statement)
    _rename_state("paused", "interrupted")


def downgrade() -> None:
    _rename_state("interrupted", "paused")
    op.execute("ALTER TABLE mover.workers RENAME COLUMN range_rows TO chunk_rows")
    op.execute("ALTER TABLE mover.frontiers RENAME COLUMN next_range_no TO next_chunk_no")
    op.execute("ALTER INDEX mover.ranges_claimable RENAME TO chunks_claimable")
    op.execute("ALTER TABLE mover.ranges RENAME CONSTRAINT ranges_pkey TO chunks_pkey")
    op.execute("ALTER TABLE mover.ranges RENAME COLUMN range_no TO chunk_no")
    op.execute("ALTER TABLE mover.ranges RENAME TO chunks")
