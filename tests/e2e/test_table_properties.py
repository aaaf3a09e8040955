"""What a table is besides its rows, carried over the swap or refused clearly: persistence,
constraints with their validation state, outbound foreign keys, index comments, the identity
sequence's name; and a crash in the middle of CREATE INDEX CONCURRENTLY."""

from __future__ import annotations

import json
import time

import psycopg

from tests.workload import create_orders, differences, finish, mover, spawn, write_plan


def query(dsn, q, params=()):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(q, params).fetchall()


def execute(dsn, statements):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statements)


def wait_for(predicate, what, timeout=60.0):
    """Poll the database for a state another process reaches, bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def status(dsn, name):
    r = mover(dsn, "status", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def plan(tmp_path, name, source, extra="", window="1h"):
    return write_plan(tmp_path / f"{name}.toml", f"""
[migration]
name = "{name}"
source = '{source}'

[target]
{extra}

[backfill]
chunk_rows = 500

[rollback]
window = "{window}"
""")


def same_rows(dsn, a, b):
    """Independent of mover's reconcile: EXCEPT ALL both ways over whole rows."""
    q = f"SELECT (SELECT count(*) FROM (TABLE {a} EXCEPT ALL TABLE {b}) x), " \
        f"(SELECT count(*) FROM (TABLE {b} EXCEPT ALL TABLE {a}) y)"
    return query(dsn, q)[0] == (0, 0)


# ---------------------------------------------------------------------------------------------
# kill -9 during CREATE INDEX CONCURRENTLY


def test_kill9_during_create_index_concurrently_then_resume(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    p = write_plan(tmp_path / "cic.toml", """
[migration]
name = "cic"
source = 'public."Orders"'
[rollback]
window = "1h"
""")
    release = tmp_path / "release"
    proc = spawn(db_dsn, "run", p, env={"MOVER_FAULT": "hang@index_building", "MOVER_FAULT_RELEASE": str(release)})
    blocker = psycopg.connect(db_dsn)
    try:
        assert "hanging at index_building" in proc.stderr.readline()
        # A writer's lock on the new table makes the build wait in its first phase, after its
        # invalid index is in the catalog: the moment a crash leaves a backend building on.
        blocker.execute('LOCK "Orders_new" IN ROW EXCLUSIVE MODE')
        release.touch()
        orphan = wait_for(lambda: query(db_dsn, "SELECT pid FROM pg_stat_progress_create_index"
                                                " WHERE relid = '\"Orders_new\"'::regclass"), "the index build")[0][0]
        proc.kill()
        finish(proc, 60)
        resume = spawn(db_dsn, "run", "cic")
        # The orphaned build must be stopped by the resume, not waited for while it waits on us.
        wait_for(lambda: resume.poll() is not None or not query(
            db_dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (orphan,)), "the orphaned build to end", 90)
        blocker.rollback()
        code, err = finish(resume, 120)
        assert code == 3 and "ready for cutover" in err, err
    finally:
        blocker.close()
        if proc.poll() is None:
            proc.kill()
    (valid, definition), = query(db_dsn, "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i"
                                         " WHERE i.indrelid = '\"Orders_new\"'::regclass AND NOT i.indisprimary")
    assert valid and '("Account", created_at)' in definition
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
