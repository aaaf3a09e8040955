"""Tables as wide as PostgreSQL allows (1600 columns): reconcile, the cutover and rollback work
on them, and a difference in the last column is found. The compare statement joins the two
ranges; a join of two 1600-column rows would exceed PostgreSQL's 1664-entry target list, so
each side is narrowed to its key and one composite of the compared values before the join."""

from __future__ import annotations

import json

import psycopg
from psycopg import sql

from tests.workload import mover, plan_text, write_plan

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
