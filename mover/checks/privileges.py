"""Privileges: mover's role can do each step, and no other role can make the capture trigger's
insert fail."""

from __future__ import annotations

from mover import names as mover_names
from mover.catalog import introspect, privileges
from mover.checks.subject import Subject
from mover.engines.capture import changelog
from mover.errors import PlanError
from mover.sql import capture as capture_sql
from mover.state import control


def setup(s: Subject) -> None:
    # Before the rehearsal, which would only say "permission denied".
    if control.schema_ready(s.cur):
        privileges.require_setup(s.cur, s.src, s.new)


def capture_path(s: Subject) -> None:
    """Is the capture trigger's insert safe from other roles? Its log and function are created in
    a savepoint, asked about (default privileges of schema mover apply to the log as they would at
    the install), and rolled back (the trigger itself is not: it would lock the table)."""
    cur, source = s.cur, s.src
    log_table, fn = mover_names.change_log(0), mover_names.capture_function(0)
    info = introspect.describe(cur, source)
    key = tuple(info.key)
    cur.execute("SAVEPOINT mover_capture_check")
    try:
        for stmt in [*capture_sql.create_log(log_table, key, tuple(info.column(k).type for k in key)),
                     *capture_sql.create_trigger_function(fn, log_table, key, s.plan.name,
                                                          changelog.key_equality(cur, info, key))]:
            cur.execute(stmt)
        missing = privileges.capture_path_missing(cur, fn, log_table)
    finally:
        cur.execute("ROLLBACK TO SAVEPOINT mover_capture_check")
    if missing:
        raise PlanError(privileges.capture_message(log_table, missing),
                        hint=privileges.capture_hint(cur, missing, s.plan.name))
