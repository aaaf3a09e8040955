"""Privileges: mover's role can do each step, and every writer of the source can run the
capture trigger."""

from __future__ import annotations

from mover import control, introspect, privileges
from mover import names as mover_names
from mover.checks import Subject
from mover.errors import PlanError
from mover.sql import capture as capture_sql


def setup(s: Subject) -> None:
    # Before the rehearsal, which would only say "permission denied".
    if control.schema_ready(s.cur):
        privileges.require_setup(s.cur, s.src, s.new)


def capture_path(s: Subject) -> None:
    """Can every writer of the source run the capture trigger? Its log is created and granted in
    a savepoint, asked about, and rolled back (the trigger itself is not: it would lock the table)."""
    cur, source = s.cur, s.src
    log_table = mover_names.change_log(0)
    info = introspect.describe(cur, source)
    cur.execute("SAVEPOINT mover_capture_check")
    try:
        cur.execute(capture_sql.create_log(log_table, tuple(info.key), tuple(info.column(k).type for k in info.key)))
        for stmt in capture_sql.grant_log(log_table):
            cur.execute(stmt)
        missing = privileges.capture_path_missing(cur, source, log_table)
    finally:
        cur.execute("ROLLBACK TO SAVEPOINT mover_capture_check")
    if missing:
        raise PlanError(privileges.capture_message(source, missing),
                        hint=privileges.capture_hint(cur, missing, s.plan.name))
