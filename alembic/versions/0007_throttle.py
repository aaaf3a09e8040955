"""The governor's row per migration (mover/engines/governor/throttle.py, written by mover/state/throttle.py):
who probes the server for the migration, what the probe and the guards read, and what every
process's bulk work is held to. The probe is this row's own update: a one-row write and commit
every few hundred ms, timed by the process that holds `prober`. A logged table on purpose: the
application's commits wait for the WAL flush, and so must the probe's to read what they pay
(bench/impact.py --signals measured the logged probe following the application's latency better
than an unlogged one).

Revision ID: 0007
Revises: 0006
"""
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE mover.throttle (
        migration_id      bigint PRIMARY KEY REFERENCES mover.migrations ON DELETE CASCADE,
        prober            text,                -- the owner id of the process that probes and decides
        probed_at         timestamptz,         -- its last probe; older than a few seconds: anyone may take over
        phase             text,                -- the bulk work governed now: backfill, index builds, reconcile
        baseline_ms       double precision,    -- the probe's median latency before the phase started
        budget_ms         double precision,    -- what the probe's latency may reach (NULL: no latency budget)
        latency_ms        double precision,    -- the probe's latency now (median of the last readings)
        duty              double precision NOT NULL DEFAULT 1,  -- the share of their time the engines work
        state             text NOT NULL DEFAULT 'idle'
                          CHECK (state IN ('idle', 'measuring', 'ok', 'throttled', 'floor', 'waiting', 'off')),
        reason            text,                -- why, as status prints it
        wait              text,                -- a guard that holds every engine (a standby, a slot, archiving)
        throttled_since   timestamptz,
        throttled_seconds double precision NOT NULL DEFAULT 0,  -- over the migration's life
        readings          jsonb                -- the guards' last readings, for status and plan check
    )""")


def downgrade() -> None:
    op.execute("DROP TABLE mover.throttle")
