"""The follower (`mover follow`, `mover run --wait`): the log stays drained at the gate and in the
window while the operator decides from another terminal, judged by plain SQL."""

from __future__ import annotations

import signal
import time

from psycopg import sql as psycopg_sql

from tests.e2e.test_promises import plan_file, sql, status, wait_for
from tests.workload import Writer, create_orders, differences, finish, mover, spawn

BACKLOG_LIMIT = 400  # a follower polling every 0.2 s keeps far less than this from a single writer


def pending(dsn: str, reverse: bool) -> int:
    mid = sql(dsn, "SELECT id FROM mover.migrations WHERE name = 'promise'")[0][0]
    log = psycopg_sql.Identifier("mover", f"m{mid}_{'reverse_' if reverse else ''}changes")
    return sql(dsn, psycopg_sql.SQL("SELECT count(*) FROM {}").format(log))[0][0]


def reverse_applied(dsn: str) -> int:
    rows = sql(dsn, "SELECT applied FROM mover.capture_stats WHERE direction = 'reverse'")
    return rows[0][0] if rows else 0


def test_follower_drains_the_gate_and_the_window_while_the_operator_cuts_over(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    plan = plan_file(tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    writer = Writer(db_dsn, seed=31).start()
    proc = spawn(db_dsn, "follow", "promise", "--interval", "0.2")
    try:
        applied0 = status(db_dsn)["capture"]["applied"]
        wait_for(lambda: status(db_dsn)["capture"]["applied"] > applied0 + 100, "the follower applying", proc)
        # At the gate the backlog stays small while the writer writes (nobody else applies it).
        backlog = []
        for _ in range(10):
            backlog.append(pending(db_dsn, reverse=False))
            time.sleep(0.1)
        assert max(backlog) < BACKLOG_LIMIT, backlog
        assert status(db_dsn)["step"] == "cutover"

        r = mover(db_dsn, "cutover", "promise")
        assert r.returncode == 0, r.stderr
        (drained,) = sql(db_dsn, "SELECT (detail->>'drained')::int FROM mover.events WHERE detail ? 'drained'"
                                 " ORDER BY id DESC LIMIT 1")[0]
        assert drained < BACKLOG_LIMIT, drained

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


def test_follower_exits_when_the_operator_rolls_back(db_dsn, tmp_path):
    create_orders(db_dsn, 2_000)
    plan = plan_file(tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    assert mover(db_dsn, "cutover", "promise").returncode == 0
    proc = spawn(db_dsn, "run", "promise", "--wait")
    try:
        sql(db_dsn, """INSERT INTO "Orders" ("Account", note) VALUES (7, 'in the window')""")
        wait_for(lambda: sql(db_dsn, """SELECT count(*) FROM "Orders_old" WHERE note = 'in the window'""")[0][0] == 1,
                 "the follower applying the reverse log", proc)
        r = mover(db_dsn, "rollback", "promise")
        assert r.returncode == 0, r.stderr
        code, err = finish(proc, 30)
        assert code == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert status(db_dsn)["step"] == "reconcile"
    assert sql(db_dsn, """SELECT count(*) FROM "Orders" WHERE note = 'in the window'""")[0][0] == 1


def test_follower_at_the_gate_exits_when_the_operator_aborts(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    assert mover(db_dsn, "run", plan_file(tmp_path)).returncode == 3
    proc = spawn(db_dsn, "follow", "promise", "--interval", "0.2")
    try:
        sql(db_dsn, """INSERT INTO "Orders" ("Account", note) VALUES (8, 'at the gate')""")
        wait_for(lambda: sql(db_dsn, """SELECT count(*) FROM "Orders_new" WHERE note = 'at the gate'""")[0][0] == 1,
                 "the follower applying the log at the gate", proc)
        r = mover(db_dsn, "abort", "promise")
        assert r.returncode == 0, r.stderr
        code, err = finish(proc, 30)
        assert code == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert status(db_dsn)["state"] == "aborted"
    assert sql(db_dsn, "SELECT to_regclass('\"Orders_new\"')")[0][0] is None
