"""Fleets (issue 38): one plan over many databases (or tenant schemas). Each member is an ordinary
migration in its own database; what the fleet itself knows lives in its home database (a member's,
by default the first canary's): the fleet's row (its runner's lease, how far the rollout and the
cutover got, what stopped it and why), one row per member (its wave, the server it is on, where the
fleet has taken it) and the fleet's events (who did what).

Revision ID: 0012
Revises: 0011
"""
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

MEMBER_STATES = ("'pending', 'checked', 'running', 'at_gate', 'cut_over', 'rolled_back', 'retired', 'aborted',"
                 " 'skipped', 'failed', 'unreachable'")


def upgrade() -> None:
    op.execute("""
    CREATE TABLE mover.fleets (
        name             text PRIMARY KEY,
        plan_hash        text NOT NULL,
        -- the last wave `fleet run` started (0: the canaries; -1: none yet), and the last wave
        -- `fleet cutover` started: a member is cut over only once its wave was reached
        run_wave         integer NOT NULL DEFAULT -1,
        cutover_wave     integer NOT NULL DEFAULT -1,
        wave_done_at     timestamptz,
        stopped_reason   text,
        stopped_member   text,
        stopped_message  text,
        stopped_at       timestamptz,
        created_at       timestamptz NOT NULL DEFAULT now(),
        updated_at       timestamptz NOT NULL DEFAULT now(),
        -- the fleet runner's lease, as a migration's orchestrator holds its own
        lease_owner      text,
        lease_host       text,
        lease_pid        integer,
        lease_expires_at timestamptz,
        heartbeat_at     timestamptz
    )""")
    op.execute(f"""
    CREATE TABLE mover.fleet_members (
        fleet       text NOT NULL REFERENCES mover.fleets ON DELETE CASCADE,
        name        text NOT NULL,
        position    integer NOT NULL,
        wave        integer NOT NULL,
        server      text NOT NULL,
        migration   text NOT NULL,
        dsn         text NOT NULL,  -- as the fleet file gave it; a password is refused there
        state       text NOT NULL DEFAULT 'pending' CHECK (state IN ({MEMBER_STATES})),
        detail      text,
        updated_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (fleet, name)
    )""")
    op.execute("""
    CREATE TABLE mover.fleet_events (
        id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        fleet   text NOT NULL REFERENCES mover.fleets ON DELETE CASCADE,
        at      timestamptz NOT NULL DEFAULT clock_timestamp(),
        actor   text NOT NULL,
        member  text,
        kind    text NOT NULL,
        message text NOT NULL,
        detail  jsonb
    )""")
    op.execute("CREATE INDEX fleet_events_by_fleet ON mover.fleet_events (fleet, id)")


def downgrade() -> None:
    for table in ("fleet_events", "fleet_members", "fleets"):
        op.execute(f"DROP TABLE mover.{table}")
