"""The range queue cuts any key into bounded, contiguous, non-empty ranges, on demand."""

from __future__ import annotations

from itertools import pairwise

import psycopg
import pytest
from psycopg import sql

from mover.catalog import conversion, introspect
from mover.names import QualifiedName
from mover.sql import copy as copy_sql
from mover.state import control, ranges
from tests.conftest import require_icu
from tests.workload import mover, plan_file


def setup_table(dsn, ddl, fill, tmp_path):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ddl)
        if fill:
            conn.execute(fill)
    plan = plan_file(tmp_path, "q", "t")
    r = mover(dsn, "step", plan)
    assert r.returncode == 0, r.stderr
    conn = psycopg.connect(dsn, autocommit=True)
    with conn.cursor() as cur:
        m = control.get(cur, "q")
        info = introspect.describe(cur, QualifiedName("public", "t"))
        ranges.ensure_frontier(cur, m.id, "backfill")
    return conn, m.id, conversion.mapping(info, info, info.key)


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


# --- bounds cut by key arithmetic (one-column integer keys) ---------------------------------


class Recording(psycopg.Cursor):
    """Keeps the text of every statement it sends: which probe ran is read from the server's side."""
    sent: list[str] = []

    def execute(self, query, params=None, **kwargs):
        from psycopg import sql
        Recording.sent.append(query.as_string(self) if isinstance(query, sql.Composable) else str(query))
        return super().execute(query, params, **kwargs)


def claim_all(conn, mid, mapping, rows, after_each=None):
    """Claim every range, each marked done with its row count (the copy's, counted in plain SQL)
    as a worker would, and the statements each claim sent."""
    out, sent = [], []
    while True:
        Recording.sent = []
        with conn.cursor() as cur:
            c = ranges.claim(cur, mid, "backfill", "tester", mapping, rows, max_attempts=3)
        if c is None:
            return out, sent
        out.append(c)
        sent.append(list(Recording.sent))
        with conn.cursor() as cur:
            ranges.mark_done(cur, mid, c, count_between(conn, c), 1.0)
        if after_each:
            after_each(c)


def count_between(conn, c) -> int:
    """The rows of t in (lo, hi], counted in plain SQL."""
    bounds = {"lo": None if c.lo is None else int(c.lo[0]), "hi": None if c.hi is None else int(c.hi[0])}
    return conn.execute("SELECT count(*) FROM t WHERE (%(lo)s::numeric IS NULL OR id > %(lo)s::numeric)"
                        " AND (%(hi)s::numeric IS NULL OR id <= %(hi)s::numeric)", bounds).fetchone()[0]


def assert_tiled(conn, cut):
    """First lo and last hi open, each lo the previous hi, and every row of t in exactly one
    range: checked by plain SQL over the bounds, not by mover's range predicate."""
    assert cut[0].lo is None and cut[-1].hi is None
    for a, b in pairwise(cut):
        assert b.lo == a.hi and a.hi is not None
        assert int(a.hi[0]) > (int(a.lo[0]) if a.lo else -2**63)
    los = [None if c.lo is None else int(c.lo[0]) for c in cut]
    his = [None if c.hi is None else int(c.hi[0]) for c in cut]
    wrong, total = conn.execute(
        "SELECT count(*) FILTER (WHERE n <> 1), count(*) FROM (SELECT (SELECT count(*) FROM"
        " unnest(%s::numeric[], %s::numeric[]) r(lo, hi) WHERE (r.lo IS NULL OR t.id > r.lo)"
        " AND (r.hi IS NULL OR t.id <= r.hi)) n FROM t) x", (los, his)).fetchone()
    assert wrong == 0 and total == conn.execute("SELECT count(*) FROM t").fetchone()[0]


def offset_scans(sent) -> int:
    return sum(1 for s in sent if " OFFSET " in s)


