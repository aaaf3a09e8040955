"""The catalog features PostgreSQL 17 and 18 added, each migrated under a writer through the cutover,
the rollback, a second cutover and the retire, on the version that has it (each test asks the server
and skips, saying why, where it lacks the feature; CI runs this file on 17 and 18). Judged twice: by
the writer's mirror (assert_oracle: every committed write is in the table that carries the name) and
by the catalog: the feature's rows in pg_constraint / pg_attribute / pg_class of the table that
carries the name are, after each step, those of the original before the migration.

What mover does with each catalog change of 17 and 18: docs/operating.md, "Server versions"."""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import sql

from tests.e2e import test_partitioning as parts
from tests.workload import Writer, WriterThread, assert_oracle, create_orders, mover, write_plan


def query(dsn: str, q: str, *params):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(q, params).fetchall()


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def require(dsn: str, what: str, *probe: str) -> None:
    """Skip unless the server runs `probe` (rolled back): the feature is asked of the server."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        try:
            with conn.transaction(force_rollback=True):
                for statement in probe:
                    conn.execute(statement)
        except psycopg.Error as exc:
            pytest.skip(f"PostgreSQL {version} has no {what} ({type(exc).__name__}: {str(exc).splitlines()[0]})")


def plan(tmp_path, name: str, source: str, body: str) -> str:
    return write_plan(tmp_path / f"{name}.toml", f'[migration]\nname = "{name}"\nsource = \'{source}\'\n\n{body}\n'
                                                 '[backfill]\nrange_rows = 500\n\n[rollback]\nwindow = "1h"\n')


def lifecycle(dsn: str, tmp_path, name: str, plan_path: str, writer: WriterThread, table: str,
              judge: Callable[[str, str], None], catalog: Callable[[str], object]) -> None:
    """run to the gate, cutover, the window's sync, rollback, run, cutover again, retire: after
    each, with the writer paused and the log drained, `judge(live, other)` (the oracle on both
    tables) and the catalog of the table carrying the name compared with the original's."""
    original = catalog(table)

    def settle(live: str, other: str | None, step: str) -> None:
        writer.pause()
        try:
            r = mover(dsn, "run", name)
            assert r.returncode == 3, f"{step}: {r.stderr}"
            judge(live, other or live)
            assert catalog(table) == original, f"{step}: the catalog of {table} changed"
        finally:
            writer.resume()

    r = mover(dsn, "run", plan_path)
    assert r.returncode == 3 and f"mover cutover {name}" in r.stderr, r.stderr
    st = json.loads(mover(dsn, "status", name, "--json").stdout)
    assert st["divergences"] == 0, st  # not one row became an apply_error
    r = mover(dsn, "parity", name, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["equal"], r.stdout + r.stderr
    settle(table, f"{table}_new", "at the gate")
    r = mover(dsn, "cutover", name)
    assert r.returncode == 0, r.stderr
    settle(table, f"{table}_old", "after the cutover")
    r = mover(dsn, "rollback", name)
    assert r.returncode == 0, r.stderr
    settle(table, f"{table}_new", "after the rollback")
    r = mover(dsn, "cutover", name)
    assert r.returncode == 0, r.stderr
    settle(table, f"{table}_old", "after the second cutover")
    r = mover(dsn, "retire", name, "--force")
    assert r.returncode == 0, r.stderr
    writer.pause()
    judge(table, table)
    assert catalog(table) == original, "after the retire"
    r = mover(dsn, "parity", name, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["equal"], r.stdout + r.stderr


def constraints(dsn: str, table: str) -> list[tuple]:
    """The table's constraints as the catalog states them (18: conenforced too), mover's names aside."""
    has = query(dsn, "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'pg_constraint'::regclass"
                     " AND attname = 'conenforced')")[0][0]
    enforced = "k.conenforced" if has else "true"
    return query(dsn, f"SELECT k.conname, k.contype, pg_get_constraintdef(k.oid), k.convalidated, k.connoinherit,"
                      f" {enforced}, obj_description(k.oid, 'pg_constraint') FROM pg_constraint k"
                      f" WHERE k.conrelid = %s::regclass AND k.contype IN ('c', 'n', 'f') ORDER BY 1", f'"{table}"')


def columns(dsn: str, table: str) -> list[tuple]:
    return query(dsn, "SELECT attname, attnotnull, attidentity, attgenerated, pg_get_expr(d.adbin, d.adrelid)"
                      " FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
                      " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                 f'"{table}"')


def own_errors(writer: Writer) -> list[str]:
    """The writer's errors but those its own constraint makes: under NOT NULL tag NOT VALID the
    application cannot write a new version of an old row whose tag is NULL (on the source as on
    the new table; the failed statement's mirror write fails with it)."""
    return [e for e in writer.errors if 'null value in column "tag"' not in e]


def orders_judge(dsn: str) -> Callable[[str, str], None]:
    return lambda live, other: assert_oracle(dsn, live, other)


# ---------------------------------------------------------------------------------------------
# PostgreSQL 18: NOT NULL constraints in pg_constraint (names, NOT VALID, NO INHERIT), CHECK and
# FOREIGN KEY NOT ENFORCED


def test_18_not_null_constraints_keep_their_names_and_states_and_a_null_row_is_no_divergence(db_dsn, tmp_path):
    """The issue's example: ADD CONSTRAINT ... NOT NULL ... NOT VALID over rows holding NULL. The
    backfill copies them (the target gets the constraint NOT VALID at the swap, not before), no
    apply_error; the name of every NOT NULL, its NO INHERIT and its validation state are the
    original's after each step; NOT ENFORCED constraints stay not enforced."""
    require(db_dsn, "NOT NULL ... NOT VALID (PostgreSQL 18)",
            "CREATE TABLE probe (a int)", "ALTER TABLE probe ADD CONSTRAINT a_nn NOT NULL a NOT VALID")
    create_orders(db_dsn, 3000)
    execute(db_dsn,
            'ALTER TABLE "Orders" ADD COLUMN tag text DEFAULT \'t\'',
            'UPDATE "Orders" SET tag = NULL WHERE id % 50 = 0',
            'ALTER TABLE "Orders" ADD CONSTRAINT tag_nn NOT NULL tag NOT VALID',
            'COMMENT ON CONSTRAINT tag_nn ON "Orders" IS \'old rows may hold NULL\'',
            'ALTER TABLE "Orders" ADD COLUMN region text CONSTRAINT "Region set" NOT NULL DEFAULT \'eu\'',
            'ALTER TABLE "Orders" ADD COLUMN src text DEFAULT \'w\'',
            'ALTER TABLE "Orders" ADD CONSTRAINT src_nn NOT NULL src NO INHERIT',
            'CREATE TABLE accounts (id int PRIMARY KEY)',
            'ALTER TABLE "Orders" ADD CONSTRAINT account_fk FOREIGN KEY ("Account") REFERENCES accounts NOT ENFORCED',
            'ALTER TABLE "Orders" ADD CONSTRAINT small_amount CHECK (amount < 10) NOT ENFORCED')
    nulls = {r[0] for r in query(db_dsn, 'SELECT id FROM "Orders" WHERE tag IS NULL')}
    assert nulls
    p = plan(tmp_path, "orders", 'public."Orders"', '[target]\ncolumns = { id = "bigint" }\n')
    r = mover(db_dsn, "plan", "check", p, "--sql")
    assert r.returncode == 0, r.stdout + r.stderr
    checked = " ".join(r.stdout.split())
    assert 'ALTER TABLE "public"."Orders_new" DROP CONSTRAINT "tag_nn"' in checked
    assert 'ALTER TABLE "public"."Orders_new" ADD CONSTRAINT "tag_nn" NOT NULL tag NOT VALID' in checked

    def judge(live: str, other: str) -> None:
        assert_oracle(db_dsn, live, other)
        # The old rows' NULLs are kept (the application can only delete those rows: the constraint
        # refuses any new version of them), and no new one got in.
        held = [{r[0] for r in query(db_dsn, f'SELECT id FROM "{t}" WHERE tag IS NULL')} for t in (live, other)]
        assert held[0] == held[1] and held[0] <= nulls and len(held[0]) > len(nulls) // 2, held

    writer = Writer(db_dsn).start()
    try:
        lifecycle(db_dsn, tmp_path, "orders", p, writer, "Orders", judge,
                  lambda t: (constraints(db_dsn, t), columns(db_dsn, t)))
    finally:
        writer.halt()
    assert own_errors(writer) == [] and writer.ops > 50
    # The table that carries the name still refuses a new NULL, still takes what is not enforced.
    with pytest.raises(psycopg.errors.NotNullViolation):
        execute(db_dsn, 'INSERT INTO "Orders" ("Account", tag) VALUES (1, NULL)')
    execute(db_dsn, 'INSERT INTO "Orders" ("Account", amount) VALUES (-5, 99)')


def test_18_validating_a_not_valid_not_null_mid_migration_is_adopted(db_dsn, tmp_path):
    """The second half of the routine deploy, as for CHECKs: the application fixes the NULLs and
    validates the constraint on the source while mover works; `mover adopt` adds it, validated,
    to the target (created without it), and the swap keeps it validated."""
    require(db_dsn, "NOT NULL ... NOT VALID (PostgreSQL 18)",
            "CREATE TABLE probe (a int)", "ALTER TABLE probe ADD CONSTRAINT a_nn NOT NULL a NOT VALID")
    create_orders(db_dsn, 2000)
    execute(db_dsn, 'ALTER TABLE "Orders" ADD COLUMN tag text DEFAULT \'t\'',
            'UPDATE "Orders" SET tag = NULL WHERE id % 50 = 0',
            'ALTER TABLE "Orders" ADD CONSTRAINT tag_nn NOT NULL tag NOT VALID')
    p = plan(tmp_path, "orders", 'public."Orders"', '[target]\ncolumns = { id = "bigint" }\n')
    writer = Writer(db_dsn).start()
    try:
        r = mover(db_dsn, "run", p)
        assert r.returncode == 3, r.stderr
        execute(db_dsn, 'UPDATE "Orders" SET tag = \'fixed\' WHERE tag IS NULL')
        assert mover(db_dsn, "run", "orders").returncode == 3  # the fix replayed into the target
        execute(db_dsn, 'ALTER TABLE "Orders" VALIDATE CONSTRAINT tag_nn')
        r = mover(db_dsn, "run", "orders")
        assert r.returncode == 2 and "tag_nn" in r.stderr and "mover adopt orders" in r.stderr, r.stderr
        r = mover(db_dsn, "adopt", "orders")
        assert r.returncode == 0, r.stderr
        assert mover(db_dsn, "run", "orders").returncode == 3
        writer.pause()
        assert mover(db_dsn, "run", "orders").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_new")
        writer.resume()
        r = mover(db_dsn, "cutover", "orders")
        assert r.returncode == 0, r.stderr
        writer.pause()
        assert_oracle(db_dsn, "Orders")
    finally:
        writer.halt()
    assert own_errors(writer) == []
    assert query(db_dsn, "SELECT convalidated, pg_get_constraintdef(oid) FROM pg_constraint"
                         " WHERE conrelid = '\"Orders\"'::regclass AND conname = 'tag_nn'") == [(True, "NOT NULL tag")]


# ---------------------------------------------------------------------------------------------
# PostgreSQL 18: virtual generated columns


def test_18_virtual_generated_columns_stay_virtual_and_are_never_copied(db_dsn, tmp_path):
    """Virtual generated columns (the default for GENERATED ALWAYS AS on 18) are computed when read:
    the copy and the replay never name them, and where the plan changes the type of a column one
    reads (ALTER TABLE would refuse), mover creates it again, virtual, over the new type."""
    require(db_dsn, "virtual generated columns (PostgreSQL 18)",
            "CREATE TABLE probe (a int, b int GENERATED ALWAYS AS (a * 2) VIRTUAL)")
    create_orders(db_dsn, 3000)
    execute(db_dsn, 'ALTER TABLE "Orders" ADD COLUMN amount_x3 numeric GENERATED ALWAYS AS (amount * 3) VIRTUAL',
            'ALTER TABLE "Orders" ADD COLUMN "Account x2" bigint GENERATED ALWAYS AS ("Account" * 2)',
            'COMMENT ON COLUMN "Orders".amount_x3 IS \'three times\'')
    p = plan(tmp_path, "orders", 'public."Orders"',
             '[target]\ncolumns = { id = "bigint", amount = "numeric(16,2)" }\n')
    r = mover(db_dsn, "plan", "check", p, "--sql")
    assert r.returncode == 0, r.stdout + r.stderr
    checked = " ".join(r.stdout.split())
    assert 'ADD COLUMN "amount_x3" numeric GENERATED ALWAYS AS ((amount * (3)::numeric)) VIRTUAL' in checked
    copies = [line for line in r.stdout.splitlines() if line.lstrip().startswith("INSERT INTO")]
    assert copies and not any("amount_x3" in line or "Account x2" in line for line in copies), copies

    def judge(live: str, other: str) -> None:
        assert_oracle(db_dsn, live, other)
        for t in (live, other):
            assert query(db_dsn, f'SELECT count(*) FROM "{t}" WHERE amount_x3 IS DISTINCT FROM amount * 3'
                                 f' OR "Account x2" IS DISTINCT FROM "Account" * 2')[0][0] == 0, t

    def catalog(t: str):
        # generated kind, expression, position and comment; the types the plan changes aside
        return query(db_dsn, "SELECT attname, attgenerated, pg_get_expr(d.adbin, d.adrelid),"
                             " col_description(a.attrelid, a.attnum) FROM pg_attribute a LEFT JOIN pg_attrdef d"
                             " ON d.adrelid = a.attrelid AND d.adnum = a.attnum WHERE a.attrelid = %s::regclass"
                             " AND a.attgenerated <> '' ORDER BY 1", f'"{t}"')

    assert [r[1] for r in catalog("Orders")] == ["v", "v"]
    writer = Writer(db_dsn).start()
    try:
        # The catalog of the table carrying the name changes only in the planned types.
        lifecycle(db_dsn, tmp_path, "orders", p, writer, "Orders", judge, catalog)
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 50


# ---------------------------------------------------------------------------------------------
# PostgreSQL 18: uuidv7() defaults


UUID_COLUMNS = ("id", "n", "note")


@dataclass
class UuidWriter(WriterThread):
    """The application of a table keyed by uuidv7() defaults: inserts (the key from the default,
    every new one after all the others), updates, deletes and delete-then-reinsert of a key, each
    mirrored in the same statement."""

    dsn: str
    ops: int = 0
    errors: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    paused: threading.Event = field(default_factory=threading.Event)
    idle: threading.Event = field(default_factory=threading.Event)

    def _loop(self) -> None:
        rnd = random.Random(3)
        with psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None) as conn:
            while not self.stop.is_set():
                if self.paused.is_set():
                    self.idle.set()
                    self.stop.wait(0.01)
                    continue
                self.idle.clear()
                try:
                    op = rnd.random()
                    row = conn.execute("SELECT id FROM tickets TABLESAMPLE SYSTEM (5) LIMIT 1").fetchone()
                    if op < 0.35 or row is None:
                        conn.execute("WITH w AS (INSERT INTO tickets (n, note) VALUES (%s, 'w') RETURNING *)"
                                     " INSERT INTO tickets_mirror SELECT * FROM w", (rnd.randint(0, 10**6),))
                    elif op < 0.7:
                        conn.execute("WITH w AS (UPDATE tickets SET n = n + 1, note = 'u' WHERE id = %s RETURNING *)"
                                     " UPDATE tickets_mirror m SET n = w.n, note = w.note FROM w WHERE m.id = w.id",
                                     row)
                    elif op < 0.85:
                        conn.execute("WITH w AS (DELETE FROM tickets WHERE id = %s RETURNING id)"
                                     " DELETE FROM tickets_mirror m USING w WHERE m.id = w.id", row)
                    else:
                        with conn.transaction():
                            conn.execute("WITH w AS (DELETE FROM tickets WHERE id = %s RETURNING id)"
                                         " DELETE FROM tickets_mirror m USING w WHERE m.id = w.id", row)
                            conn.execute("WITH w AS (INSERT INTO tickets (id, n, note) VALUES (%s, 0, 'r')"
                                         " RETURNING *) INSERT INTO tickets_mirror SELECT * FROM w", row)
                    self.ops += 1
                except psycopg.Error as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")


def test_18_uuidv7_default_key_through_every_step(db_dsn, tmp_path):
    """A key drawn from uuidv7() (18): time-ordered, so every insert lands after every range the
    backfill cut; the default itself is carried (the table that carries the name goes on drawing)."""
    require(db_dsn, "uuidv7() (PostgreSQL 18)", "SELECT uuidv7()")
    execute(db_dsn, "CREATE TABLE tickets (id uuid PRIMARY KEY DEFAULT uuidv7(), n integer NOT NULL, note text)",
            "INSERT INTO tickets (n, note) SELECT g, md5(g::text) FROM generate_series(1, 3000) g",
            "CREATE TABLE tickets_mirror (LIKE tickets)", "ALTER TABLE tickets_mirror ADD PRIMARY KEY (id)",
            "INSERT INTO tickets_mirror SELECT * FROM tickets")
    p = plan(tmp_path, "tickets", "public.tickets", '[target]\ncolumns = { n = "bigint" }\n')

    def judge(live: str, other: str) -> None:
        assert_oracle(db_dsn, live, other, mirror="tickets_mirror", columns=UUID_COLUMNS)

    writer = UuidWriter(db_dsn).start()
    try:
        lifecycle(db_dsn, tmp_path, "tickets", p, writer, "tickets", judge,
                  lambda t: query(db_dsn, "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a"
                                          " ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
                                          " WHERE d.adrelid = %s::regclass AND a.attname = 'id'", t))
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 50
    (version,) = query(db_dsn, "INSERT INTO tickets (n) VALUES (1) RETURNING uuid_extract_version(id)")[0]
    assert version == 7


# ---------------------------------------------------------------------------------------------
# PostgreSQL 17: the MAINTAIN privilege; identity columns on partitioned tables


def test_17_maintain_privilege_follows_the_table(db_dsn, tmp_path):
    """GRANT MAINTAIN (17: VACUUM, ANALYZE, REINDEX, CLUSTER, REFRESH, LOCK TABLE without owning the
    table) is a grant like the others: carried to the new table and back, and the grantee can use it."""
    require(db_dsn, "the MAINTAIN privilege (PostgreSQL 17)", "CREATE TABLE probe (a int)",
            "GRANT MAINTAIN ON probe TO PUBLIC")
    role = f"ops_{uuid.uuid4().hex[:8]}"
    create_orders(db_dsn, 3000)
    execute(db_dsn, f"CREATE ROLE {role} LOGIN", f'GRANT MAINTAIN ON "Orders" TO {role}',
            f'GRANT SELECT ON "Orders" TO {role} WITH GRANT OPTION', 'GRANT MAINTAIN ON "Orders" TO PUBLIC')
    p = plan(tmp_path, "orders", 'public."Orders"', '[target]\ncolumns = { id = "bigint" }\n')

    def grants(t: str):
        return query(db_dsn, "SELECT coalesce(pg_get_userbyid(nullif(a.grantee, 0)), 'PUBLIC'), a.privilege_type,"
                             " a.is_grantable FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = %s::regclass"
                             " AND a.grantee <> c.relowner ORDER BY 1, 2", f'"{t}"')

    assert (role, "MAINTAIN", False) in grants("Orders")
    writer = Writer(db_dsn).start()
    try:
        lifecycle(db_dsn, tmp_path, "orders", p, writer, "Orders", orders_judge(db_dsn), grants)
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 50
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        conn.execute('ANALYZE "Orders"')  # the grantee maintains the new table
        with conn.transaction():
            conn.execute('LOCK TABLE "Orders" IN SHARE UPDATE EXCLUSIVE MODE')


def test_17_identity_column_of_a_table_converted_to_partitions(db_dsn, tmp_path):
    """17 lets partitioned tables have identity columns that their partitions share: the converted
    table keeps drawing from the identity (handed over at the swap and back), direct inserts into
    a partition too, and no value is drawn twice."""
    require(db_dsn, "identity columns on partitioned tables (PostgreSQL 17)",
            "CREATE TABLE probe (id int GENERATED BY DEFAULT AS IDENTITY, at int) PARTITION BY RANGE (at)",
            "CREATE TABLE probe1 PARTITION OF probe FOR VALUES FROM (0) TO (10)", "INSERT INTO probe1 (at) VALUES (1)")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(parts.EVENTS_DDL.replace("id bigserial PRIMARY KEY",
                                              "id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
                     .replace("%s", "2000"))
    p = parts.plan_file(tmp_path, parts.MONTHLY_DEFAULT)

    def judge(live: str, other: str) -> None:
        parts.assert_oracle(db_dsn, live, other)

    def identity(t: str):
        # the parent's identity and the sequence it draws from, by name
        return query(db_dsn, "SELECT a.attidentity, pg_get_serial_sequence(%s, 'id') FROM pg_attribute a"
                             " WHERE a.attrelid = %s::regclass AND a.attname = 'id'", t, t)

    writer = parts.EventWriter(db_dsn).start()
    try:
        original = identity("events")
        lifecycle(db_dsn, tmp_path, "events_part", p, writer, "events", judge, identity)
        assert identity("events") == original
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 50
    # Every partition shares the identity: a direct insert draws the next value, never a used one.
    (top,) = query(db_dsn, "SELECT max(id) FROM events_mirror")[0]
    (leaf, through_parent) = query(db_dsn, "INSERT INTO events (created_at, tenant_id, region)"
                                           " VALUES (now(), 1, 'de') RETURNING tableoid::regclass::text, id")[0]
    assert leaf != "events" and through_parent > top
    assert query(db_dsn, "SELECT attidentity FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'id'",
                 leaf) == [("d",)]
    (direct,) = query(db_dsn, f"INSERT INTO {leaf} (created_at, tenant_id, region) VALUES (now(), 1, 'de')"
                              " RETURNING id")[0]
    assert direct > through_parent
