"""The query rehearsal reads a recorded statement as PostgreSQL's scanner does (mover/sql/statement_text.py):
a name matches only where it stands as an identifier, the statement must be one plannable statement,
and only the schema of a qualified `schema.table` reference is rewritten."""

from __future__ import annotations

import pytest

from mover.sql.statement_text import Unreadable, read


@pytest.mark.parametrize(("text", "name", "expected"), [
    ('SELECT * FROM orders WHERE id = $1', "orders", True),
    ('SELECT * FROM ORDERS WHERE id = $1', "orders", True),  # unquoted folds
    ('SELECT * FROM "ORDERS" WHERE id = $1', "orders", False),  # quoted keeps its case
    ('SELECT * FROM "Orders" o WHERE o.id = $1', "Orders", True),
    ('SELECT * FROM orders WHERE id = $1', "Orders", False),
    ('SELECT * FROM orders_archive WHERE id = $1', "orders", False),  # a longer word
    ('SELECT * FROM archive_orders WHERE id = $1', "orders", False),
    ("SELECT * FROM t WHERE note = 'orders'", "orders", False),  # inside a string
    ("SELECT * FROM t WHERE note = E'it''s \\' orders'", "orders", False),
    ("SELECT $q$ from orders $q$ FROM t", "orders", False),  # dollar-quoted
    ("SELECT 1 /* orders /* nested */ orders */ FROM t -- orders\n", "orders", False),  # comments
    ('SELECT "a""orders" FROM t', "orders", False),
    ('SELECT * FROM "we""ird" WHERE id = $1', 'we"ird', True),
    ('SELECT * FROM public.orders WHERE id=$1', "orders", True),
])
def test_a_name_matches_only_as_an_identifier(text, name, expected):
    assert read(text).mentions(name) is expected


@pytest.mark.parametrize(("text", "plannable"), [
    ("SELECT 1", True),
    ("  with x AS (SELECT 1) SELECT * FROM x", True),
    ("(SELECT 1) UNION (SELECT 2)", True),
    ("INSERT INTO t VALUES ($1)", True),
    ("UPDATE t SET a = $1", True),
    ("DELETE FROM t", True),
    ("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE", True),
    ("VALUES (1)", True),
    ("TABLE t", True),
    ("SELECT 1;", True),  # a trailing semicolon
    ("SELECT 1; DROP TABLE t", False),  # two statements
    ("SELECT ';' FROM t", True),
    ("EXPLAIN ANALYZE SELECT 1", False),
    ("ANALYZE t", False),
    ("LOCK TABLE t", False),
    ("CREATE TABLE t AS SELECT 1", False),
    ("COPY t TO STDOUT", False),
])
def test_only_one_statement_a_planner_plans_is_rehearsed(text, plannable):
    assert read(text).plannable is plannable


def test_unterminated_text_is_unreadable():
    for text in ("SELECT 'x", 'SELECT "x', "SELECT $a$ x", "SELECT /* x"):
        with pytest.raises(Unreadable):
            read(text)


def test_qualified_and_unqualified_references():
    st = read('SELECT * FROM public.orders o JOIN orders p USING (id) WHERE public.orders.id = $1')
    assert st.mentions_qualified("public", "orders")
    assert st.mentions_unqualified("orders")
    assert not read("SELECT * FROM public.orders").mentions_unqualified("orders")
    assert read("SELECT orders.id FROM public.orders").mentions_unqualified("orders")  # a column qualifier
    assert not read("SELECT x.orders FROM t x").mentions_qualified("public", "orders")
    assert read("SELECT * FROM mover.m1_changes").qualifies("mover")
    assert not read("SELECT mover FROM t").qualifies("mover")


def test_only_the_schema_of_a_qualified_reference_is_pointed_elsewhere():
    st = read('SELECT public.orders.id, o.x FROM Public . "orders" o, mydb.public.orders, publicx.orders,'
              ' "public".orders_archive WHERE note = \'public.orders\'')
    assert st.redirected("public", "orders", "pg_temp") == (
        'SELECT "pg_temp".orders.id, o.x FROM "pg_temp" . "orders" o, mydb."pg_temp".orders, publicx.orders,'
        ' "public".orders_archive WHERE note = \'public.orders\'')
