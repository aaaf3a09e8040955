"""The query rehearsal's engine (mover/engines/swap/query_rehearsal.py) on statements given to it, as
pg_stat_statements would record them: no pg_stat_statements needed, so it runs on every server
version the suite covers, and both ways of planning a generic plan where the server has both
(EXPLAIN (GENERIC_PLAN) from 16; PREPARE + EXPLAIN EXECUTE on all).

The tables are the test's own: the source `orders` has an index on customer_id that the target
`orders_new` lacks (planted), and the target's `code` is text where the source's is integer."""

from __future__ import annotations

import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from mover.db import Database
from mover.engines.swap import query_rehearsal as qr
from mover.errors import BadInput
from mover.names import QualifiedName

SETUP = """
CREATE TABLE public.orders (id int PRIMARY KEY, customer_id int NOT NULL, code int, note text);
INSERT INTO public.orders SELECT g, g % 2000, g % 97, md5(g::text) FROM generate_series(1, 20000) g;
CREATE INDEX orders_customer_idx ON public.orders (customer_id);
CREATE TABLE public.orders_new (id bigint PRIMARY KEY, customer_id int NOT NULL, code text, note text);
INSERT INTO public.orders_new SELECT id, customer_id, code::text, note FROM public.orders;
CREATE TABLE public.orders_archive (id int PRIMARY KEY, customer_id int);
ANALYZE public.orders;
"""
PAIR = qr.Pair(QualifiedName("public", "orders"), QualifiedName("public", "orders_new"),
               {"orders_new_pkey": "orders_pkey"})


@pytest.fixture
def tables(db_dsn) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
    return db_dsn