def test_a_dense_integer_key_is_cut_by_arithmetic_after_the_first_ranges(db_dsn, tmp_path):
    conn, mid, mapping = setup_table(db_dsn, "CREATE TABLE t (id bigint PRIMARY KEY)",
                                     "INSERT INTO t SELECT generate_series(1, 3000)", tmp_path)
    conn.cursor_factory = Recording
    cut, sent = claim_all(conn, mid, mapping, 200)
    assert_tiled(conn, cut)
    # The first range has no lo, the second no done range with both bounds before it: probed.
    assert [c.cut for c in cut[:2]] == ["probe", "probe"]
    assert all(c.cut == "arithmetic" for c in cut[2:]), [c.cut for c in cut]
    assert [offset_scans(s) for s in sent] == [1, 1] + [0] * (len(cut) - 2)
    assert all(any(q.startswith("SELECT 1 FROM") for q in s) for s in sent[2:-1])
    assert [count_between(conn, c) for c in cut] == [200] * 15
    assert cut[-1].lo == ["2800"]  # no key above 3000: the last range is open, not a 16th empty one


def test_a_bulk_deleted_gap_and_a_sparse_region_go_back_to_the_probe(db_dsn, tmp_path):
    # keys 10, 20 .. 3000 (one in ten: probed), 3003, 3006 .. 6000 (one in three: arithmetic), then
    # 6001 .. 8000 dense, then a gap of 100,000 deleted keys, then 108001 .. 110000 dense.
    conn, mid, mapping = setup_table(
        db_dsn, "CREATE TABLE t (id bigint PRIMARY KEY)",
        "INSERT INTO t SELECT g * 10 FROM generate_series(1, 300) g"
        " UNION ALL SELECT 3000 + g * 3 FROM generate_series(1, 1000) g"
        " UNION ALL SELECT generate_series(6001, 110000)", tmp_path)
    conn.execute("DELETE FROM t WHERE id BETWEEN 8001 AND 108000")
    cut, _ = claim_all(conn, mid, mapping, 100)
    assert_tiled(conn, cut)
    counts = [count_between(conn, c) for c in cut]
    assert max(counts) <= 4 * 100, counts  # never far more than asked, even running into the dense part
    sparse = [c for c in cut if c.hi is not None and int(c.hi[0]) <= 3000]
    assert sparse and all(c.cut == "probe" for c in sparse)  # one key in ten: below 1/4
    third = [c for c in cut if c.lo is not None and c.hi is not None and 3400 <= int(c.lo[0]) and int(c.hi[0]) <= 5900]
    assert third and all(c.cut == "arithmetic" for c in third)
    # The range that runs from the one-in-three keys into the dense ones holds 3x what was asked:
    # the next one is probed, and arithmetic resumes after it at the dense region's density.
    i = next(i for i, c in enumerate(cut) if c.lo and c.hi and int(c.lo[0]) < 6150 <= int(c.hi[0]))
    assert cut[i].cut == "arithmetic" and 200 < counts[i] <= 300
    assert (cut[i + 1].cut, counts[i + 1], cut[i + 2].cut, counts[i + 2]) == ("probe", 100, "arithmetic", 100)
    # At most one empty range at the gap, then the probe jumps it.
    assert counts.count(0) <= 1
    over_gap = next(c for c in cut if c.hi is not None and int(c.hi[0]) > 108000 and int(c.lo[0]) <= 108000)
    assert over_gap.cut == "probe" and count_between(conn, over_gap) == 100
    after = [c for c in cut if c.lo is not None and int(c.lo[0]) >= 108300 and c.hi is not None]
    assert after and all(c.cut == "arithmetic" for c in after)


@pytest.mark.parametrize(("type_", "top"), [("integer", 2**31 - 1), ("smallint", 2**15 - 1)])
def test_a_key_near_its_type_maximum_ends_in_the_open_range_without_overflow(db_dsn, tmp_path, type_, top):
    conn, mid, mapping = setup_table(db_dsn, f"CREATE TABLE t (id {type_} PRIMARY KEY)",
                                     f"INSERT INTO t SELECT generate_series({top - 999}, {top})", tmp_path)
    cut, _ = claim_all(conn, mid, mapping, 300)
    assert_tiled(conn, cut)
    # 300, 300 probed; 300 by arithmetic; the next candidate lies past the maximum: open, 100 rows.
    assert [c.cut for c in cut] == ["probe", "probe", "arithmetic", "arithmetic"]
    assert [count_between(conn, c) for c in cut] == [300, 300, 300, 100]
    assert cut[-2].hi == [str(top - 100)]


