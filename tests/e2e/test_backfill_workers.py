"""Backfill at scale: several workers, a worker killed mid-range, pause, a failing range, and a
crash around the deferred index builds."""

from __future__ import annotations

import json
import signal

import psycopg

from tests.workload import (
    Writer,
    app_execute,
    assert_oracle,
    create_orders,
    differences,
    finish,
    hung_at,
    mover,
    plan_file,
    spawn,
)


def wide_plan(tmp_path, workers=2, rate=0, columns=None):
    return plan_file(tmp_path, "wide", columns=columns or {"id": "bigint"},
                     backfill={"range_rows": 500, "min_rows": 500, "max_rows": 500, "workers": workers,
                               "max_rows_per_second": rate, "max_attempts": 2})


def status(dsn):
    r = mover(dsn, "status", "wide", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_for(predicate, what, timeout=60.0):
    """Poll the database for an event (a state another process reaches), bounded."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def query(dsn, q, params=()):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(q, params).fetchall()


def test_workers_race_and_a_killed_worker_range_is_redone_once(db_dsn, tmp_path):
    create_orders(db_dsn, 20_000)
    plan = wide_plan(tmp_path, workers=2, rate=8000)
    writer = Writer(db_dsn, seed=21).start()
    assert mover(db_dsn, "step", plan).returncode == 0  # registered; create_target done
    # An extra worker on "another host" joins, copies one range's rows and dies before committing.
    doomed = spawn(db_dsn, "worker", "wide", env={"MOVER_FAULT": "kill@range_copied"})
    orchestrator = spawn(db_dsn, "run", plan)
    try:
        assert finish(doomed, 120)[0] == -signal.SIGKILL
        code, err = finish(orchestrator, 300)
        assert code == 3, err
        redone = query(db_dsn, "SELECT range_no, attempts FROM mover.ranges WHERE kind = 'backfill' AND attempts > 1")
        assert len(redone) == 1 and redone[0][1] == 2
        owners = query(db_dsn, "SELECT count(DISTINCT owner) FROM mover.ranges WHERE kind = 'backfill'")[0][0]
        assert owners >= 2  # both orchestrator workers did ranges
        writer.pause()
        assert mover(db_dsn, "run", "wide").returncode == 3
        assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
        assert_oracle(db_dsn, "Orders", "Orders_new")
    finally:
        for p in (doomed, orchestrator):
            if p.poll() is None:
                p.kill()
        writer.halt()
    assert writer.errors == []


def test_the_log_is_applied_while_the_only_worker_copies_a_range(db_dsn, tmp_path):
    """The applier replays the writers' changes to copied ranges beside the copy: with the only
    worker held inside its third range's transaction, changes to the first two ranges reach the
    new table meanwhile (without the applier they would wait for that range to end)."""
    create_orders(db_dsn, 3_000)
    release = tmp_path / "release"
    proc = spawn(db_dsn, "run", wide_plan(tmp_path, workers=1),
                 env={"MOVER_FAULT": "hang@range_copied:3", "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert hung_at(proc, "range_copied:3")
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            app_execute(conn, 'UPDATE {t} SET "Account" = -1, note = \'applied beside\' WHERE id IN (10, 700)')
        wait_for(lambda: query(db_dsn, 'SELECT count(*) FROM "Orders_new" WHERE id IN (10, 700)'
                                       " AND note = 'applied beside'") == [(2,)],
                 "the changes to copied ranges to be applied", 30)
        assert proc.poll() is None  # still inside range 3
        release.touch()
        code, err = finish(proc, 120)
        assert code == 3, err
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_pause_takes_effect_within_one_range_and_unpause_resumes(db_dsn, tmp_path):
    create_orders(db_dsn, 20_000)
    # 20 capped ranges of 1,000 rows, one per 500 ms: ~9 s of copy left after the first two, room
    # for `mover pause` to start and land on a loaded machine before the copy could end.
    assert mover(db_dsn, "step", wide_plan(tmp_path, workers=1, rate=2000)).returncode == 0
    run = spawn(db_dsn, "run", "wide")
    try:
        # Plain SQL, not `mover status`: one interpreter start per poll would eat that room.
        wait_for(lambda: query(db_dsn, "SELECT count(*) FROM mover.ranges WHERE kind = 'backfill'"
                                       " AND status = 'done'")[0][0] >= 2, "two ranges copied")
        assert mover(db_dsn, "pause", "wide").returncode == 0
        (paused_at,) = query(db_dsn, "SELECT clock_timestamp()")[0]
        wait_for(lambda: "paused" in " ".join(status(db_dsn)["backfill"]["waiting_for"]), "the worker to pause")
        # The worker re-reads the flag every second while paused: see it do so twice.
        first = query(db_dsn, "SELECT xmin::text FROM mover.workers")[0][0]
        second = wait_for(lambda: [x for (x,) in query(db_dsn, "SELECT xmin::text FROM mover.workers") if x != first],
                          "a second pause check")[0]
        wait_for(lambda: [x for (x,) in query(db_dsn, "SELECT xmin::text FROM mover.workers") if x != second],
                 "a third pause check")
        (unpaused_at,) = query(db_dsn, "SELECT clock_timestamp()")[0]
        assert mover(db_dsn, "unpause", "wide").returncode == 0
        code, err = finish(run, 300)
        assert code == 3, err
    finally:
        if run.poll() is None:
            run.kill()
    late = query(db_dsn, "SELECT count(*) FROM mover.ranges WHERE kind = 'backfill' AND finished_at > %s", (paused_at,))
    during = query(db_dsn, "SELECT count(*) FROM mover.ranges WHERE kind = 'backfill' AND finished_at > %s"
                           " AND finished_at < %s", (paused_at, unpaused_at))
    assert during[0][0] <= 1  # at most the range in flight when the pause came
    assert late[0][0] > 1  # and the copy went on after unpause
    events = [e["kind"] for e in json.loads(mover(db_dsn, "events", "wide", "--json").stdout)]
    assert "paused" in events and "unpaused" in events
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_settings_change_while_running_is_recorded(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    assert mover(db_dsn, "step", wide_plan(tmp_path)).returncode == 0
    r = mover(db_dsn, "set", "wide", "backfill.max_rows_per_second=1234", "cutover.lock_timeout=50ms")
    assert r.returncode == 0, r.stderr
    plan = query(db_dsn, "SELECT plan FROM mover.migrations")[0][0]
    assert plan["backfill"]["max_rows_per_second"] == 1234 and plan["cutover"]["lock_timeout_ms"] == 50
    r = mover(db_dsn, "set", "wide", "target.columns={}")
    assert r.returncode == 2 and "cannot set" in r.stderr
    r = mover(db_dsn, "set", "wide", "backfill.workers=0")
    assert r.returncode == 2 and "workers" in r.stderr


def test_a_range_that_keeps_failing_is_marked_failed_without_stopping_the_others(db_dsn, tmp_path):
    create_orders(db_dsn, 5_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # A value that does not convert (class 22/23) is a divergence, not a failing range: this
        # conversion fails with an error of another class (P0001), which the range cannot skip.
        conn.execute("CREATE FUNCTION picky(v integer) RETURNS boolean LANGUAGE plpgsql AS"
                     " $$BEGIN IF v = 100000 THEN RAISE EXCEPTION 'picky about %', v; END IF; RETURN true; END$$")
        conn.execute("CREATE DOMAIN account_no AS integer CHECK (picky(VALUE))")
        app_execute(conn, 'UPDATE {t} SET "Account" = 100000 WHERE id = 2600')
    plan = wide_plan(tmp_path, columns={"Account": "public.account_no"})
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 1
    assert "1 backfill ranges failed" in r.stderr and "picky about 100000" in r.stderr
    st = status(db_dsn)
    assert st["backfill"]["ranges_failed"] == 1 and st["state"] == "failed"
    assert st["backfill"]["ranges_done"] == st["backfill"]["ranges_total"] - 1  # the others were copied
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        app_execute(conn, 'UPDATE {t} SET "Account" = 7 WHERE id = 2600')
    r = mover(db_dsn, "run", "wide")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_an_interrupted_index_build_is_found_invalid_and_rebuilt(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    proc = spawn(db_dsn, "run", wide_plan(tmp_path, workers=1), env={"MOVER_FAULT": "hang@index_building"})
    try:
        assert hung_at(proc, "index_building")
        # What a crash in the middle of CREATE INDEX CONCURRENTLY (an earlier version's build) leaves:
        # an invalid index by that name.
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            name = conn.execute("SELECT 'Orders by account_m' || id FROM mover.migrations").fetchone()[0]
            try:
                conn.execute(f'CREATE UNIQUE INDEX CONCURRENTLY "{name}" ON "Orders_new" ("Account")')
            except psycopg.errors.UniqueViolation:
                pass
        proc.kill()
        finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert query(db_dsn, "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass",
                 (f'"{name}"',)) == [(False,)]
    r = mover(db_dsn, "run", "wide")
    assert r.returncode == 3, r.stderr
    valid, definition = query(db_dsn, "SELECT indisvalid, pg_get_indexdef(indexrelid) FROM pg_index"
                                      " WHERE indexrelid = %s::regclass", (f'"{name}"',))[0]
    assert valid and "UNIQUE" not in definition and '("Account", created_at)' in definition
    assert_oracle(db_dsn, "Orders", "Orders_new")
