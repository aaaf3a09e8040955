"""A family of tables moved together (issue 27): customers.id referenced by orders.customer_id and
invoices.customer_id, invoices.order_id referencing orders.id (a key referenced twice, once through
a table that is itself referenced), every key and reference int -> bigint, under an application
writing every table (inserts, updates, deletes, key changes that respect the foreign keys, a parent
and its children written and deleted in one transaction), with kill -9 in each table's steps and
inside the cutover and the rollback. Judged by the application's own mirrors (one per table,
written in its transactions): nothing lost; a sampler checks with plain SQL, all along, that no
row of one side references a missing row of the same side; one cutover swaps all three (one lock
hold), one rollback swaps them all back."""

from __future__ import annotations

import html
import json
import random
import signal
import threading
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from mover import api
from tests.workload import AppWriter, assert_oracle, mover, write_plan

SCHEMA = """
CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, note text);
CREATE TABLE orders (id serial PRIMARY KEY, customer_id int NOT NULL REFERENCES customers, amount numeric(12,2),
                     note text);
CREATE TABLE invoices (id serial PRIMARY KEY, customer_id int NOT NULL REFERENCES customers,
                       order_id int REFERENCES orders, total numeric(12,2));
CREATE INDEX invoices_by_order ON invoices (order_id);
INSERT INTO customers (name) SELECT 'c' || g FROM generate_series(1, 1500) g;
INSERT INTO orders (customer_id, amount) SELECT 1 + g % 1500, g FROM generate_series(1, 3000) g;
INSERT INTO invoices (customer_id, order_id, total) SELECT customer_id, id, amount FROM orders WHERE id % 3 <> 0;
"""

COLUMNS = {"customers": ("id", "name", "note"), "orders": ("id", "customer_id", "amount", "note"),
           "invoices": ("id", "customer_id", "order_id", "total")}
# Each key between them: (child, column, parent).
KEYS = (("orders", "customer_id", "customers"), ("invoices", "customer_id", "customers"),
        ("invoices", "order_id", "orders"))

PLAN = """
[migration]
name = "family"
source = "public.customers"

[target]
columns = { id = "bigint" }

[[also]]
source = "public.orders"
columns = { id = "bigint", customer_id = "bigint" }

[[also]]
source = "public.invoices"
columns = { customer_id = "bigint", order_id = "bigint" }

[backfill]
range_rows = 500
min_rows = 500
max_rows = 500

[reconcile]
range_rows = 1000

[rollback]
window = "1h"
"""


def create(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        for table in COLUMNS:
            # The oracle: what the application committed, kept by the writer in its own transactions.
            m = sql.Identifier(f"{table}_mirror")
            conn.execute(sql.SQL("CREATE TABLE {} AS SELECT * FROM {}").format(m, sql.Identifier(table)))
            conn.execute(sql.SQL("ALTER TABLE {} ALTER id TYPE bigint, ADD PRIMARY KEY (id)").format(m))
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))


