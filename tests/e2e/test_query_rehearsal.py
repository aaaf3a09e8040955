"""The query rehearsal (`mover rehearse NAME`, and the cutover's preflight with `[cutover] rehearse
= true`) against statements the application ran and pg_stat_statements recorded, under a writer:

- nothing planted: every statement plans alike on the target (exit 0); an index the target lacks
  (planted by the test after the backfill): the statement that used it is reported as a
  sequential scan (exit 3), the others not;
- a type change that defeats an index for an application's statement (a numeric column made integer,
  compared with a numeric parameter): with `[cutover] rehearse = true` the cutover refuses the swap
  (exit 3, nothing swapped) until the operator turns the rehearsal off; then it swaps, and the
  writer's mirror judges the table;
- the locks: while a rehearsal holds the source's lock (hung at its fault point) that lock is one
  the application's reads and writes never wait for, and a writer whose every statement gives up
  after 100ms of waiting for a lock never fails during rehearsals.

The server is the test's own, with pg_stat_statements preloaded (the suite's server keeps its
settings); PostgreSQL without contrib (the pgserver wheel) cannot start it, and the test says so."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from mover.demo.embedded import EmbeddedPostgres
from tests.workload import Writer, app_execute, assert_oracle, create_orders, finish, hung_at, mover, spawn, write_plan

PLAN = """
[migration]
name = "{name}"
source = 'public."Orders"'

[target]
columns = {{ {columns} }}
{target}

[backfill]
range_rows = 1000

[cutover]
{cutover}

[rollback]
window = "1h"
"""


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres(fast=True, settings={"shared_preload_libraries": "pg_stat_statements"})
    try:
        pg.start()
    except RuntimeError as exc:
        pytest.fail(f"cannot start PostgreSQL with shared_preload_libraries = pg_stat_statements ({exc}); the "
                    f"query rehearsal's tests need the server's contrib modules (Debian: postgresql-15 ships them; "
                    f"MOVER_EMBEDDED=system uses it)", pytrace=False)
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            if not conn.execute("SELECT EXISTS (SELECT 1 FROM pg_available_extensions"
                                " WHERE name = 'pg_stat_statements')").fetchone()[0]:
                pytest.fail("this PostgreSQL has no pg_stat_statements extension (contrib)", pytrace=False)
        yield pg
    finally:
        pg.stop()


def database(server: EmbeddedPostgres, name: str, rows: int = 5000, *, extension: bool = True) -> str:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = server.dsn_for(name)
    assert mover(dsn, "init").returncode == 0
    create_orders(dsn, rows)
    if extension:
        run_sql(dsn, "CREATE EXTENSION pg_stat_statements")
    return dsn


def run_sql(dsn: str, statement: str | sql.Composable, params=None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def application(dsn: str, rounds: int = 30, *, extra: tuple[str, ...] = ()) -> None:
    """The application's reads and writes, so that pg_stat_statements records them (parameters
    bound, as a driver sends them)."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        for i in range(rounds):
            # Mirrored for the oracle (the statement runs as written, RETURNING id added)
            app_execute(conn, "UPDATE {t} SET note = %s WHERE id = %s", (f"a{i}", i + 1))
            app_execute(conn, "UPDATE {t} SET note = %s WHERE id = %s", (f"b{i}", i + 2))
            conn.execute('SELECT id, amount FROM "Orders" WHERE "Account" = %s ORDER BY created_at LIMIT 20', (i,))
            conn.execute('SELECT * FROM public."Orders" WHERE id = %s', (i,))
            for statement in extra:
                conn.execute(statement, (i,))


def rehearse(dsn: str, name: str) -> tuple[int, dict, str]:
    r = mover(dsn, "rehearse", name, "--json")
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {}, r.stderr


def by_text(result: dict, fragment: str) -> dict:
    [found] = [s for s in result["tables"][0]["statements"] if fragment in s["statement"]]
    return found


