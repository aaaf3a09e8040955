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

from tests.workload import catalog_snapshot, create_orders, differences, finish, mover, plan_text, spawn, write_plan

LOCK_TIMEOUT_MS = 300

CUTOVER = {"lock_timeout": f"{LOCK_TIMEOUT_MS}ms", "attempts": 2}
PLAN = plan_text("locked", columns={"id": "bigint"}, cutover=CUTOVER)


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


@contextmanager
def prepared_holding(dsn: str, table: str, gid: str):
    """A prepared transaction (two-phase commit) that wrote `table`: it holds ROW EXCLUSIVE on it,
    in no session, until COMMIT PREPARED or ROLLBACK PREPARED."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) == 0:
            pytest.skip("the server has max_prepared_transactions = 0: no prepared transaction can block anything")
        conn.execute("BEGIN")
        conn.execute(sql.SQL("UPDATE {} SET note = note WHERE id = 1").format(sql.Identifier(table)))
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        try:
            yield
        finally:
            if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone():
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


@pytest.mark.parametrize("operation", ["install_capture", "cutover"])
def test_a_prepared_transaction_that_blocks_the_lock_is_named(db_dsn, tmp_path, operation):
    """Issue 21, item 11: a prepared transaction has no session to terminate; mover names it (gid,
    owner, database, age) and the statements that end it, and says that terminate_blockers
    cannot; once it is rolled back the same command goes through."""
    create_orders(db_dsn, 500)
    plan = write_plan(tmp_path / "locked.toml",
                      plan_text("locked", columns={"id": "bigint"}, cutover={**CUTOVER, "terminate_blockers": True}))
    setup, command, _ = CASES[operation]
    for args, code in setup:
        r = mover(db_dsn, *[plan if a == "PLAN" else a for a in args])
        assert r.returncode == code, r.stderr
    if operation == "install_capture":
        r = mover(db_dsn, "step", plan)
        assert r.returncode == 0, r.stderr
    command = tuple(plan if a == "PLAN" else a for a in command)
    gid = "app's 2pc 1"
    with prepared_holding(db_dsn, "Orders", gid):
        before = catalog_snapshot(db_dsn)
        r = mover(db_dsn, *command)
        assert r.returncode == 3, r.stderr
        err = " ".join(r.stderr.split())  # the message as one line, wherever the terminal wrapped it
        assert "prepared transaction 'app''s 2pc 1' (owner postgres, database " in err, err
        assert "prepared " in err and " s ago, holding " in err, err
        assert "COMMIT PREPARED 'app''s 2pc 1'" in err and "ROLLBACK PREPARED 'app''s 2pc 1'" in err
        assert "terminate_blockers` cannot end them" in err, err
        assert f"retry `mover {command[0]} " in err and "pg_terminate_backend" not in err, err
        assert "blockers_cancelled" not in err
        assert catalog_snapshot(db_dsn) == before
        st = status(db_dsn)
        assert st["state"] == "waiting", st
    r = mover(db_dsn, *command)
    assert r.returncode in (0, 3), r.stderr
    assert status(db_dsn)["step"] == ("cutover" if operation == "install_capture" else "rollback_window")
