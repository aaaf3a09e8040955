"""[[also]] tables (issue 27): read by [target]'s declarations, stored and hashed only when present,
written back for `mover set`, and each turned into its table's own plan."""

from __future__ import annotations

import json

import pytest

from mover.errors import PlanError
from mover.names import QualifiedName
from mover.plan import member_name, parse_plan, plan_from_canonical, to_document

BASE = {"migration": {"name": "ids", "source": "public.customers"}, "target": {"columns": {"id": "bigint"}},
        "rollback": {"window": "1h", "keep_old": True, "old_name": "customers_before"},
        "backfill": {"workers": 3}, "hooks": {"after_cutover": {"command": "true"}}}
ALSO = [{"source": "public.orders", "columns": {"customer_id": "bigint", "id": "bigint"}},
        {"source": "invoices", "name": "invoices_v2", "columns": {"customer_id": "bigint"},
         "drop_foreign_keys": ["invoices_note_fkey"], "accept_lossy": ["customer_id"]}]


def test_also_tables_are_stored_hashed_and_read_back():
    plan = parse_plan({**BASE, "also": ALSO})
    single = parse_plan(BASE)
    stored = plan.canonical()
    assert list(stored)[-1] == "also" and "also" not in single.canonical()  # a plan of one table stores as before
    assert stored["also"][1] == {"name": [None, "invoices_v2"], "columns": {"customer_id": "bigint"},
                                 "accept_lossy": ["customer_id"], "drop_foreign_keys": ["invoices_note_fkey"],
                                 "partition": None, "source": [None, "invoices"]}
    again = plan_from_canonical(json.loads(json.dumps(stored)))
    assert again == plan and again.shape_hash() == plan.shape_hash()
    assert parse_plan(to_document(plan)) == plan and "also" not in to_document(single)
    # What defines the migration: each [[also]] table, whole; unqualified names in their own schema.
    assert plan.shape_hash() != single.shape_hash()
    other = parse_plan({**BASE, "also": [ALSO[0], {**ALSO[1], "drop_foreign_keys": []}]})
    assert other.shape_hash() != plan.shape_hash()
    qualified = parse_plan({**BASE, "also": [ALSO[0], {**ALSO[1], "source": "public.invoices"}]})
    assert qualified.shape_hash("public") == plan.shape_hash("public")


def test_each_table_gets_its_own_plan():
    head, orders, invoices = parse_plan({**BASE, "also": ALSO}).tables()
    assert head.also and head.name == "ids" and head.hooks
    assert (orders.name, orders.source, orders.columns) == ("ids/public.orders", QualifiedName("public", "orders"),
                                                            {"customer_id": "bigint", "id": "bigint"})
    assert (invoices.target, invoices.drop_foreign_keys, invoices.accept_lossy) == (
        QualifiedName(None, "invoices_v2"), ("invoices_note_fkey",), ("customer_id",))
    for table in (orders, invoices):
        # the family's settings, but hooks run once (the head's) and each old table is <source>_old
        assert table.also == () and table.hooks == {} and table.rollback.old_name is None
        assert table.rollback.keep_old and table.rollback.window_ms == 3_600_000 and table.backfill.workers == 3
        assert plan_from_canonical(json.loads(json.dumps(table.canonical()))) == table
    assert member_name("ids", QualifiedName("public", "orders")) == "ids/public.orders"


@pytest.mark.parametrize(("also", "expected"), [
    ({"source": "orders"}, "[also] must be an array of tables: write [[also]] above each table's keys"),
    ([{"columns": {"id": "bigint"}}], "missing required key [also] source"),
    ([{"source": "orders", "colour": 1}], "unknown key [also] colour"),
    ([{"source": "orders", "columns": {"id": 5}}], "[also] columns: the type of column 'id' must be a non-empty"),
    ([{"source": "orders", "accept_lossy": ["x"]}], "[also] accept_lossy: 'x' is not a column of [also] columns"),
    ([{"source": "a.b.c"}], "[also] source: 'a.b.c' has 3 dot-separated parts"),
    (["orders"], "[[also]] must be an array of tables"),
])
def test_bad_also_tables_name_the_key(also, expected):
    with pytest.raises(PlanError) as info:
        parse_plan({**BASE, "also": also})
    assert expected in str(info.value)
