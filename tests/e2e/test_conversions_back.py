"""Type changes both ways (issue 21: every schema plan check accepts can finish; invariants 8 and 9).

Forward, mover converts as ALTER TABLE ... TYPE without USING does, with the assignment cast: a change
PostgreSQL has no assignment cast for is refused at plan check, before anything is created. Back,
in the rollback window, the application's writes go to the old table with the assignment cast, or
with an explicit CAST where there is none (integer -> text: text -> integer has only CAST), and only
where the value comes back unchanged: a value the old table cannot hold ('abc') or holds only changed
('042' would read back as '42') keeps its row in the new table only, a divergence that `mover
rollback` refuses to leave behind and `mover retire` keeps.

Judged by the writer's mirror (tests/workload.py), whose "Account" is text here: what the application
wrote after the swap, 'abc' included. The integer tables are compared with it as text.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import sql

from tests.workload import (
    MIRROR,
    ORDERS_COLUMNS,
    Writer,
    app_execute,
    assert_oracle,
    catalog_snapshot,
    create_orders,
    mover,
    plan_file,
)

# What the old table's integer holds unchanged: the text an integer prints as.
GOES_BACK = r"^(0|-?[1-9][0-9]{0,9})$"  # (and in its range: the test writes no other)


def prepare(dsn: str, rows: int) -> None:
    create_orders(dsn, rows)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL('ALTER TABLE {} ALTER "Account" TYPE text').format(sql.Identifier(MIRROR)))


def assert_oracle_as_text(dsn: str, table: str, *, without: set[int] | None = None) -> None:
    """`table` (whose "Account" is an integer) holds what the application committed, "Account"
    compared as text; the keys in `without` are left out (rows the old table could not take)."""
    cols = sql.SQL(", ").join(sql.SQL('CAST("Account" AS text) AS "Account"') if c == "Account" else sql.Identifier(c)
                              for c in ORDERS_COLUMNS)
    q = sql.SQL("SELECT count(*), (array_agg(row_to_json(d)::text))[1:3] FROM (SELECT {c} FROM {a}"
                " WHERE id <> ALL(%(w)s) EXCEPT ALL SELECT {c} FROM {b} WHERE id <> ALL(%(w)s)) d")
    t, m = sql.Identifier(table), sql.Identifier(MIRROR)
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        keys = sorted(without or ())
        only_table = conn.execute(q.format(c=cols, a=t, b=m), {"w": keys}).fetchone()
        only_mirror = conn.execute(q.format(c=cols, a=m, b=t), {"w": keys}).fetchone()
    assert (only_table[0], only_mirror[0]) == (0, 0), \
        f"{table} differs from what the application committed: only in {table}: {only_table}; only in the mirror: " \
        f"{only_mirror}"


def not_going_back(dsn: str) -> set[int]:
    """The rows the application left with an "Account" the old table's integer cannot hold unchanged."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute(sql.SQL('SELECT id FROM {} WHERE "Account" !~ %s').format(
            sql.Identifier(MIRROR)), (GOES_BACK,)).fetchall()}


def refused_keys(stderr: str) -> set[int]:
    return {int(k) for k in re.findall(r"key \['(\d+)'\]", " ".join(stderr.split()))}


def to_window(dsn: str, tmp_path, writer: Writer) -> str:
    """Registered, copied and compared under the writer, then swapped in (no accept_parity: the
    collation a column gains with text follows from the planned type change)."""
    plan = plan_file(tmp_path, "acct", columns={"Account": "text"}, backfill={"range_rows": 500})
    r = mover(dsn, "plan", "check", plan)
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "'Account' text -> integer: no assignment cast; converted with CAST, only the values that convert " \
           "to integer go back" in flat, flat
    r = mover(dsn, "run", plan)
    assert r.returncode == 3, r.stderr  # the gate
    writer.pause()  # the target holds every committed write once the log is applied
    assert mover(dsn, "run", "acct").returncode == 3
    assert_oracle_as_text(dsn, "Orders")
    assert_oracle(dsn, "Orders_new")
    writer.resume()
    r = mover(dsn, "cutover", "acct")
    assert r.returncode == 0, r.stderr
    writer.pause()
    assert_oracle(dsn, "Orders")  # the new table, text, under the name
    writer.resume()
    return plan


