"""The digest Context.check_shape trusts between its full checks (shape.SHAPE_INPUTS): every change
a full check would see moves it, so a cached check never hides one. Each change below is made on
a migration at the gate, the digest read before and after, and the full check compared: whenever
the description changed, the digest did too (the converse need not hold: a change the
description does not show may move it, and only costs a full check)."""

from __future__ import annotations

import psycopg

from mover.catalog import shape
from mover.db import connect
from tests.workload import mover, plan_text, write_plan

DDL = """
CREATE SEQUENCE t_seq;
CREATE TABLE ref (id int PRIMARY KEY, code text UNIQUE);
INSERT INTO ref SELECT g, 'c' || g FROM generate_series(1, 10) g;
CREATE FUNCTION pos(x int) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT x > 0';
CREATE TABLE t (id int PRIMARY KEY, n int DEFAULT nextval('t_seq') CHECK (pos(n)), r int REFERENCES ref (id),
                v text COLLATE "C", w numeric(10, 2));
CREATE INDEX t_v ON t (v);
INSERT INTO t (id, r, v, w) SELECT g, 1 + g % 10, 'v' || g, g FROM generate_series(1, 50) g;
"""

# Statements the application or a DBA might run beside a migration; each rolled back after the check.
CHANGES = [
    "ALTER TABLE t ADD COLUMN x int",
    "ALTER TABLE t DROP COLUMN w",
    "ALTER TABLE t ALTER COLUMN w TYPE numeric(12, 2)",
    "ALTER TABLE t RENAME COLUMN v TO vv",
    "ALTER TABLE t ALTER COLUMN v SET NOT NULL",
    "ALTER TABLE t ALTER COLUMN w SET DEFAULT 0",
    "ALTER TABLE t ALTER COLUMN n DROP DEFAULT",
    "ALTER SEQUENCE t_seq RENAME TO t_seq2",
    "ALTER TABLE ref RENAME TO ref2",
    "ALTER TABLE ref RENAME COLUMN id TO rid",
    "ALTER FUNCTION pos(int) RENAME TO pos2",
    "ALTER TABLE t ADD CONSTRAINT t_w CHECK (w > 0) NOT VALID",
    "ALTER TABLE t DROP CONSTRAINT t_r_fkey",
    "CREATE INDEX t_w ON t (w)",
    "ALTER INDEX t_v RENAME TO t_v2",
    "DROP INDEX t_v",
    "ALTER TABLE t RENAME TO t2",
    "CREATE SCHEMA s2; ALTER TABLE t SET SCHEMA s2",
    "ALTER TABLE t SET UNLOGGED",
    "CREATE TYPE ty AS (a int); ALTER TABLE t ADD COLUMN y ty; ALTER TYPE ty RENAME TO ty2",
    "ALTER TABLE t_new ADD COLUMN x int",
    "ALTER TABLE t_new ALTER COLUMN v TYPE varchar(20)",
]


def test_every_change_a_full_check_sees_moves_the_digest(db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    plan = write_plan(tmp_path / "t.toml", plan_text("t", "t", columns={"id": "bigint"}))
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    with connect(db_dsn) as conn, conn.cursor() as cur:
        (mid,) = cur.execute("SELECT id FROM mover.migrations WHERE name = 't'").fetchone()
        for change in CHANGES:
            with conn.transaction(force_rollback=True):
                before = shape.inputs_digest(cur, mid)
                _, _, unchanged = shape.changes(cur, mid)
                assert unchanged == []
                path = cur.execute("SHOW search_path").fetchone()[0]  # mover's own; the DDL names public's tables
                cur.execute("SELECT set_config('search_path', 'public', true)")
                cur.execute(change)
                cur.execute("SELECT set_config('search_path', %s, true)", (path,))
                after = shape.inputs_digest(cur, mid)
                _, _, found = shape.changes(cur, mid)
            assert found, f"the full check does not see {change!r}: not a case for this test"
            assert after != before, f"{change!r} changed the shape ({found[0].message}) but not the digest"
        assert shape.inputs_digest(cur, mid) == before  # every change rolled back: the digest is back
