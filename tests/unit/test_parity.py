"""mover/engines/swap/parity.py's pure part: two descriptions compared, each difference planned, accepted or not."""

from __future__ import annotations

import copy

from mover.engines.swap import parity
from tests.unit.test_shape import BASE

META = {
    "owner": "app", "comment": "orders", "reloptions": ["fillfactor=90"], "row_security": False,
    "force_row_security": False, "replica_identity": "i", "replica_identity_index": "orders_pkey",
    "grants": ["SELECT TO PUBLIC", "INSERT TO web"],
    "columns": {"id": {"storage": "p", "compression": None, "statistics": None, "comment": None, "grants": [],
                       "security_labels": {}},
                "qty": {"storage": "p", "compression": None, "statistics": 500, "comment": "how many",
                        "grants": ["UPDATE TO web"], "security_labels": {}},
                "note": {"storage": "e", "compression": "p", "statistics": None, "comment": None, "grants": [],
                         "security_labels": {}}},
    "index_comments": {"orders_qty": "by quantity"}, "constraint_comments": {}, "security_labels": {},
    "publications": {"pub": {"columns": ["id", "qty"], "row_filter": "(id > 0)"}},
    "statistics": {"orders_stat": {"definition": "(dependencies, ndistinct) ON qty, note", "statistics": 200,
                                   "comment": None}},
    "triggers": {"audit": {"definition": "CREATE TRIGGER audit AFTER INSERT ON <table> FOR EACH ROW EXECUTE "
                                         "FUNCTION audit()", "enabled": "O"}},
    "rules": {}, "policies": {}, "views": ["public.orders_view"], "referenced_by": {},
}
DESC = {**copy.deepcopy(BASE), "metadata": META}
# The new table's names for the source's indexes (mover/steps/create_target.py, mover/engines/bulk/builds.py).
RENAMES = {"orders_new_pkey": "orders_pkey", "orders_qty_m1": "orders_qty"}


def new_table(fn=None):
    """DESC as mover builds the new table: the same, under mover's index names."""
    d = copy.deepcopy(DESC)
    d["indexes"] = {after: d["indexes"][before] for after, before in RENAMES.items()}
    d["indexes"]["orders_new_pkey"]["constraint"] = "orders_new_pkey"
    d["constraints"] = {"orders_new_pkey": d["constraints"]["orders_pkey"]}
    d["metadata"]["index_comments"] = {"orders_qty_m1": "by quantity"}
    d["metadata"]["replica_identity_index"] = "orders_new_pkey"
    if fn:
        fn(d)
    return d


def compare(after, **kw):
    kw.setdefault("renames", RENAMES)
    return parity.compare(DESC, after, parity.Planned(**kw))


def statuses(diffs):
    return {d.key: d.status for d in diffs}


def test_identical_descriptions_have_no_difference():
    assert parity.compare(DESC, copy.deepcopy(DESC), parity.Planned()) == []


def test_mover_names_are_planned_and_nothing_else_differs():
    diffs = compare(new_table())
    assert statuses(diffs) == {"index_name:orders_pkey": "planned", "index_name:orders_qty": "planned",
                               "constraint_name:orders_pkey": "planned"}
    assert parity.unplanned(diffs) == []


def test_a_lost_grant_is_unplanned_and_named_for_accept_parity():
    diffs = compare(new_table(lambda d: d["metadata"]["grants"].remove("INSERT TO web")))
    bad = parity.unplanned(diffs)
    assert [(d.key, d.before, d.after) for d in bad] == [("grant:INSERT TO web", "INSERT TO web", None)]
    accepted = compare(new_table(lambda d: d["metadata"]["grants"].remove("INSERT TO web")),
                       accepted=frozenset({"grant:INSERT TO web"}))
    assert parity.unplanned(accepted) == [] and statuses(accepted)["grant:INSERT TO web"] == "accepted"
    # a bare kind accepts every difference of that kind
    assert parity.unplanned(compare(new_table(lambda d: d["metadata"]["grants"].clear()),
                                    accepted=frozenset({"grant"}))) == []


