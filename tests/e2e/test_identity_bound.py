"""Objects bound to the source's identity (its oid or row type) rather than to its name (invariant 15):
the swap carries them or refuses, naming each with the statement that fixes it; retire and abort
name what would refuse their drop instead of passing PostgreSQL's raw error through.

Each object is created after registration (at the gate), where plan check could not see it. The
oracle is the application's own statement (an INSERT through an audit trigger, a SQL function's
count against the table's), the catalog (which relation a policy or rule reads, which parent a
child has) and, for a subscribed source, the publisher's row reaching the subscriber's table."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql

from tests.conftest import connect, dsn_with_dbname
from tests.workload import create_orders, cutover_with_change_before_lock, finish, hung_at, mover, plan_file, spawn

ROWS = 300


def q(dsn, statement, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def at_gate(dsn, tmp_path, name="ident") -> str:
    create_orders(dsn, ROWS)
    p = plan_file(tmp_path, name, columns={"id": "bigint"}, backfill={"range_rows": 100})
    r = mover(dsn, "run", p)
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    return p


def insert_one(dsn) -> None:
    q(dsn, 'INSERT INTO "Orders" ("Account", amount, status) VALUES (1, 1, \'new\')')


def reads_orders(dsn, classid: str, objid_sql: str) -> bool:
    """The catalog: every relation the object depends on among the migration's tables is the one
    that carries the name "Orders"."""
    rows = q(dsn, f"""SELECT DISTINCT d.refobjid::regclass::text FROM pg_depend d
                      WHERE d.classid = '{classid}'::regclass AND d.objid = ({objid_sql})
                        AND d.refclassid = 'pg_class'::regclass
                        AND d.refobjid IN ('"Orders"'::regclass, to_regclass('"Orders_old"'),
                                           to_regclass('"Orders_new"'))""")
    return rows == [('"Orders"',)]


# (setup at the gate, what the refusal names, the application's check after the cutover attempt)
CASES = {
    "row-type column filled by a trigger": (
        """CREATE TABLE audit (at timestamptz DEFAULT now(), r "Orders");
           CREATE FUNCTION audit_orders() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN INSERT INTO audit (r) VALUES (NEW); RETURN NEW; END $$;
           CREATE TRIGGER audit_orders AFTER INSERT ON "Orders" FOR EACH ROW EXECUTE FUNCTION audit_orders()""",
        ["column r of table public.audit", 'ALTER TABLE "public"."audit" ALTER COLUMN "r" TYPE jsonb'],
        lambda dsn: insert_one(dsn) or q(dsn, "SELECT count(*) FROM audit")[0][0] == 1),
    "BEGIN ATOMIC function": (
        """CREATE FUNCTION orders_count() RETURNS bigint LANGUAGE sql
           BEGIN ATOMIC SELECT count(*) FROM "Orders"; END""",
        ["function public.orders_count()", "AS $$"],
        lambda dsn: insert_one(dsn) or q(dsn, 'SELECT orders_count() = (SELECT count(*) FROM "Orders")')[0][0]),
    "policy on another table": (
        """CREATE TABLE shown (id int); ALTER TABLE shown ENABLE ROW LEVEL SECURITY;
           CREATE POLICY by_order ON shown USING (id IN (SELECT id FROM "Orders"))""",
        ["policy by_order on table public.shown", 'DROP POLICY "by_order" ON "public"."shown"'],
        lambda dsn: reads_orders(dsn, "pg_policy", "SELECT oid FROM pg_policy WHERE polname = 'by_order'")),
    "rule on another table": (
        """CREATE TABLE requests (id int);
           CREATE RULE copy_orders AS ON INSERT TO requests DO ALSO
             UPDATE "Orders" SET note = 'requested' WHERE id = NEW.id""",
        ["rule copy_orders on table public.requests", 'DROP RULE "copy_orders" ON "public"."requests"'],
        lambda dsn: reads_orders(dsn, "pg_rewrite", "SELECT oid FROM pg_rewrite WHERE rulename = 'copy_orders'")),
    "domain over the row type": (
        """CREATE DOMAIN order_row AS "Orders"; CREATE TABLE kept (o order_row)""",
        ["type public.order_row", 'DROP DOMAIN "public"."order_row"', "column o of table public.kept"],
        lambda dsn: q(dsn, """SELECT t.typbasetype = c.reltype FROM pg_type t, pg_class c
                              WHERE t.typname = 'order_row' AND c.oid = '"Orders"'::regclass""")[0][0]),
    "array of the row type": (
        """CREATE TABLE batches (orders "Orders"[]);
           CREATE FUNCTION batch_orders() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN INSERT INTO batches VALUES (ARRAY[NEW]); RETURN NEW; END $$;
           CREATE TRIGGER batch_orders AFTER INSERT ON "Orders" FOR EACH ROW EXECUTE FUNCTION batch_orders()""",
        ["column orders of table public.batches"],
        lambda dsn: insert_one(dsn) or q(dsn, "SELECT count(*) FROM batches")[0][0] == 1),
    "inheritance child": (
        """CREATE TABLE "Orders_archive" () INHERITS ("Orders");
           INSERT INTO "Orders_archive" ("Account", created_at) VALUES (7, now())""",
        ['"Orders_archive"', 'ALTER TABLE "public"."Orders_archive" NO INHERIT "public"."Orders"'],
        lambda dsn: q(dsn, 'SELECT count(*) FROM "Orders"')[0][0] == ROWS + 1),
    "inheritance parent": (
        """CREATE TABLE reporting (id int); ALTER TABLE "Orders" INHERIT reporting""",
        ["inheritance parent", 'ALTER TABLE "public"."Orders" NO INHERIT "public"."reporting"'],
        lambda dsn: insert_one(dsn) or q(dsn, 'SELECT (SELECT count(*) FROM reporting)'
                                              ' = (SELECT count(*) FROM "Orders")')[0][0]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_object_bound_to_the_identity_made_at_the_gate_refuses_the_cutover(db_dsn, tmp_path, case):
    setup, named, app_is_fine = CASES[case]
    at_gate(db_dsn, tmp_path)
    q(db_dsn, setup)
    r = mover(db_dsn, "cutover", "ident")
    flat = " ".join(r.stderr.split())
    # The application's statements still work, on the table that has the name (before this change the
    # cutover exited 0 and left the object on the old table).
    assert app_is_fine(db_dsn), flat
    assert r.returncode == 3, flat
    for text in named:
        assert text in flat, flat
    assert q(db_dsn, "SELECT step FROM mover.migrations WHERE name = 'ident'")[0][0] == "cutover"
    # The gate names it too (mover run stops there).
    r = mover(db_dsn, "run", "ident")
    assert r.returncode == 3 and "bound to the identity" in r.stderr, r.stderr


@pytest.mark.parametrize("statement, named", [
    ('CREATE TABLE audit (r "Orders")', "column r of table public.audit"),
    ('CREATE TABLE "Orders_archive" () INHERITS ("Orders")', 'NO INHERIT "public"."Orders"'),
    ('CREATE TABLE reporting (id int); ALTER TABLE "Orders" INHERIT reporting', 'NO INHERIT "public"."reporting"'),
    ("CREATE FUNCTION orders_count() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM \"Orders\"; END",
     "function public.orders_count()"),
], ids=["row-type column", "inheritance child", "inheritance parent", "BEGIN ATOMIC"])
def test_an_object_made_between_the_preparation_and_the_lock_is_refused_under_the_lock(db_dsn, tmp_path,
                                                                                      statement, named):
    """The swap's statements are read before its lock; the catalog digest it compares under the lock
    covers what the identity search reads, so an object made in between is found there."""
    at_gate(db_dsn, tmp_path)
    code, err = cutover_with_change_before_lock(db_dsn, "ident", tmp_path, statement)
    flat = " ".join(err.split())
    assert code == 3 and named in flat, flat
    insert_one(db_dsn)  # the application's table is the one it was
    assert q(db_dsn, "SELECT step FROM mover.migrations WHERE name = 'ident'")[0][0] == "cutover"


def test_a_fixed_object_lets_the_cutover_through_and_retire_names_what_binds_the_old_table(db_dsn, tmp_path):
    at_gate(db_dsn, tmp_path)
    q(db_dsn, """CREATE FUNCTION orders_count() RETURNS bigint LANGUAGE sql
                 BEGIN ATOMIC SELECT count(*) FROM "Orders"; END""")
    assert mover(db_dsn, "cutover", "ident").returncode == 3
    # The fix named: the body as a string, read by name at each call.
    q(db_dsn, """CREATE OR REPLACE FUNCTION orders_count() RETURNS bigint LANGUAGE sql
                 AS $$ SELECT count(*) FROM "Orders" $$""")
    r = mover(db_dsn, "cutover", "ident")
    assert r.returncode == 0, r.stderr
    insert_one(db_dsn)
    assert q(db_dsn, 'SELECT orders_count() = (SELECT count(*) FROM "Orders")')[0][0]
    # In the window, objects made on the old table would refuse its drop: retire names them with their
    # fix instead of PostgreSQL's raw "cannot drop table" (2BP01), and drops nothing.
    q(db_dsn, """CREATE VIEW old_orders AS SELECT * FROM "Orders_old";
                 CREATE TABLE old_audit (r "Orders_old")""")
    r = mover(db_dsn, "retire", "ident", "--force")
    flat = " ".join(r.stderr.split())
    assert r.returncode == 3, flat
    assert "cannot drop" not in flat and 'DROP VIEW "public"."old_orders"' in flat, flat
    assert 'ALTER TABLE "public"."old_audit" DROP COLUMN "r"' in flat, flat
    assert q(db_dsn, "SELECT to_regclass('\"Orders_old\"') IS NOT NULL")[0][0]
    q(db_dsn, 'DROP VIEW old_orders; DROP TABLE old_audit')
    r = mover(db_dsn, "retire", "ident", "--force")
    assert r.returncode == 0, r.stderr
    assert q(db_dsn, "SELECT to_regclass('\"Orders_old\"') IS NULL")[0][0]


def test_abort_names_what_binds_the_target(db_dsn, tmp_path):
    at_gate(db_dsn, tmp_path)
    q(db_dsn, 'CREATE VIEW peek AS SELECT * FROM "Orders_new"')
    r = mover(db_dsn, "abort", "ident")
    flat = " ".join(r.stderr.split())
    assert r.returncode == 3 and 'DROP VIEW "public"."peek"' in flat and "cannot drop" not in flat, flat
    q(db_dsn, "DROP VIEW peek")
    assert mover(db_dsn, "abort", "ident").returncode == 0


def test_the_rollback_refuses_what_binds_the_new_table(db_dsn, tmp_path):
    at_gate(db_dsn, tmp_path)
    assert mover(db_dsn, "cutover", "ident").returncode == 0
    q(db_dsn, 'CREATE TABLE later (r "Orders")')  # the new table's row type, in the window
    r = mover(db_dsn, "rollback", "ident")
    flat = " ".join(r.stderr.split())
    assert r.returncode == 3 and "column r of table public.later" in flat, flat
    insert_one(db_dsn)
    assert q(db_dsn, "INSERT INTO later SELECT o FROM \"Orders\" o LIMIT 1 RETURNING 1") == [(1,)]


# ---------------------------------------------------------------------------------------------
# A subscribed source: a real subscription, from a publisher database on the same server.


@pytest.fixture
def publisher(pg_dsn, db_dsn):
    name = "pub_" + db_dsn.rsplit("/", 1)[-1][-20:].replace("-", "_")
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    pub = dsn_with_dbname(pg_dsn, name)
    create_orders(pub, ROWS)
    q(pub, 'CREATE PUBLICATION orders_pub FOR TABLE "Orders"')
    q(pub, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    yield pub, name
    for statement in ("DROP SUBSCRIPTION IF EXISTS orders_sub",):
        q(db_dsn, statement)
    with connect(pg_dsn) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                     (name,))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def subscribe(db_dsn, pub, slot) -> None:
    # The slot made beforehand: a subscription to the same cluster cannot create its own. The rows are
    # there already on both sides (create_orders is deterministic): no initial copy.
    q(db_dsn, sql.SQL("CREATE SUBSCRIPTION orders_sub CONNECTION {} PUBLICATION orders_pub WITH (create_slot = false,"
                      " slot_name = {}, copy_data = false)").format(sql.Literal(pub), sql.Literal(slot)))


def replicates(db_dsn, pub, marker: str, timeout: float = 30) -> bool:
    """A row the publisher writes reaches the subscriber's table bearing the name."""
    q(pub, 'INSERT INTO "Orders" (id, "Account", note) VALUES (100000 + %s, 1, %s)', (len(marker), marker))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if q(db_dsn, 'SELECT count(*) FROM "Orders" WHERE note = %s', (marker,))[0][0] == 1:
            return True
        time.sleep(0.1)
    return False


