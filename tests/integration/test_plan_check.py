"""Bad plans against a real database, through the CLI: exit 2, a message that names the key or
the object (quoted the way SQL writes it), and not one change in the catalog or in mover's
control tables. A good plan: `plan check` says what it does to each table (with --sql, the seven
steps and their SQL), changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from psycopg import sql

from tests.conftest import connect, dsn_with_dbname
from tests.workload import mover, plan_text, toml_value

STEP_NAMES = ("create_target", "install_capture", "backfill", "reconcile", "cutover", "rollback_window", "retire")
ROOT = Path(__file__).resolve().parents[2]

BASE_SCHEMA = """
CREATE TABLE public.orders (
    id        int PRIMARY KEY,
    customer  text NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now(),
    total     numeric(12,2) CHECK (total >= 0),
    total_x2  numeric GENERATED ALWAYS AS (total * 2) STORED
);
INSERT INTO public.orders (id, customer, placed_at, total)
SELECT g, 'customer ' || g, '2024-01-01'::timestamptz + g * interval '1 hour', g * 1.5
FROM generate_series(1, 50) g;
CREATE SCHEMA "Sales";
CREATE TABLE "Sales"."Order Items" ("Item ID" int PRIMARY KEY, "Qty" int NOT NULL);
INSERT INTO "Sales"."Order Items" SELECT g, g FROM generate_series(1, 10) g;
CREATE SCHEMA other;
"""


# ---------------------------------------------------------------------------------------------
# Helpers


def mover_process(dsn: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "mover", "--dsn", dsn, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def flat(text: str) -> str:
    """Output with its line wrapping undone (rich wraps long lines at the console width)."""
    return " ".join(text.split())


def plan_toml(name: str = "orders-move", source: str = "public.orders", target: str | None = None,
              columns: dict[str, str] | None = None, old_name: str | None = None, window: str = "1h",
              range_rows: int | None = None, accept_lossy: list[str] | None = None) -> str:
    """The plan text, always with a [target] section (some cases add keys to it)."""
    given = {"target": {"name": target, "accept_lossy": accept_lossy}, "backfill": {"range_rows": range_rows},
             "rollback": {"old_name": old_name}}
    sections = {k: {key: v for key, v in keys.items() if v is not None} for k, keys in given.items()}
    return plan_text(name, source, columns=columns, window=window, **{k: v for k, v in sections.items()
                                                                      if v or k == "target"})


def execute(dsn: str, statements: str) -> None:
    if statements.strip():
        with connect(dsn) as conn:
            conn.execute(statements)


_USER = "n.nspname NOT IN ('pg_catalog', 'information_schema')"

_CATALOG_QUERIES = {
    "namespaces": f"SELECT n.nspname, n.nspowner::regrole::text, n.nspacl::text FROM pg_namespace n WHERE {_USER}",
    "relations": f"""
        SELECT n.nspname, c.relname, c.relkind, c.relfilenode, c.relpersistence, c.relhastriggers,
               c.relacl::text, c.reloptions::text, c.relreplident, c.relrowsecurity
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER}""",
    "columns": f"""
        SELECT c.oid::regclass::text, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               a.attisdropped, a.attidentity, a.attgenerated, pg_get_expr(d.adbin, d.adrelid)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE {_USER} AND a.attnum > 0""",
    "constraints": f"""
        SELECT n.nspname, co.conname, co.conrelid::regclass::text, co.contype, co.convalidated,
               pg_get_constraintdef(co.oid)
        FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace WHERE {_USER}""",
    "indexes": f"""
        SELECT i.indexrelid::regclass::text, i.indrelid::regclass::text, i.indisvalid, i.indisready,
               pg_get_indexdef(i.indexrelid)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE {_USER}""",
    "triggers": """
        SELECT t.tgrelid::regclass::text, t.tgname, t.tgenabled, t.tgfoid::regprocedure::text, t.tgisinternal
        FROM pg_trigger t""",
    "functions": f"""
        SELECT p.oid::regprocedure::text, md5(p.prosrc)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE {_USER}""",
    "types": f"""
        SELECT n.nspname, t.typname, t.typtype
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE {_USER}""",
    "rules": "SELECT r.ev_class::regclass::text, r.rulename, md5(r.ev_action::text) FROM pg_rewrite r"
             " WHERE r.ev_class >= 16384",
    "sequences": "SELECT schemaname, sequencename, last_value FROM pg_sequences",
    "comments": "SELECT classoid::regclass::text, objoid, objsubid, md5(description) FROM pg_description"
                " WHERE objoid >= 16384",
    "extensions": "SELECT extname, extversion FROM pg_extension",
    "event_triggers": "SELECT evtname FROM pg_event_trigger",
    "publications": "SELECT pubname FROM pg_publication",
}
_CONTROL_TABLES = ("migrations", "steps", "events", "ranges", "divergences", "alembic_version")


def snapshot(dsn: str) -> dict[str, list]:
    """The user-visible catalog, mover's control tables, and the content of every user table."""
    snap: dict[str, list] = {}
    with connect(dsn) as conn:
        for key, query in _CATALOG_QUERIES.items():
            snap[key] = sorted(conn.execute(query).fetchall(), key=repr)
        for table in _CONTROL_TABLES:
            if conn.execute("SELECT to_regclass(%s)", (f"mover.{table}",)).fetchone()[0] is not None:
                rows = conn.execute(sql.SQL("SELECT to_jsonb(t)::text FROM mover.{} t").format(
                    sql.Identifier(table))).fetchall()
                snap[f"mover.{table}"] = sorted(r[0] for r in rows)
        tables = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'mover')"
            # (another session's temporary table cannot be read)
            " AND n.nspname NOT LIKE 'pg\\_toast%' AND c.relpersistence <> 't'").fetchall()
        for schema, name in tables:
            snap[f"data {schema}.{name}"] = conn.execute(sql.SQL(
                "SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {} t"
            ).format(sql.Identifier(schema, name))).fetchall()
    assert snap["relations"], "the snapshot must see something"
    return snap