def test_type_change_and_its_storage_are_planned_for_the_plans_columns_only():
    def widen(d):
        d["columns"][1]["type"] = "bigint"
        d["metadata"]["columns"]["note"]["storage"] = "x"
    diffs = compare(new_table(widen), columns=frozenset({"qty"}))
    assert statuses(diffs)["column_type:qty"] == "planned"
    assert statuses(diffs)["column_storage:note"] == "unplanned"


def test_a_collation_that_follows_from_a_planned_type_change_is_planned():
    """integer -> text gives the column the type's default collation, text -> integer takes it away
    (issue 21: the swap refused an integer -> text plan for it). Between two collatable types the
    column keeps its own: another collation there is not the plan's."""
    def to_text(d):
        d["columns"][1].update(type="text", collation='pg_catalog."default"')
        d["metadata"]["columns"]["qty"]["storage"] = "x"
    diffs = compare(new_table(to_text), columns=frozenset({"qty"}))
    assert {k: v for k, v in statuses(diffs).items() if k.startswith("column_")} == {
        "column_type:qty": "planned", "column_collation:qty": "planned", "column_storage:qty": "planned"}
    assert parity.unplanned(diffs) == []
    # the swap back compares the other way: the collation goes as the type goes back
    back = parity.compare(new_table(to_text), DESC, parity.Planned(columns=frozenset({"qty"})))
    assert statuses(back)["column_collation:qty"] == "planned"
    # not planned for a column the plan leaves alone, nor a collation changed between collatable types
    assert statuses(compare(new_table(to_text)))["column_collation:qty"] == "unplanned"
    recollated = compare(new_table(lambda d: d["columns"][2].update(type="character varying(20)",
                                                                    collation='"C"')),
                         columns=frozenset({"note"}))
    assert statuses(recollated) == {**statuses(compare(new_table())), "column_type:note": "planned",
                                    "column_collation:note": "unplanned"}


def test_each_aspect_is_compared():
    cases = {
        "column_statistics:qty": lambda d: d["metadata"]["columns"]["qty"].update(statistics=None),
        "column_compression:note": lambda d: d["metadata"]["columns"]["note"].update(compression=None),
        "column_comment:qty": lambda d: d["metadata"]["columns"]["qty"].update(comment=None),
        "column_grants:qty": lambda d: d["metadata"]["columns"]["qty"].update(grants=[]),
        "owner:table": lambda d: d["metadata"].update(owner="postgres"),
        "comment:table": lambda d: d["metadata"].update(comment=None),
        "reloptions:table": lambda d: d["metadata"].update(reloptions=[]),
        "replica_identity:table": lambda d: d["metadata"].update(replica_identity="d"),
        "publication:pub": lambda d: d["metadata"]["publications"]["pub"].update(row_filter=None),
        "statistics:orders_stat": lambda d: d["metadata"].update(statistics={}),
        "statistics_statistics:orders_stat":
            lambda d: d["metadata"]["statistics"]["orders_stat"].update(statistics=None),
        "trigger:audit": lambda d: d["metadata"]["triggers"]["audit"].update(enabled="D"),
        "view:public.orders_view": lambda d: d["metadata"].update(views=[]),
        "index_comment:orders_qty": lambda d: d["metadata"].update(index_comments={}),
        "index:orders_qty": lambda d: d["indexes"]["orders_qty_m1"].update(definition="USING hash (qty)"),
        "column_not_null:qty": lambda d: d["columns"][1].update(not_null=True),
        "of_type:table": lambda d: d.update(of_type="point2"),  # a typed table (OF type), issue 21 item 9
    }
    for key, fn in cases.items():
        bad = [d.key for d in parity.unplanned(compare(new_table(fn)))]
        assert bad == [key], (key, bad)


def test_statistics_are_matched_by_definition_and_their_name_compared():
    def rename(d):
        d["metadata"]["statistics"] = {"orders_stat_orders_new": d["metadata"]["statistics"]["orders_stat"]}
    diffs = compare(new_table(rename))
    assert [(d.key, d.after, d.status) for d in diffs if d.kind.startswith("statistics")] == [
        ("statistics_name:orders_stat", "orders_stat_orders_new", "unplanned")]
    # Before the swap it is the swap that gives the name over: planned.
    diffs = compare(new_table(rename), at_swap=True)
    assert parity.unplanned(diffs) == []