@dataclass(eq=False, kw_only=True)
class FamilyWriter(AppWriter):
    """The application: every write in a transaction of its own (one or several statements), each
    statement's rows copied to the table's mirror in that transaction. Legal writes only: a child
    always references an existing parent, a parent goes after its children."""

    def write(self, conn: psycopg.Connection, rnd: random.Random) -> None:
        ops = [self._insert_family, self._update, self._delete_family, self._change_order_key,
               self._change_customer_key, self._reparent, self._reinsert_invoice, self._insert_children]
        with conn.transaction():
            rnd.choice(ops)(conn, rnd)

    @staticmethod
    def _write(conn, table: str, statement: str, params: dict) -> list[int]:
        """`statement` (on {t}, ending in RETURNING id) and its rows' state copied to the mirror."""
        t, m = sql.Identifier(table), sql.Identifier(f"{table}_mirror")
        ids = [r[0] for r in conn.execute(sql.SQL(statement).format(t=t), params).fetchall()]
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(m), (ids,))
        cols = sql.SQL(", ").join(map(sql.Identifier, COLUMNS[table]))
        conn.execute(sql.SQL("INSERT INTO {m} ({c}) SELECT {c} FROM {t} WHERE id = ANY(%s)").format(m=m, c=cols, t=t),
                     (ids,))
        return ids

    @staticmethod
    def _pick(conn, table: str, rnd: random.Random, where: str = "true") -> int | None:
        (top,) = conn.execute(sql.SQL("SELECT max(id) FROM {}").format(sql.Identifier(table))).fetchone()
        if top is None:
            return None
        row = conn.execute(sql.SQL("SELECT id FROM {} WHERE id >= %s AND " + where + " ORDER BY id LIMIT 1").format(
            sql.Identifier(table)), (rnd.randint(1, top),)).fetchone()
        return row[0] if row else None

    def _insert_family(self, conn, rnd) -> None:
        """A customer, an order of it and an invoice of that order, in one transaction."""
        (c,) = self._write(conn, "customers", "INSERT INTO {t} (name) VALUES (%(n)s) RETURNING id", {"n": "new"})
        (o,) = self._write(conn, "orders", "INSERT INTO {t} (customer_id, amount) VALUES (%(c)s, %(a)s) RETURNING id",
                           {"c": c, "a": rnd.randint(1, 999)})
        self._write(conn, "invoices", "INSERT INTO {t} (customer_id, order_id, total) VALUES (%(c)s, %(o)s, 1)"
                                      " RETURNING id", {"c": c, "o": o})

    def _insert_children(self, conn, rnd) -> None:
        c = self._pick(conn, "customers", rnd)
        if c is not None:
            (o,) = self._write(conn, "orders", "INSERT INTO {t} (customer_id, amount) VALUES (%(c)s, 2) RETURNING id",
                               {"c": c})
            self._write(conn, "invoices", "INSERT INTO {t} (customer_id, order_id, total) VALUES (%(c)s, %(o)s, 2)"
                                          " RETURNING id", {"c": c, "o": o})

    def _update(self, conn, rnd) -> None:
        table = rnd.choice(list(COLUMNS))
        k = self._pick(conn, table, rnd)
        column = {"customers": "note", "orders": "amount", "invoices": "total"}[table]
        value = "u" if table == "customers" else rnd.randint(1, 10**6) / 100
        if k is not None:
            self._write(conn, table, f"UPDATE {{t}} SET {column} = %(v)s WHERE id = %(k)s RETURNING id",
                        {"v": value, "k": k})

    def _delete_family(self, conn, rnd) -> None:
        """An order with its invoices, and its customer when nothing else references it: children
        first, in one transaction."""
        o = self._pick(conn, "orders", rnd)
        if o is None:
            return
        (c,) = conn.execute("SELECT customer_id FROM orders WHERE id = %s", (o,)).fetchone()
        self._write(conn, "invoices", "DELETE FROM {t} WHERE order_id = %(o)s RETURNING id", {"o": o})
        self._write(conn, "orders", "DELETE FROM {t} WHERE id = %(o)s RETURNING id", {"o": o})
        self._write(conn, "customers", "DELETE FROM {t} WHERE id = %(c)s AND NOT EXISTS (SELECT 1 FROM orders"
                                       " WHERE customer_id = %(c)s) AND NOT EXISTS (SELECT 1 FROM invoices WHERE"
                                       " customer_id = %(c)s) RETURNING id", {"c": c})

    def _change_order_key(self, conn, rnd) -> None:
        """An order's key changes, its invoices follow: the new row, the references moved, the old row gone."""
        o = self._pick(conn, "orders", rnd)
        if o is None:
            return
        (n,) = self._write(conn, "orders", "INSERT INTO {t} (id, customer_id, amount, note) SELECT"
                                           " nextval(pg_get_serial_sequence('orders', 'id')), customer_id, amount,"
                                           " 'moved' FROM {t} WHERE id = %(o)s RETURNING id", {"o": o})
        self._write(conn, "invoices", "UPDATE {t} SET order_id = %(n)s WHERE order_id = %(o)s RETURNING id",
                    {"n": n, "o": o})
        self._write(conn, "orders", "DELETE FROM {t} WHERE id = %(o)s RETURNING id", {"o": o})

    def _change_customer_key(self, conn, rnd) -> None:
        c = self._pick(conn, "customers", rnd)
        if c is None:
            return
        (n,) = self._write(conn, "customers", "INSERT INTO {t} (id, name, note) SELECT"
                                              " nextval(pg_get_serial_sequence('customers', 'id')), name, 'moved'"
                                              " FROM {t} WHERE id = %(c)s RETURNING id", {"c": c})
        for child in ("orders", "invoices"):
            self._write(conn, child, "UPDATE {t} SET customer_id = %(n)s WHERE customer_id = %(c)s RETURNING id",
                        {"n": n, "c": c})
        self._write(conn, "customers", "DELETE FROM {t} WHERE id = %(c)s RETURNING id", {"c": c})

    def _reparent(self, conn, rnd) -> None:
        o, c = self._pick(conn, "orders", rnd), self._pick(conn, "customers", rnd)
        if o is not None and c is not None:
            self._write(conn, "orders", "UPDATE {t} SET customer_id = %(c)s WHERE id = %(o)s RETURNING id",
                        {"c": c, "o": o})
            self._write(conn, "invoices", "UPDATE {t} SET customer_id = %(c)s WHERE order_id = %(o)s RETURNING id",
                        {"c": c, "o": o})

    def _reinsert_invoice(self, conn, rnd) -> None:
        """Delete and insert again the same key, in one transaction."""
        i = self._pick(conn, "invoices", rnd)
        if i is None:
            return
        row = conn.execute("SELECT customer_id, order_id FROM invoices WHERE id = %s", (i,)).fetchone()
        self._write(conn, "invoices", "DELETE FROM {t} WHERE id = %(i)s RETURNING id", {"i": i})
        self._write(conn, "invoices", "INSERT INTO {t} (id, customer_id, order_id, total) VALUES (%(i)s, %(c)s,"
                                      " %(o)s, 0) RETURNING id", {"i": i, "c": row[0], "o": row[1]})