def assert_bad(result: subprocess.CompletedProcess, fragments: list[str]) -> None:
    message = flat(result.stderr)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in stderr: {message!r}"


def write_plan(tmp_path: Path, text: str, name: str = "plan.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def db(db_dsn: str) -> str:
    execute(db_dsn, BASE_SCHEMA)
    return db_dsn


# ---------------------------------------------------------------------------------------------
# Bad plans that need the live database


INVOICES = """CREATE TABLE customers (id int PRIMARY KEY);
INSERT INTO customers SELECT g FROM generate_series(1, 5) g;
CREATE TABLE invoices (id int PRIMARY KEY, customer_id int REFERENCES customers);
INSERT INTO invoices SELECT g, 1 + g % 5 FROM generate_series(1, 20) g"""


DAILY = """CREATE TABLE daily (id int, day date NOT NULL, PRIMARY KEY (id, day));
INSERT INTO daily SELECT g, current_date - 13 + g FROM generate_series(0, 13) g"""


@dataclass
class Case:
    id: str
    plan: str
    fragments: list[str]
    setup: str = ""
    also_run: bool = False  # check `mover run PLAN` too, not only `mover plan check PLAN`
    extra: dict = field(default_factory=dict)


CASES = [
    # The source
    Case("source-missing", plan_toml(source="public.nope"),
         ["[migration] source", 'table "public"."nope" does not exist'], also_run=True),
    Case("source-unquoted-folds", plan_toml(source='Sales."Order Items"'),
         ["[migration] source", '"sales"."Order Items" does not exist']),
    Case("source-no-key", plan_toml(source="nokey"),
         ['"public"."nokey"', "no primary key or unique index on NOT NULL columns"],
         setup="CREATE TABLE nokey (a int, b text); INSERT INTO nokey VALUES (1, 'x')", also_run=True),
    Case("source-nullable-unique", plan_toml(source="nullable_unique"),
         ['"public"."nullable_unique"', "no primary key"],
         setup="CREATE TABLE nullable_unique (a int UNIQUE, b text NOT NULL)"),
    Case("source-partial-unique", plan_toml(source="partial_unique"),
         ['"public"."partial_unique"', "no primary key"],
         setup="CREATE TABLE partial_unique (a int NOT NULL); CREATE UNIQUE INDEX ON partial_unique (a) WHERE a > 0"),
    Case("source-no-key-mixed-case", plan_toml(source='"Sales"."Log Lines"'),
         ['"Sales"."Log Lines"', "no primary key"],
         setup='CREATE TABLE "Sales"."Log Lines" ("Line" text)'),
    Case("source-view", plan_toml(source="orders_view"),
         ["[migration] source", '"public"."orders_view" is a view'],
         setup="CREATE VIEW orders_view AS SELECT id, total FROM orders", also_run=True),
    Case("source-matview", plan_toml(source="orders_mv"),
         ["[migration] source", '"public"."orders_mv" is a materialized view'],
         setup="CREATE MATERIALIZED VIEW orders_mv AS SELECT id FROM orders; CREATE UNIQUE INDEX ON orders_mv (id)"),
    # A partitioned source: the new table's partitions wait under `<name>_new` until the swap.
    Case("source-partitioned-name-taken", plan_toml(source="parted"),
         ["[migration] source", '"public"."parted_1_new"', "exists"],
         setup="CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id);"
               " CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10);"
               " CREATE TABLE parted_1_new (x int)", also_run=True),
    Case("source-partitioned-detach-pending", plan_toml(source="parted"),
         ["[migration] source", '"public"."parted_1"', "DETACH PARTITION", "FINALIZE"],
         setup="CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id);"
               " CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10);"
               " UPDATE pg_inherits SET inhdetachpending = true WHERE inhrelid = 'parted_1'::regclass"),
    Case("one-table-of-an-ordinary-source", plan_toml() + '[target.partition]\nby = "none"\n',
         ["[target.partition]", 'by = "none"', '"public"."orders" is not partitioned']),
    Case("range-layout-over-max-partitions",
         plan_toml(source="daily").replace("[target]\n", '[target]\n[target.partition]\nby = "range"\n'
                                           'column = "day"\ninterval = "1 day"\nmax_partitions = 12\n'),
         ["[target.partition]: 17 partitions would be created", "at most 12 ([target.partition] max_partitions)",
          "raise max_partitions"],
         setup=DAILY, also_run=True),
    Case("source-control-table", plan_toml(source="mover.migrations"),
         ["[migration] source", '"mover"."migrations" belongs to mover itself']),
    Case("source-system-catalog", plan_toml(source="pg_catalog.pg_class"),
         ["[migration] source", '"pg_catalog"."pg_class"', "system"]),
    # Names that are taken
    Case("target-taken", plan_toml(),
         ["[target] name", '"public"."orders_new" already exists'],
         setup="CREATE TABLE orders_new (x int)", also_run=True),
    Case("target-taken-by-sequence", plan_toml(target="orders_v2"),
         ["[target] name", '"public"."orders_v2" already exists'],
         setup="CREATE SEQUENCE orders_v2"),
    Case("target-taken-by-type", plan_toml(target="orders_v2"),
         ["[target] name", '"public"."orders_v2"', "already exists"],
         setup="CREATE TYPE orders_v2 AS ENUM ('a')", also_run=True),
    Case("target-taken-mixed-case", plan_toml(source='"Sales"."Order Items"'),
         ["[target] name", '"Sales"."Order Items_new" already exists'],
         setup='CREATE TABLE "Sales"."Order Items_new" (x int)'),
    Case("old-name-taken", plan_toml(),
         ["[rollback] old_name", '"public"."orders_old" already exists'],
         setup="CREATE TABLE orders_old (x int)", also_run=True),
    Case("old-name-taken-quoted", plan_toml(old_name='"Orders ""Before"""'),
         ["[rollback] old_name", '"public"."Orders ""Before""" already exists'],
         setup='CREATE VIEW "Orders ""Before""" AS SELECT 1 AS one'),
    Case("target-index-name-taken", plan_toml(),
         ['"orders_new_pkey"', "already exists"],
         setup="CREATE TABLE misc (a int); CREATE INDEX orders_new_pkey ON misc (a)", also_run=True),
    Case("target-other-schema", plan_toml(target="other.orders_new"),
         ["[target] name", '"other"."orders_new" must be in the source\'s schema "public"']),
    Case("target-missing-schema", plan_toml(source='"Sales"."Order Items"', target='nowhere."Items"'),
         ["[target] name", '"nowhere"."Items" must be in the source\'s schema "Sales"']),
    Case("old-name-other-schema", plan_toml(old_name="Sales.orders_old"),
         ["[rollback] old_name", '"sales"."orders_old" must be in the source\'s schema "public"']),
    Case("target-is-source", plan_toml(target="public.orders"),
         ['"public"."orders"', "must all differ"]),
    Case("target-is-old-name", plan_toml(target="orders_x", old_name="orders_x"),
         ['"public"."orders_x"', "must all differ"]),
    # Columns and types
    Case("column-missing", plan_toml(columns={"nope": "bigint"}),
         ["[target] columns", '"public"."orders" has no column "nope"'], also_run=True),
    Case("column-case-matters", plan_toml(columns={"ID": "bigint"}),
         ["[target] columns", 'has no column "ID"']),
    Case("column-missing-mixed-case", plan_toml(source='"Sales"."Order Items"', columns={"Item Id": "bigint"}),
         ["[target] columns", '"Sales"."Order Items" has no column "Item Id"']),
    Case("type-missing", plan_toml(columns={"id": "bigintt"}),
         ["[target] columns", "'bigintt'", '"id"', "not a type"], also_run=True),
    Case("type-is-sql", plan_toml(columns={"id": "bigint) FROM orders; DROP TABLE orders; --"}),
         ["[target] columns", "not a type"], also_run=True),
    Case("cast-timestamptz-to-point", plan_toml(columns={"placed_at": "point"}),
         ["[target] columns", 'column "placed_at" cannot become \'point\''], also_run=True),
    Case("cast-int-to-uuid", plan_toml(columns={"id": "uuid"}),
         ["[target] columns", 'column "id" cannot become \'uuid\'']),
    Case("cast-mixed-case-column", plan_toml(source='"Sales"."Order Items"', columns={"Qty": "inet"}),
         ["[target] columns", 'column "Qty" cannot become \'inet\'']),
    Case("cast-explicit-only", plan_toml(columns={"customer": "integer"}),
         ["[target] columns", '"customer"', "no assignment cast from text to integer",
          "without USING", "ALTER COLUMN \"customer\" TYPE integer USING"], also_run=True),
    Case("generated-column", plan_toml(columns={"total_x2": "numeric(20,2)"}),
         ["[target] columns", '"total_x2" is a generated column']),
    # A generated column that reads a changed column is created again over the new type; only
    # when a plain column follows it would the order change (issue 21 item 8).
    Case("generated-column-followed-by-a-plain-one", plan_toml(source="gen_mid", columns={"a": "bigint"}),
         ["[target] columns", 'generated column "twice"', 'the column "note" after it is not generated'],
         setup="CREATE TABLE gen_mid (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED,"
               " note text)", also_run=True),
    Case("identity-to-text", plan_toml(source="idents", columns={"id": "text"}),
         ["[target] columns", '"id"', "identity column"],
         setup="CREATE TABLE idents (k int PRIMARY KEY, id int GENERATED ALWAYS AS IDENTITY, v text)"),
    # What the swap cannot carry over. An exclusion constraint on a partitioned table: PostgreSQL 15
    # and 16 take none, 17 only one that compares the partition columns with = (this one does not).
    Case("exclusion-constraint-on-a-partitioned-target",
         plan_toml(source="bookings").replace("[target]\n", '[target]\n[target.partition]\nby = "hash"\n'
                                              'column = "id"\nmodulus = 2\n'),
         ["[target.partition]", '"public"."bookings" has the exclusion constraint "bookings_during_excl"',
          "EXCLUDE USING gist (during WITH &&)", "partitioned table"],
         setup="CREATE TABLE bookings (id int PRIMARY KEY, during tsrange NOT NULL,"
               " EXCLUDE USING gist (during WITH &&))", also_run=True),
    # The new table's exclusion constraint is tried on the rehearsed target: over a changed column
    # type, its expression may not exist.
    Case("exclusion-constraint-the-new-type-cannot-carry", plan_toml(source="slots", columns={"lo": "bigint"}),
         ["[target] columns", 'column "lo" cannot become \'bigint\'', "int4range(bigint, integer) does not exist"],
         setup="CREATE TABLE slots (id int PRIMARY KEY, lo int NOT NULL, hi int NOT NULL,"
               " EXCLUDE USING gist (int4range(lo, hi) WITH &&))", also_run=True),
    Case("a-partition", plan_toml(source="events_2026"), ['"public"."events_2026"', "partition"],
         setup="CREATE TABLE events (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);"
               " CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')"),
    Case("inheritance-parent", plan_toml(source="animals"), ['"public"."animals"', "inheritance child",
                                                         'ALTER TABLE "public"."dogs" NO INHERIT "public"."animals"'],
         setup="CREATE TABLE animals (id int PRIMARY KEY); CREATE TABLE dogs () INHERITS (animals)"),
    Case("not-valid-foreign-key-to-a-partitioned-target",
         plan_toml(source="invoices").replace("[target]\n", '[target]\n[target.partition]\nby = "hash"\n'
                                              'column = "id"\nmodulus = 2\n'),
         ["[target.partition]", 'foreign key "invoices_customer_id_fkey"', "NOT VALID", "VALIDATE CONSTRAINT"],
         setup=INVOICES + "; ALTER TABLE invoices DROP CONSTRAINT invoices_customer_id_fkey;"
                          " ALTER TABLE invoices ADD CONSTRAINT invoices_customer_id_fkey FOREIGN KEY (customer_id)"
                          " REFERENCES customers NOT VALID", also_run=True),
    # The swap carries the foreign key (mover/engines/swap/carry.py): plan check tries that DDL on the rehearsed target.
    Case("foreign-key-the-new-type-cannot-carry", plan_toml(source="invoices", columns={"customer_id": "text"}),
         ["[target] columns", 'column "customer_id" cannot become \'text\'', "invoices_customer_id_fkey",
          "incompatible types"], setup=INVOICES, also_run=True),
    Case("typed-table", plan_toml(source="typed"), ['"public"."typed"', "typed table (OF public.point2)"],
         setup="CREATE TYPE point2 AS (id int, v text); CREATE TABLE typed OF point2 (PRIMARY KEY (id))"),
    Case("drop-foreign-keys-unknown-name",
         plan_toml(source="invoices").replace("[target]\n", '[target]\ndrop_foreign_keys = ["invoices_fk", '
                                              '"invoices_customer_id_fkey"]\n'),
         ["[target] drop_foreign_keys", '"invoices_fk" is not a foreign key of "public"."invoices"',
          '"invoices_customer_id_fkey"'], setup=INVOICES, also_run=True),
    # A NOT VALID check comes back at the swap: it must still fit the new column types
    Case("not-valid-check-breaks-with-new-type", plan_toml(source="flags", columns={"bits": "numeric"}),
         ["[target] columns", 'column "bits" cannot become \'numeric\'', "operator does not exist: numeric &"],
         setup="CREATE TABLE flags (id int PRIMARY KEY, bits int); INSERT INTO flags VALUES (1, 3);"
               " ALTER TABLE flags ADD CONSTRAINT even CHECK ((bits & 1) = 0) NOT VALID", also_run=True),
    Case("drop-foreign-keys-on-a-table-without-any",
         plan_toml().replace("[target]\n", '[target]\ndrop_foreign_keys = ["orders_fkey"]\n'),
         ["[target] drop_foreign_keys", '"orders_fkey" is not a foreign key of "public"."orders"', "none"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_plan_exits_2_and_changes_nothing(db, tmp_path, case):
    execute(db, case.setup)
    path = write_plan(tmp_path, case.plan)
    before = snapshot(db)
    assert_bad(mover(db, "plan", "check", str(path)), case.fragments)
    assert snapshot(db) == before
    if case.also_run:
        assert_bad(mover(db, "run", str(path)), case.fragments)
        assert snapshot(db) == before


def test_a_range_layout_past_the_default_limit_passes_with_max_partitions(db, tmp_path):
    execute(db, DAILY)
    plan = plan_toml(source="daily").replace("[target]\n", '[target]\n[target.partition]\nby = "range"\n'
                                               'column = "day"\ninterval = "1 day"\nmax_partitions = 17\n')
    r = mover(db, "plan", "check", str(write_plan(tmp_path, plan)))
    assert r.returncode == 0, r.stderr
    assert "17 partitions to create" in flat(r.stdout), r.stdout


# ---------------------------------------------------------------------------------------------
# Dependents the swap carries over (mover/engines/swap/carry.py): once refused here, now accepted, and plan
# check prints the statements that move each one at the swap.

CARRIED = [
    # Built on the new table after the copy (its name as the deferred indexes', given back at the swap).
    Case("exclusion-constraint", plan_toml(source="bookings", columns={"id": "bigint"}),
         ['ALTER TABLE "public"."bookings_new" ADD CONSTRAINT "bookings_during_excl_m',
          "EXCLUDE USING gist (during WITH &&) WHERE ((NOT cancelled))"],
         setup="CREATE TABLE bookings (id int PRIMARY KEY, during tsrange NOT NULL, cancelled boolean NOT NULL,"
               " EXCLUDE USING gist (during WITH &&) WHERE (NOT cancelled))"),
    Case("inbound-foreign-key", plan_toml(),
         ['ALTER TABLE "public"."lines" DROP CONSTRAINT "lines_order_id_fkey"',
          'ALTER TABLE "public"."lines" ADD CONSTRAINT "lines_order_id_fkey" FOREIGN KEY (order_id) REFERENCES'
          ' public.orders(id) NOT VALID', 'VALIDATE CONSTRAINT "lines_order_id_fkey"'],
         setup="CREATE TABLE lines (id int PRIMARY KEY, order_id int REFERENCES orders)"),
    Case("inbound-foreign-key-mixed-case", plan_toml(),
         ['ALTER TABLE "Sales"."Lines" ADD CONSTRAINT "Order FK" FOREIGN KEY (o) REFERENCES public.orders(id)'
          ' NOT VALID'],
         setup='CREATE TABLE "Sales"."Lines" (id int PRIMARY KEY, o int CONSTRAINT "Order FK" REFERENCES orders)'),
    Case("dependent-view", plan_toml(),
         ['DROP VIEW "Sales"."Big Orders"', 'CREATE VIEW "Sales"."Big Orders" AS'],
         setup='CREATE VIEW "Sales"."Big Orders" AS SELECT * FROM orders WHERE total > 10'),
    Case("dependent-matview", plan_toml(),
         ['DROP MATERIALIZED VIEW "public"."orders_summary"', 'REFRESH MATERIALIZED VIEW "public"."orders_summary"'],
         setup="CREATE MATERIALIZED VIEW orders_summary AS SELECT count(*) FROM orders"),
    Case("user-trigger", plan_toml(source="audited"),
         ['DROP TRIGGER "audit me" ON "public"."audited"', 'CREATE TRIGGER "audit me" BEFORE INSERT ON'],
         setup="CREATE TABLE audited (id int PRIMARY KEY); CREATE FUNCTION audit_fn() RETURNS trigger"
               " LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';"
               ' CREATE TRIGGER "audit me" BEFORE INSERT ON audited FOR EACH ROW EXECUTE FUNCTION audit_fn()'),
    Case("row-level-security", plan_toml(source="secret"),
         ['DROP POLICY "mine" ON "public"."secret"', 'CREATE POLICY "mine" ON "public"."secret" AS PERMISSIVE'
          ' FOR ALL TO PUBLIC USING ((owner = CURRENT_USER))', 'ALTER TABLE "public"."secret" ENABLE ROW LEVEL'],
         setup="CREATE TABLE secret (id int PRIMARY KEY, owner text); ALTER TABLE secret ENABLE ROW LEVEL SECURITY;"
               " CREATE POLICY mine ON secret USING (owner = current_user)"),
    Case("a-rule", plan_toml(source="ruled"),
         ['DROP RULE "no_deletes" ON "public"."ruled"', "CREATE RULE no_deletes AS"],
         setup="CREATE TABLE ruled (id int PRIMARY KEY);"
               " CREATE RULE no_deletes AS ON DELETE TO ruled DO INSTEAD NOTHING"),
    Case("outbound-foreign-key", plan_toml(source="invoices"),
         ['ALTER TABLE "public"."invoices" DROP CONSTRAINT "invoices_customer_id_fkey"',
          'ALTER TABLE "public"."invoices" ADD CONSTRAINT "invoices_customer_id_fkey" FOREIGN KEY (customer_id)'
          ' REFERENCES public.customers(id) NOT VALID'], setup=INVOICES),
    Case("outbound-foreign-key-partly-acknowledged",
         plan_toml(source="invoices").replace("[target]\n",
                                              '[target]\ndrop_foreign_keys = ["invoices_customer_id_fkey"]\n'),
         ['ADD CONSTRAINT "Invoice Region" FOREIGN KEY (region) REFERENCES "Sales".regions(r) NOT VALID',
          "foreign keys not carried over (acknowledged in [target] drop_foreign_keys): invoices_customer_id_fkey"],
         setup=INVOICES + """; CREATE TABLE "Sales".regions (r text PRIMARY KEY);
               ALTER TABLE invoices ADD COLUMN region text CONSTRAINT "Invoice Region" REFERENCES "Sales".regions"""),
    Case("outbound-foreign-key-self-reference", plan_toml(source="tree"),
         ['ALTER TABLE "public"."tree" ADD CONSTRAINT "tree_parent_fkey" FOREIGN KEY (parent)'
          ' REFERENCES public.tree(id) NOT VALID'],
         setup="CREATE TABLE tree (id int PRIMARY KEY, parent int REFERENCES tree)"),
]


@pytest.mark.parametrize("case", CARRIED, ids=[c.id for c in CARRIED])
def test_carried_dependents_pass_and_plan_check_prints_their_moves(db, tmp_path, case):
    execute(db, case.setup)
    path = write_plan(tmp_path, case.plan)
    before = snapshot(db)
    result = mover(db, "plan", "check", str(path), "--sql")
    assert result.returncode == 0, (result.stdout, result.stderr)
    text = flat(result.stdout)
    for fragment in case.fragments:
        assert fragment in text, f"{fragment!r} not in plan check's output: {text!r}"
    assert snapshot(db) == before


# ---------------------------------------------------------------------------------------------
# Bad plan files through the CLI (the database is there, but never reached)

FILE_CASES = [
    ("malformed-toml", '[migration\nname = "m"\n', ["not valid TOML"]),
    ("unquoted-string", "[migration]\nname = orders\n", ["not valid TOML"]),
    ("unknown-key", plan_toml() + "\n[backfill]\nrange_size = 10\n", ["unknown key [backfill] range_size"]),
    ("unknown-section", plan_toml() + "\n[swap]\nauto = true\n", ["unknown section [swap]"]),
    ("missing-name", '[migration]\nsource = "orders"\n[rollback]\nwindow = "1h"\n',
     ["missing required key [migration] name"]),
    ("missing-window", '[migration]\nname = "m"\nsource = "orders"\n', ["missing required key [rollback] window"]),
    ("wrong-type", plan_toml().replace('window = "1h"', "window = 3600"), ["[rollback] window must be a string"]),
    ("range-rows-string", plan_toml() + '\n[backfill]\nrange_rows = "10"\n',
     ["[backfill] range_rows must be an integer"]),
    ("auto-yes", plan_toml() + '\n[cutover]\nauto = "yes"\n', ["[cutover] auto must be a boolean"]),
    ("bad-duration", plan_toml(window="1 week"), ["[rollback] window", "not a duration"]),
    ("lock-timeout-range", plan_toml() + '\n[cutover]\nlock_timeout = "5min"\n',
     ["[cutover] lock_timeout must be between 1ms and 60s"]),
    ("bad-name", plan_toml(name="orders move"), ["[migration] name 'orders move'"]),
    ("three-part-source", plan_toml(source="db.public.orders"), ["[migration] source", "3 dot-separated parts"]),
    ("drop-foreign-keys-not-names", plan_toml().replace("[target]\n", "[target]\ndrop_foreign_keys = [1]\n"),
     ["[target] drop_foreign_keys must list distinct constraint names"]),
    ("drop-foreign-keys-a-string", plan_toml().replace("[target]\n", '[target]\ndrop_foreign_keys = "fk"\n'),
     ["[target] drop_foreign_keys must be an array"]),
]


@pytest.mark.parametrize("text, fragments", [(t, f) for _, t, f in FILE_CASES], ids=[i for i, _, _ in FILE_CASES])
def test_bad_plan_file_exits_2(db, tmp_path, text, fragments):
    path = write_plan(tmp_path, text)
    before = snapshot(db)
    for command in (["plan", "check"], ["run"]):
        result = mover(db, *command, str(path))
        assert_bad(result, fragments)
        assert str(path) in flat(result.stderr)
    assert snapshot(db) == before


def test_missing_plan_file_exits_2(db, tmp_path):
    before = snapshot(db)
    assert_bad(mover(db, "plan", "check", str(tmp_path / "nope.toml")), ["nope.toml"])
    assert_bad(mover(db, "run", str(tmp_path / "nope.toml")), ["cannot read plan file", "nope.toml"])
    assert snapshot(db) == before


def test_the_cli_process_exit_codes_and_output(db, tmp_path):
    """The other tests call the CLI in-process; here a real `python -m mover` each way: the exit
    status a shell sees, the message on stderr, the JSON alone on stdout."""
    bad = mover_process(db, "plan", "check", str(write_plan(tmp_path, plan_toml(window="1 week"), "bad.toml")))
    assert_bad(bad, ["[rollback] window", "not a duration"])
    assert bad.stdout == ""
    good = mover_process(db, "plan", "check", "--json", str(write_plan(tmp_path, plan_toml(), "good.toml")))
    assert good.returncode == 0, good.stderr
    assert [s["name"] for s in json.loads(good.stdout)["steps"]] == list(STEP_NAMES)


# ---------------------------------------------------------------------------------------------
# Bad plans that depend on what is registered


def _register(dsn: str, path: Path) -> None:
    """`mover step PLAN`: registers the migration and runs create_target."""
    result = mover(dsn, "step", str(path))
    assert result.returncode == 0, (result.stdout, result.stderr)
    with connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM mover.migrations").fetchone()[0] == 1
        assert conn.execute("SELECT to_regclass('public.orders_new') IS NOT NULL").fetchone()[0]


@pytest.mark.parametrize("second", [
    plan_toml(name="orders-again", target="orders_v3", old_name="orders_v3_old"),
    plan_toml(name="orders-again"),  # the same derived names as the first: the migration is the news
    plan_toml(name="orders-again", source="ORDERS", columns={"id": "bigint"}),
], ids=["other-names", "same-names", "other-shape"])
def test_second_migration_of_the_same_source(db, tmp_path, second):
    _register(db, write_plan(tmp_path, plan_toml(name="orders-first"), "first.toml"))
    path = write_plan(tmp_path, second, "second.toml")
    before = snapshot(db)
    for command in (["plan", "check"], ["run"], ["step"]):
        assert_bad(mover(db, *command, str(path)),
                   ['"public"."orders" is already being moved by migration \'orders-first\'',
                    "mover abort orders-first"])
        assert snapshot(db) == before


@pytest.mark.parametrize("changed", [
    plan_toml(name="orders-first", columns={"id": "bigint"}),
    plan_toml(name="orders-first", target="orders_v2"),
    plan_toml(name="orders-first", source='"Sales"."Order Items"'),
], ids=["columns", "target", "source"])
def test_changed_shape_of_a_registered_plan(db, tmp_path, changed):
    _register(db, write_plan(tmp_path, plan_toml(name="orders-first"), "first.toml"))
    path = write_plan(tmp_path, changed, "changed.toml")
    before = snapshot(db)
    for command in (["plan", "check"], ["run"]):
        assert_bad(mover(db, *command, str(path)),
                   ["plan for 'orders-first' differs from the one registered", "mover abort orders-first"])
        assert snapshot(db) == before


def test_changed_tunables_of_a_registered_plan_are_fine(db, tmp_path):
    _register(db, write_plan(tmp_path, plan_toml(name="orders-first"), "first.toml"))
    path = write_plan(tmp_path, plan_toml(name="orders-first", window="2h", range_rows=5), "tuned.toml")
    before = snapshot(db)
    result = mover(db, "plan", "check", "--json", str(path))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["registered"] is True and doc["name"] == "orders-first"
    assert doc["status"]["step"] == "install_capture"
    assert snapshot(db) == before


def _with_drop(text: str, *fks: str) -> str:
    return text.replace("[target]\n", f"[target]\ndrop_foreign_keys = [{', '.join(toml_value(f) for f in fks)}]\n")


def test_an_edit_of_a_registered_plan_is_checked_like_a_registration(db, tmp_path):
    """Issue 21, item 10: `run` and `plan check` of an edited registered plan refuse a
    [target] drop_foreign_keys name that is not a foreign key of the source (as registration
    does), and an edit of a key read only at registration; an accepted edit is stored with when it
    takes effect, and a foreign key added to drop_foreign_keys after registration is honoured at
    the cutover, as docs/plan.md says."""
    execute(db, "CREATE TABLE public.customers (id int PRIMARY KEY); INSERT INTO public.customers VALUES (1);"
                " ALTER TABLE public.orders ADD COLUMN customer_id int DEFAULT 1 REFERENCES public.customers")
    first = plan_toml(name="orders-first", columns={"id": "bigint"})
    _register(db, write_plan(tmp_path, first, "first.toml"))
    before = snapshot(db)
    unknown = write_plan(tmp_path, _with_drop(first, "no_such_fkey"), "unknown.toml")
    lossy = write_plan(tmp_path, first.replace("[target]\n", '[target]\naccept_lossy = ["id"]\n'), "lossy.toml")
    for command in (["plan", "check"], ["run"], ["step"]):
        assert_bad(mover(db, *command, str(unknown)),
                   ['[target] drop_foreign_keys: "no_such_fkey" is not a foreign key of "public"."orders"',
                    'its foreign keys are: "orders_customer_id_fkey"'])
        assert_bad(mover(db, *command, str(lossy)),
                   ["[target] accept_lossy of migration 'orders-first' changed, but it is read only when the plan"
                    " is registered", "restore [target] accept_lossy"])
        assert snapshot(db) == before
    real = write_plan(tmp_path, _with_drop(first, "orders_customer_id_fkey").replace('"1h"', '"0s"'), "real.toml")
    result = mover(db, "plan", "check", str(real))
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert "changed: [target] drop_foreign_keys, takes effect at the next cutover" in out, out
    assert "changed: [rollback] window, takes effect at the cutover" in out, out
    result = mover(db, "run", str(real))
    assert result.returncode == 3, result.stderr
    with connect(db) as conn:
        message, changes = conn.execute("SELECT message, detail->'changes' FROM mover.events"
                                        " WHERE kind = 'plan_updated'").fetchone()
        assert "[target] drop_foreign_keys at the next cutover" in message, message
        assert len(changes) == 2, changes
    result = mover(db, "cutover", "orders-first")
    assert result.returncode == 0, result.stderr
    with connect(db) as conn:
        fks = conn.execute("SELECT conrelid::regclass::text FROM pg_constraint"
                           " WHERE conname = 'orders_customer_id_fkey'").fetchall()
    assert fks in ([], [("orders_old",)]), fks  # not on the live table (the old one is retired at once)


def test_every_problem_is_reported_in_one_run(db, tmp_path):
    # Three independent problems (a taken target name, a column that does not exist, a type that
    # does not exist): one run names all three, each with its own next step, and changes nothing.
    execute(db, "CREATE TABLE public.orders_new (id int)")
    path = write_plan(tmp_path, plan_toml(columns={"nope": "bigint", "total": "no_such_type"}))
    before = snapshot(db)
    for command in (["plan", "check"], ["run"]):
        result = mover(db, *command, str(path))
        assert_bad(result, ["the plan has 3 problems:",
                            '[target] name: "public"."orders_new" already exists',
                            '[target] columns: "public"."orders" has no column "nope"',
                            "[target] columns: 'no_such_type' (for column \"total\") is not a type this database knows",
                            "next: choose another name or drop that table"])
        assert snapshot(db) == before


@pytest.fixture
def bare_db(pg_dsn: str):
    """A database without mover's control schema (not cloned from the template)."""
    name = f"bare_{uuid.uuid4().hex[:12]}"
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    dsn = dsn_with_dbname(pg_dsn, name)
    try:
        execute(dsn, BASE_SCHEMA)
        yield dsn
    finally:
        with connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_control_schema_not_installed(bare_db, tmp_path):
    path = write_plan(tmp_path, plan_toml())
    before = snapshot(bare_db)
    assert not [r for r in before["namespaces"] if r[0] == "mover"]
    for command in (["plan", "check"], ["run"], ["step"]):
        assert_bad(mover(bare_db, *command, str(path)), ["control schema is not installed", "mover init"])
        assert snapshot(bare_db) == before


# ---------------------------------------------------------------------------------------------
# A good plan


def test_good_plan_check_prints_the_steps_and_changes_nothing(db, tmp_path):
    path = write_plan(tmp_path, plan_toml(source='"Sales"."Order Items"', columns={"Item ID": "bigint"}))
    before = snapshot(db)
    result = mover(db, "plan", "check", str(path), "--sql")
    assert result.returncode == 0, (result.stdout, result.stderr)
    text = result.stdout
    for step in STEP_NAMES:
        assert step in text, step
    assert 'CREATE TABLE "Sales"."Order Items_new"' in flat(text)
    assert 'ALTER COLUMN "Item ID" TYPE bigint' in flat(text)
    assert snapshot(db) == before

    result = mover(db, "plan", "check", "--json", str(path))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["registered"] is False
    assert doc["name"] == "orders-move"
    assert doc["tables"] == {"source": '"Sales"."Order Items"', "target": '"Sales"."Order Items_new"',
                             "old": '"Sales"."Order Items_old"'}
    assert doc["key"] == ["Item ID"]
    assert [s["name"] for s in doc["steps"]] == list(STEP_NAMES)
    create = doc["steps"][0]["sql"]
    assert any(s.startswith('CREATE TABLE "Sales"."Order Items_new"') for s in create), create
    assert all(isinstance(s, str) for step in doc["steps"] for s in step["sql"])
    assert sum(len(step["sql"]) for step in doc["steps"]) >= 7
    assert snapshot(db) == before


def test_plan_check_says_what_it_does_to_the_table_and_prints_the_statements_with_sql(db, tmp_path):
    """By default a few lines a person reads: the table it creates, the key it copies by, how it
    checks, the name the original keeps after the swap, and the flag that prints the statements."""
    execute(db, 'CREATE INDEX "Qty idx" ON "Sales"."Order Items" ("Qty")')
    path = write_plan(tmp_path, plan_toml(source='"Sales"."Order Items"', columns={"Item ID": "bigint"},
                                          old_name='"Sales"."Items before"', window="2h"))
    before = snapshot(db)
    result = mover(db, "plan", "check", str(path))
    assert result.returncode == 0, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    summary = flat("\n".join(lines[lines.index("what it does:") + 1:]))
    assert summary.startswith("table 'orders-move' (\"Sales\".\"Order Items\"): created: "
                              '"Sales"."Order Items_new" ("Item ID" as bigint) with its key\'s index; after the copy 1 '
                              'index ("Qty idx_m1") the capture: trigger "mover_m1_capture" on "Sales"."Order Items" '
                              'into "mover"."m1_changes"'), summary
    assert ('copied: "Sales"."Order Items" -> "Sales"."Order Items_new", keyed by ("Item ID"), 10000 keys a '
            'transaction; about 10 rows') in summary, summary
    assert "checked: every row compared (ranges of about 100000 keys, 1 worker)" in summary, summary
    assert ('swapped: "Sales"."Order Items_new" takes the name "Sales"."Order Items", the original kept as '
            '"Sales"."Items before" (rollback window 2h) refused: `mover rollback` while a value of "Item ID"') \
        in summary, summary
    assert "in one transaction with the other" not in summary and "not carried" not in summary, summary
    assert "it locks 2 relations one at a time (the table, its new table) and mover's change logs" in summary
    assert lines[-1] == f"the statements each step runs: `mover plan check {path} --sql`", lines[-1]
    assert 'CREATE TABLE "Sales"."Order Items_new"' not in result.stdout and "\ncreate_target\n" not in result.stdout
    assert snapshot(db) == before


def test_good_plan_with_a_type_change_and_explicit_names(db, tmp_path):
    path = write_plan(tmp_path, plan_toml(target="orders_v2", old_name='"Orders (old)"',
                                          columns={"id": "bigint", "customer": "varchar(200)"},
                                          accept_lossy=["customer"]))  # text -> varchar(200) can refuse values
    before = snapshot(db)
    result = mover(db, "plan", "check", "--json", str(path))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["tables"] == {"source": '"public"."orders"', "target": '"public"."orders_v2"',
                             "old": '"public"."Orders (old)"'}
    assert doc["key"] == ["id"]
    statements = " ".join(doc["steps"][0]["sql"])
    assert 'ALTER COLUMN "id" TYPE bigint' in statements
    assert 'ALTER COLUMN "customer" TYPE varchar(200)' in statements
    assert snapshot(db) == before


def test_snapshot_sees_changes(db, tmp_path):
    """The catalog comparison itself can fail: registering a plan changes the snapshot."""
    before = snapshot(db)
    execute(db, "COMMENT ON TABLE orders IS 'x'")
    commented = snapshot(db)
    assert commented != before
    execute(db, "UPDATE orders SET total = total + 1 WHERE id = 1")
    changed = snapshot(db)
    assert changed != commented
    _register(db, write_plan(tmp_path, plan_toml(name="orders-first")))
    after = snapshot(db)
    assert after["relations"] != changed["relations"]
    assert after["mover.migrations"] != changed["mover.migrations"]


# ---------------------------------------------------------------------------------------------
# Sources mover cannot move, told for what they are; acknowledged outbound foreign keys


def test_temporary_table_is_refused_as_temporary(db, tmp_path):
    with connect(db) as owner:  # a temporary table lives as long as this session
        owner.execute("CREATE TEMPORARY TABLE scratch (id int PRIMARY KEY)")
        schema = owner.execute("SELECT nspname FROM pg_namespace WHERE oid = pg_my_temp_schema()").fetchone()[0]
        path = write_plan(tmp_path, plan_toml(source=f"{schema}.scratch"))
        before = snapshot(db)
        for command in (["plan", "check"], ["run"]):
            result = mover(db, *command, str(path))
            assert_bad(result, [f'"{schema}"."scratch" is a temporary table',
                                "exists only in the session that created it"])
            assert "system table" not in result.stderr
        assert snapshot(db) == before


def test_acknowledged_outbound_foreign_key_passes_and_is_recorded(db, tmp_path):
    execute(db, INVOICES)
    path = write_plan(tmp_path, plan_toml(source="invoices", window="0s").replace(
        "[target]\n", '[target]\ndrop_foreign_keys = ["invoices_customer_id_fkey"]\n'))
    before = snapshot(db)
    result = mover(db, "plan", "check", str(path))
    assert result.returncode == 0, result.stderr
    assert snapshot(db) == before
    result = mover(db, "run", str(path))
    assert result.returncode == 3, result.stderr
    result = mover(db, "cutover", "orders-move")
    assert result.returncode == 0, result.stderr
    with connect(db) as conn:
        detail = conn.execute("SELECT detail FROM mover.events WHERE step = 'cutover' AND detail ? 'lock_ms'"
                              ).fetchone()[0]
        assert detail["foreign_keys_not_carried"] == ["invoices_customer_id_fkey"]
        # What the operator accepted: the live table no longer has the foreign key.
        assert conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = 'invoices'::regclass"
                            " AND contype = 'f'").fetchone()[0] == 0


def test_unlogged_source_plan_creates_an_unlogged_target(db, tmp_path):
    execute(db, "CREATE UNLOGGED TABLE cache (id int PRIMARY KEY, v text)")
    path = write_plan(tmp_path, plan_toml(source="cache"))
    result = mover(db, "plan", "check", str(path), "--sql")
    assert result.returncode == 0, result.stderr
    assert 'CREATE UNLOGGED TABLE "public"."cache_new"' in flat(result.stdout)


@pytest.mark.parametrize(("ddl", "arithmetic"), [
    ("CREATE TABLE public.keyed (id bigint PRIMARY KEY, v text)", True),
    ("CREATE TABLE public.keyed (id smallint PRIMARY KEY, v text)", True),
    ("CREATE TABLE public.keyed (id text PRIMARY KEY, v text)", False),
    ("CREATE TABLE public.keyed (id int NOT NULL, v text NOT NULL, PRIMARY KEY (id, v))", False),
])
def test_plan_check_prints_every_statement_that_cuts_a_range_bound(db, tmp_path, ddl, arithmetic):
    execute(db, ddl)
    path = write_plan(tmp_path, plan_toml(source="public.keyed"))
    result = mover(db, "plan", "check", "--json", str(path))
    assert result.returncode == 0, result.stderr
    backfill = next(s["sql"] for s in json.loads(result.stdout)["steps"] if s["name"] == "backfill")
    assert any(" OFFSET %s LIMIT 1" in s and s.startswith("SELECT") for s in backfill), backfill
    # The probe that ends a range cut by key arithmetic: only for a one-column integer key.
    exists = [s for s in backfill if s.startswith('SELECT 1 FROM ONLY "public"."keyed" s WHERE')]
    assert len(exists) == (1 if arithmetic else 0), backfill
