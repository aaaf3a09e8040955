"""What `mover plan check` says of the governor (mover/engines/throttle.py describe, from the
server's views now, judged by the governor's own functions) and the backfill's preflight (the
space the target takes and the WAL the backfill writes). An archiver that fails is read from a
real server's pg_stat_archiver and named as the guard that would hold mover at its first range."""

from __future__ import annotations

import json
import time

import psycopg

from mover import api
from mover.demo.embedded import EmbeddedPostgres
from tests.workload import create_orders, mover, plan_file


def check(dsn, plan) -> dict:
    r = mover(dsn, "plan", "check", plan, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_plan_check_prints_each_input_of_the_governor_and_the_preflight(db_dsn, tmp_path):
    create_orders(db_dsn, 20_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        table_bytes = conn.execute("""SELECT pg_table_size('"Orders"')""").fetchone()[0]
    plan = plan_file(tmp_path, "gov", columns={"id": "bigint"}, throttle={"max_wal_per_second": "50MB"})
    got = check(db_dsn, plan)
    lines = got["throttle"]
    assert [line.split(":")[0] for line in lines] == ["application latency", "standbys", "replication slots",
                                                      "archiving", "WAL rate"], lines
    assert "kept within 50% of its latency before each step's bulk work" in lines[0], lines[0]
    assert lines[1].startswith("standbys: 0 (none); mover waits while one lags more than 30s"), lines[1]
    assert lines[3] == "archiving: off (archive_mode)", lines[3]
    assert lines[4] == "WAL rate: kept under 50.0 MB/s ([throttle] max_wal_per_second)", lines[4]
    # The preflight: about the source's size (its rows, a wider key), and the WAL that copy writes.
    est = got["estimates"]
    assert table_bytes * 0.8 < est["heap_bytes"] < table_bytes * 2, (est, table_bytes)
    assert est["target_bytes"] > est["heap_bytes"] and est["wal_bytes"] > est["heap_bytes"], est
    assert got["preflight"][0].startswith("the target will take about"), got["preflight"]
    assert got["preflight"][1].startswith("the backfill writes about"), got["preflight"]
    assert not [w for w in got["warnings"] if "would wait" in w], got["warnings"]
    shown = mover(db_dsn, "plan", "check", plan).stdout
    assert "throttle:\n  application latency: the probe" in shown and "preflight:\n  the target will take" in shown, \
        shown
    # "off" turns the budget off, and says so.
    got = check(db_dsn, plan_file(tmp_path, "gov", throttle={"max_latency_increase": "off"}))
    assert got["throttle"][0] == 'application latency: not governed ([throttle] max_latency_increase = "off")'


def test_a_failing_archiver_is_named_as_what_would_hold_mover(tmp_path):
    with EmbeddedPostgres(fast=True, settings={"archive_mode": "on", "archive_command": "false"}) as pg:
        dsn = pg.dsn
        api.init(dsn)
        create_orders(dsn, 1_000)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_switch_wal()")  # a segment for archive_command to fail on
            deadline = time.monotonic() + 60
            while not conn.execute("SELECT failed_count > 0 FROM pg_stat_archiver").fetchone()[0]:
                assert time.monotonic() < deadline, "the archiver never tried"
                time.sleep(0.1)
        got = check(dsn, plan_file(tmp_path, "gov"))
        archiving = [line for line in got["throttle"] if line.startswith("archiving:")]
        assert archiving and archiving[0].endswith("mover waits while it fails or more than 1.0 GB waits "
                                                   "([throttle] max_archive_backlog)"), archiving
        held = [w for w in got["warnings"] if w.startswith("mover would wait at its first range now: archiving fails")]
        assert held, got["warnings"]
        assert got["server"]["archiver"]["failing"] is True, got["server"]["archiver"]