ORPHANS = " + ".join(
    f"(SELECT count(*) FROM {{{child}}} x WHERE x.{column} IS NOT NULL AND NOT EXISTS"
    f" (SELECT 1 FROM {{{parent}}} p WHERE p.id = x.{column}))" for child, column, parent in KEYS)


class KeySampler:
    """Checks, over and over with plain SQL (one statement, one snapshot), that no row of the live
    tables references a missing row, nor of the other side (the targets before the swap, the old
    tables in the window) where it exists; and that the live tables hold their three keys,
    validated. Whatever it finds is kept."""

    def __init__(self, dsn: str):
        self.dsn, self.found, self.samples = dsn, [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> KeySampler:
        self.thread.start()
        return self

    def _loop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.02):
                for suffix in ("", "_new", "_old"):
                    names = {t: sql.Identifier(t + suffix) for t in COLUMNS}
                    try:
                        # The other side once it holds its keys (before that, the targets are being copied)
                        if suffix and conn.execute(
                                "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid = ANY("
                                "ARRAY[to_regclass(%s), to_regclass(%s)])", ("orders" + suffix, "invoices" + suffix)
                                ).fetchone()[0] < 3:
                            continue
                        (n,) = conn.execute(sql.SQL("SELECT " + ORPHANS).format(**names)).fetchone()
                        if not suffix:
                            (keys,) = conn.execute(
                                "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND convalidated"
                                " AND conrelid IN ('orders'::regclass, 'invoices'::regclass)"
                                " AND confrelid IN ('customers'::regclass, 'orders'::regclass)").fetchone()
                            if keys != 3:
                                self.found.append(f"the live tables hold {keys} validated keys between them")
                    except (psycopg.errors.UndefinedTable, psycopg.errors.LockNotAvailable):
                        continue  # renamed or dropped between two statements (a swap, a retire)
                    self.samples += 1
                    if n:
                        self.found.append(f"{n} orphans on the {suffix or 'live'} side")

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(30)


