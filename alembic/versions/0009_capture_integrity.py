"""Capture integrity (issue 34, invariant 14): what mover last verified of each capture object
(capture_marks: the pg_trigger / pg_publication / pg_publication_rel row's oid and raw xmin, which
any ALTER of the row changes and freezing does not), and each gap found in it (capture_gaps: the
object, what was seen, when it was found, when capture was back in force, and when the full
comparison, or re-sync, that covers the gap ran after that).

Revision ID: 0009
Revises: 0008
"""
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE mover.capture_marks (
        migration_id bigint NOT NULL REFERENCES mover.migrations ON DELETE CASCADE,
        direction    text NOT NULL CHECK (direction IN ('forward', 'reverse')),
        object       text NOT NULL,
        object_oid   bigint NOT NULL,
        row_xmin     text NOT NULL,
        state        text,
        marked_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (migration_id, direction, object)
    )""")
    op.execute("""
    CREATE TABLE mover.capture_gaps (
        id           bigserial PRIMARY KEY,
        migration_id bigint NOT NULL REFERENCES mover.migrations ON DELETE CASCADE,
        direction    text NOT NULL CHECK (direction IN ('forward', 'reverse')),
        object       text NOT NULL,
        relation     text,
        seen         text NOT NULL,
        fix          text,
        detected_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
        restored_at  timestamptz,
        compared_at  timestamptz,
        resolution   text
    )""")
    op.execute("CREATE INDEX capture_gaps_open ON mover.capture_gaps (migration_id, direction)"
               " WHERE compared_at IS NULL")


def downgrade() -> None:
    op.execute("DROP TABLE mover.capture_gaps")
    op.execute("DROP TABLE mover.capture_marks")
