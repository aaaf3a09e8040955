"""The governor's `quiet` state (issue 36): no application session has run a statement for
[throttle] idle_after, so nothing needs protecting and the engines work at full speed.

Revision ID: 0011
Revises: 0010
"""
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE mover.throttle
        DROP CONSTRAINT throttle_state_check,
        ADD CONSTRAINT throttle_state_check
            CHECK (state IN ('idle', 'measuring', 'ok', 'throttled', 'floor', 'waiting', 'off', 'quiet'))""")


def downgrade() -> None:
    # The older releases know no `quiet`: a governed row at full duty says the same.
    op.execute("UPDATE mover.throttle SET state = 'ok' WHERE state = 'quiet'")
    op.execute("""
    ALTER TABLE mover.throttle
        DROP CONSTRAINT throttle_state_check,
        ADD CONSTRAINT throttle_state_check
            CHECK (state IN ('idle', 'measuring', 'ok', 'throttled', 'floor', 'waiting', 'off'))""")
