"""mover's control schema: migrations, steps, events, chunks, divergences.

Revision ID: 0001
Revises:
"""
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STEPS = "'create_target', 'install_capture', 'backfill', 'reconcile', 'cutover', 'rollback_window', 'retire'"
STATES = "'pending', 'running', 'paused', 'waiting', 'failed', 'done', 'aborted'"


def upgrade() -> None:
    op.execute(f"""
    CREATE TABLE mover.migrations (
        id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name             text NOT NULL UNIQUE,
        plan             jsonb NOT NULL,
        plan_hash        text NOT NULL,
        source_schema    text NOT NULL,
        source_table     text NOT NULL,
        target_schema    text NOT NULL,
        target_table     text NOT NULL,
        old_schema       text NOT NULL,
        old_table        text NOT NULL,
        key_columns      text[] NOT NULL,
        -- the current step, or the next one to run
        step             text NOT NULL DEFAULT 'create_target' CHECK (step IN ({STEPS}, 'finished')),
        state            text NOT NULL DEFAULT 'pending' CHECK (state IN ({STATES})),
        paused           boolean NOT NULL DEFAULT false,
        error            text,
        created_at       timestamptz NOT NULL DEFAULT now(),
        updated_at       timestamptz NOT NULL DEFAULT now(),
        cutover_at       timestamptz,
        cutover_lock_ms  double precision,
        window_ends_at   timestamptz,
        finished_at      timestamptz,
        -- the orchestrator's lease (not a session advisory lock: those break behind PgBouncer)
        lease_owner      text,
        lease_host       text,
        lease_pid        integer,
        lease_expires_at timestamptz,
        heartbeat_at     timestamptz
    )""")
    # One live migration per source table, enforced by the database rather than by the code.
    op.execute("""
    CREATE UNIQUE INDEX migrations_one_active_per_source ON mover.migrations (source_schema, source_table)
        WHERE state NOT IN ('done', 'aborted')""")
    op.execute(f"""
    CREATE TABLE mover.steps (
        migration_id bigint NOT NULL REFERENCES mover.migrations ON DELETE CASCADE,
        name         text NOT NULL CHECK (name IN ({STEPS})),
        position     integer NOT NULL,
        status       text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'done', 'undone')),
        started_at   timestamptz,
        finished_at  timestamptz,
        PRIMARY KEY (migration_id, name)
    )""")
    op.execute("""
    CREATE TABLE mover.events (
        id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        migration_id bigint NOT NULL REFERENCES mover.migrations ON DELETE CASCADE,
        at           timestamptz NOT NULL DEFAULT clock_timestamp(),
        actor        text NOT NULL,
        step         text,
        kind         text NOT NULL,
        message      text NOT NULL,
        detail       jsonb,
        duration_ms  double precision
    )""")
    op.execute("CREATE INDEX events_by_migration ON mover.events (migration_id, id)")
    op.execute("""
    CREATE TABLE mover.chunks (
        migration_id     bigint NOT NULL REFERENCES mover.migrations ON DELETE CASCADE,
        kind             text NOT NULL CHECK (kind IN ('backfill', 'reconcile')),
        chunk_no         integer NOT NULL,
        -- key bounds in their text form, cast back to the key's types when used;
        -- lo is exclusive, hi inclusive, NULL an open end
        lo               text[],
        hi               text[],
        status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'done', 'failed')),
        owner            text,
        lease_expires_at timestamptz,
        attempts         integer NOT NULL DEFAULT 0,
        rows             bigint,
        duration_ms      double precision,
        finished_at      timestamptz,
        error            text,
        PRIMARY KEY (migration_id, kind, chunk_no)
    )""")
    op.execute("""
    CREATE TABLE mover.divergences (
        id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        migration_id bigint NOT NULL REFERENCES mover.migrations ON DELETE CASCADE,
        key          text[] NOT NULL,
        kind         text NOT NULL CHECK (kind IN ('missing_in_target', 'extra_in_target', 'different', 'apply_error')),
        columns      jsonb,
        found_at     timestamptz NOT NULL DEFAULT now(),
        resolved_at  timestamptz,
        resolution   text
    )""")
    op.execute("CREATE INDEX divergences_open ON mover.divergences (migration_id) WHERE resolved_at IS NULL")


def downgrade() -> None:
    for table in ("divergences", "chunks", "events", "steps", "migrations"):
        op.execute(f"DROP TABLE mover.{table}")
