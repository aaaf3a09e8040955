"""The follower (`mover follow`, `mover run --wait`): the log stays drained at the gate and in the
window while the operator decides from another terminal, judged by plain SQL."""

from __future__ import annotations

import signal
import time

from psycopg import sql as psycopg_sql

from tests.e2e.test_promises import promise_plan, sql, status, wait_for
from tests.workload import Writer, create_orders, differences, finish, mover, spawn


def pending(dsn: str, reverse: bool) -> int:
    mid = sql(dsn, "SELECT id FROM mover.migrations WHERE name = 'promise'")[0][0]
    log = psycopg_sql.Identifier("mover", f"m{mid}_{'reverse_' if reverse else ''}changes")
    return sql(dsn, psycopg_sql.SQL("SELECT count(*) FROM {}").format(log))[0][0]


def reverse_applied(dsn: str) -> int:
    rows = sql(dsn, "SELECT applied FROM mover.capture_stats WHERE direction = 'reverse'")
    return rows[0][0] if rows else 0


def test_follower_drains_the_gate_and_the_window_while_the_operator_cuts_over(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    plan = promise_plan(tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    writer = Writer(db_dsn, seed=31).start()
    proc = spawn(db_dsn, "follow", "promise", "--interval", "0.2")
    try:
        applied0 = status(db_dsn)["capture"]["applied"]
        wait_for(lambda: status(db_dsn)["capture"]["applied"] > applied0 + 100, "the follower applying", proc)
        # At the gate the follower keeps up with the writer (nobody else applies the log): over a
        # window of writes, what it applies is of the order of what was written, and the backlog
        # falls back between samples instead of growing. Relative, so a loaded machine slowing
        # writer and follower alike does not decide it.
        ops0, applied0 = writer.ops, status(db_dsn)["capture"]["applied"]
        backlog = []
        for _ in range(20):
            backlog.append(pending(db_dsn, reverse=False))
            time.sleep(0.1)
        ops1, applied1 = writer.ops, status(db_dsn)["capture"]["applied"]
        assert ops1 - ops0 > 10, "the writer wrote in the window"
        assert applied1 - applied0 >= (ops1 - ops0) / 2, (ops1 - ops0, applied1 - applied0, backlog)
        assert any(b < a for a, b in zip(backlog, backlog[1:], strict=False)), backlog
        assert status(db_dsn)["step"] == "cutover"

        r = mover(db_dsn, "cutover", "promise")
        assert r.returncode == 0, r.stderr
        (drained,) = sql(db_dsn, "SELECT (detail->>'drained')::int FROM mover.events WHERE detail ? 'drained'"
                                 " ORDER BY id DESC LIMIT 1")[0]
        # The cutover's last drain under its lock is what arrived since the follower's last batch.
        assert drained <= max(2 * max(backlog), 100), (drained, backlog)

        # The follower noticed the swap and now applies the reverse log to the old table.
        wait_for(lambda: reverse_applied(db_dsn) > 50, "the reverse log applied in the window", proc)
        writer.pause()
        wait_for(lambda: pending(db_dsn, reverse=True) == 0, "the reverse log drained", proc)
        assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)
        assert proc.poll() is None and status(db_dsn)["step"] == "rollback_window"

        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc, 30)
        assert code == 0, err
        assert "follow" in err
    finally:
        writer.halt()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert writer.errors == []
    st = status(db_dsn)
    # Stopped cleanly: nothing half-done, nobody holds the lease, the window still open.
    assert (st["step"], st["state"]) == ("rollback_window", "waiting")
    assert sql(db_dsn, "SELECT lease_owner FROM mover.migrations WHERE name = 'promise'")[0][0] is None


def follower_applies_then_exits_on(db_dsn, proc, other: str, note: str, command: str) -> None:
    """A write by the application reaches `other` through the running follower; then the operator's
    `command` from another process succeeds and the follower exits 0 by itself."""
    try:
        sql(db_dsn, """INSERT INTO "Orders" ("Account", note) VALUES (7, %s)""", (note,))
        probe = psycopg_sql.SQL("SELECT count(*) FROM {} WHERE note = %s").format(psycopg_sql.Identifier(other))
        wait_for(lambda: sql(db_dsn, probe, (note,))[0][0] == 1, f"the follower applying the log to {other}", proc)
        r = mover(db_dsn, command, "promise")
        assert r.returncode == 0, r.stderr
        code, err = finish(proc, 30)
        assert code == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_follower_exits_when_the_operator_rolls_back(db_dsn, tmp_path):
    create_orders(db_dsn, 2_000)
    plan = promise_plan(tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    assert mover(db_dsn, "cutover", "promise").returncode == 0
    proc = spawn(db_dsn, "run", "promise", "--wait")
    follower_applies_then_exits_on(db_dsn, proc, "Orders_old", "in the window", "rollback")
    assert status(db_dsn)["step"] == "reconcile"
    assert sql(db_dsn, """SELECT count(*) FROM "Orders" WHERE note = 'in the window'""")[0][0] == 1


def test_follower_at_the_gate_exits_when_the_operator_aborts(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    assert mover(db_dsn, "run", promise_plan(tmp_path)).returncode == 3
    proc = spawn(db_dsn, "follow", "promise", "--interval", "0.2")
    follower_applies_then_exits_on(db_dsn, proc, "Orders_new", "at the gate", "abort")
    assert status(db_dsn)["state"] == "aborted"
    assert sql(db_dsn, "SELECT to_regclass('\"Orders_new\"')")[0][0] is None
