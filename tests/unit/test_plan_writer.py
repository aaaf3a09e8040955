"""`mover plan new`'s text (mover/plan/writer.py) and its flags (mover/runner/draft.py), without a
database: names that need quoting survive TOML and SQL both, the file reads back as the plan it
was meant to be, every commented default line is the default, and the flags are read or refused
naming themselves."""

from __future__ import annotations

import re
import tomllib

import pytest

from mover.errors import BadInput
from mover.names import QualifiedName
from mover.plan import parse_plan
from mover.plan.writer import AlsoDraft, Draft, toml_key, toml_name, toml_string
from mover.runner.draft import columns_option, default_name, partition_option

ORDER_ITEMS = QualifiedName("Sales", "Order Items")
NOTES = QualifiedName("Sales", 'Order "Notes".v2')


def draft(**kw) -> Draft:
    return Draft(**{"name": "order_items_bigint", "source": ORDER_ITEMS,
                    "columns": {"id": "bigint", "Line No": "bigint", "amount": "numeric(12,2)"},
                    "also": (AlsoDraft(source=NOTES, columns={"Order Id": "bigint"}, why='"Order Id" (integer) '
                                                                                       'references ...'),
                             AlsoDraft(source=QualifiedName("public", "shipments"), columns={"item_id": "bigint"},
                                       why="...")),
                    "header": ("Moves a table; a long line " + "of words " * 20, "", "Next: ...")} | kw)


def test_names_that_need_quoting_read_back_as_the_same_tables_and_columns():
    text = draft().text()
    plan = parse_plan(tomllib.loads(text))
    assert plan.name == "order_items_bigint"
    assert plan.source == ORDER_ITEMS
    assert plan.columns == {"id": "bigint", "Line No": "bigint", "amount": "numeric(12,2)"}
    assert [(a.source, a.columns) for a in plan.also] == [(NOTES, {"Order Id": "bigint"}),
                                                         (QualifiedName("public", "shipments"), {"item_id": "bigint"})]
    assert 'source = "\\"Sales\\".\\"Order Items\\""' in text and 'source = "public.shipments"' in text
    assert all(len(line) <= 100 for line in text.splitlines() if line.startswith("#"))


def test_the_file_round_trips_to_the_plan_it_was_meant_to_be():
    """What the file says is the plan of its values alone: every other section at its defaults,
    [rollback] window (required) at its default."""
    d = draft(partition={"by": "range", "column": "created_at", "interval": "1 month", "accept_key_change": True})
    meant = parse_plan({"migration": {"name": d.name, "source": str(d.source)}, "target": {
        "columns": d.columns, "partition": d.partition}, "also": [{"source": str(a.source), "columns": a.columns}
                                                                  for a in d.also], "rollback": {"window": "24h"}})
    written = parse_plan(tomllib.loads(d.text()))
    assert written == meant
    assert written.canonical() == meant.canonical() and written.shape_hash() == meant.shape_hash()


@pytest.mark.parametrize("partition", [None, {"by": "hash", "column": "tenant", "modulus": 4}])
def test_every_commented_default_uncommented_changes_nothing(partition):
    text = draft(partition=partition).text()
    lines = text.splitlines()
    base = parse_plan(tomllib.loads(text))
    seen = 0
    for i, line in enumerate(lines):
        m = re.match(r"^# (\w+) = (.+?)(  # .*)?$", line)
        if not m or m.group(2) == "...":
            continue
        seen += 1
        uncommented = [*lines[:i], line[2:], *lines[i + 1:]]
        assert parse_plan(tomllib.loads("\n".join(uncommented))) == base, f"{line!r} is not the default"
    assert seen > 30
    assert ("[partitions]" in text) == (partition is not None)  # the upkeep of a partitioned target only


def test_toml_strings_and_keys_read_back_as_written():
    for text in ['plain', 'a "quoted" \\ name', "tab\there", "del\x7f", "é and 🙂", "new\nline"]:
        assert tomllib.loads(f"k = {toml_string(text)}")["k"] == text
        assert tomllib.loads(f"{toml_key(text)} = 1") == {text: 1}
    assert toml_key("order_id") == "order_id" and toml_key("Order Id") == '"Order Id"'
    assert toml_name(QualifiedName("public", "orders")) == '"public.orders"'
    assert toml_name(QualifiedName("public", "Orders")) == '"\\"public\\".\\"Orders\\""'


def test_columns_flags():
    assert columns_option(("id=bigint", " amount = numeric(12,2) ", "Line No=bigint")) == {
        "id": "bigint", "amount": "numeric(12,2)", "Line No": "bigint"}
    for bad in ("id", "=bigint", "id="):
        with pytest.raises(BadInput, match="--columns"):
            columns_option((bad,))
    with pytest.raises(BadInput, match="twice"):
        columns_option(("id=bigint", "id=numeric"))


def test_partition_flag_is_read_as_the_plan_reads_target_partition():
    assert partition_option("by=range,column=created_at,interval=1 month,premake=2,default=true") == {
        "by": "range", "column": "created_at", "interval": "1 month", "premake": 2, "default": True}
    assert partition_option("by=range, column=id, interval=100000") == {"by": "range", "column": "id",
                                                                          "interval": 100000}
    assert partition_option("by=hash,columns=tenant|region,modulus=8") == {
        "by": "hash", "columns": ["tenant", "region"], "modulus": 8}
    assert partition_option("by=list,column=region,values.eu=de|fr,values.us=us") == {
        "by": "list", "column": "region", "values": {"eu": ["de", "fr"], "us": ["us"]}}
    for bad, said in (("by=range,column=created_at", "interval is required"), ("by=range", "column"),
                      ("by=range,column=c,interval=1 fortnight", "interval must be"), ("premake=x", "number"),
                      ("by=hash,column=t,modulus=8,default=yes", "true or false"), ("by", "key=value"),
                      ("by=hash,column=t,modulus=8,colour=red", "unknown key")):
        with pytest.raises(BadInput, match="--partition") as exc:
            partition_option(bad)
        assert said in str(exc.value)


def test_default_names_are_migration_names():
    assert default_name(ORDER_ITEMS, {"id": "bigint"}, None) == "order_items_bigint"
    assert default_name(QualifiedName("public", "events"), {}, {"by": "hash"}) == "events_partitioned"
    assert default_name(QualifiedName("public", "t"), {"a": "numeric(12,2)"}, None) == "t_numeric_12_2"
    assert default_name(QualifiedName("public", "t"), {"a": "bigint", "b": "text"}, None) == "t_columns"
    assert default_name(QualifiedName("public", "t"), {}, None) == "t_rebuild"
    assert re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}$", default_name(QualifiedName("s", "é" * 60), {}, None))