def status(dsn) -> dict:
    r = mover(dsn, "status", "family", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_mirrored(dsn: str, suffix: str = "") -> None:
    """Each table (with `suffix`: the other side) holds exactly what the application committed."""
    for table, columns in COLUMNS.items():
        assert_oracle(dsn, table + suffix, mirror=f"{table}_mirror", columns=columns)


def settle(dsn, writer, suffix: str) -> None:
    """Writer paused, the other side caught up (`mover run` drains and exits 3): both sides hold
    what the application committed."""
    writer.pause()
    r = mover(dsn, "run", "family")
    assert r.returncode == 3, r.stderr
    assert_mirrored(dsn)
    assert_mirrored(dsn, suffix)
    writer.resume()


# Where a kill lands, in order: each one in the middle of some table's step (the same point fires
# again for the next table once the first is past it), then at the family's own moments.
KILLS = ("after:create_target:1", "after:install_capture:0", "backfill_range:2", "after:backfill:0",
         "backfill_range:2", "backfill_range:2", "family:keys", "reconcile_range:1", "after:reconcile:1")


def test_a_family_widens_under_writers_through_kills_one_cutover_one_rollback(db_dsn, tmp_path):
    create(db_dsn)
    plan = write_plan(tmp_path / "family.toml", PLAN)
    writer, sampler = FamilyWriter(db_dsn, seed=27).start(), KeySampler(db_dsn).start()
    try:
        for point in KILLS:
            r = mover(db_dsn, "run", plan, env={"MOVER_FAULT": f"kill@{point}"})
            assert r.returncode == -signal.SIGKILL, f"{point}: {r.stderr}"
        r = mover(db_dsn, "run", "family")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        st = status(db_dsn)
        assert (st["step"], st["divergences"]) == ("cutover", 0)
        assert [t["step"] for t in st["family"]["tables"]] == ["cutover"] * 3
        settle(db_dsn, writer, "_new")

        # kill -9 inside the family's swap: after its locks (the first table's record), and after
        # every table's DDL: nothing swapped either time.
        for point in ("swap:locked", "swap:executed"):
            r = mover(db_dsn, "cutover", "family", env={"MOVER_FAULT": f"kill@{point}"})
            assert r.returncode == -signal.SIGKILL, r.stderr
            st = status(db_dsn)
            assert st["step"] == "cutover" and all(t["cutover"] is None for t in st["family"]["tables"])
        r = mover(db_dsn, "cutover", "family")
        assert r.returncode == 0, r.stderr
        st = status(db_dsn)
        assert st["step"] == "rollback_window"
        assert {t["cutover"]["at"] for t in st["family"]["tables"]} == {st["cutover"]["at"]}  # one transaction
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            types = dict(conn.execute(
                "SELECT attrelid::regclass::text || '.' || attname, format_type(atttypid, NULL) FROM pg_attribute"
                " WHERE attrelid IN ('customers'::regclass, 'orders'::regclass, 'invoices'::regclass)"
                " AND attname IN ('id', 'customer_id', 'order_id')").fetchall())
        assert types == {"customers.id": "bigint", "orders.id": "bigint", "orders.customer_id": "bigint",
                         "invoices.id": "integer", "invoices.customer_id": "bigint", "invoices.order_id": "bigint"}
        settle(db_dsn, writer, "_old")  # the window: the old tables kept in step, their keys held

        r = mover(db_dsn, "rollback", "family", env={"MOVER_FAULT": "kill@swap_back:locked"})
        assert r.returncode == -signal.SIGKILL, r.stderr
        assert status(db_dsn)["step"] == "rollback_window"
        r = mover(db_dsn, "rollback", "family")
        assert r.returncode == 0, r.stderr
        settle(db_dsn, writer, "_new")  # back before the gate, the targets in step again
        assert status(db_dsn)["step"] == "cutover"

        r = mover(db_dsn, "cutover", "family")
        assert r.returncode == 0, r.stderr
        # kill -9 inside retire's one transaction (the window closed before it): no table retired,
        # every old table still there
        r = mover(db_dsn, "retire", "family", "--force", env={"MOVER_FAULT": "kill@retire:dropped"})
        assert r.returncode == -signal.SIGKILL, r.stderr
        st = status(db_dsn)
        assert [t["step"] for t in st["family"]["tables"]] == ["retire"] * 3 and st["state"] == "failed", st
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM pg_class WHERE relname ~ '_old$' AND relkind = 'r'"
                                ).fetchone() == (3,)
        r = mover(db_dsn, "retire", "family", "--force")
        assert r.returncode == 0, r.stderr
        writer.pause()
        assert_mirrored(db_dsn)
    finally:
        writer.halt()
        sampler.halt()
    assert writer.errors == []
    assert writer.ops > 100
    assert sampler.samples > 100 and sampler.found == []
    st = status(db_dsn)
    assert (st["state"], st["divergences"]) == ("done", 0)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # Never a divergence: a parent and its child written (or deleted) in one transaction are
        # replayed together, whatever the order of the tables' logs.
        assert conn.execute("SELECT count(*) FROM mover.divergences").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM mover.events WHERE kind = 'rolled_back'").fetchone()[0] == 3
        assert conn.execute("SELECT relname FROM pg_class WHERE relname ~ '_(old|new)$' AND relkind = 'r'"
                            ).fetchall() == []


