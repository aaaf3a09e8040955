"""Tables as wide as PostgreSQL allows (1600 columns): reconcile, the cutover and rollback work
on them, a difference in the last column is found, and one under a concurrent writer reaches the
gate and cuts over in time (issue 34: the cost of a range grew with columns x ranges). The compare
statement joins the two ranges; a join of two 1600-column rows would exceed PostgreSQL's
1664-entry target list, so each side is narrowed to its key and one composite of the compared
values before the join."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

from tests.workload import AppWriter, mover, plan_text, write_plan

COLUMNS = 1600

PLAN = plan_text("wide", "wide", columns={"id": "bigint"}, backfill={"range_rows": 100}, reconcile={"range_rows": 100})


def create_wide(dsn: str, rows: int = 150) -> None:
    # c1..c1598 plus id and one text column: 1600 columns, the server's limit.
    cols = [sql.SQL("{} int").format(sql.Identifier(f"c{i}")) for i in range(1, COLUMNS - 1)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE wide (id int PRIMARY KEY, {}, note text)").format(sql.SQL(", ").join(cols)))
        values = sql.SQL(", ").join(sql.SQL("g + {}").format(sql.Literal(i)) for i in range(1, COLUMNS - 1))
        conn.execute(sql.SQL("INSERT INTO wide SELECT g, {}, 'n' || g FROM generate_series(1, %s) g").format(values),
                     (rows,))


def differences(dsn: str, a: str, b: str) -> tuple[int, int]:
    """Independent of mover: EXCEPT ALL both ways, rows compared whole as their text."""
    with psycopg.connect(dsn) as conn:
        q = "SELECT count(*) FROM (SELECT x::text FROM {a} x EXCEPT ALL SELECT y::text FROM {b} y) d"
        one = conn.execute(sql.SQL(q).format(a=sql.Identifier(a), b=sql.Identifier(b))).fetchone()[0]
        two = conn.execute(sql.SQL(q).format(a=sql.Identifier(b), b=sql.Identifier(a))).fetchone()[0]
        return one, two


def test_a_1600_column_table_reconciles_finds_a_late_column_and_cuts_over(db_dsn, tmp_path):
    create_wide(db_dsn)
    plan = write_plan(tmp_path / "wide.toml", PLAN)
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 0, r.stdout + r.stderr
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    assert differences(db_dsn, "wide", "wide_new") == (0, 0)
    # A difference planted in the target's highest-numbered column (past what one jsonb object of
    # the divergence detail holds), and one in the last, after the 1598 int columns.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE wide_new DISABLE TRIGGER USER")  # nothing guards the target here, but be sure
        conn.execute("UPDATE wide_new SET c1598 = -1 WHERE id = 77")
        conn.execute("UPDATE wide_new SET note = 'planted' WHERE id = 5")
        conn.execute("ALTER TABLE wide_new ENABLE TRIGGER USER")
    r = mover(db_dsn, "reconcile", "wide", "--full", "--json")
    assert r.returncode == 3, r.stdout + r.stderr
    r = mover(db_dsn, "divergences", "wide", "--json")
    assert r.returncode == 0, r.stderr
    found = {(d["key"][0], d["kind"], tuple(sorted(d["columns"]))) for d in json.loads(r.stdout)}
    assert found == {("77", "different", ("c1598",)), ("5", "different", ("note",))}, found
    r = mover(db_dsn, "repair", "wide")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mover(db_dsn, "reconcile", "wide", "--full")
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "cutover", "wide")
    assert r.returncode == 0, r.stderr
    assert differences(db_dsn, "wide", "wide_old") == (0, 0)
    r = mover(db_dsn, "rollback", "wide")
    assert r.returncode == 0, r.stderr
    assert differences(db_dsn, "wide", "wide_new") == (0, 0)


def create_mirror_of_wide(dsn: str) -> None:
    """The oracle: a copy of `wide` the application writes in the same transaction as `wide`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE wide_mirror (LIKE wide)")
        conn.execute("ALTER TABLE wide_mirror ALTER id TYPE bigint, ADD PRIMARY KEY (id)")
        conn.execute("INSERT INTO wide_mirror SELECT * FROM wide")


class WideWriter(AppWriter):
    """A light application on the wide table: an update of one column of one row (most of its
    writes), an insert of a new row, a delete; each in one transaction with the same write to the
    mirror."""

    def write(self, conn: psycopg.Connection, rnd) -> None:
        op = rnd.random()
        with conn.transaction():
            (top,) = conn.execute("SELECT coalesce(max(id), 0) FROM wide_mirror").fetchone()
            k = rnd.randint(1, top)
            if op < 0.7:
                col = sql.Identifier(f"c{rnd.randint(1, COLUMNS - 2)}")
                for t in ("wide", "wide_mirror"):
                    conn.execute(sql.SQL("UPDATE {} SET {c} = {c} + 1, note = %s WHERE id = %s").format(
                        sql.Identifier(t), c=col), (f"u{self.ops}", k))
            elif op < 0.85:
                for t in ("wide", "wide_mirror"):
                    conn.execute(sql.SQL("INSERT INTO {} (id, c1, c1598, note) VALUES (%s, %s, %s, 'i')").format(
                        sql.Identifier(t)), (top + 1, self.ops, -self.ops))
            else:
                for t in ("wide", "wide_mirror"):
                    conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(sql.Identifier(t)), (k,))


# Measured on this shared 2-core machine, 1200 rows under this writer (about 30 operations/s):
# main (dea31b9) needed 71 s to reach the gate and 57 s for the cutover (its last check at 24
# rows/s, each of 14 ranges composing, sending and parsing 670 KB of SQL and describing both
# tables several times); with the statements composed once, the differing columns named only for
# the keys that differ and the shape checked through a catalog digest, 13 s and 5 s. With the
# 1600 rows here the test takes about 20 s, and main times out. The timeout is what a comparison
# whose cost grows with columns x ranges trips; the test asserts no timing.
@pytest.mark.timeout(80)
def test_a_1600_column_table_under_a_writer_reaches_the_gate_and_cuts_over(db_dsn, tmp_path):
    create_wide(db_dsn, rows=1600)
    create_mirror_of_wide(db_dsn)
    # The governor off: this measures the comparison, not how busy the shared machine is.
    plan = write_plan(tmp_path / "wide.toml", PLAN + '[throttle]\nmax_latency_increase = "off"\n')
    with WideWriter(db_dsn, delay=0.02) as writer:
        r = mover(db_dsn, "run", plan)
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        r = mover(db_dsn, "cutover", "wide")
        assert r.returncode == 0, r.stderr
        writer.wait_for_ops(writer.ops + 20)  # writing through the swapped-in table too
    assert writer.errors == []
    assert writer.ops > 100
    assert differences(db_dsn, "wide", "wide_mirror") == (0, 0)
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                            " WHERE attrelid = 'wide'::regclass AND attname = 'id'").fetchone()[0] == "bigint"
