"""Race 7: rows that swap unique values in one transaction (two rows, or a longer cycle) must
replay to the source's final state; a row the other side cannot hold is never dropped silently."""

from __future__ import annotations

import json
import random
import threading

import psycopg
from psycopg import sql

from tests.workload import mover, write_plan

ACCT_COLUMNS = ("id", "email", "handle", "note")

PLAN = """
[migration]
name = "acct"
source = "acct"

[target]
columns = {{ id = "bigint"{extra} }}

[backfill]
chunk_rows = {chunk_rows}
{throttle}
[rollback]
window = "1h"
"""


def create_acct(dsn: str, rows: int = 3000) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, email text NOT NULL UNIQUE, handle text,"
                     " note text)")
        # An expression index too: the closure must match it as the target evaluates it.
        conn.execute("CREATE UNIQUE INDEX acct_handle ON acct (lower(handle))")
        conn.execute("INSERT INTO acct SELECT g, 'u' || g || '@x', 'H' || g, 'n' FROM generate_series(1, %s) g",
                     (rows,))


def plan_file(tmp_path, chunk_rows=500, extra="", throttle="") -> str:
    return write_plan(tmp_path / "acct.toml", PLAN.format(chunk_rows=chunk_rows, extra=extra, throttle=throttle))


def status(dsn):
    r = mover(dsn, "status", "acct", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def differences(dsn: str, a: str, b: str) -> tuple[int, int]:
    """Independent of mover: EXCEPT ALL both ways in one snapshot."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in ACCT_COLUMNS)
    q = "SELECT count(*) FROM (SELECT {c} FROM {x} EXCEPT ALL SELECT {c} FROM {y}) d"
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        ab = conn.execute(sql.SQL(q).format(c=cols, x=sql.Identifier(a), y=sql.Identifier(b))).fetchone()[0]
        ba = conn.execute(sql.SQL(q).format(c=cols, x=sql.Identifier(b), y=sql.Identifier(a))).fetchone()[0]
    return ab, ba


def rotate(conn: psycopg.Connection, ids: list[int], column: str = "email") -> None:
    """One application transaction: each row takes the next one's value (a cycle of len(ids))."""
    col = sql.Identifier(column)
    with conn.transaction():
        values = [conn.execute(sql.SQL("SELECT {} FROM acct WHERE id = %s").format(col), (i,)).fetchone()[0]
                  for i in ids]
        conn.execute(sql.SQL("UPDATE acct SET {} = 'tmp-' || id WHERE id = ANY(%s)").format(col), (ids,))
        for i, v in zip(ids, values[1:] + values[:1]):
            conn.execute(sql.SQL("UPDATE acct SET {} = %s WHERE id = %s").format(col), (v, i))


def test_swap_and_cycle_at_the_gate_replay_and_cut_over(db_dsn, tmp_path):
    create_acct(db_dsn)
    plan = plan_file(tmp_path)
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rotate(conn, [1, 2])  # the swap
        rotate(conn, [3, 4, 5])  # a 3-cycle
        rotate(conn, [6, 7], "handle")  # through the expression index
        rotate(conn, [10, 2900])  # keys far apart: not in one range
    r = mover(db_dsn, "run", "acct")
    assert r.returncode == 3, r.stderr
    assert "ready for cutover" in r.stderr
    st = status(db_dsn)
    assert (st["step"], st["divergences"]) == ("cutover", 0), st
    assert differences(db_dsn, "acct", "acct_new") == (0, 0)
    r = mover(db_dsn, "cutover", "acct")
    assert r.returncode == 0, r.stderr
    assert differences(db_dsn, "acct", "acct_old") == (0, 0)
