"""The range queue cuts any key into bounded, contiguous, non-empty ranges, on demand."""

from __future__ import annotations

from itertools import pairwise

import psycopg
import pytest

from mover import control, introspect, ranges
from mover.names import QualifiedName
from mover.sql.mapping import Mapping
from tests.conftest import require_icu
from tests.workload import mover, write_plan


def setup_table(dsn, ddl, fill, tmp_path):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ddl)
        if fill:
            conn.execute(fill)
    plan = write_plan(tmp_path / "p.toml", '[migration]\nname = "q"\nsource = "t"\n[rollback]\nwindow = "1h"\n')
    r = mover(dsn, "step", plan)
    assert r.returncode == 0, r.stderr
    conn = psycopg.connect(dsn, autocommit=True)
    with conn.cursor() as cur:
        m = control.get(cur, "q")
        info = introspect.describe(cur, QualifiedName("public", "t"))
        ranges.ensure_frontier(cur, m.id, "backfill")
    return conn, m.id, Mapping.between(info, info, info.key)


def cut_all(conn, mid, mapping, rows, after_each=None):
    out = []
    with conn.cursor() as cur:
        while True:
            c = ranges.claim(cur, mid, "backfill", "tester", mapping, rows, max_attempts=3)
            if c is None:
                return out
            out.append(c)
            ranges.mark_done(cur, mid, c, 0, 0.0)
            if after_each:
                after_each(c)


def rows_in(conn, mapping, c) -> int:
    from psycopg import sql

    from mover.sql.mapping import range_predicate
    where, params = range_predicate("s", mapping, c.lo, c.hi)
    return conn.execute(sql.SQL("SELECT count(*) FROM t s WHERE {}").format(where), params).fetchone()[0]


CASES = {
    "sparse integer": ("CREATE TABLE t (id bigint PRIMARY KEY)",
                       "INSERT INTO t SELECT g * g * 1000 FROM generate_series(1, 1000) g", 1000),
    "composite": ("CREATE TABLE t (a int NOT NULL, b text NOT NULL, PRIMARY KEY (a, b))",
                  "INSERT INTO t SELECT g % 7, md5(g::text) FROM generate_series(1, 1000) g", 1000),
    "text": ("CREATE TABLE t (k text PRIMARY KEY)",
             "INSERT INTO t SELECT 'key ' || g || ' ''quoted'' ' FROM generate_series(1, 1000) g", 1000),
    "uuid": ("CREATE TABLE t (k uuid PRIMARY KEY)",
             "INSERT INTO t SELECT md5(g::text)::uuid FROM generate_series(1, 1000) g", 1000),
    "unique not null instead of a primary key": (
        "CREATE TABLE t (k timestamptz NOT NULL UNIQUE, v int)",
        "INSERT INTO t SELECT timestamptz '2026-01-01' + g * interval '1 ms', g FROM generate_series(1, 1000) g", 1000),
    # A collation other than the database's: bounds are compared in the key's own order.
    "icu text": ('CREATE TABLE t (k text COLLATE "en-x-icu" PRIMARY KEY)',
                 "INSERT INTO t SELECT CASE WHEN g % 2 = 0 THEN upper(md5(g::text)) ELSE md5(g::text) END"
                 " FROM generate_series(1, 1000) g", 1000),
    "one row": ("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (42)", 1),
    "empty": ("CREATE TABLE t (id int PRIMARY KEY)", None, 0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ranges_cover_every_key_once_and_are_never_empty(db_dsn, tmp_path, case):
    ddl, fill, total = CASES[case]
    if "icu" in ddl:
        require_icu(db_dsn)
    conn, mid, mapping = setup_table(db_dsn, ddl, fill, tmp_path)
    cut = cut_all(conn, mid, mapping, 128)
    assert cut[0].lo is None and cut[-1].hi is None
    for a, b in pairwise(cut):
        assert b.lo == a.hi  # contiguous: (lo, hi] then (hi, next]
    counts = [rows_in(conn, mapping, c) for c in cut]
    assert sum(counts) == total
    assert all(n == 128 for n in counts[:-1])  # bounded, and no empty ranges on sparse keys
    assert counts[-1] <= 128
    assert [c.range_no for c in cut] == list(range(1, len(cut) + 1))
    with conn.cursor() as cur:
        st = ranges.state(cur, mid, "backfill")
        assert st["finished"] and st["total"] == len(cut)
        assert ranges.watermark(cur, mid, "backfill") == (True, None)


def test_keys_inserted_above_the_maximum_during_the_copy_land_in_the_last_range(db_dsn, tmp_path):
    conn, mid, mapping = setup_table(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)",
                                     "INSERT INTO t SELECT generate_series(1, 500)", tmp_path)

    def grow(c):
        if c.range_no == 1:
            conn.execute("INSERT INTO t SELECT generate_series(10001, 10300)")

    cut = cut_all(conn, mid, mapping, 100, after_each=grow)
    assert sum(rows_in(conn, mapping, c) for c in cut) == 800
    assert cut[-1].hi is None


def test_watermark_is_the_done_prefix_when_ranges_finish_out_of_order(db_dsn, tmp_path):
    conn, mid, mapping = setup_table(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)",
                                     "INSERT INTO t SELECT generate_series(1, 500)", tmp_path)
    with conn.cursor() as cur:
        a = ranges.claim(cur, mid, "backfill", "w1", mapping, 100, 3)
        b = ranges.claim(cur, mid, "backfill", "w2", mapping, 100, 3)
        assert ranges.watermark(cur, mid, "backfill") == (False, None)
        ranges.mark_done(cur, mid, b, 100, 1.0)
        assert ranges.watermark(cur, mid, "backfill") == (False, None)  # b is done, a is not
        ranges.mark_done(cur, mid, a, 100, 1.0)
        assert ranges.watermark(cur, mid, "backfill") == (False, b.hi)


