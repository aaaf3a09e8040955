"""The backfill's throttles as docs/plan.md promises them: the rows/s cap holds over every second,
and `mover set` reaches a running worker at its next range."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from tests.workload import create_orders, differences, finish, mover, plan_file, spawn


def throttled_plan(tmp_path, range_rows: int, cap: int, **backfill) -> str:
    backfill = {"range_rows": range_rows, "target_range_ms": 500, "max_rows_per_second": cap, **backfill}
    return plan_file(tmp_path, "throttled", columns={"id": "bigint"}, backfill=backfill)


def ranges(dsn: str) -> list[tuple[int, int, float]]:
    """(range_no, rows, finished_at as epoch seconds) of every copied backfill range."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT c.range_no, c.rows, extract(epoch FROM c.finished_at)::float8 FROM mover.ranges c"
            " JOIN mover.migrations m ON m.id = c.migration_id WHERE m.name = 'throttled' AND c.kind = 'backfill'"
            " AND c.status = 'done' ORDER BY c.finished_at").fetchall()


def busiest_second(done: list[tuple[int, int, float]]) -> int:
    """The most rows whose ranges finished within any one second (a sliding, half-open window)."""
    return max(sum(r for _, r, t in done if start <= t < start + 1.0) for _, _, start in done)


@pytest.mark.parametrize("range_rows, workers", [(5_000, 1), (100, 1), (100, 2)])
def test_rows_per_second_cap_holds_over_every_second(db_dsn, tmp_path, range_rows, workers):
    # A cap of 2,000 rows/s. A first range of 5,000 keys, copied in one burst, would break the cap
    # within its second whatever the pause after it; so would ranges that grew toward
    # target_range_ms from a small start (fast copies ask for ever bigger ranges). Two workers
    # share the cap.
    create_orders(db_dsn, 6_000)
    plan = throttled_plan(tmp_path, range_rows, 2_000, workers=workers)
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    done = ranges(db_dsn)
    assert sum(r for _, r, _ in done) == 6_000
    assert max(r for _, r, _ in done) <= 1_000  # 2,000 rows/s x 500 ms
    # A range finishes at most every ~500 ms, so two (three with jitter) fit in one second: well
    # under twice the cap, and far under what one unpaced range copies.
    assert busiest_second(done) <= 2 * 2_000, done
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)


def test_set_reaches_a_running_backfill(db_dsn, tmp_path):
    create_orders(db_dsn, 6_000)
    plan = throttled_plan(tmp_path, 500, 1_000)
    proc = spawn(db_dsn, "run", plan)
    try:
        deadline = time.monotonic() + 60
        while len(ranges(db_dsn)) < 2:  # two capped ranges of 500 rows copied
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        # Hold the frontier (no range is cut meanwhile) so that which ranges were cut before the
        # change is known exactly.
        with psycopg.connect(db_dsn) as conn:
            (frontier,) = conn.execute(
                "SELECT f.next_range_no FROM mover.frontiers f JOIN mover.migrations m ON m.id = f.migration_id"
                " WHERE m.name = 'throttled' AND f.kind = 'backfill' FOR UPDATE OF f").fetchone()
            r = mover(db_dsn, "set", "throttled", "backfill.max_rows_per_second=0", "backfill.min_rows=1500",
                      "backfill.max_rows=1500")
            assert r.returncode == 0, r.stderr
        code, err = finish(proc, 120)
        assert code == 3, err
    finally:
        if proc.poll() is None:
            proc.kill()
    done = {no: rows for no, rows, _ in ranges(db_dsn)}
    assert sum(done.values()) == 6_000
    assert all(done[no] == 500 for no in done if no < frontier)  # the cap's budget
    # Cut after the set (the next one may have been cut just before the worker saw it): the new
    # size, uncapped.
    later = [done[no] for no in sorted(done) if no > frontier]
    assert later and all(rows == 1500 for rows in later[:-1]) and later[-1] <= 1500, done
    st = json.loads(mover(db_dsn, "status", "throttled", "--json").stdout)
    assert st["backfill"]["rows_copied"] == 6_000
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)


def test_set_range_rows_reaches_a_waiting_worker(db_dsn, tmp_path):
    # `mover set backfill.range_rows` is the size of the next range a running worker cuts (then
    # it adapts as usual), not only of a later run's first one.
    create_orders(db_dsn, 3_000)
    plan = throttled_plan(tmp_path, 100, 0)
    for _ in ("create_target", "install_capture"):
        assert mover(db_dsn, "step", plan).returncode == 0
    assert mover(db_dsn, "pause", "throttled").returncode == 0
    proc = spawn(db_dsn, "step", "throttled")
    try:
        deadline = time.monotonic() + 60
        while True:  # the worker is up and waits on the pause, before its first range
            st = json.loads(mover(db_dsn, "status", "throttled", "--json").stdout)
            if "paused" in " ".join(st["backfill"]["waiting_for"]):
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        r = mover(db_dsn, "set", "throttled", "backfill.range_rows=1200")
        assert r.returncode == 0, r.stderr
        assert mover(db_dsn, "unpause", "throttled").returncode == 0
        code, err = finish(proc, 120)
        assert code == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
    done = {no: rows for no, rows, _ in ranges(db_dsn)}
    assert done[1] == 1_200, done
    assert sum(done.values()) == 3_000
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)


def test_status_never_waits_on_the_cap_with_nothing_left_to_copy(db_dsn, tmp_path):
    # Ranges of 500 rows under a cap of 1,000 rows/s: each is followed by a 0.5 s wait, except the
    # key space's last, after which nothing is left to pace. The status is sampled throughout.
    from mover import api
    create_orders(db_dsn, 2_750)
    plan = throttled_plan(tmp_path, 500, 1_000, min_rows=100, max_rows=500)
    proc = spawn(db_dsn, "run", plan)
    samples = []
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                st = api.status(db_dsn, "throttled")
            except Exception:  # not registered yet
                time.sleep(0.02)
                continue
            samples.append((st["backfill"]["rows_copied"], st["backfill"]["waiting_for"], st["step"]))
            time.sleep(0.02)
        code, err = finish(proc, 120)
        assert code == 3, err
    finally:
        if proc.poll() is None:
            proc.kill()
    capped = [s for s in samples if any("rows/s cap" in w for w in s[1])]
    assert capped, samples  # the cap was seen working between ranges
    assert all(rows < 2_750 for rows, _, _ in capped), capped
    done = ranges(db_dsn)
    assert sum(r for _, r, _ in done) == 2_750 and max(r for _, r, _ in done) <= 500
    assert busiest_second(done) <= 2 * 1_000, done
