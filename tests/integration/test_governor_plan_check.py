"""What `mover plan check` says of the governor (mover/engines/governor/throttle.py describe, from the
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
    assert [line.split(":")[0] for line in lines] == ["application latency", "application sessions", "standbys",
                                                      "replication slots", "archiving", "WAL rate"], lines
    assert "kept within 50% of its latency before each step's bulk work" in lines[0], lines[0]
    assert lines[1].startswith("application sessions: mover works at full speed while none has run a statement "
                               "for 10 s, the budget holds from the first busy one ([throttle] idle_after); now: "), \
        lines[1]
    assert lines[2].startswith("standbys: 0 (none); mover waits while one lags more than 30s"), lines[2]
    assert lines[4] == "archiving: off (archive_mode)", lines[4]
    assert lines[5] == "WAL rate: kept under 50.0 MB/s ([throttle] max_wal_per_second)", lines[5]
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


def test_plan_check_says_whether_the_backfills_wal_finds_segments_ready(db_dsn, tmp_path):
    """pg_wal's segments past the one being written, counted independently, against what the
    backfill needs: enough, or how many are new files; a role without pg_monitor is told what it
    cannot read, and its transaction goes on."""
    from mover.engines.bulk import preflight

    create_orders(db_dsn, 20_000)
    counted = "SELECT count(*) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'" \
              " AND name > pg_walfile_name(pg_current_wal_insert_lsn())"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        segment = conn.execute("SELECT pg_size_bytes(current_setting('wal_segment_size'))").fetchone()[0]
        before = conn.execute(counted).fetchone()[0]
        got = check(db_dsn, plan_file(tmp_path, "seg", columns={"id": "bigint"}))
        after = conn.execute(counted).fetchone()[0]
    est, line = got["estimates"], got["preflight"][-1]
    assert est["wal_segments_needed"] == -(-est["wal_bytes"] // segment), est
    # Other tests' writes may use a segment up, a checkpoint recycle some, meanwhile.
    assert min(before, after) - 2 <= est["wal_segments_ahead"] <= max(before, after) + 2, (est, before, after)
    ahead = est["wal_segments_ahead"]
    if ahead >= est["wal_segments_needed"]:
        assert line == f"WAL segments: {ahead:,} ready for reuse in pg_wal, enough for the backfill's " \
                       f"{est['wal_segments_needed']:,}", line
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        cur = conn.cursor()
        big = preflight.wal_segments(cur, (after + 50) * segment)  # more than pg_wal holds ready
        ahead = big["wal_segments_ahead"]
        assert big["wal_segments_needed"] == after + 50 and ahead < after + 50, big
        assert f"{ahead:,} ready for reuse in pg_wal; the backfill's WAL needs about {after + 50:,}: the others" \
               " are new files, each written out whole (wal_init_zero)" in big["line"], big["line"]
        conn.execute("DROP ROLE IF EXISTS no_monitor")
        conn.execute("CREATE ROLE no_monitor")
        try:
            with conn.transaction(force_rollback=True):
                conn.execute("SET LOCAL ROLE no_monitor")
                blind = preflight.wal_segments(cur, 10 * segment)
                assert conn.execute("SELECT current_user").fetchone()[0] == "no_monitor"  # still usable
            assert blind["wal_segments_ahead"] is None, blind
            assert "not readable (pg_ls_waldir needs pg_monitor)" in blind["line"], blind["line"]
        finally:
            conn.execute("DROP ROLE no_monitor")
