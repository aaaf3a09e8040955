"""The settings that change a conversion or a comparison (TimeZone, DateStyle, ...), read from the
registering session and set in every one of the migration's transactions (mover/db.py
CONVERSION_SETTINGS). NULL for a migration registered before: it runs with the session's own.

Revision ID: 0006
Revises: 0005
"""
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE mover.migrations ADD COLUMN session_settings jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE mover.migrations DROP COLUMN session_settings")
