"""Reconcile's definition of equal, type by type, against the server: a source value cast to the
target's type equals the target's value when IS NOT DISTINCT FROM says so (by text for types
without an equality or a hash), and the stored fingerprints agree with that, in every session
time zone.

Each case is a source table and a target table with one compared column `v`, one row per pair
of values: reconcile's range statement must find exactly the unequal pairs, and the per-row
fingerprint of the two sides must be equal exactly for the equal ones."""

from __future__ import annotations

import json

import psycopg
import pytest

from mover.catalog import conversion, introspect
from mover.engines.bulk import reconcile
from mover.names import QualifiedName
from mover.sql import compare

# (case, setup SQL, source type, target type, [(source value, target value, equal)], has `=`)
CASES = [
    ("int_to_bigint", "", "integer", "bigint",
     [("1", "1", True), ("-1", "-1", True), ("2147483647", "2147483647", True), ("1", "2", False),
      ("NULL", "NULL", True), ("NULL", "0", False)], True),
    # PostgreSQL's own 64-bit hash of a bigint folds it to 32 bits first: 2^33 and 2^33 + 2^32 + 1
    # hash alike there. mover hashes bigint through its 8 bytes, so the fingerprints differ too.
    ("bigint_fold", "", "bigint", "bigint",
     [("8589934592", "8589934592", True), ("8589934592", "12884901889", False), ("1", "4294967296", False)], True),
    ("numeric_scale", "", "numeric", "numeric",
     [("1.0", "1.00", True), ("1.0", "1.01", False), ("'NaN'", "'NaN'", True), ("0", "-0.000", True),
      ("NULL", "0", False), ("123456789012345678901234567890.5", "123456789012345678901234567890.50", True)], True),
    # The plan narrows the scale: a lossy conversion, compared in the source's type, so a value
    # the copy rounded differs (invariant 8: no comparison through a lossy conversion).
    ("numeric_to_numeric_12_2", "", "numeric", "numeric(12,2)",
     [("1.005", "1.01", False), ("1.004", "1.01", False), ("7", "7.00", True), ("1.01", "1.01", True)], True),
    ("numeric_scale_narrowing", "", "numeric(12,4)", "numeric(12,2)",
     [("1.2345", "1.23", False), ("1.2300", "1.23", True), ("NULL", "NULL", True), ("-0.0050", "-0.01", False)],
     True),
    ("float8_to_float4", "", "double precision", "real",
     [("0.5", "0.5", True), ("1.23456", "1.23456", False), ("'NaN'", "'NaN'", True), ("0.1", "0.1", False)], True),
    # An explicit cast would truncate 'abcdefgh' to 'abcde' and call the pair equal.
    ("varchar_narrowing", "", "varchar(20)", "varchar(5)",
     [("'abc'", "'abc'", True), ("'abcdefgh'", "'abcde'", False), ("'abcde'", "'abcde'", True)], True),
    ("bigint_to_int", "", "bigint", "integer",
     [("1", "1", True), ("5000000000", "705032704", False), ("-2", "-2", True)], True),
    ("float8", "", "double precision", "double precision",
     [("'-0'", "'0'", True), ("'NaN'", "'NaN'", True), ("'Infinity'", "'Infinity'", True),
      ("1.5", "1.5000000000000002", False), ("0.1", "0.1", True), ("'-Infinity'", "'Infinity'", False)], True),
    ("real_to_double", "", "real", "double precision",
     [("0.5", "0.5", True), ("0.1", "0.1", False)], True),  # 0.1::real widened is not 0.1::float8
    ("timestamptz", "", "timestamp with time zone", "timestamp with time zone",
     [("'2024-01-01 00:00:00+00'", "'2024-01-01 01:00:00+01'", True),
      ("'2024-01-01 00:00:00+00'", "'2024-01-01 00:00:00.000001+00'", False),
      ("'infinity'", "'infinity'", True),
      # 2^33 us and 2^33 + 2^32 + 1 us after 2000-01-01: alike for the folding hash, not for mover's.
      ("timestamptz '2000-01-01 00:00:00+00' + interval '8589.934592 seconds'",
       "timestamptz '2000-01-01 00:00:00+00' + interval '12884.901889 seconds'", False)], True),
    ("timestamp", "", "timestamp without time zone", "timestamp without time zone",
     [("'2024-01-01 10:00'", "'2024-01-01 10:00:00.000'", True), ("'2024-01-01 10:00'", "'2024-01-01 10:01'", False)],
     True),
    ("interval", "", "interval", "interval",
     [("'1 day'", "'24 hours'", True), ("'1 mon'", "'30 days'", True), ("'1 day'", "'1 day 1 second'", False)],
     True),
    ("money", "", "money", "money", [("1.00", "1.00", True), ("1.00", "1.01", False)], True),
    ("json", "", "json", "json",
     [("'{\"a\": 1}'", "'{\"a\": 1}'", True), ("'{\"a\": 1}'", "'{\"a\":1}'", False),
      ("'[1, 2]'", "'[2, 1]'", False), ("NULL", "'null'", False)], False),
    ("json_to_jsonb", "", "json", "jsonb",
     [("'{\"a\": 1, \"b\": [1, 2]}'", "'{\"b\": [1, 2], \"a\": 1}'", True), ("'{\"a\": 1}'", "'{\"a\": 2}'", False)],
     True),
    ("jsonb", "", "jsonb", "jsonb",
     [("'{\"a\": 1}'", "'{\"a\": 1.0}'", True), ("'[1, 2]'", "'[2, 1]'", False),
      ("'{\"a\": null}'", "'{}'", False)], True),
    ("int_array", "", "integer[]", "integer[]",
     [("'{1,2}'", "'{1,2}'", True), ("'{1,2}'", "'{2,1}'", False), ("'{1,NULL}'", "'{1,NULL}'", True),
      ("'{}'", "NULL", False)], True),
    ("numeric_array", "", "numeric[]", "numeric[]", [("'{1.0,2}'", "'{1.00,2.0}'", True), ("'{1}'", "'{1.1}'", False)],
     True),
    ("composite", "CREATE TYPE pair AS (x integer, y text)", "pair", "pair",
     [("'(1,a)'", "'(1,a)'", True), ("'(1,a)'", "'(1,b)'", False), ("'(1,)'", "'(1,)'", True),
      ("'(1,)'", "'(1,\"\")'", False)], True),
    # A composite holding json cannot be hashed or compared by PostgreSQL: compared by text.
    ("composite_with_json", "CREATE TYPE doc AS (n integer, body json)", "doc", "doc",
     [("'(1,\"{}\")'", "'(1,\"{}\")'", True), ("'(1,\"{}\")'", "'(1,\"{ }\")'", False)], False),
    ("enum", "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')", "mood", "mood",
     [("'ok'", "'ok'", True), ("'ok'", "'happy'", False)], True),
    ("text_to_enum", "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')", "text", "mood",
     [("'ok'", "'ok'", True), ("'sad'", "'ok'", False)], True),
    ("bytea", "", "bytea", "bytea",
     [("'\\x00ff'", "'\\x00ff'", True), ("'\\x00'", "'\\x0000'", False), ("''", "NULL", False)], True),
    ("text_toast", "", "text", "text",
     [("repeat('x', 100000)", "repeat('x', 100000)", True),
      ("repeat('x', 100000)", "repeat('x', 99999) || 'y'", False),
      ("(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 5000) i)",
       "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 5000) i)", True),
      ("''", "NULL", False)], True),
    ("varchar_to_text", "", "character varying(20)", "text", [("'abc'", "'abc'", True), ("'abc'", "'abc '", False)],
     True),
    ("xml", "", "xml", "xml", [("'<a/>'", "'<a/>'", True), ("'<a/>'", "'<a />'", False)], False),
    ("point", "", "point", "point", [("'(1,2)'", "'(1,2)'", True), ("'(1,2)'", "'(1,2.5)'", False)], False),
    ("uuid", "", "uuid", "uuid",
     [("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", True),
      ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12'", False)], True),
    ("inet", "", "inet", "inet", [("'10.0.0.1'", "'10.0.0.1/32'", True), ("'10.0.0.1'", "'10.0.0.1/24'", False)],
     True),
    ("domain_over_bigint", "CREATE DOMAIN amount AS bigint CHECK (VALUE >= 0)", "amount", "amount",
     [("5", "5", True), ("8589934592", "12884901889", False)], True),
]


# The session time zones every case is compared in: the values were written in the server's
# default zone; a timestamptz compares by instant, and a text-compared value's text must not move.
ZONES = ("UTC", "America/St_Johns", "Asia/Kathmandu")


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            if stmt:
                conn.execute(stmt)


def server_has_xml(dsn: str) -> bool:
    """Asked of the server, not assumed: a build without libxml rejects every xml value."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("SELECT '<a/>'::xml")
        except psycopg.errors.FeatureNotSupported:
            return False
    return True


def build(dsn: str, setup: str, src_type: str, dst_type: str, pairs) -> None:
    values_s = ", ".join(f"({i}, ({a})::{src_type})" for i, (a, _, _) in enumerate(pairs, 1))
    values_t = ", ".join(f"({i}, ({b})::{dst_type})" for i, (_, b, _) in enumerate(pairs, 1))
    execute(dsn, setup,
            f"CREATE TABLE s (id integer PRIMARY KEY, v {src_type})",
            f"CREATE TABLE t (id bigint PRIMARY KEY, v {dst_type})",
            f"INSERT INTO s VALUES {values_s}, (1000, NULL)",  # 1000: missing in the target
            f"INSERT INTO t VALUES {values_t}, (5000000000, NULL)")  # an extra row beyond the source's int range


def spec_of(cur) -> compare.Spec:
    m = conversion.mapping(introspect.describe(cur, QualifiedName("public", "s")),
                        introspect.describe(cur, QualifiedName("public", "t")), ("id",))
    return reconcile.spec_for(cur, m)


def compare_all(cur, spec):
    stmt, params = compare.compare_range(spec, None, None, None, None)
    cur.execute(stmt, params)
    names = [d.name for d in cur.description]
    rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return rows[0], with_columns(cur, spec, [r for r in rows if r["key"] is not None])


def with_columns(cur, spec, diffs):
    """The wide form's range statement leaves a differing row's columns to a re-check of its key
    (as mover/engines/bulk/reconcile.py asks it, in the range's transaction): filled in from one."""
    unnamed = [d["key"] for d in diffs if d["kind"] == "different" and d["columns"] is None]
    if not unnamed:
        return diffs
    assert compare.is_wide(spec), "only the wide form leaves the columns to a re-check"
    cur.execute(compare.recheck_keys(spec, None), (json.dumps(unnamed),))
    named = {tuple(r[0]): r[2] for r in cur.fetchall()}
    return [{**d, "columns": named[tuple(d["key"])]} if d["key"] in unnamed else d for d in diffs]


def fingerprints(cur, spec, lo, hi):
    out = []
    for side in ("src", "dst"):
        stmt, params = compare.range_fingerprint(spec, side, lo, hi)
        cur.execute(stmt, params)
        count, total = cur.fetchone()
        out.append((count, compare.signed64(int(total))))
    return out


@pytest.fixture(params=["plain", "wide"])
def form(request, monkeypatch):
    """Both forms of the compare statement: the plain join, and the one a table wider than
    compare.WIDE_COLUMNS gets (each side narrowed to a composite), forced here on narrow tables:
    the definition of equal must not depend on the table's width."""
    if request.param == "wide":
        monkeypatch.setattr(compare, "WIDE_COLUMNS", 0)
    return request.param


@pytest.mark.parametrize("case, setup, src_type, dst_type, pairs, has_equality", CASES, ids=[c[0] for c in CASES])
def test_equal_means_is_not_distinct_from(db_dsn, form, case, setup, src_type, dst_type, pairs, has_equality):
    if src_type == "xml" and not server_has_xml(db_dsn):
        pytest.skip("this server was built without libxml (the pgserver wheel's 16.2): no xml type to compare")
    build(db_dsn, setup, src_type, dst_type, pairs)
    unequal = {str(i) for i, (_, _, eq) in enumerate(pairs, 1) if not eq}
    for zone in ZONES:
        check_case(db_dsn, zone, case, src_type, dst_type, pairs, has_equality, unequal)


def check_case(db_dsn, zone, case, src_type, dst_type, pairs, has_equality, unequal):
    case = f"{case} in TimeZone {zone}"
    # a transaction: spec_for() probes in savepoints
    with psycopg.connect(db_dsn, options=f"-c TimeZone={zone}") as conn, conn.cursor() as cur:
        spec = spec_of(cur)
        agg, diffs = compare_all(cur, spec)
        kinds = {d["key"][0]: d["kind"] for d in diffs}
        assert {k for k, kind in kinds.items() if kind == "different"} == unequal, case
        assert kinds["1000"] == "missing_in_target" and kinds["5000000000"] == "extra_in_target"
        for d in diffs:
            if d["kind"] == "different":
                assert list(d["columns"]) == ["v"]  # both values shown, source first
        if has_equality:
            # The definition itself, evaluated by the server: in the source's type when lossy.
            lossy = spec.column("v").back_to is not None
            differs = (f"s.v IS DISTINCT FROM CAST(t.v AS {src_type})" if lossy
                       else f"CAST(s.v AS {dst_type}) IS DISTINCT FROM t.v")
            cur.execute(f"SELECT s.id::text FROM s JOIN t USING (id) WHERE {differs}")
            assert {r[0] for r in cur.fetchall()} == unequal
        else:
            assert spec.column("v").mode == "text"
        # Fingerprints: the target's, derived from the source's and the differing rows, is what
        # hashing the target gives; and per row, the two sides hash alike exactly when equal.
        src_fp, dst_fp = compare.fingerprint(agg["src_sum"], diffs)
        (s_rows, s_fp), (t_rows, t_fp) = fingerprints(cur, spec, None, None)
        assert (s_rows, s_fp, t_rows, t_fp) == (agg["src_rows"], src_fp, agg["dst_rows"], dst_fp)
        for i, (_, _, eq) in enumerate(pairs, 1):
            (_, a), (_, b) = fingerprints(cur, spec, [str(i - 1)], [str(i)])
            assert (a == b) == eq, f"{case}: pair {i} hashes {'differently' if eq else 'alike'}"


def test_modes_follow_the_type(db_dsn):
    execute(db_dsn, "CREATE TYPE doc AS (n integer, body json)",
            "CREATE TABLE s (id integer PRIMARY KEY, a bigint, b timestamptz, c json, d jsonb, e point, f doc,"
            " g numeric, h money, i int[])",
            "CREATE TABLE t (LIKE s INCLUDING ALL)", "ALTER TABLE t ALTER COLUMN id TYPE bigint")
    with psycopg.connect(db_dsn) as conn, conn.cursor() as cur:
        spec = spec_of(cur)
        modes = {c.name: c.mode for c in spec.columns}
        assert modes == {"id": "send", "a": "send", "b": "send", "c": "text", "d": "value", "e": "text",
                         "f": "text", "g": "value", "h": "send", "i": "value"}
        assert spec.column("id").cast_to == "bigint" and spec.dst_key_types == ("bigint",)


def test_fingerprint_ignores_the_session_time_zone(db_dsn):
    execute(db_dsn, "CREATE TABLE s (id integer PRIMARY KEY, at timestamptz, day date, n numeric)",
            "INSERT INTO s SELECT g, timestamptz '2024-03-31 01:30:00+00' + g * interval '17 minutes',"
            " date '2024-01-01' + g, g / 7.0 FROM generate_series(1, 500) g",
            "CREATE TABLE t (LIKE s INCLUDING ALL)", "INSERT INTO t SELECT * FROM s")
    seen = set()
    for zone in ("UTC", "Europe/Berlin", "America/St_Johns", "Asia/Kathmandu"):
        with psycopg.connect(db_dsn, options=f"-c TimeZone={zone}") as conn, conn.cursor() as cur:
            spec = spec_of(cur)
            agg, diffs = compare_all(cur, spec)
            assert diffs == []
            seen.add((agg["src_rows"], compare.fingerprint(agg["src_sum"], diffs)))
    assert len(seen) == 1


def test_composite_key_and_many_columns(db_dsn, form, monkeypatch):
    """Two-column key (one widened), more compared columns than jsonb_build_object takes arguments."""
    cols = ", ".join(f"c{i} integer" for i in range(60))
    if form == "wide":
        monkeypatch.setattr(compare, "WIDE_GROUP", 25)  # the differing columns in different groups
    execute(db_dsn, f'CREATE TABLE s (a integer, "B key" text, {cols}, PRIMARY KEY (a, "B key"))',
            f"INSERT INTO s SELECT g % 7, g::text, {', '.join(f'g + {i}' for i in range(60))}"
            " FROM generate_series(1, 300) g",
            "CREATE TABLE t (LIKE s INCLUDING ALL)", "ALTER TABLE t ALTER COLUMN a TYPE bigint",
            "INSERT INTO t SELECT * FROM s",
            "UPDATE t SET c59 = -1, c3 = -1 WHERE a = 3 AND \"B key\" = '10'",
            "DELETE FROM t WHERE a = 1 AND \"B key\" = '15'")
    with psycopg.connect(db_dsn) as conn, conn.cursor() as cur:
        m = conversion.mapping(introspect.describe(cur, QualifiedName("public", "s")),
                            introspect.describe(cur, QualifiedName("public", "t")), ("a", "B key"))
        spec = reconcile.spec_for(cur, m)
        stmt, params = compare.compare_range(spec, None, None, ["2", "99"], None)  # keys after (2, '99')
        cur.execute(stmt, params)
        names = [d.name for d in cur.description]
        diffs = [dict(zip(names, r, strict=True)) for r in cur.fetchall() if r[names.index("key")] is not None]
        assert [d["columns"] is None for d in diffs] == [form == "wide"]
        diffs = with_columns(cur, spec, diffs)
        assert [(d["key"], d["kind"]) for d in diffs] == [(["3", "10"], "different")]
        assert diffs[0]["columns"] == {"c3": ["13", "-1"], "c59": ["69", "-1"]}
        stmt = compare.recheck_keys(spec, None)
        cur.execute(stmt, ('[["1", "15"], ["3", "10"], ["4", "11"]]',))
        assert sorted((r[0], r[1]) for r in cur.fetchall()) == [(["1", "15"], "missing_in_target"),
                                                               (["3", "10"], "different")]
