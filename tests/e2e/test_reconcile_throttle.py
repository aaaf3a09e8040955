"""Reconcile reads both whole tables, so it obeys the same throttle as the backfill
(mover/engines/governor/throttle.py): `mover pause`, its own rows/s cap, and replica lag; and `mover worker`
helps with its ranges as with the backfill's."""

from __future__ import annotations

import json
import time

import psycopg

from tests.workload import create_orders, differences, finish, mover, plan_file, spawn


def query(dsn: str, statement: str, params=()) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


def status(dsn: str) -> dict:
    r = mover(dsn, "status", "recthrottle", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def reconcile_ranges(dsn: str) -> list[tuple[int, int, float, str]]:
    """(range_no, source rows, finished_at as epoch seconds, owner) of every verified range."""
    return query(dsn, "SELECT c.range_no, c.rows, extract(epoch FROM c.finished_at)::float8, c.owner"
                      " FROM mover.ranges c JOIN mover.migrations m ON m.id = c.migration_id"
                      " WHERE m.name = 'recthrottle' AND c.kind = 'reconcile' AND c.status = 'done'"
                      " ORDER BY c.finished_at")


def wait_for(predicate, what: str, *procs, timeout: float = 60.0):
    """Poll for a state another process reaches, failing early if one of `procs` died."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for proc in procs:
            if proc.poll() is not None:
                _, err = proc.communicate()
                raise AssertionError(f"mover exited ({proc.returncode}) before {what}: {err}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def to_reconcile(dsn: str, tmp_path, rows: int, range_rows: int, cap: int = 0) -> str:
    """A migration whose next step is the reconcile."""
    create_orders(dsn, rows)
    plan = plan_file(tmp_path, "recthrottle", columns={"id": "bigint"}, backfill={"range_rows": 5000},
                     reconcile={"range_rows": range_rows, "max_rows_per_second": cap})
    for _ in ("create_target", "install_capture", "backfill"):
        r = mover(dsn, "step", plan)
        assert r.returncode == 0, r.stderr
    assert status(dsn)["step"] == "reconcile"
    return plan


def test_reconcile_waits_while_paused_and_says_so(db_dsn, tmp_path):
    to_reconcile(db_dsn, tmp_path, 3_000, 500)
    assert mover(db_dsn, "pause", "recthrottle").returncode == 0
    proc = spawn(db_dsn, "step", "recthrottle")
    try:
        st = wait_for(lambda: (s := status(db_dsn)) and "paused" in " ".join(s["reconcile"]["waiting_for"]) and s,
                      "the reconcile worker to wait on the pause", proc)
        assert st["reconcile"]["paused"] is True and st["step"] == "reconcile"
        # The worker re-reads the flag every second while paused: see it do so twice, comparing nothing.
        first = query(db_dsn, "SELECT xmin::text FROM mover.workers")[0][0]
        second = wait_for(lambda: [x for (x,) in query(db_dsn, "SELECT xmin::text FROM mover.workers") if x != first],
                          "the worker to look at the flag again", proc)[0]
        wait_for(lambda: [x for (x,) in query(db_dsn, "SELECT xmin::text FROM mover.workers") if x != second],
                 "the worker to look at the flag once more", proc)
        assert reconcile_ranges(db_dsn) == []
        assert mover(db_dsn, "unpause", "recthrottle").returncode == 0
        code, err = finish(proc, 120)
        assert code == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
    st = status(db_dsn)
    assert st["step"] == "cutover" and st["reconcile"]["waiting_for"] == [] and not st["reconcile"]["paused"]
    assert st["reconcile"]["rows_compared"] == 3_000 and st["divergences"] == 0
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)


def test_reconcile_under_a_rows_per_second_cap(db_dsn, tmp_path):
    # 6,000 rows at 2,000 rows/s: ranges of at most the cap's one-second budget (not range_rows'
    # 5,000), paced so that the pass takes about three seconds.
    to_reconcile(db_dsn, tmp_path, 6_000, 5_000, cap=2_000)
    r = mover(db_dsn, "step", "recthrottle")
    assert r.returncode == 0, r.stderr
    done = reconcile_ranges(db_dsn)
    assert sum(rows for _, rows, _, _ in done) == 6_000
    assert max(rows for _, rows, _, _ in done) <= 2_000, done
    # A range ends at most every second (the wait after each is what its rows are worth).
    assert done[-1][2] - done[0][2] >= (6_000 - 2_000) / 2_000 * 0.9, done
    busiest = max(sum(rows for _, rows, t, _ in done if start <= t < start + 1.0) for _, _, start, _ in done)
    assert busiest <= 2 * 2_000, done
    assert status(db_dsn)["step"] == "cutover"


def test_mover_worker_takes_reconcile_ranges(db_dsn, tmp_path):
    # A capped pass (per process: 1,000 rows/s, ranges of 500) leaves room for a helper.
    to_reconcile(db_dsn, tmp_path, 6_000, 500, cap=1_000)
    assert mover(db_dsn, "pause", "recthrottle").returncode == 0
    orchestrator = spawn(db_dsn, "step", "recthrottle")
    helper = None
    try:
        wait_for(lambda: "paused" in " ".join(status(db_dsn)["reconcile"]["waiting_for"]),
                 "the orchestrator's reconcile worker to wait on the pause", orchestrator)
        helper = spawn(db_dsn, "worker", "recthrottle")
        wait_for(lambda: query(db_dsn, "SELECT count(*) FROM mover.workers WHERE waiting_for LIKE 'paused%%'")[0][0]
                 == 2, "the helper's reconcile worker to join and wait on the pause", orchestrator, helper)
        assert mover(db_dsn, "unpause", "recthrottle").returncode == 0
        code, err = finish(orchestrator, 120)
        assert code == 0, err
        code, err = finish(helper, 120)
        assert code == 0, err
    finally:
        for proc in (orchestrator, helper):
            if proc is not None and proc.poll() is None:
                proc.kill()
    done = reconcile_ranges(db_dsn)
    assert sum(rows for _, rows, _, _ in done) == 6_000
    pids = {owner.split(":")[1] for _, _, _, owner in done}
    assert str(helper.pid) in pids and str(orchestrator.pid) in pids, (helper.pid, orchestrator.pid, pids)
    st = status(db_dsn)
    assert st["step"] == "cutover" and st["divergences"] == 0
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