def test_before_the_swap_what_the_swap_makes_is_planned_but_a_lost_grant_is_not():
    def bare(d):
        d["metadata"].update(publications={}, triggers={}, views=[], replica_identity="d",
                             replica_identity_index=None)
        d["metadata"]["grants"].remove("SELECT TO PUBLIC")
    diffs = compare(new_table(bare), at_swap=True)
    assert [d.key for d in parity.unplanned(diffs)] == ["grant:SELECT TO PUBLIC"]
    # after the swap the same absences are unplanned
    assert {d.kind for d in parity.unplanned(compare(new_table(bare)))} == {
        "grant", "publication", "trigger", "view", "replica_identity", "replica_identity_index"}


def test_planned_foreign_key_drop_and_partitioned_key():
    d = copy.deepcopy(DESC)
    d["constraints"]["orders_cust_fkey"] = {"type": "f", "definition": "FOREIGN KEY (qty) REFERENCES c(id)",
                                            "validated": True, "deferrable": False, "deferred": False}
    diffs = parity.compare(d, new_table(), parity.Planned(renames=RENAMES,
                                                          dropped_foreign_keys=frozenset({"orders_cust_fkey"})))
    assert statuses(diffs)["constraint:orders_cust_fkey"] == "planned"

    def partitioned(n):
        n["kind"] = "p"
        n["constraints"]["orders_new_pkey"]["definition"] = "PRIMARY KEY (id, qty)"
        n["metadata"]["reloptions"] = []
    assert parity.unplanned(compare(new_table(partitioned), partition_columns=frozenset({"qty"}))) == []
    assert {x.kind for x in parity.unplanned(compare(new_table(partitioned)))} == {"kind", "constraint",
                                                                                   "reloptions"}


def test_a_partitioned_target_plans_no_difference_of_an_exclusion_constraint():
    """Issue 21, item 7: partitioning plans the key's differences, not an exclusion constraint's:
    one missing (or changed) on the partitioned table taking the name is unplanned."""
    excl = {"type": "x", "definition": "EXCLUDE USING gist (qty WITH =)", "validated": True, "deferrable": False,
            "deferred": False}
    d = copy.deepcopy(DESC)
    d["constraints"]["orders_qty_excl"] = excl

    def partitioned(with_excl):
        def fn(n):
            n["kind"] = "p"
            n["constraints"]["orders_new_pkey"]["definition"] = "PRIMARY KEY (id, qty)"
            n["metadata"]["reloptions"] = []
            if with_excl:
                n["constraints"]["orders_qty_excl_m1"] = dict(excl)
        return fn

    renames = {**RENAMES, "orders_qty_excl_m1": "orders_qty_excl"}
    planned = parity.Planned(renames=renames, partition_columns=frozenset({"qty"}))
    assert parity.unplanned(parity.compare(d, new_table(partitioned(True)), planned)) == []
    assert [x.key for x in parity.unplanned(parity.compare(d, new_table(partitioned(False)), planned))] == [
        "constraint:orders_qty_excl"]


def test_a_temporal_key_that_went_missing_is_unplanned_whether_partitioned_or_not():
    """PostgreSQL 18's temporal keys are exclusion constraints underneath, built as the constraint
    they are (never a unique index carried under mover's name, nor part of a partitioned key): one
    missing from the table taking the name is unplanned, on a plain or a partitioned target."""
    temporal = {"type": "u", "definition": "UNIQUE (qty, note WITHOUT OVERLAPS)", "validated": True,
                "deferrable": False, "deferred": False}
    d = copy.deepcopy(DESC)
    d["constraints"]["orders_qty_note_key"] = temporal
    d["indexes"]["orders_qty_note_key"] = {"definition": "USING gist (qty, note)", "unique": True, "valid": True,
                                           "constraint": "orders_qty_note_key"}

    def built(with_key, partitioned):
        def fn(n):
            if partitioned:
                n["kind"] = "p"
                n["constraints"]["orders_new_pkey"]["definition"] = "PRIMARY KEY (id, qty)"
                n["metadata"]["reloptions"] = []
            if with_key:
                n["constraints"]["orders_qty_note_key_m1"] = dict(temporal)
                n["indexes"]["orders_qty_note_key_m1"] = dict(d["indexes"]["orders_qty_note_key"],
                                                              constraint="orders_qty_note_key_m1")
        return fn

    renames = {**RENAMES, "orders_qty_note_key_m1": "orders_qty_note_key"}
    for partitioned in (False, True):
        planned = parity.Planned(renames=renames, partition_columns=frozenset({"qty"} if partitioned else ()))
        assert parity.unplanned(parity.compare(d, new_table(built(True, partitioned)), planned)) == []
        missing = parity.unplanned(parity.compare(d, new_table(built(False, partitioned)), planned))
        assert "constraint:orders_qty_note_key" in [x.key for x in missing], partitioned


