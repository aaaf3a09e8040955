"""Reconcile: per-range counts and fingerprints, divergence resolutions.

Revision ID: 0003
Revises: 0002
"""
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # What reconcile saw in each range it verified, on both sides: the row count and the sum
    # mod 2^64 of a 64-bit hash per row (mover/sql/compare.py). Kept after the pass, so that a
    # later pass re-verifies only the ranges that changed since, and so that a copy elsewhere
    # can be checked against these figures without moving rows.
    op.execute("""
    ALTER TABLE mover.chunks
        ADD COLUMN src_rows        bigint,
        ADD COLUMN src_fingerprint bigint,
        ADD COLUMN dst_rows        bigint,
        ADD COLUMN dst_fingerprint bigint,
        ADD COLUMN differences     integer,
        ADD COLUMN verified_at     timestamptz""")
    # How an open divergence was closed: the rows were equal when checked again, `mover repair`
    # re-synced them, the operator accepted the difference (with a reason), or an older release
    # superseded it with a new pass.
    op.execute("""
    ALTER TABLE mover.divergences
        ADD COLUMN resolved_how text CHECK (resolved_how IN ('equal_on_recheck', 'repaired', 'accepted',
                                                             'superseded')),
        ADD COLUMN resolved_by  text,
        ADD COLUMN reason       text,
        ADD COLUMN checked_at   timestamptz""")
    op.execute("UPDATE mover.divergences SET resolved_how = 'superseded' WHERE resolved_at IS NOT NULL")
    # A range's open divergences are looked up by key when the range is verified again.
    op.execute("CREATE INDEX divergences_by_key ON mover.divergences (migration_id, key)")


def downgrade() -> None:
    op.execute("DROP INDEX mover.divergences_by_key")
    op.execute("ALTER TABLE mover.divergences DROP COLUMN resolved_how, DROP COLUMN resolved_by,"
               " DROP COLUMN reason, DROP COLUMN checked_at")
    op.execute("ALTER TABLE mover.chunks DROP COLUMN src_rows, DROP COLUMN src_fingerprint, DROP COLUMN dst_rows,"
               " DROP COLUMN dst_fingerprint, DROP COLUMN differences, DROP COLUMN verified_at")
