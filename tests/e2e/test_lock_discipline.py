"""Lock discipline (mover/engines/swap/lockwatch.py) with real sessions: a blocking transaction is named in
the output and the status; with terminate_blockers it is ended and reported; autovacuum is paused
for the locked transaction and its setting comes back, also after a kill -9."""

from __future__ import annotations

import json
import signal
import time

import psycopg
import pytest

from tests.workload import create_orders, differences, mover, plan_file, plan_text, write_plan


def plan(tmp_path, **cutover) -> str:
    return plan_file(tmp_path, "disc", columns={"id": "bigint"},
                     cutover={"lock_timeout": "200ms", "attempts": 2, **cutover})


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
    assert mover(db_dsn, "run", plan(tmp_path, terminate_blockers=True, blocker_grace="300ms")).returncode == 3
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


PARTITIONED_PLAN = plan_text(
    "disc", "events", cutover={"lock_timeout": "200ms", "attempts": 2},
    target={"partition": {"by": "range", "column": "created_at", "interval": "1 month", "premake": 1,
                          "accept_key_change": True}})


def partitions(dsn, table):
    """(name, reloptions) of each partition of `table` that has storage."""
    return sql(dsn, "SELECT c.relname, c.reloptions FROM pg_partition_tree(%s::regclass) p"
                    " JOIN pg_class c ON c.oid = p.relid WHERE c.relkind = 'r' ORDER BY 1", (table,))


def test_autovacuum_is_paused_on_each_partition_of_a_partitioned_target(db_dsn, tmp_path):
    """A partitioned parent has no storage: autovacuum works on its partitions, which the swap's
    LOCK TABLE locks too, so each is paused (and restored after a crash) like a plain table."""
    sql(db_dsn, "CREATE TABLE events (id bigserial PRIMARY KEY, created_at timestamptz NOT NULL, note text);"
                " INSERT INTO events (created_at, note) SELECT now() - g * interval '1 day', md5(g::text)"
                " FROM generate_series(0, 90) g")
    plan = write_plan(tmp_path / "disc.toml", PARTITIONED_PLAN)
    assert mover(db_dsn, "run", plan).returncode == 3
    before = partitions(db_dsn, "events_new")
    assert len(before) >= 4 and all(options is None for _, options in before), before
    r = mover(db_dsn, "cutover", "disc", env={"MOVER_FAULT": "kill@lock:paused"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert [options for _, options in partitions(db_dsn, "events_new")] == [["autovacuum_enabled=false"]] * len(before)
    assert reloptions(db_dsn, "events_new") is None  # the parent takes no setting
    assert reloptions(db_dsn, "events") == ["autovacuum_enabled=false"]
    paused = {t["table"] for t in events(db_dsn, "autovacuum_paused")[-1][1]["tables"]}
    assert {f'"public"."{name}"' for name, _ in before} | {'"public"."events"'} == paused
    r = mover(db_dsn, "run", "disc")  # the next run restores them all
    assert r.returncode == 3, r.stderr
    assert partitions(db_dsn, "events_new") == before
    assert reloptions(db_dsn, "events") is None
    assert mover(db_dsn, "cutover", "disc").returncode == 0
    assert partitions(db_dsn, "events") == before and reloptions(db_dsn, "events_old") is None


def autovacuum_worker(dsn, table) -> int | None:
    rows = sql(dsn, "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE a.backend_type = 'autovacuum worker' AND l.locktype = 'relation' AND l.granted"
                    " AND l.relation = to_regclass(%s)", (table,))
    return rows[0][0] if rows else None


def test_a_real_autovacuum_worker_is_cancelled_and_named(db_dsn, tmp_path):
    """A real autovacuum worker (not a stand-in VACUUM) on the source when the cutover starts: the
    lock discipline cancels it (before pausing autovacuum, whose ALTER TABLE it would block), the
    swap goes through, and the events and the output name the worker. The worker is provoked with
    per-table thresholds of 0 and made slow (cost delay 100 ms per page) so it is still running;
    autovacuum_naptime is per server, lowered for this test only."""
    create_orders(db_dsn, 2_000)
    # before the run: the new table is created with the same storage parameters (parity)
    sql(db_dsn, 'ALTER TABLE "Orders" SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0,'
                ' autovacuum_vacuum_cost_delay = 100, autovacuum_vacuum_cost_limit = 1)')
    assert mover(db_dsn, "run", plan(tmp_path)).returncode == 3
    sql(db_dsn, "ALTER SYSTEM SET autovacuum_naptime = 1")
    sql(db_dsn, "SELECT pg_reload_conf()")
    try:
        sql(db_dsn, 'UPDATE "Orders" SET note = note || \'x\'')  # dead rows for it to vacuum
        deadline = time.monotonic() + 60
        while (pid := autovacuum_worker(db_dsn, '"Orders"')) is None:
            assert time.monotonic() < deadline, "no autovacuum worker started on the table within 60 s"
            time.sleep(0.2)  # polling the server's own scheduler: there is no event to wait for
        r = mover(db_dsn, "cutover", "disc")
        assert r.returncode == 0, r.stderr
        assert str(pid) in r.stderr, r.stderr
    finally:
        sql(db_dsn, "ALTER SYSTEM RESET autovacuum_naptime")
        sql(db_dsn, "SELECT pg_reload_conf()")
    cancelled = [d["pids"] for _, d in events(db_dsn, "autovacuum_cancelled")]
    assert any(pid in pids for pids in cancelled), cancelled
    assert status(db_dsn)["step"] == "rollback_window"
    assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)
    # its storage parameters came back with the pause undone (the vacuum settings are the operator's)
    assert "autovacuum_enabled=false" not in reloptions(db_dsn, '"Orders_old"')


def test_one_lock_timeout_bounds_all_the_locks_of_an_attempt(db_dsn):
    """lockwatch.lock_all spends the transaction's lock_timeout across its locks (race 9): the
    first waits 0.6 s for a session that then lets it go, the second waits only the 0.4 s left of
    1 s before giving up, not a whole second more. An application transaction queued behind the
    first table waits for the whole sequence: one lock_timeout each could hold it past the
    server's deadlock_timeout."""
    import threading

    from mover.engines.swap import lockwatch
    from mover.names import QualifiedName
    sql(db_dsn, "CREATE TABLE first_t (id int); CREATE TABLE second_t (id int)")
    holder_first = psycopg.connect(db_dsn)
    holder_second = psycopg.connect(db_dsn)
    holder_first.execute("SELECT * FROM first_t")  # ACCESS SHARE, let go after 0.6 s
    holder_second.execute("SELECT * FROM second_t")  # held throughout
    release = threading.Timer(0.6, holder_first.commit)
    try:
        with psycopg.connect(db_dsn) as conn, conn.cursor() as cur:
            cur.execute("SET LOCAL lock_timeout = '1s'")
            release.start()
            started = time.monotonic()
            with pytest.raises(psycopg.errors.LockNotAvailable):
                lockwatch.lock_all(cur, [QualifiedName("public", "first_t"), QualifiedName("public", "second_t")])
            waited = time.monotonic() - started
            assert lockwatch.waiting_on() == QualifiedName("public", "second_t")
    finally:
        release.join()
        holder_first.close()
        holder_second.close()
    assert 0.9 <= waited < 1.4, waited  # one lock_timeout each would have been 1.6 s