def test_integer_to_text_rows_that_cannot_go_back_are_kept_and_named(db_dsn, tmp_path):
    prepare(db_dsn, 3_000)
    writer = Writer(db_dsn, seed=21).start()
    try:
        to_window(db_dsn, tmp_path, writer)
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            # After the swap the application writes text: some of it reads as an integer, some not.
            app_execute(conn, 'UPDATE {t} SET "Account" = %s WHERE id = ANY(%s)', ("777", [20, 21]))
            app_execute(conn, 'UPDATE {t} SET "Account" = %s WHERE id = ANY(%s)', ("abc", [30, 31]))
            app_execute(conn, 'UPDATE {t} SET "Account" = %s WHERE id = 32', ("042",))
            app_execute(conn, 'INSERT INTO {t} ("Account", note) VALUES (%s, %s)', ("-5", "goes back"))
            app_execute(conn, 'INSERT INTO {t} ("Account", note) VALUES (%s, %s)', ("x1", "stays"))
        writer.pause()
        bad = not_going_back(db_dsn)
        assert bad, "the application wrote values the old table cannot hold"
        r = mover(db_dsn, "run", "acct")
        assert r.returncode == 3, r.stderr  # the window, saying which rows the old table rejected
        assert refused_keys(r.stderr) == bad, (bad, r.stderr)
        # next: what moves on with such rows (a plain rollback would refuse)
        assert "`mover rollback acct --give-up-rows` swaps back without them" in " ".join(r.stderr.split()), r.stderr
        assert "does not convert to integer and back unchanged: '042' comes back as '42'" in " ".join(
            r.stderr.split()), r.stderr
        assert_oracle(db_dsn, "Orders")
        assert_oracle_as_text(db_dsn, "Orders_old", without=bad)  # every other write went back
        before = catalog_snapshot(db_dsn)
        r = mover(db_dsn, "rollback", "acct")
        assert r.returncode == 3, r.stderr
        assert "refused" in r.stderr and refused_keys(r.stderr) == bad, (bad, r.stderr)
        assert "--give-up-rows" in r.stderr, r.stderr
        assert catalog_snapshot(db_dsn) == before  # refused before anything was swapped
        writer.resume()
        r = mover(db_dsn, "run", "acct")  # the window goes on
        assert r.returncode == 3, r.stderr
        writer.pause()
        r = mover(db_dsn, "retire", "acct", "--force")
        assert r.returncode == 0, r.stderr  # the rows live on in the new table
        assert_oracle(db_dsn, "Orders")
        writer.resume()
    finally:
        writer.halt()
    assert writer.errors == []


def test_integer_to_text_and_back_when_every_value_converts(db_dsn, tmp_path):
    prepare(db_dsn, 3_000)
    writer = Writer(db_dsn, seed=22).start()
    try:
        to_window(db_dsn, tmp_path, writer)
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            app_execute(conn, 'UPDATE {t} SET "Account" = %s WHERE id = ANY(%s)', ("777", [20, 21]))
            app_execute(conn, 'UPDATE {t} SET "Account" = %s WHERE id = 22', ("-2147483648",))
            app_execute(conn, 'INSERT INTO {t} ("Account", note) VALUES (%s, %s)', ("0", "goes back"))
        writer.pause()
        assert not_going_back(db_dsn) == set()
        r = mover(db_dsn, "run", "acct")
        assert r.returncode == 3 and "rejected" not in r.stderr, r.stderr
        assert_oracle(db_dsn, "Orders")
        assert_oracle_as_text(db_dsn, "Orders_old")
        writer.resume()
        r = mover(db_dsn, "rollback", "acct")
        assert r.returncode == 0, r.stderr
        writer.pause()
        assert_oracle_as_text(db_dsn, "Orders")  # the original is back, with every write of the window
        # The forward capture runs again: at the gate the new table holds them too.
        assert mover(db_dsn, "run", "acct").returncode == 3
        assert mover(db_dsn, "run", "acct").returncode == 3
        assert_oracle(db_dsn, "Orders_new")
        assert_oracle_as_text(db_dsn, "Orders")
    finally:
        writer.halt()
    assert writer.errors == []


def test_a_change_with_no_assignment_cast_is_refused_at_plan_check_nothing_created(db_dsn, tmp_path):
    """text -> integer and text -> jsonb have only an explicit cast (ALTER TABLE asks for USING):
    refused before anything is created, the column, both types and the way out named; also when the
    plan has another problem (every problem at once: the DDL rehearsal alone would not run then)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE codes (id int PRIMARY KEY, n text, doc text, pay integer)")
        conn.execute("""INSERT INTO codes VALUES (1, '42', '{"a": 1}', 5)""")
    before = catalog_snapshot(db_dsn)
    for column, typ in (("n", "integer"), ("doc", "jsonb")):
        plan = plan_file(tmp_path, f"to_{column}", "codes", columns={column: typ, "nope": "bigint"})
        for command in (("plan", "check", plan), ("run", plan)):
            r = mover(db_dsn, *command)
            assert r.returncode == 2, (command, r.stderr)
            flat = " ".join(r.stderr.split())
            assert f"column \"{column}\" cannot become '{typ}': PostgreSQL has no assignment cast from text to " \
                   f"{typ}" in flat, flat
            assert f'ALTER COLUMN "{column}" TYPE {typ} USING' in flat, flat
            assert 'has no column "nope"' in flat, flat  # the other problem, in the same run
            assert catalog_snapshot(db_dsn) == before
    # Back: integer -> money converts, money -> integer not at all: the window could not carry a
    # value back. Refused at plan check too.
    plan = plan_file(tmp_path, "to_money", "codes", columns={"pay": "money"})
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 2, r.stderr
    flat = " ".join(r.stderr.split())
    assert "column \"pay\" cannot become 'money': in the rollback window" in flat, flat
    assert "no cast from money to integer" in flat, flat
    assert catalog_snapshot(db_dsn) == before
