"""Every lock mover takes on the live table (install_capture, cutover, rollback, retire, abort)
against an application session that holds a conflicting lock: mover waits at most
[cutover] lock_timeout per attempt, gives up after `attempts` with exit 3, a message and a next
step, changes nothing, and an application statement queued behind it waits no longer than
lock_timeout."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql

from tests.workload import catalog_snapshot, create_orders, differences, finish, mover, spawn, write_plan

LOCK_TIMEOUT_MS = 300

PLAN = f"""
[migration]
name = "locked"
source = 'public."Orders"'

[target]
columns = {{ id = "bigint" }}

[cutover]
lock_timeout = "{LOCK_TIMEOUT_MS}ms"
attempts = 2

[rollback]
window = "1h"
"""


@contextmanager
def holding(dsn: str, table: str, mode: str):
    """An application transaction left open while holding `mode` on the table."""
    conn = psycopg.connect(dsn)
    try:
        conn.execute(sql.SQL("LOCK TABLE {} IN {} MODE").format(sql.Identifier(table), sql.SQL(mode)))
        yield
    finally:
        conn.rollback()
        conn.close()


def queued_application_write(dsn: str, table: str, proc) -> float | None:
    """Once mover waits for a lock, run one application UPDATE on the table and time it; None if
    mover ended without ever waiting."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while not conn.execute("SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'mover%%'"
                               " AND wait_event_type = 'Lock' AND datname = current_database()").fetchone():
            if proc.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.005)
        # Far above mover's lock_timeout: an application that waited until mover's turn came would
        # show it, rather than fail here.
        conn.execute("SET lock_timeout = '20s'")
        started = time.monotonic()
        conn.execute(sql.SQL("UPDATE {} SET note = note WHERE id = 1").format(sql.Identifier(table)))
        return time.monotonic() - started


def status(dsn):
    r = mover(dsn, "status", "locked", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


CASES = {
    # operation: (setup commands and their exit codes, the command, the lock the application holds)
    "install_capture": ([], ("run", "PLAN"), "ROW EXCLUSIVE"),
    "cutover": ([(("run", "PLAN"), 3)], ("cutover", "locked"), "ACCESS SHARE"),
    "rollback": ([(("run", "PLAN"), 3), (("cutover", "locked"), 0)], ("rollback", "locked"), "ACCESS SHARE"),
    "retire": ([(("run", "PLAN"), 3), (("cutover", "locked"), 0)], ("retire", "locked", "--force"), "ACCESS SHARE"),
    "abort": ([(("run", "PLAN"), 3)], ("abort", "locked"), "ACCESS SHARE"),
}


@pytest.mark.parametrize("operation", list(CASES))
def test_backs_off_from_a_conflicting_lock(db_dsn, tmp_path, operation):
    create_orders(db_dsn, 2_000)
    plan = write_plan(tmp_path / "locked.toml", PLAN)
    setup, command, mode = CASES[operation]
    for args, code in setup:
        r = mover(db_dsn, *[plan if a == "PLAN" else a for a in args])
        assert r.returncode == code, r.stderr
    command = tuple(plan if a == "PLAN" else a for a in command)
    if operation == "install_capture":
        # create_target needs no conflicting lock: stop before install_capture so the snapshot
        # below is the state the locked step must leave alone.
        r = mover(db_dsn, "step", plan)
        assert r.returncode == 0, r.stderr
    before = catalog_snapshot(db_dsn)
    step_before = status(db_dsn)["step"]

    with holding(db_dsn, "Orders", mode):
        proc = spawn(db_dsn, *command)
        waited = queued_application_write(db_dsn, "Orders", proc)
        code, err = finish(proc, 120)
    assert code == 3, err
    assert "lock" in err and f"next: retry `mover {command[0]} locked" in err, err
    assert waited is not None, f"mover never waited for the lock: {err}"
    # One attempt's lock_timeout and generous slack; an application that had to wait for
    # mover's attempts to run out (or for the holder to finish) would take much longer.
    assert waited < LOCK_TIMEOUT_MS / 1000 + 1.0, waited
    assert catalog_snapshot(db_dsn) == before  # nothing swapped, dropped or installed
    st = status(db_dsn)
    # A forced retire records the window's early end before it tries the lock: it then waits at
    # step retire, with the old table and its sync still in place (the snapshot above).
    assert st["step"] == ("retire" if operation == "retire" else step_before) and st["state"] == "waiting", st

    # Once the application lets go, the same command goes through.
    r = mover(db_dsn, *command)
    assert r.returncode in (0, 3), r.stderr
    st = status(db_dsn)
    expected = {"install_capture": ("cutover", "waiting"), "cutover": ("rollback_window", "waiting"),
                "rollback": ("cutover", "waiting"), "retire": ("retire", "done"), "abort": (st["step"], "aborted")}
    if operation == "rollback":
        r = mover(db_dsn, "run", "locked")
        assert r.returncode == 3, r.stderr
        st = status(db_dsn)
    assert (st["step"], st["state"]) == expected[operation], st
    if operation in ("install_capture", "rollback"):
        assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