def me(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT current_user").fetchone()[0]


def rehearse(dsn: str, *texts: str, role: str | None = None, prepared: bool | None = None,
             **settings) -> list[qr.Finding]:
    db = Database(dsn)
    try:
        who = role or me(dsn)
        recorded = [qr.Recorded(who, t, 100 - i, 1.0) for i, t in enumerate(texts)]
        [result] = qr.rehearse(db, [PAIR], qr.Settings(prepared=prepared, **settings), statements={PAIR: recorded})
        assert result.analyzed == settings.get("analyze", True)
        return result.findings
    finally:
        db.close()


def ways(dsn: str) -> list[bool | None]:
    """Both ways of planning where the server has both (None: its own way)."""
    with psycopg.connect(dsn) as conn:
        return [None, True] if conn.info.server_version >= 160000 else [None]


def test_each_verdict_on_the_target_under_the_sources_name(tables):
    statements = {
        "seq_scan": "SELECT * FROM orders WHERE customer_id = $1",
        "update_seq_scan": "UPDATE orders SET note = $1 WHERE customer_id = $2",
        "same": "SELECT note FROM public.orders WHERE id = $1",
        "fails": "SELECT * FROM orders WHERE code = $1::integer",
        "join": "SELECT * FROM orders o JOIN public.orders p USING (id) WHERE o.customer_id = $1",
        "other_table": "SELECT * FROM orders_archive WHERE customer_id = $1",
        "cte": "WITH orders AS (SELECT 1 AS id) SELECT * FROM orders",
        "system_column": "SELECT ctid FROM orders WHERE id = $1",
        "upsert": "INSERT INTO orders (id, customer_id) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET note = $3",
        "column_qualified": "SELECT orders.note FROM public.orders WHERE orders.id = $1",
        # An operator psycopg would read as a placeholder, a quote, a comment naming the table.
        "lexing": "SELECT count(*) FROM orders /* public.orders; */ WHERE id % 7 = $1 AND note <> 'it''s; %s'",
    }
    for way in ways(tables):
        found = dict(zip(statements, rehearse(tables, *statements.values(), prepared=way), strict=True))
        assert found["seq_scan"].verdict == qr.SEQ_SCAN, found["seq_scan"]
        assert found["seq_scan"].before.indexes == ("orders_customer_idx",)
        assert found["seq_scan"].after.seq_scans == 1 and found["seq_scan"].marked
        assert found["update_seq_scan"].verdict == qr.SEQ_SCAN, found["update_seq_scan"]
        assert found["join"].verdict == qr.SEQ_SCAN, found["join"]  # both references point at the target
        # The target's key index shown by the name the swap gives it: the same plan.
        assert found["same"].verdict == qr.SAME, found["same"]
        assert found["same"].before.indexes == found["same"].after.indexes == ("orders_pkey",)
        assert found["column_qualified"].verdict == qr.SAME, found["column_qualified"]
        assert found["lexing"].verdict == qr.SAME, found["lexing"]
        assert found["upsert"].verdict in (qr.SAME, qr.CHANGED), found["upsert"]
        assert found["fails"].verdict == qr.FAILS and found["fails"].marked
        assert "operator does not exist: text = integer" in found["fails"].error
        assert found["other_table"].verdict == qr.SKIPPED and "does not name" in found["other_table"].note
        assert found["cte"].verdict == qr.SKIPPED and "does not read" in found["cte"].note
        assert found["system_column"].verdict == qr.SKIPPED
        assert "cannot be pointed at the target" in found["system_column"].note


def test_a_cost_rise_of_the_factor_is_marked(tables):
    """The same scan both sides, a costlier one: the target holds ten times the rows."""
    with psycopg.connect(tables, autocommit=True) as conn:
        conn.execute("INSERT INTO orders_new SELECT g, g % 2000, NULL, 'x' FROM generate_series(20001, 200000) g")
    [same] = rehearse(tables, "SELECT count(*) FROM orders WHERE note = $1", cost_factor=1000)
    assert same.verdict in (qr.SAME, qr.CHANGED) and same.factor is not None and same.factor > 4
    [marked] = rehearse(tables, "SELECT count(*) FROM orders WHERE note = $1", cost_factor=4)
    assert marked.verdict == qr.COST_UP and marked.marked


def test_the_source_is_left_as_it_was(tables):
    """Nothing of a rehearsal stays: no view, no prepared statement, no change to the source."""
    def catalog(dsn):
        with psycopg.connect(dsn) as conn:
            return conn.execute("SELECT count(*), max(xmin::text::bigint) FROM pg_class").fetchone(), \
                conn.execute("SELECT count(*) FROM orders").fetchone()
    db = Database(tables)
    try:
        before = catalog(tables)
        qr.rehearse(db, [PAIR], qr.Settings(analyze=False), statements={PAIR: [
            qr.Recorded(me(tables), "DELETE FROM orders WHERE customer_id = $1", 1, 1.0)]})
        assert catalog(tables) == before
        with db.connection().cursor() as cur:
            assert cur.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
            assert cur.execute("SELECT to_regclass('pg_temp.orders')").fetchone()[0] is None
    finally:
        db.close()


def test_a_lock_not_granted_skips_the_statement_instead_of_queueing(tables):
    """A session holding the source (a DDL in progress): the rehearsal waits lock_timeout per
    attempt, then leaves the statement out, saying why; it does not wait in the lock's queue."""
    with psycopg.connect(tables) as holder:
        holder.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        [f] = rehearse(tables, "SELECT * FROM orders WHERE id = $1", lock_timeout_ms=20, analyze=False)
        holder.rollback()
    assert f.verdict == qr.SKIPPED and "was not granted" in f.note and not f.marked


def test_without_pg_stat_statements_it_says_how_to_enable_it(db_dsn):
    db = Database(db_dsn)
    try:
        with pytest.raises(BadInput) as info:
            qr.statements_view(db)
    finally:
        db.close()
    assert info.value.exit_code == 2
    assert "shared_preload_libraries" in info.value.hint and "CREATE EXTENSION pg_stat_statements" in info.value.hint


# ---------------------------------------------------------------------------------------------
# Invariant 11: a statement is planned as the role that ran it, never with mover's rights.

def as_user(dsn: str, user: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def roles(tables) -> Iterator[dict[str, str]]:
    """app (the application's role, which op may become), op (mover's role, not a superuser, owner
    of the tables), other (a role op cannot become), admin (holds op's rights); and a function
    that says as whom it was planned."""
    tag = uuid.uuid4().hex[:8]
    names = {k: f"{k}_{tag}" for k in ("app", "op", "other", "admin")}
    i = {k: sql.Identifier(v) for k, v in names.items()}
    with psycopg.connect(tables, autocommit=True) as conn:
        for k in names:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(i[k]))
        conn.execute(sql.SQL("GRANT {} TO {}").format(i["app"], i["op"]))  # op may SET ROLE app
        conn.execute(sql.SQL("GRANT {} TO {}").format(i["op"], i["admin"]))  # admin has op's rights
        conn.execute(sql.SQL("ALTER TABLE orders OWNER TO {}").format(i["op"]))
        conn.execute(sql.SQL("ALTER TABLE orders_new OWNER TO {}").format(i["op"]))
        conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON orders, orders_new TO {}, {}")
                     .format(i["app"], i["other"]))
        conn.execute("CREATE SCHEMA who")
        conn.execute("GRANT USAGE ON SCHEMA who TO PUBLIC")
        # Planning folds an immutable function over constants: this one says as whom it ran.
        conn.execute("CREATE FUNCTION who.am_i() RETURNS int IMMUTABLE LANGUAGE plpgsql AS"
                     " $$BEGIN RAISE EXCEPTION 'planned as %', current_user; END$$")
    try:
        yield names
    finally:
        with psycopg.connect(tables, autocommit=True) as conn:
            conn.execute("DROP SCHEMA who CASCADE")
            for k in ("admin", "other", "app", "op"):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(i[k]))
                conn.execute(sql.SQL("DROP ROLE {}").format(i[k]))


