"""`plan check` and families (issue 27): a plan of one table that widens a referenced key prints
the [[also]] lines that widen every narrower referencing column, recursively (a column widened so
is itself referenced: a key made of it, a table that references itself), ready to paste; the plan
with them pasted checks clean and describes every table and the family's own work; bad [[also]]
tables are refused naming the table, changing nothing."""

from __future__ import annotations

import psycopg
import pytest

from mover import api
from mover.errors import PlanError
from tests.workload import mover, write_plan

SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers,
                     parent_order int REFERENCES orders);
CREATE TABLE invoices (id bigint PRIMARY KEY, customer_id int REFERENCES customers,
                       order_id int REFERENCES orders ON DELETE CASCADE);
CREATE TABLE order_lines (order_id int REFERENCES orders, line int, PRIMARY KEY (order_id, line));
CREATE TABLE shipments (id serial PRIMARY KEY, order_id int, line int,
                        FOREIGN KEY (order_id, line) REFERENCES order_lines);
CREATE TABLE "Audit Log" ("Customer Id" smallint REFERENCES customers, note text);
CREATE TABLE wide_refs (customer_id bigint REFERENCES customers);
"""

HEAD = """
[migration]
name = "ids"
source = "public.orders"

[target]
columns = { id = "bigint" }

[rollback]
window = "1h"
"""


@pytest.fixture
def schema(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return db_dsn


def tables_of(dsn) -> list[tuple[str, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT relname, relkind FROM pg_class WHERE relnamespace = 'public'::regnamespace"
                            " ORDER BY 1").fetchall()


def test_a_widened_key_prints_the_also_lines_of_every_narrower_column_recursively(schema, tmp_path):
    before = tables_of(schema)
    result = api.check_plan(schema, write_plan(tmp_path / "ids.toml", HEAD))
    # orders.id becomes bigint: its own parent_order (a self-reference) in [target], the columns of
    # invoices and order_lines in [[also]] tables, and shipments.order_id, which references
    # order_lines.order_id once that is widened (not orders.id directly)
    assert result["also"] == [
        '# add to the columns of [target]: "parent_order" (integer) references "public"."orders"."id"',
        '#   parent_order = "bigint"',
        "",
        '# "order_id" (integer) references "public"."orders"."id"',
        "[[also]]",
        'source = "public.invoices"',
        'columns = { order_id = "bigint" }',
        "",
        '# "order_id" (integer) references "public"."orders"."id"',
        "[[also]]",
        'source = "public.order_lines"',
        'columns = { order_id = "bigint" }',
        "",
        '# "order_id" (integer) references "public"."order_lines"."order_id"',
        "[[also]]",
        'source = "public.shipments"',
        'columns = { order_id = "bigint" }',
    ]
    assert sum("widen it in this migration" in w for w in result["warnings"]) == 4
    assert tables_of(schema) == before  # checking a plan changes nothing

    # The lines pasted: nothing left to widen, and every table described, one family.
    pasted = HEAD.replace('columns = { id = "bigint" }', 'columns = { id = "bigint", parent_order = "bigint" }')
    pasted += "\n".join(line for line in result["also"] if not line.startswith("#")) + "\n"
    result = api.check_plan(schema, write_plan(tmp_path / "family.toml", pasted))
    assert result["also"] == [] and not any("widen it" in w for w in result["warnings"])
    family = result["family"]
    assert [t["name"] for t in family["tables"]] == ["ids", "ids/public.invoices", "ids/public.order_lines",
                                                     "ids/public.shipments"]
    assert [t["tables"]["target"] for t in family["tables"]] == [
        '"public"."orders_new"', '"public"."invoices_new"', '"public"."order_lines_new"', '"public"."shipments_new"']
    for t in family["tables"][1:]:
        assert [s["name"] for s in t["steps"]][0] == "create_target"
        # each table's copy printed over its own rehearsed target (describe == run), its column
        # converted as the copy converts it
        [backfill] = [s["sql"] for s in t["steps"] if s["name"] == "backfill"]
        [copy] = [x for x in backfill if x.startswith("INSERT INTO")]
        assert copy.startswith(f"INSERT INTO {t['tables']['target']}") and '"order_id"' in copy, copy
        assert t["rollback_carries_back"] is not None
    keys = [s for s in family["sql"] if s.startswith("ALTER TABLE")]
    # the keys between the family's tables, on the targets (the self-reference is the table's own)
    assert keys == [
        'ALTER TABLE "public"."invoices_new" ADD CONSTRAINT "invoices_order_id_fkey" FOREIGN KEY ("order_id")'
        ' REFERENCES "public"."orders_new" ("id") MATCH SIMPLE ON UPDATE NO ACTION ON DELETE CASCADE',
        'ALTER TABLE "public"."order_lines_new" ADD CONSTRAINT "order_lines_order_id_fkey" FOREIGN KEY ("order_id")'
        ' REFERENCES "public"."orders_new" ("id") MATCH SIMPLE ON UPDATE NO ACTION ON DELETE NO ACTION',
        'ALTER TABLE "public"."shipments_new" ADD CONSTRAINT "shipments_order_id_line_fkey" FOREIGN KEY'
        ' ("order_id", "line") REFERENCES "public"."order_lines_new" ("order_id", "line") MATCH SIMPLE'
        ' ON UPDATE NO ACTION ON DELETE NO ACTION']
    # the swap locks the live tables referenced ones first, then the targets in the same order
    locks = [s.removeprefix("--   ") for s in family["sql"] if s.startswith("--   ")]
    assert locks[:8] == ['"public"."orders"', '"public"."invoices"', '"public"."order_lines"', '"public"."shipments"',
                         '"public"."orders_new"', '"public"."invoices_new"', '"public"."order_lines_new"',
                         '"public"."shipments_new"']
    assert tables_of(schema) == before


def test_the_cli_prints_the_lines_to_paste(schema, tmp_path):
    plan = write_plan(tmp_path / "c.toml", HEAD.replace('"public.orders"', '"public.customers"'))
    r = mover(schema, "plan", "check", plan)
    assert r.returncode == 0, r.stderr
    assert "add to the plan:" in r.stdout
    # a quoted column name and a table name that need quoting in TOML; a smallint widened to bigint
    assert '[[also]]\nsource = "\\"public\\".\\"Audit Log\\""\ncolumns = { "Customer Id" = "bigint" }' in r.stdout
    advice = r.stdout[r.stdout.index("add to the plan:"):r.stdout.index("\ncreate_target")]
    assert "wide_refs" not in advice  # as wide as the key becomes: nothing to do


def test_bad_also_tables_are_refused_naming_the_table_and_changing_nothing(schema, tmp_path):
    before = tables_of(schema)
    plan = HEAD + """