def test_keys_inserted_above_the_maximum_during_arithmetic_claims_are_covered(db_dsn, tmp_path):
    conn, mid, mapping = setup_table(db_dsn, "CREATE TABLE t (id bigint PRIMARY KEY)",
                                     "INSERT INTO t SELECT generate_series(1, 1000)", tmp_path)

    def grow(c):
        if c.range_no == 3:  # just above the maximum, where arithmetic ranges still reach
            conn.execute("INSERT INTO t SELECT generate_series(1001, 1150)")
        if c.hi is None:  # the open last range was claimed: later keys belong to it
            conn.execute("INSERT INTO t SELECT generate_series(50001, 50300)")

    cut, _ = claim_all(conn, mid, mapping, 100, after_each=grow)
    assert_tiled(conn, cut)
    assert count_between(conn, cut[-1]) >= 300  # the keys inserted last are in the open range
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1450
    assert cut[-1].cut == "arithmetic"


@pytest.mark.parametrize("case", ["text", "composite", "uuid"])
def test_other_keys_keep_the_offset_probe(db_dsn, tmp_path, case):
    ddl, fill, total = CASES[case]
    conn, mid, mapping = setup_table(db_dsn, ddl, fill, tmp_path)
    assert ranges.integer_key(mapping) is None
    with conn.cursor() as cur:
        cut = []
        while (c := ranges.claim(cur, mid, "backfill", "tester", mapping, 100, max_attempts=3)) is not None:
            cut.append(c)
            ranges.mark_done(cur, mid, c, rows_in(conn, mapping, c), 1.0)  # dense enough, were it an integer
    assert all(c.cut == "probe" for c in cut)
    assert cut[0].lo is None and cut[-1].hi is None and all(b.lo == a.hi for a, b in pairwise(cut))
    counts = [rows_in(conn, mapping, c) for c in cut]
    assert all(n == 100 for n in counts[:-1]) and counts[-1] <= 100 and sum(counts) == total


def test_a_range_taken_over_keeps_its_bounds_whatever_cut_them(db_dsn, tmp_path):
    conn, mid, mapping = setup_table(db_dsn, "CREATE TABLE t (id bigint PRIMARY KEY)",
                                     "INSERT INTO t SELECT generate_series(1, 1000)", tmp_path)
    with conn.cursor() as cur:
        for _ in range(2):
            c = ranges.claim(cur, mid, "backfill", "w1", mapping, 100, 3)
            ranges.mark_done(cur, mid, c, 100, 1.0)
        third = ranges.claim(cur, mid, "backfill", "dead", mapping, 100, 3)
        assert third.cut == "arithmetic" and third.hi == ["300"]
        cur.execute("UPDATE mover.ranges SET lease_expires_at = now() - interval '1s' WHERE owner = 'dead'")
        again = ranges.claim(cur, mid, "backfill", "alive", mapping, 100, 3)
        assert again == third and again.cut is None  # its stored bounds, not cut again


def test_the_probe_above_an_arithmetic_bound_reads_the_key_index_not_the_table(db_dsn, tmp_path):
    """On an append-mostly table the keys above a bound sit at the heap's end: a plan that reads
    the table from its start for the first of them scans the whole table (an EXISTS subquery,
    whose ORDER BY the planner drops, gets that plan). The probe must start in the key's index."""
    conn, _, mapping = setup_table(db_dsn, "CREATE TABLE t (id bigint PRIMARY KEY, pad text)",
                                   "INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 200000) g",
                                   tmp_path)
    conn.execute("VACUUM ANALYZE t")
    for bound in ("1000", "150000", "199990"):
        stmt, params = copy_sql.key_above(mapping, [bound])
        plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN ") + stmt, params))
        assert "Index" in plan and "Seq Scan" not in plan, plan
        assert conn.execute(stmt, params).fetchone() == (1,)
    assert conn.execute(*copy_sql.key_above(mapping, ["200000"])).fetchone() is None