def test_an_index_the_target_lacks_is_reported_and_nothing_else(server, tmp_path):
    dsn = database(server, "planted", extension=False)
    plan = write_plan(tmp_path / "p.toml", PLAN.format(name="planted", columns='id = "bigint"', target="", cutover=""))
    writer = Writer(dsn, seed=3).start()
    probe = None
    try:
        r = mover(dsn, "run", plan)
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        # Without the extension: exit 2, saying what to run.
        code, _, err = rehearse(dsn, "planted")
        assert code == 2 and "CREATE EXTENSION pg_stat_statements" in err, err
        run_sql(dsn, "CREATE EXTENSION pg_stat_statements")
        # A second writer whose every statement gives up after 100ms waiting for a lock: the
        # rehearsals below must never make it wait that long.
        probe = Writer(dsn + "?options=-c%20lock_timeout%3D100ms", seed=4).start()
        application(dsn)

        code, result, err = rehearse(dsn, "planted")
        assert code == 0, err
        t = result["tables"][0]
        assert t["analyzed"] and t["marked"] == 0 and t["rehearsed"] >= 4, t
        # Nothing marked; the test's own setup (create_orders' INSERT over generate_series($1, $2))
        # does not plan with its parameters' types unknown: left out, saying so.
        assert set(t["verdicts"]) <= {"same", "changed", "skipped"}, t["verdicts"]
        for s in t["statements"]:
            assert s["verdict"] != "skipped" or "generate_series" in s["statement"], s
        for fragment in ('UPDATE "Orders" SET note = $1 WHERE id = $2', 'public."Orders" WHERE id = $1'):
            assert by_text(result, fragment)["verdict"] == "same", by_text(result, fragment)
        lookup = by_text(result, '"Account" = $1')
        assert lookup["verdict"] == "same" and lookup["before"]["indexes"] == ['Orders by account'] == \
            lookup["after"]["indexes"], lookup

        # The rehearsals changed nothing: judged at the gate (which drains the log), writers paused.
        writer.pause()
        probe.pause()
        assert mover(dsn, "run", "planted").returncode == 3
        assert_oracle(dsn, "Orders", "Orders_new")
        writer.resume()
        probe.resume()

        # Planted: the target loses its copy of the index on "Account" (a shape change that the
        # next step would refuse; the rehearsal reads plans only).
        [(index,)] = run_sql(dsn, "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                                  " WHERE i.indrelid = '\"Orders_new\"'::regclass AND NOT i.indisprimary")
        run_sql(dsn, sql.SQL("DROP INDEX {}").format(sql.Identifier("public", index)))
        code, result, err = rehearse(dsn, "planted")
        assert code == 3, err
        assert "read it sequentially where the source's plan uses an index" in " ".join(err.split()), err
        lookup = by_text(result, '"Account" = $1')
        assert lookup["verdict"] == "seq_scan" and lookup["marked"], lookup
        assert lookup["before"]["indexes"] == ['Orders by account'] and lookup["after"]["indexes"] == []
        marked = [s["statement"] for s in result["tables"][0]["statements"] if s["marked"]]
        assert marked == [lookup["statement"]], marked
        # The text output names it too.
        text = mover(dsn, "rehearse", "planted", env={"COLUMNS": "400"})
        assert text.returncode == 3 and "SEQ SCAN" in text.stdout and '"Account" = $1' in text.stdout, text.stdout
    finally:
        writer.halt()
        if probe is not None:
            probe.halt()
    assert writer.errors == [] and probe.errors == [], (writer.errors[:3], probe.errors[:3])


def test_the_cutover_refuses_a_statement_a_type_change_slows_down_until_told(server, tmp_path):
    dsn = database(server, "preflight")
    # The application compares a numeric column with a numeric parameter; made integer, the column
    # is cast to numeric for that comparison, and its index no longer serves it.
    run_sql(dsn, 'ALTER TABLE "Orders" ADD COLUMN code numeric')
    run_sql(dsn, 'UPDATE "Orders" SET code = id % 2000')
    run_sql(dsn, 'CREATE INDEX "Orders by code" ON "Orders" (code)')
    run_sql(dsn, 'ANALYZE "Orders"')
    plan = write_plan(tmp_path / "p.toml", PLAN.format(name="preflight", columns='code = "integer"',
                                                        target='accept_lossy = ["code"]', cutover="rehearse = true"))
    assert "[cutover] rehearse" in mover(dsn, "plan", "check", plan).stdout
    writer = Writer(dsn, seed=5).start()
    try:
        r = mover(dsn, "run", plan)
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        application(dsn, extra=('SELECT id FROM "Orders" WHERE code = %s::numeric',))
        r = mover(dsn, "cutover", "preflight")
        assert r.returncode == 3, r.stderr
        err = " ".join(r.stderr.split())
        assert "read it sequentially where the source's plan uses an index" in err, err
        assert "cutover.rehearse=false" in err, err
        status = json.loads(mover(dsn, "status", "preflight", "--json").stdout)
        assert status["step"] == "cutover" and status["cutover"] is None, status  # nothing swapped
        [(detail,)] = run_sql(dsn, "SELECT detail FROM mover.events WHERE kind = 'rehearsal'")
        assert detail["marked"] == 1, detail
        code, result, _ = rehearse(dsn, "preflight")
        slower = by_text(result, "code = $1::numeric")
        assert code == 3 and slower["verdict"] == "seq_scan", slower
        assert slower["before"]["indexes"] == ["Orders by code"] and slower["after"]["indexes"] == [], slower
        # The operator decides to go ahead.
        assert mover(dsn, "set", "preflight", "cutover.rehearse=false").returncode == 0
        r = mover(dsn, "cutover", "preflight")
        assert r.returncode == 0, r.stderr
        writer.pause()
        assert_oracle(dsn, "Orders")
        writer.resume()
    finally:
        writer.halt()
    assert writer.errors == [], writer.errors[:3]


def test_a_rehearsal_holds_no_lock_a_writer_waits_for(server, tmp_path):
    dsn = database(server, "locks")
    plan = write_plan(tmp_path / "p.toml", PLAN.format(name="locks", columns='id = "bigint"', target="", cutover=""))
    assert mover(dsn, "run", plan).returncode == 3
    run_sql(dsn, "SELECT pg_stat_statements_reset()")
    application(dsn)  # its UPDATE is the most called: rehearsed first, its plan on the source a write's
    release = tmp_path / "release"
    proc = spawn(dsn, "rehearse", "locks", env={"MOVER_FAULT": "hang@rehearsal:source_planned",
                                                "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert hung_at(proc, "rehearsal:source_planned")
        held = run_sql(dsn, "SELECT l.mode FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                            " WHERE a.application_name LIKE 'mover%%' AND l.relation = '\"Orders\"'::regclass")
        modes = {m for (m,) in held}
        assert modes and modes <= {"AccessShareLock", "RowExclusiveLock"}, modes
        # The application's reads and writes go on meanwhile, none waiting for a lock.
        with psycopg.connect(dsn, autocommit=True) as app:
            app.execute("SET lock_timeout = '50ms'")
            app_execute(app, "UPDATE {t} SET note = %s WHERE id = 7", ("during",))
            app_execute(app, "INSERT INTO {t} (\"Account\", amount) VALUES (1, 1)")
            app_execute(app, "DELETE FROM {t} WHERE id = 9")
            app.execute('SELECT count(*) FROM "Orders"')
    finally:
        release.touch()
        code, err = finish(proc, 120)
    assert code == 0, err
    assert run_sql(dsn, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                        " WHERE a.application_name LIKE 'mover%%'")[0][0] == 0


FAMILY = """
CREATE TABLE customers (id int PRIMARY KEY, name text);
INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 2000) g;
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers, code numeric);
INSERT INTO orders SELECT g, 1 + g % 2000, g % 2000 FROM generate_series(1, 20000) g;
CREATE INDEX orders_by_customer ON orders (customer_id);
CREATE INDEX orders_by_code ON orders (code);
ANALYZE customers, orders;
"""

FAMILY_PLAN = """
[migration]
name = "family"
source = "public.customers"

[target]
columns = { id = "bigint" }

[[also]]
source = "public.orders"
columns = { customer_id = "bigint", code = "integer" }
accept_lossy = ["code"]

[cutover]
rehearse = true

[rollback]
window = "1h"
"""


def test_a_family_rehearses_every_table_and_its_cutover_refuses_a_slower_one(server, tmp_path):
    """A family (issue 27): `mover rehearse` plans the statements of every table on its target, and
    the family's cutover with `[cutover] rehearse = true` refuses the swap of all (nothing swapped)
    while a statement on any table (here the second: a numeric column made integer, compared with
    a numeric parameter) plans markedly worse."""
    dsn = database(server, "family_rehearsal", rows=10)
    run_sql(dsn, FAMILY)
    r = mover(dsn, "run", write_plan(tmp_path / "family.toml", FAMILY_PLAN))
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        for i in range(30):
            conn.execute("SELECT * FROM customers WHERE id = %s", (i,))
            conn.execute("SELECT id FROM orders WHERE customer_id = %s", (i,))
            conn.execute("SELECT id FROM orders WHERE code = %s::numeric", (i,))

    code, result, err = rehearse(dsn, "family/public.orders")  # a table's name is its family's
    assert code == 3, err
    assert [(t["source"], t["marked"]) for t in result["tables"]] == [('"public"."customers"', 0),
                                                                     ('"public"."orders"', 1)], result["tables"]
    [slower] = [s for s in result["tables"][1]["statements"] if s["marked"]]
    assert "code = $1::numeric" in slower["statement"] and slower["verdict"] == "seq_scan", slower
    customer = [s for s in result["tables"][0]["statements"] if "customers WHERE id = $1" in s["statement"]]
    assert [s["verdict"] for s in customer] == ["same"], customer

    r = mover(dsn, "cutover", "family")
    assert r.returncode == 3, r.stderr
    err = " ".join(r.stderr.split())
    assert 'plan markedly worse on "public"."orders_new" than on "public"."orders"' in err, err
    st = json.loads(mover(dsn, "status", "family", "--json").stdout)
    assert st["step"] == "cutover" and all(t["cutover"] is None for t in st["family"]["tables"]), st
    assert mover(dsn, "set", "family", "cutover.rehearse=false").returncode == 0
    r = mover(dsn, "cutover", "family")
    assert r.returncode == 0, r.stderr