@pytest.mark.parametrize("suffix", ["_new"])
def test_a_family_aborts_in_one_transaction(db_dsn, tmp_path, suffix):
    create(db_dsn)
    plan = write_plan(tmp_path / "family.toml", PLAN)
    described = [s for s in api.check_plan(db_dsn, plan)["family"]["sql"] if s.startswith("ALTER TABLE")]
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # describe == run: the keys plan check printed are the keys the run added to the targets
        (ran,) = conn.execute("SELECT detail->'statements' FROM mover.events WHERE kind = 'family_keys'").fetchone()
    assert ran == described and len(ran) == 3
    # kill -9 inside abort's one transaction: nothing dropped, every table still at the gate
    r = mover(db_dsn, "abort", "family", env={"MOVER_FAULT": "kill@abort:dropped"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT DISTINCT step, state = 'aborted' FROM mover.migrations").fetchall() == [
            ("cutover", False)]
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE %s AND relkind = 'r'",
                            (f"%{suffix}",)).fetchone() == (3,)
    r = mover(db_dsn, "abort", "family/public.orders")  # a table's name is its family's
    assert r.returncode == 0, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT relname FROM pg_class WHERE relname LIKE %s", (f"%{suffix}",)).fetchall() == []
        assert conn.execute("SELECT DISTINCT state FROM mover.migrations").fetchall() == [("aborted",)]
        assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'mover%'").fetchone()[0] == 0
    assert_mirrored(db_dsn)


def test_status_watch_history_and_report_show_each_table_and_the_whole(db_dsn, tmp_path):
    """Each read command shows the family as a whole (its step, the sums) and each table: status
    (JSON and text), the list of migrations (the family once), history, the report (JSON, each
    event naming its table, and the page), watch (its line and its screen)."""
    from rich.console import Console

    from mover.db import Database, bind
    from mover.views import watch

    create(db_dsn)
    plan = write_plan(tmp_path / "family.toml", PLAN)
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    names = ['"public"."customers"', '"public"."orders"', '"public"."invoices"']
    rows = [1500, 3000, 2000]

    st = status(db_dsn)
    tables = st["family"]["tables"]
    assert [t["tables"]["source"] for t in tables] == names
    assert [t["step"] for t in tables] == ["cutover"] * 3
    assert [t["backfill"]["rows_copied"] for t in tables] == rows
    assert st["backfill"]["rows_copied"] == sum(rows)  # the whole: the sum of its tables'
    assert st["reconcile"]["rows_compared"] == sum(t["reconcile"]["rows_compared"] for t in tables) >= sum(rows)
    text = mover(db_dsn, "status", "family").stdout
    for name, n in zip(names, rows, strict=True):
        assert f"table {name}" in text and f"{n:,} rows copied" in text, text
    every = json.loads(mover(db_dsn, "status", "--json").stdout)
    assert [m["name"] for m in every] == ["family"]  # a family is listed once

    (entry,) = json.loads(mover(db_dsn, "history", "--json").stdout)
    assert entry["name"] == "family"
    assert [t["name"] for t in entry["tables"]] == ["family/public.orders", "family/public.invoices"]

    db = Database(db_dsn)
    try:
        snap = db.transaction(bind(watch.snapshot, "family"))
    finally:
        db.close()
    line = watch.line(snap)
    assert "| backfill 6,500 rows" in line, line
    for name, n in zip(names, rows, strict=True):
        assert f"{name} cutover/waiting {n:,} copied 0 pending" in line, line
    console = Console(record=True, width=200)
    console.print(watch.screen(snap))
    screen = console.export_text()
    assert "tables" in screen and all(name in screen for name in names), screen

    r = mover(db_dsn, "cutover", "family")
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "retire", "family", "--force")
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "watch", "family", "--interval", "30", timeout=60)  # done: one line, then it ends
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if " | family | " in ln]
    assert all(f"{name} retire/done {n:,} copied" in line for name, n in zip(names, rows, strict=True)), line

    page = tmp_path / "report.html"
    r = mover(db_dsn, "report", "family", "--json", "--html", str(page))
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)
    assert [t["tables"]["source"] for t in model["status"]["family"]["tables"]] == names
    assert {e["table"] for e in model["events"]} == set(names)
    swaps = [e for e in model["events"] if e["kind"] == "family_swapped"]
    assert len(swaps) == 1 and swaps[0]["detail"]["lock_ms"] > 0  # one swap, its lock hold
    each = page.read_text().split("id='tables'>Each table</h2>")[1]  # the page's section of its own
    assert all(html.escape(name) in each for name in names), each[:2000]


