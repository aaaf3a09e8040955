"""mover/catalog/shape.py's pure part: the diff of two catalog descriptions, the fingerprint, the hint."""

from __future__ import annotations

import copy

from mover.catalog import shape


def col(name, position, type_="integer", not_null=False, default=None, collation=None, identity="", generated=""):
    return {"name": name, "position": position, "type": type_, "not_null": not_null, "default": default,
            "collation": collation, "identity": identity, "generated": generated}


BASE = {
    "oid": 16384, "schema": "public", "name": "orders", "kind": "r", "persistence": "p",
    "columns": [col("id", 1, not_null=True), col("qty", 2), col("note", 3, "text", collation='pg_catalog."default"')],
    "constraints": {"orders_pkey": {"type": "p", "definition": "PRIMARY KEY (id)", "validated": True,
                                    "deferrable": False, "deferred": False}},
    "indexes": {"orders_pkey": {"definition": "USING btree (id)", "unique": True, "valid": True,
                                "constraint": "orders_pkey"},
                "orders_qty": {"definition": "USING btree (qty)", "unique": False, "valid": True, "constraint": None}},
}


def changed(fn):
    new = copy.deepcopy(BASE)
    fn(new)
    return shape.diff(BASE, new)


def kinds(changes):
    return [(c.kind, c.item, c.adoptable) for c in changes]


def test_same_description_same_fingerprint_and_no_changes():
    assert shape.diff(BASE, copy.deepcopy(BASE)) == []
    assert shape.fingerprint(BASE) == shape.fingerprint(copy.deepcopy(BASE))
    assert shape.fingerprint(BASE) != shape.fingerprint(changed_desc(lambda d: d.update(persistence="u")))


def changed_desc(fn):
    new = copy.deepcopy(BASE)
    fn(new)
    return new


def test_added_column_is_adoptable_and_named():
    out = changed(lambda d: d["columns"].append(col("priority", 4, not_null=True, default="0")))
    assert kinds(out) == [("column_added", "priority", True)]
    assert out[0].message == 'column "priority" was added to "public"."orders" (integer DEFAULT 0 NOT NULL)'


def test_identity_or_generated_column_added_is_not_adoptable():
    assert kinds(changed(lambda d: d["columns"].append(col("n", 4, identity="a")))) == [("column_added", "n", False)]
    assert kinds(changed(lambda d: d["columns"].append(col("g", 4, generated="s")))) == [("column_added", "g", False)]


def test_dropped_renamed_recreated_columns():
    assert kinds(changed(lambda d: d["columns"].pop())) == [("column_dropped", "note", False)]

    def rename(d):
        d["columns"][1]["name"] = "quantity"
    out = changed(rename)
    assert kinds(out) == [("column_renamed", "qty", False)]
    assert 'renamed to "quantity"' in out[0].message

    def recreate(d):
        d["columns"].pop(1)
        d["columns"].append(col("qty", 4))
    assert kinds(changed(recreate)) == [("column_recreated", "qty", False)]


def test_column_properties():
    def alter(**kw):
        def fn(d):
            d["columns"][1].update(kw)
        return kinds(changed(fn))
    assert alter(type="bigint") == [("column_type", "qty", False)]
    assert alter(not_null=True) == [("column_not_null", "qty", False)]
    assert alter(default="1") == [("column_default", "qty", False)]
    assert alter(collation='"C"') == [("column_collation", "qty", False)]
    assert alter(identity="d") == [("column_identity", "qty", False)]


def test_table_rename_persistence_drop():
    assert kinds(changed(lambda d: d.update(name="orders2"))) == [("renamed", None, False)]
    out = changed(lambda d: d.update(persistence="u"))
    assert kinds(out) == [("persistence", None, False)] and "UNLOGGED" in out[0].message
    assert kinds(shape.diff(BASE, None)) == [("dropped", None, False)]


def test_constraints():
    check = {"type": "c", "definition": "CHECK ((qty > 0)) NOT VALID", "validated": False, "deferrable": False,
             "deferred": False}
    assert kinds(changed(lambda d: d["constraints"].update(qty_pos=check))) == [("constraint_added", "qty_pos", True)]
    fk = {"type": "f", "definition": "FOREIGN KEY (qty) REFERENCES t(id)", "validated": True, "deferrable": False,
          "deferred": False}
    assert kinds(changed(lambda d: d["constraints"].update(fk=fk))) == [("constraint_added", "fk", False)]
    with_check = changed_desc(lambda d: d["constraints"].update(qty_pos=check))
    validated = copy.deepcopy(with_check)
    validated["constraints"]["qty_pos"].update(definition="CHECK ((qty > 0))", validated=True)
    assert kinds(shape.diff(with_check, validated)) == [("constraint_validated", "qty_pos", True)]
    assert kinds(shape.diff(validated, with_check)) == [("constraint_validated", "qty_pos", False)]
    assert kinds(shape.diff(with_check, BASE)) == [("constraint_dropped", "qty_pos", False)]


def test_indexes_and_constraint_indexes_reported_once():
    new_ix = {"definition": "USING btree (note)", "unique": False, "valid": True, "constraint": None}
    assert kinds(changed(lambda d: d["indexes"].update(orders_note=new_ix))) == [("index_added", "orders_note", True)]
    building = dict(new_ix, valid=False)
    assert kinds(changed(lambda d: d["indexes"].update(orders_note=building))) == [
        ("index_added", "orders_note", False)]
    assert kinds(changed(lambda d: d["indexes"].pop("orders_qty"))) == [("index_dropped", "orders_qty", False)]

    def other_def(d):
        d["indexes"]["orders_qty"]["definition"] = "USING hash (qty)"
    assert kinds(changed(other_def)) == [("index_changed", "orders_qty", False)]

    def drop_pk(d):
        d["constraints"].pop("orders_pkey")
        d["indexes"].pop("orders_pkey")
    assert kinds(changed(drop_pk)) == [("constraint_dropped", "orders_pkey", False)]


def test_hint_says_adopt_only_when_every_change_is_adoptable_on_the_live_table():
    added = changed(lambda d: d["columns"].append(col("p", 4)))
    err = shape.explain("ord", added, swapped=False)
    assert err.exit_code == 2 and "mover adopt ord" in err.hint
    assert 'column "p" was added to "public"."orders"' in err.message
    dropped = changed(lambda d: d["columns"].pop())
    assert "mover abort ord" in shape.explain("ord", added + dropped, swapped=False).hint
    assert "mover adopt" not in shape.explain("ord", added + dropped, swapped=False).hint
    # The same addition on the new table before the swap is not the application's: not adopted.
    on_target = shape.diff(BASE, changed_desc(lambda d: d["columns"].append(col("p", 4))), side="target")
    assert "mover adopt" not in shape.explain("ord", on_target, swapped=False).hint
    assert "mover adopt ord" in shape.explain("ord", on_target, swapped=True).hint


def test_an_adopt_that_stopped_half_way_still_says_adopt():
    live = changed(lambda d: (d["columns"].append(col("p", 4)),
                              d["indexes"].update(orders_p={"definition": "USING btree (p)", "unique": False,
                                                            "valid": True, "constraint": None})))
    other = shape.diff(BASE, changed_desc(lambda d: (
        d["columns"].append(col("p", 4)),
        d["indexes"].update(orders_p_m7={"definition": "USING btree (p)", "unique": False, "valid": False,
                                         "constraint": None}))), side="target")
    assert "mover adopt ord" in shape.explain("ord", live + other, swapped=False, mid=7).hint
    assert "mover adopt" not in shape.explain("ord", live + other, swapped=False, mid=8).hint
