"""Lock discipline (mover/lockwatch.py) with real sessions: a blocking transaction is named in
the output and the status; with terminate_blockers it is ended and reported; autovacuum is paused
for the locked transaction and its setting comes back, also after a kill -9."""

from __future__ import annotations

import json
import signal

import psycopg
import pytest

from tests.workload import create_orders, differences, mover, write_plan

PLAN = """
[migration]
name = "disc"
source = 'public."Orders"'

[target]
columns = {{ id = "bigint" }}

[cutover]
lock_timeout = "200ms"
attempts = 2
{cutover}

[rollback]
window = "1h"
"""


def plan(tmp_path, cutover: str = "") -> str:
    return write_plan(tmp_path / "disc.toml", PLAN.format(cutover=cutover))


def sql(dsn, statement, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def status(dsn):
    r = mover(dsn, "status", "disc", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def reloptions(dsn, table):
    return sql(dsn, "SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s)", (table,))[0][0]


def events(dsn, kind):
    return sql(dsn, "SELECT message, detail FROM mover.events WHERE kind = %s ORDER BY id", (kind,))


def open_blocker(dsn) -> psycopg.Connection:
    """An application session idle in a transaction that read the table: it holds ACCESS SHARE."""
    conn = psycopg.connect(dsn, application_name="app-report")
    conn.execute('SELECT count(*) FROM "Orders"')
    return conn


def test_a_blocking_session_is_named(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    assert mover(db_dsn, "run", plan(tmp_path)).returncode == 3
    blocker = open_blocker(db_dsn)
    pid = blocker.info.backend_pid
    r = mover(db_dsn, "cutover", "disc")
    assert r.returncode == 3, r.stderr
    err = " ".join(r.stderr.split())  # the console wraps long lines
    assert f"pid {pid} (user " in err and "'app-report'" in err and "idle in transaction" in err, err
    assert "terminate_blockers" in r.stderr  # the next: line offers it
    st = status(db_dsn)
    assert st["step"] == "cutover" and f"pid {pid}" in st["error"], st
    assert reloptions(db_dsn, '"Orders"') is None  # autovacuum not left paused
    assert reloptions(db_dsn, '"Orders_new"') is None
    blocker.execute("SELECT 1")  # left alone: still connected
    blocker.rollback()
    assert mover(db_dsn, "cutover", "disc").returncode == 0
    blocker.close()


def test_terminate_blockers_ends_them_and_reports_whom(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    assert mover(db_dsn, "run", plan(tmp_path, 'terminate_blockers = true\nblocker_grace = "300ms"')).returncode == 3
    blocker = open_blocker(db_dsn)
    pid = blocker.info.backend_pid
    r = mover(db_dsn, "cutover", "disc")
    assert r.returncode == 0, r.stderr
    assert f"pid {pid}" in r.stderr, r.stderr
    assert status(db_dsn)["step"] == "rollback_window"
    ((message, detail),) = events(db_dsn, "blockers_cancelled")
    # Idle in a transaction, it ignores the cancel: it was terminated after the grace.
    assert f"terminated pid {pid}" in message
    assert [(s["pid"], s["action"], s["application_name"]) for s in detail["sessions"]] == \
        [(pid, "terminated", "app-report")]
    with pytest.raises(psycopg.OperationalError):
        blocker.execute("SELECT 1")
    blocker.close()
    assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)


def test_autovacuum_is_paused_for_the_swap_and_restored(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    sql(db_dsn, 'ALTER TABLE "Orders" SET (autovacuum_enabled = true, fillfactor = 90)')
    assert mover(db_dsn, "run", plan(tmp_path)).returncode == 3
    new_before = reloptions(db_dsn, '"Orders_new"')
    assert mover(db_dsn, "cutover", "disc").returncode == 0
    # Each physical table has its own setting back (the swap renamed them).
    assert sorted(reloptions(db_dsn, '"Orders_old"')) == ["autovacuum_enabled=true", "fillfactor=90"]
    assert reloptions(db_dsn, '"Orders"') == new_before
    paused = events(db_dsn, "autovacuum_paused")
    restored = events(db_dsn, "autovacuum_restored")
    assert len(paused) == len(restored) >= 2  # install_capture and the cutover at least
    assert {t["table"] for t in paused[-1][1]["tables"]} == {'"public"."Orders"', '"public"."Orders_new"'}


def test_autovacuum_restored_after_a_kill_between_pause_and_swap(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    assert mover(db_dsn, "run", plan(tmp_path)).returncode == 3
    r = mover(db_dsn, "cutover", "disc", env={"MOVER_FAULT": "kill@lock:paused"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert reloptions(db_dsn, '"Orders"') == ["autovacuum_enabled=false"]  # the crash left it paused
    assert reloptions(db_dsn, '"Orders_new"') == ["autovacuum_enabled=false"]
    r = mover(db_dsn, "run", "disc")  # the next run restores it before anything else
    assert r.returncode == 3, r.stderr
    assert reloptions(db_dsn, '"Orders"') is None
    assert reloptions(db_dsn, '"Orders_new"') is None
    assert status(db_dsn)["step"] == "cutover"
    assert mover(db_dsn, "cutover", "disc").returncode == 0
    assert reloptions(db_dsn, '"Orders"') is None and reloptions(db_dsn, '"Orders_old"') is None