def test_differences_read_as_json_and_refusal_names_the_keys():
    diffs = parity.unplanned(compare(new_table(lambda d: d["metadata"].update(owner="postgres"))))
    assert diffs[0].as_dict() == {"key": "owner:table", "kind": "owner", "item": "table", "before": "app",
                                  "after": "postgres", "status": "unplanned", "reason": ""}
    err = parity.refusal("orders", diffs, "the swap would make")
    assert err.exit_code == 3 and "owner table: app -> postgres" in err.message
    assert err.hint is not None and 'accept_parity = ["owner:table"]' in err.hint


def test_renames_follow_mover_naming():
    assert parity.renames(7, DESC, "orders_new", "orders_pkey") == {"orders_new_pkey": "orders_pkey",
                                                                    "orders_qty_m7": "orders_qty"}


def test_swap_back_compares_the_other_way_with_the_names_inverted():
    """Rollback: the new table (mover's names) is "before", the original "after"."""
    def with_unique(d, index):
        d["indexes"][index] = {"definition": "USING btree (note)", "unique": True, "valid": True,
                               "constraint": "orders_note_key" if index == "orders_note_key" else None}
        if index == "orders_note_key":
            d["constraints"]["orders_note_key"] = {"type": "u", "definition": "UNIQUE (note)", "validated": True,
                                                   "deferrable": False, "deferred": False}
    original = copy.deepcopy(DESC)
    with_unique(original, "orders_note_key")
    new = new_table(lambda d: with_unique(d, "orders_note_key_m1"))
    renames = {**RENAMES, "orders_note_key_m1": "orders_note_key"}
    inverted = {v: k for k, v in renames.items()}
    forward = parity.compare(original, new, parity.Planned(renames=renames))
    back = parity.compare(new, original, parity.Planned(renames=inverted))
    assert parity.unplanned(forward) == [] and parity.unplanned(back) == []
    assert statuses(forward)["constraint:orders_note_key"] == "planned"


def test_partitions_are_matched_by_bound_value_across_a_widened_partition_column():
    """PostgreSQL prints an integer bound bare and a bigint one quoted: `tenant_id` int -> bigint, the
    layout kept, leaves the same partitions, which must not read as each one gone and another come."""
    def tree(low, high, owner="app"):
        part = {"kind": "r", "owner": "app", "comment": None, "tablespace": None, "reloptions": [], "grants": []}
        return {f"FOR VALUES FROM ({low}) TO ({high}) under FOR VALUES IN ('us')": {**part, "owner": owner},
                "FOR VALUES IN ('de', 'fr')": part}

    before = {**copy.deepcopy(DESC), "metadata": {**META, "partitions": tree("0", "10")}}

    def widened(owner="app"):
        d = copy.deepcopy(before)
        d["metadata"]["partitions"] = tree("'0'", "'10'", owner)
        return d

    assert parity.compare(before, widened(), parity.Planned()) == []
    # Matched, so what differs on a partition is still seen, under the bound as values.
    (diff,) = parity.compare(before, widened(owner="intruder"), parity.Planned())
    assert (diff.kind, diff.item, diff.before, diff.after) == (
        "partition_owner", "FOR VALUES FROM (0) TO (10) under FOR VALUES IN ('us')", "app", "intruder")
