"""Parallel workers: chunk frontiers, worker registry, capture counters, throttle reason.

Revision ID: 0002
Revises: 0001
"""
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Where the next chunk of a kind starts. Claiming a new range locks this row briefly, so
    # ranges are cut in key order and numbered in that order by whichever worker asks.
    op.execute("""
    CREATE TABLE mover.frontiers (
        migration_id   bigint NOT NULL REFERENCES mover.migrations ON DELETE CASCADE,
        kind           text NOT NULL CHECK (kind IN ('backfill', 'reconcile')),
        next_lo        text[],
        next_chunk_no  integer NOT NULL DEFAULT 1,
        exhausted      boolean NOT NULL DEFAULT false,
        PRIMARY KEY (migration_id, kind)
    )""")
    op.execute("CREATE INDEX chunks_claimable ON mover.chunks (migration_id, kind, chunk_no)"
               " WHERE status IN ('pending', 'running')")
    op.execute("""
    CREATE TABLE mover.workers (
        migration_id  bigint NOT NULL REFERENCES mover.migrations ON DELETE CASCADE,
        worker_id     text NOT NULL,
        host          text NOT NULL,
        pid           integer NOT NULL,
        started_at    timestamptz NOT NULL DEFAULT now(),
        heartbeat_at  timestamptz NOT NULL DEFAULT now(),
        chunk_rows    integer,
        rows_done     bigint NOT NULL DEFAULT 0,
        waiting_for   text,
        PRIMARY KEY (migration_id, worker_id)
    )""")
    op.execute("""
    CREATE TABLE mover.capture_stats (
        migration_id    bigint NOT NULL REFERENCES mover.migrations ON DELETE CASCADE,
        direction       text NOT NULL CHECK (direction IN ('forward', 'reverse')),
        applied         bigint NOT NULL DEFAULT 0,
        last_applied_at timestamptz,
        PRIMARY KEY (migration_id, direction)
    )""")


def downgrade() -> None:
    op.execute("DROP TABLE mover.capture_stats")
    op.execute("DROP TABLE mover.workers")
    op.execute("DROP INDEX mover.chunks_claimable")
    op.execute("DROP TABLE mover.frontiers")