def test_a_subscribed_source_is_refused_at_plan_check(db_dsn, tmp_path, publisher):
    pub, slot = publisher
    create_orders(db_dsn, ROWS)
    subscribe(db_dsn, pub, slot)
    assert replicates(db_dsn, pub, "before")
    p = plan_file(tmp_path, "ident", columns={"id": "bigint"})
    r = mover(db_dsn, "plan", "check", p)
    flat = " ".join(r.stderr.split())
    assert r.returncode == 2 and 'subscription "orders_sub"' in flat and "A subscribed source" in flat, flat


def test_a_subscription_made_after_registration_refuses_the_cutover(db_dsn, tmp_path, publisher):
    pub, slot = publisher
    at_gate(db_dsn, tmp_path)
    subscribe(db_dsn, pub, slot)
    assert replicates(db_dsn, pub, "at the gate")
    r = mover(db_dsn, "cutover", "ident")
    flat = " ".join(r.stderr.split())
    assert r.returncode == 3 and 'subscription "orders_sub"' in flat, flat
    # The apply worker reopens the table (as after any restart): it still applies into the table
    # bearing the name.
    q(db_dsn, "ALTER SUBSCRIPTION orders_sub DISABLE")
    q(db_dsn, "ALTER SUBSCRIPTION orders_sub ENABLE")
    assert replicates(db_dsn, pub, "after the refused cutover")