def test_a_statement_is_planned_as_the_role_that_ran_it(tables, roles):
    op = as_user(tables, roles["op"])
    text = "SELECT * FROM orders WHERE id = who.am_i()"
    [as_app] = rehearse(op, text, role=roles["app"], analyze=False)
    assert as_app.verdict == qr.SKIPPED and f"planned as {roles['app']}" in as_app.note, as_app
    # A role mover's role cannot become, without mover's rights: not planned at all.
    [other] = rehearse(op, text, role=roles["other"], analyze=False)
    assert other.verdict == qr.SKIPPED and "cannot SET ROLE" in other.note and "planned as" not in other.note
    # A role that holds mover's rights anyway: planned as mover's role.
    [admin] = rehearse(op, text, role=roles["admin"], analyze=False)
    assert f"planned as {roles['op']}" in admin.note, admin
    # And the plans themselves, as app, under app's own search_path.
    with psycopg.connect(tables, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE {} SET search_path = who, public").format(sql.Identifier(roles["app"])))
    [seq] = rehearse(op, "SELECT * FROM orders WHERE customer_id = $1", role=roles["app"], analyze=False)
    assert seq.verdict == qr.SEQ_SCAN, seq


def test_rehearsals_never_make_a_writer_of_the_source_wait(tables):
    """A writer of the source whose every statement gives up after 100ms of waiting for a lock,
    while rehearsals of reads and writes of the source run: none of its statements fails (the
    bound is the server's lock_timeout, not a clock in the test; its longest statement is
    measured and shown)."""
    stop, errors, done, longest = threading.Event(), [], [0], [0.0]

    def write():
        with psycopg.connect(tables, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '100ms'")
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    started = time.monotonic()
                    conn.execute("UPDATE orders SET note = %s WHERE id = %s", (str(i), i % 20000 + 1))
                    conn.execute("INSERT INTO orders VALUES (%s, 1, 1, 'w') ON CONFLICT (id) DO NOTHING",
                                 (100000 + i,))
                    longest[0] = max(longest[0], time.monotonic() - started)
                    done[0] += 1
                except psycopg.Error as exc:
                    errors.append(str(exc))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        for _ in range(3):
            before = done[0]
            rehearse(tables, "SELECT * FROM orders WHERE customer_id = $1", "UPDATE orders SET note = $1 WHERE id = $2",
                     "DELETE FROM public.orders WHERE customer_id = $1")
            assert done[0] > before or not writer.is_alive()
    finally:
        stop.set()
        writer.join(30)
    assert errors == [] and done[0] > 0, (errors[:3], f"longest writer statement {longest[0] * 1000:.0f} ms")
    print(f"writer: {done[0]} pairs of writes, longest {longest[0] * 1000:.1f} ms")
