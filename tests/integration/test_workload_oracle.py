"""The oracle itself (tests/workload.py): a test's own mirrored write (app_execute) and the Writer's
mirrored statements, racing on one row, leave the mirror equal to the table. No mover here.

The race: app_execute's transaction changes row k and rewrites k's mirror row; the Writer's
statement on k (one statement: the table's row and the mirror's) takes its snapshot, then waits
for k's row lock. Once app_execute commits, PostgreSQL follows k's update chain in the table to
the new version, but the mirror row the Writer's snapshot sees is the old one: if app_execute
had deleted it and inserted a new one, there is no chain to follow, the Writer's mirror write
finds nothing, and the mirror keeps a row the application deleted (a "lost" row the live table
never had to hold: tests/e2e/test_capture_integrity.py failed once on it, the row the Writer of
seed 34 deletes at its ~334th operation, key 385, updated by replica_writes just before)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import sql

from tests.workload import Writer, app_execute, assert_oracle, create_orders

KEY = 5
WRITES = {
    "delete": (sql.SQL("DELETE FROM {} WHERE id = %(k)s RETURNING id"), {"delete": True}),
    "update": (sql.SQL("UPDATE {} SET amount = amount + 1, note = NULL WHERE id = %(k)s RETURNING"
                       " id, \"Account\", amount, status, payload, note, created_at"), {"old_key": True}),
    "key_change": (sql.SQL("UPDATE {} SET id = nextval(pg_get_serial_sequence('\"Orders\"', 'id')) WHERE id = %(k)s"
                           " RETURNING id, \"Account\", amount, status, payload, note, created_at"), {"old_key": True}),
}


def waiting_for_a_lock(conn: psycopg.Connection, pid: int) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row and row[0] == "Lock":
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("write", list(WRITES))
def test_a_writer_blocked_behind_app_execute_keeps_the_mirror_equal(db_dsn, write):
    create_orders(db_dsn, 20)
    stmt, how = WRITES[write]
    writer = Writer(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as app, psycopg.connect(db_dsn, autocommit=True) as w, \
            psycopg.connect(db_dsn, autocommit=True) as watch:
        writer.connected(w)
        errors: list[BaseException] = []

        def writer_statement() -> None:
            try:
                writer._run(w, stmt.format(sql.Identifier("Orders")), {"k": KEY}, **how)
            except BaseException as exc:  # the test's thread: seen by the assertion below
                errors.append(exc)

        with app.transaction():  # app_execute's transaction held open until the Writer waits on its row
            app_execute(app, "UPDATE {t} SET note = %s WHERE id = %s", ("app", KEY))
            t = threading.Thread(target=writer_statement)
            t.start()
            assert waiting_for_a_lock(watch, w.info.backend_pid)
        t.join(30)
        assert not t.is_alive() and errors == []
    assert_oracle(db_dsn, "Orders")