def test_an_expired_lease_is_reclaimed_and_a_failing_range_stops_at_the_ceiling(db_dsn, tmp_path):
    conn, mid, mapping = setup_table(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)",
                                     "INSERT INTO t SELECT generate_series(1, 50)", tmp_path)
    with conn.cursor() as cur:
        first = ranges.claim(cur, mid, "backfill", "dead", mapping, 100, 2)
        cur.execute("UPDATE mover.ranges SET lease_expires_at = now() - interval '1s'")
        again = ranges.claim(cur, mid, "backfill", "alive", mapping, 100, 2)
        assert again == first  # taken over, attempt 2
        # the late owner can no longer commit its work
        with pytest.raises(Exception, match="taken over"):
            ranges.hold(cur, mid, first, "dead")
        assert ranges.mark_failed_attempt(cur, mid, again, "alive", "boom", 2) == "failed"
        assert ranges.claim(cur, mid, "backfill", "alive", mapping, 100, 2) is None
        assert ranges.failed_ranges(cur, mid, "backfill") == [(1, "boom")]
        assert ranges.retry_failed(cur, mid, "backfill") == 1


def test_a_worker_that_lost_the_answer_to_its_claim_gets_its_own_range_back(db_dsn, tmp_path):
    conn, mid, mapping = setup_table(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)",
                                     "INSERT INTO t SELECT generate_series(1, 500)", tmp_path)
    with conn.cursor() as cur:
        first = ranges.claim(cur, mid, "backfill", "w1", mapping, 100, 5)
        # The claim committed but w1 never heard back (a server restart): it claims again.
        again = ranges.claim(cur, mid, "backfill", "w1", mapping, 100, 5)
        assert again == first
        other = ranges.claim(cur, mid, "backfill", "w2", mapping, 100, 5)
        assert other.range_no == first.range_no + 1  # still leased to w1: nobody else takes it