def test_the_familys_reconcile_checks_the_keys_between_its_tables(db_dsn, tmp_path):
    """The family's reconcile (its step, and `mover reconcile`) checks with a plain query that no
    row of a target references a missing row: a parent deleted behind the keys' back
    (session_replication_role = replica) fails it, naming the rows, the tables and the key."""
    create(db_dsn)
    plan = write_plan(tmp_path / "family.toml", PLAN)
    # Killed inside the first reconcile pass: the keys are on the targets by then.
    r = mover(db_dsn, "run", plan, env={"MOVER_FAULT": "kill@reconcile_range:1"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        (keys,) = conn.execute("SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND convalidated"
                               " AND conrelid IN ('orders_new'::regclass, 'invoices_new'::regclass)").fetchone()
        assert keys == 3
        conn.execute("SET session_replication_role = replica")
        (customer,) = conn.execute("SELECT customer_id FROM orders_new WHERE customer_id NOT IN"
                                   " (SELECT customer_id FROM invoices_new) LIMIT 1").fetchone()
        conn.execute("DELETE FROM customers_new WHERE id = %s", (customer,))
    orphan = ('rows of "public"."orders_new" reference no row of "public"."customers_new"'
              " (foreign key orders_customer_id_fkey)")
    r = mover(db_dsn, "run", "family")
    assert r.returncode == 1 and orphan in r.stderr, r.stderr
    assert "invoices_new" not in r.stderr.split("next:")[0]  # only the key that finds orphans
    r = mover(db_dsn, "reconcile", "family")
    assert r.returncode == 1 and orphan in r.stderr, r.stderr
    # Put back, the family's reconcile passes and says how many keys it checked.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO customers_new SELECT * FROM customers WHERE id = %s", (customer,))
    r = mover(db_dsn, "reconcile", "family")
    assert r.returncode == 0, r.stderr
    assert "3 foreign keys between the tables hold" in r.stdout, r.stdout
    r = mover(db_dsn, "reconcile", "family", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["pass"]
    assert p["foreign_keys_checked"] == 3 and [t["table"] for t in p["tables"]] == [
        '"public"."customers"', '"public"."orders"', '"public"."invoices"']
    r = mover(db_dsn, "run", "family")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr


def test_a_blocker_on_any_table_of_the_family_is_named_and_nothing_is_swapped(db_dsn, tmp_path):
    """The family's swap takes its locks as one table's does (lockwatch: lock_timeout, attempts,
    blockers named, autovacuum paused and restored, terminate_blockers): a session holding the
    last table the swap locks (invoices, referenced by none) makes it give up with every table
    unswapped, naming the session; with terminate_blockers the session is ended and all swap."""
    create(db_dsn)
    plan = write_plan(tmp_path / "family.toml", PLAN + '\n[cutover]\nlock_timeout = "200ms"\nattempts = 2\n')
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    # kill -9 with autovacuum paused on the six tables: the next run puts every setting back.
    r = mover(db_dsn, "cutover", "family", env={"MOVER_FAULT": "kill@lock:paused"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    paused = ("SELECT count(*) FROM pg_class WHERE relname ~ '^(customers|orders|invoices)(_new)?$'"
              " AND reloptions = '{autovacuum_enabled=false}'")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute(paused).fetchone() == (6,)
    r = mover(db_dsn, "run", "family")
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute(paused).fetchone() == (0,)
    blocker = psycopg.connect(db_dsn, application_name="app-report")
    blocker.execute("SELECT count(*) FROM invoices")  # idle in a transaction: ACCESS SHARE held
    pid = blocker.info.backend_pid
    try:
        r = mover(db_dsn, "cutover", "family")
        assert r.returncode == 3, r.stderr
        err = " ".join(r.stderr.split())
        assert f"pid {pid} (user " in err and "'app-report'" in err, err
        st = status(db_dsn)
        assert st["step"] == "cutover" and all(t["cutover"] is None for t in st["family"]["tables"])
        assert f"pid {pid}" in st["error"]
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            # Nothing swapped, nothing left paused.
            assert conn.execute("SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid ="
                                " 'customers'::regclass AND attname = 'id'").fetchone() == ("integer",)
            assert conn.execute("SELECT count(*) FROM pg_class WHERE relname ~ '^(customers|orders|invoices)'"
                                " AND reloptions IS NOT NULL").fetchone() == (0,)
        assert mover(db_dsn, "set", "family", "cutover.terminate_blockers=true",
                     "cutover.blocker_grace=300ms").returncode == 0
        r = mover(db_dsn, "cutover", "family")
        assert r.returncode == 0, r.stderr
        with pytest.raises(psycopg.OperationalError):
            blocker.execute("SELECT 1")
    finally:
        blocker.close()
    st = status(db_dsn)
    assert st["step"] == "rollback_window"
    assert {t["cutover"]["at"] for t in st["family"]["tables"]} == {st["cutover"]["at"]}
    assert_mirrored(db_dsn)
    assert_mirrored(db_dsn, "_old")



def test_the_swap_locks_first_the_table_an_attempt_timed_out_on(db_dsn, tmp_path):
    """Race 9: the application takes the family's tables in an order of its own. One writer holds
    customers a moment at a time (an update, then 50 ms in its transaction), the others insert
    orders (the order first, then customers for the key check). The swap's first order
    (customers, referenced, first) waits for customers, the inserts queue behind it holding
    orders, and its wait for orders is a cycle: the attempt gives up. The next one locks orders
    first and swaps while they all write; the application sees no error, no deadlock among them."""
    create(db_dsn)
    slow = write_plan(tmp_path / "slow.toml", PLAN + '\n[cutover]\nlock_timeout = "1s"\n')
    warned = [line for line in api.check_plan(db_dsn, slow)["family"]["sql"] if "deadlock_timeout" in line]
    assert len(warned) == 1 and "(1000ms)" in warned[0], warned  # the server's default: 1s, not below it
    plan = write_plan(tmp_path / "family.toml", PLAN + '\n[cutover]\nlock_timeout = "300ms"\nattempts = 4\n')
    assert not [line for line in api.check_plan(db_dsn, plan)["family"]["sql"] if "deadlock_timeout" in line]
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr

    def hold_customer(conn: psycopg.Connection, rnd: random.Random) -> None:
        with conn.transaction():
            conn.execute("UPDATE customers SET note = 'held' WHERE id = %s", (rnd.randint(1, 1500),))
            conn.execute("SELECT pg_sleep(0.05)")

    def insert_order(conn: psycopg.Connection, rnd: random.Random) -> None:
        conn.execute("INSERT INTO orders (customer_id, amount) VALUES (%s, 1)", (rnd.randint(1, 1500),))

    writers = [AppWriter(db_dsn, seed=1, each=hold_customer).start(),
               *(AppWriter(db_dsn, seed=2 + i, each=insert_order).start() for i in range(3))]
    try:
        for w in writers:
            w.wait_for_ops(5)
        r = mover(db_dsn, "cutover", "family")
        assert r.returncode == 0, r.stderr
        for w in writers:  # still writing, to the new tables
            w.wait_for_ops(w.ops + 5)
    finally:
        for w in writers:
            w.halt()
    assert [w.errors for w in writers] == [[]] * 4
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        (attempt,) = conn.execute("SELECT (detail->>'attempt')::int FROM mover.events"
                                  " WHERE kind = 'family_swapped'").fetchone()
        swaps = conn.execute("SELECT count(*) FROM mover.events e JOIN mover.migrations m ON m.id ="
                             " e.migration_id WHERE m.name = 'family' AND e.kind = 'family_swapped'").fetchone()
    assert attempt >= 2 and swaps == (1,), attempt  # the first attempt met the cycle (else: nothing tested)


OUTSIDE = """
CREATE TABLE regions (id int PRIMARY KEY);
INSERT INTO regions SELECT generate_series(1, 3);
CREATE TABLE customers (id serial PRIMARY KEY, region_id int NOT NULL REFERENCES regions);
CREATE TABLE orders (id serial PRIMARY KEY, customer_id int NOT NULL REFERENCES customers ON DELETE CASCADE);
CREATE TABLE payments (id serial PRIMARY KEY, order_id bigint REFERENCES orders,
                       customer_id bigint NOT NULL REFERENCES customers);
INSERT INTO customers (region_id) SELECT 1 + g % 3 FROM generate_series(1, 300) g;
INSERT INTO orders (customer_id) SELECT 1 + g % 300 FROM generate_series(1, 600) g;
INSERT INTO payments (order_id, customer_id) SELECT id, customer_id FROM orders WHERE id % 2 = 0;
"""


def test_keys_from_and_to_tables_outside_the_family_are_moved_as_for_one_table(db_dsn, tmp_path):
    """A table outside the family that references two of its tables (payments, its columns bigint
    already: nothing to widen) and a key from the family to a table outside it (customers to
    regions): the swap moves them to the tables taking the names, validated after the lock, and
    the rollback moves them back; the keys between the family's tables stay with their tables."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(OUTSIDE)
    plan = write_plan(tmp_path / "family.toml", PLAN.split("[[also]]")[0] + """
[[also]]
source = "public.orders"
columns = { customer_id = "bigint" }

[rollback]
window = "1h"
""")
    check = api.check_plan(db_dsn, plan)
    assert check["also"] == []  # payments' columns are as wide as the keys become

    def keys() -> dict[str, tuple[int, int, bool]]:
        """Every foreign key of the schema: (table, referenced table) oids and whether validated."""
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            return {f"{r[0]}.{r[1]}": (r[2], r[3], r[4]) for r in conn.execute(
                "SELECT conrelid::regclass::text, conname, conrelid::oid::int, confrelid::oid::int, convalidated"
                " FROM pg_constraint WHERE contype = 'f' AND connamespace = 'public'::regnamespace").fetchall()}

    def oid(conn, name: str) -> int:
        return conn.execute("SELECT %s::regclass::oid::int", (name,)).fetchone()[0]

    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        old = {t: oid(conn, t) for t in ("customers", "orders")}
        new = {t: oid(conn, f"{t}_new") for t in ("customers", "orders")}
        outside = {t: oid(conn, t) for t in ("payments", "regions")}
    before = keys()

    r = mover(db_dsn, "cutover", "family")
    assert r.returncode == 0, r.stderr
    after = keys()
    # From outside: payments' keys now reference the new tables (taking the names), validated.
    assert after["payments.payments_order_id_fkey"] == (outside["payments"], new["orders"], True)
    assert after["payments.payments_customer_id_fkey"] == (outside["payments"], new["customers"], True)
    # To outside: the live customers (the new table) references regions, validated.
    (to_regions,) = [v for k, v in after.items() if k.startswith("customers.") and v[1] == outside["regions"]]
    assert to_regions == (new["customers"], outside["regions"], True)
    # Between the family's tables: the key stayed with its tables, on both sides.
    assert after["orders.orders_customer_id_fkey"] == (new["orders"], new["customers"], True)
    assert after["orders_old.orders_customer_id_fkey"] == (old["orders"], old["customers"], True)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("INSERT INTO payments (order_id, customer_id) VALUES (1000000, 1)")
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("DELETE FROM customers WHERE id = (SELECT min(customer_id) FROM payments)")

    r = mover(db_dsn, "rollback", "family")
    assert r.returncode == 0, r.stderr
    back = keys()
    assert back["payments.payments_order_id_fkey"] == (outside["payments"], old["orders"], True)
    assert back["payments.payments_customer_id_fkey"] == (outside["payments"], old["customers"], True)
    assert back["orders.orders_customer_id_fkey"] == before["orders.orders_customer_id_fkey"]
    (to_regions,) = [v for k, v in back.items() if k.startswith("customers.") and v[1] == outside["regions"]]
    assert to_regions == (old["customers"], outside["regions"], True)