[[also]]
source = "public.invoices"
columns = { nope = "bigint" }

[[also]]
source = "orders"
columns = { customer_id = "bigint" }

[[also]]
source = "public.missing"

[[also]]
source = "public.order_lines"
drop_foreign_keys = ["order_lines_order_id_fkey"]
"""
    with pytest.raises(PlanError) as info:
        api.check_plan(schema, write_plan(tmp_path / "bad.toml", plan))
    text = str(info.value)
    assert "[[also]] source = \"public\".\"invoices\"" in text and "nope" in text
    assert 'which the plan moves already' in text
    assert '[[also]] source = "public"."missing"' in text
    assert '"order_lines_order_id_fkey" references another table of this migration' in text
    assert tables_of(schema) == before
    with psycopg.connect(schema, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM mover.migrations").fetchone()[0] == 0


def test_a_family_with_logical_capture_is_refused_saying_why(schema, tmp_path):
    """A family's replays need every change the sources show in the logs at once (the keys between
    its tables are checked at the end of each); logical capture logs each table from its own slot,
    behind the application. plan check and run refuse it (exit 2), naming the reason and the way
    out, and change nothing; the same plan without [[also]] checks clean (the refusal is the
    family's, not the server's)."""
    before = tables_of(schema)
    head = HEAD.replace('"public.orders"', '"public.customers"') + '\n[capture]\nmethod = "logical"\n'
    alone = write_plan(tmp_path / "alone.toml", head)
    family = write_plan(tmp_path / "family.toml", head + """
[[also]]
source = "public.orders"
columns = { customer_id = "bigint" }
""")
    r = mover(schema, "plan", "check", alone)
    assert r.returncode == 0, r.stderr
    for args in (("plan", "check", family), ("run", family)):
        r = mover(schema, *args)
        assert r.returncode == 2, r.stderr
        assert '[capture] method = "logical" cannot move a family (2 tables' in r.stderr
        assert "a child's change can be logged before its parent's" in r.stderr
        assert "remove [capture] method" in r.stderr
    assert tables_of(schema) == before
    with psycopg.connect(schema, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM mover.migrations").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0] == 0
