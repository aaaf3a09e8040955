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
    r = mover(schema, "plan", "check", plan, "--sql")  # the advice ends where the steps' statements begin
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


FAMILY = HEAD.replace('columns = { id = "bigint" }', 'columns = { id = "bigint", parent_order = "bigint" }\n'
                      'drop_foreign_keys = ["orders_customer_id_fkey"]') + """
[[also]]
source = "public.invoices"
columns = { order_id = "bigint" }

[[also]]
source = "public.order_lines"
columns = { order_id = "bigint" }

[[also]]
source = "public.shipments"
columns = { order_id = "bigint" }
"""


def test_a_family_plan_check_is_a_short_summary_per_table_and_the_statements_come_with_sql(schema, tmp_path):
    """Four tables: by default a summary a person reads (each table's created, copied, checked and
    swapped lines, what is left behind, the swap's one transaction), in under 80 lines; with --sql
    every step's statements, as before (over 500 lines here), after the same opening lines."""
    with psycopg.connect(schema, autocommit=True) as conn:
        conn.execute("CREATE INDEX orders_customer_idx ON orders (customer_id)")
    before = tables_of(schema)
    plan = write_plan(tmp_path / "family.toml", FAMILY)
    r = mover(schema, "plan", "check", plan)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) < 80, r.stdout
    blocks: dict[str, list[str]] = {}  # each table's lines (a line the console wrapped among them)
    for line in lines[lines.index("what it does, table by table (4 tables, swapped together):") + 1:]:
        if line.startswith("the swap: "):
            break
        if line.startswith("table "):
            blocks[line] = []
        else:
            list(blocks.values())[-1].append(line)
    assert list(blocks) == ["table 'ids' (\"public\".\"orders\"):",
                            "table 'ids/public.invoices' (\"public\".\"invoices\"):",
                            "table 'ids/public.order_lines' (\"public\".\"order_lines\"):",
                            "table 'ids/public.shipments' (\"public\".\"shipments\"):"], r.stdout
    for (title, block), mid in zip(blocks.items(), range(1, 5), strict=True):
        source = title.split("(")[1].rstrip("):")
        target = source[:-1] + '_new"'
        text = " ".join(" ".join(block).split())
        labels = [b.split(":")[0].strip() for b in block if b.startswith("  ") and not b.startswith("   ")]
        assert labels[:4] == ["created", "copied", "checked", "swapped"], block
        assert f"created: {target} (" in text and f'"mover"."m{mid}_changes"' in text, text
        assert f"copied: {source} -> {target}, keyed by (" in text, text
        assert "every row compared" in text and "again before the swap" in text, text
        assert (f"swapped: {target} takes the name {source}, the original kept as {source[:-1]}_old\" (rollback "
                f"window 1h), in one transaction with the other 3 tables") in text, text
    orders, invoices, order_lines, shipments = (" ".join(" ".join(b).split()) for b in blocks.values())
    assert '("id", "parent_order" as bigint)' in orders, orders
    assert 'after the copy 1 index ("orders_customer_idx_m1")' in orders, orders
    assert ('not carried: foreign key "orders_customer_id_fkey" ([target] drop_foreign_keys): it stays on '
            '"public"."orders_old"') in orders, orders
    assert 'keyed by ("order_id", "line")' in order_lines, order_lines
    for text, parent in ((invoices, "orders"), (order_lines, "orders"), (shipments, "order_lines")):
        assert f'after the copy 1 foreign key to "public"."{parent}_new" (between the migration\'s tables)' in text
        assert "not carried" not in text, text
    assert "foreign key to" not in orders, orders  # its own self-reference is the table's, not the family's
    assert "it locks 8 relations one at a time (the 4 tables, their new tables)" in r.stdout, r.stdout
    assert lines[-1] == f"the statements each step runs: `mover plan check {plan} --sql`", lines[-1]
    # The statements, with the flag only.
    statement = 'ALTER TABLE "public"."invoices_new" ADD CONSTRAINT "invoices_order_id_fkey" FOREIGN KEY ("order_id")'
    index = 'CREATE INDEX "orders_customer_idx_m1" ON "public"."orders_new"'
    assert statement not in r.stdout and index not in r.stdout and "\ncreate_target\n" not in r.stdout
    full = mover(schema, "plan", "check", plan, "--sql")
    assert full.returncode == 0, full.stderr
    assert statement in full.stdout and index in full.stdout and full.stdout.count("\ncreate_target\n") == 4
    assert len(full.stdout.splitlines()) > 500
    # The same lines before the statements as before the summary (but the preflight's, whose WAL
    # segments ready for reuse move with the other tests' writes).
    opening = r.stdout[:r.stdout.index("\n\nwhat it does") + 1]
    head, tail = opening.split("\npreflight:\n")[0], opening[opening.index("\nwarning: "):]
    assert full.stdout.startswith(head + "\npreflight:\n"), full.stdout[:len(head) + 100]
    assert full.stdout[full.stdout.index("\nwarning: "):].startswith(tail + "\ncreate_target\n"), full.stdout
    assert "what it does" not in full.stdout and "--sql`" not in full.stdout
    assert tables_of(schema) == before