def test_an_inheritance_child_made_during_the_backfill_is_never_copied(db_dsn, tmp_path):
    """The copies read ONLY the source: a child made while the backfill copies (after its step began,
    so no step start has refused it yet) keeps its rows to itself, and the next step's start names it."""
    create_orders(db_dsn, ROWS)
    p = plan_file(tmp_path, "ident", columns={"id": "bigint"}, backfill={"range_rows": 100})
    release = tmp_path / "release"
    proc = spawn(db_dsn, "run", p, env={"MOVER_FAULT": "hang@range_copied", "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert hung_at(proc, "range_copied")  # the backfill under way: its first range copied
        q(db_dsn, """CREATE TABLE "Orders_archive" () INHERITS ("Orders");
                     INSERT INTO "Orders_archive" (id, "Account", created_at)
                     SELECT 100000 + g, 7, now() FROM generate_series(1, 50) g""")
        release.touch()
        code, err = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 3 and '"Orders_archive"' in " ".join(err.split()), err
    assert q(db_dsn, "SELECT step FROM mover.migrations WHERE name = 'ident'") == [("reconcile",)]
    assert q(db_dsn, 'SELECT (SELECT count(*) FROM "Orders_new"), (SELECT count(*) FROM ONLY "Orders")') \
        == [(ROWS, ROWS)]
    r = mover(db_dsn, "run", "ident")  # still named until it is fixed
    assert r.returncode == 3 and "NO INHERIT" in r.stderr, r.stderr


def test_an_object_bound_during_the_backfill_stops_the_run_at_the_next_step(db_dsn, tmp_path):
    """From registration on, not first at the gate: an inheritance child made after the first step
    is named when the next step starts (exit 3, with its fix), and the run goes on once it is fixed.
    The oracle: the child's parent in the catalog, and the copy holding the source's rows only."""
    create_orders(db_dsn, ROWS)
    p = plan_file(tmp_path, "early", columns={"id": "bigint"}, backfill={"range_rows": 100})
    r = mover(db_dsn, "step", p)  # create_target only
    assert r.returncode == 0, r.stderr
    q(db_dsn, 'CREATE TABLE "Orders_child" () INHERITS ("Orders")')
    r = mover(db_dsn, "run", "early")
    err = " ".join(r.stderr.split())
    assert r.returncode == 3, err
    assert 'ALTER TABLE "public"."Orders_child" NO INHERIT "public"."Orders"' in err, err
    step = q(db_dsn, "SELECT step FROM mover.migrations WHERE name = 'early'")[0][0]
    assert step in ("install_capture", "backfill"), step  # stopped before the gate
    q(db_dsn, 'ALTER TABLE "Orders_child" NO INHERIT "Orders"')
    r = mover(db_dsn, "run", "early")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    assert q(db_dsn, "SELECT count(*) FROM pg_inherits WHERE inhparent = '\"Orders\"'::regclass") == [(0,)]
