"""What the query rehearsal reads of a plan (mover/engines/swap/query_rehearsal.py `shape`) and how it
judges two plans of one statement (`verdict`), on EXPLAIN (FORMAT JSON, VERBOSE) output as the
server prints it."""

from __future__ import annotations

from mover.engines.swap.query_rehearsal import CHANGED, COST_UP, SAME, SEQ_SCAN, PlanShape, Scan, shape, verdict
from mover.names import QualifiedName

SOURCE = QualifiedName("public", "orders")
TARGET = QualifiedName("public", "orders_new")


def node(kind: str, cost: float, *children: dict, rel: QualifiedName | None = None, index: str | None = None) -> dict:
    n: dict = {"Node Type": kind, "Total Cost": cost}
    if rel is not None:
        n |= {"Schema": rel.schema, "Relation Name": rel.name, "Alias": rel.name}
    if index is not None:
        n["Index Name"] = index
    if children:
        n["Plans"] = list(children)
    return n


def explained(top: dict) -> dict:
    return {"Plan": top}


def test_the_shape_names_the_target_as_the_application_will_and_its_indexes_as_the_swap_will():
    plan = explained(node("Limit", 12.5, node("Bitmap Heap Scan", 12.0, node("Bitmap Index Scan", 4.3,
                                                                             index="orders_customer_idx_m7"),
                                              rel=TARGET),
                          node("Seq Scan", 1.0, rel=QualifiedName("public", "customers"))))
    s = shape(plan, frozenset({("public", "orders_new")}), frozenset({"orders_customer_idx_m7", "orders_new_pkey"}),
              TARGET, "orders", {"orders_customer_idx_m7": "orders_customer_idx"})
    assert s.cost == 12.5
    assert s.nodes == ("Limit", 'Bitmap Heap Scan on "orders"', 'Bitmap Index Scan using "orders_customer_idx"',
                       'Seq Scan on "customers"')
    # The heap scan is reached through the index: one index access, no sequential scan of the table.
    assert s.scans == (Scan("Bitmap Index Scan", None, "orders_customer_idx"),)
    assert (s.seq_scans, s.index_scans, s.indexes) == (0, 1, ("orders_customer_idx",))


def test_a_partition_scan_counts_as_the_tables():
    p1 = QualifiedName("public", "orders_new_p1")
    plan = explained(node("Append", 40.0, node("Seq Scan", 20.0, rel=p1), node("Index Scan", 20.0, rel=p1,
                                                                               index="orders_new_p1_pkey")))
    s = shape(plan, frozenset({("public", "orders_new"), ("public", "orders_new_p1")}),
              frozenset({"orders_new_p1_pkey"}), TARGET, "orders", {})
    assert (s.seq_scans, s.index_scans) == (1, 1)
    assert s.nodes[1] == 'Seq Scan on "orders_new_p1"'


def _shape(cost: float, *scans: Scan, nodes: tuple[str, ...] | None = None) -> PlanShape:
    return PlanShape(cost, nodes if nodes is not None else tuple(s.node for s in scans), scans)


INDEX = Scan("Index Scan", "orders", "orders_customer_idx")
SEQ = Scan("Seq Scan", "orders", None)


def test_an_index_scan_that_becomes_a_sequential_scan_is_marked_whatever_the_costs():
    assert verdict(_shape(8.3, INDEX), _shape(9.0, SEQ), 2) == SEQ_SCAN  # a tiny table: the cost barely moves


def test_a_cost_rise_of_the_factor_is_marked_and_a_smaller_one_is_not():
    assert verdict(_shape(10.0, INDEX), _shape(20.0, INDEX), 2) == COST_UP
    assert verdict(_shape(10.0, INDEX), _shape(19.9, INDEX), 2) == SAME
    assert verdict(_shape(10.0, INDEX), _shape(39.0, INDEX), 4) == SAME


def test_another_plan_not_markedly_worse_is_changed_not_marked():
    other = Scan("Index Only Scan", "orders", "orders_customer_idx")
    assert verdict(_shape(10.0, INDEX), _shape(10.0, other), 2) == CHANGED
    assert verdict(_shape(10.0, SEQ), _shape(4.0, SEQ), 2) == CHANGED  # far cheaper
    assert verdict(_shape(100.0, SEQ), _shape(100.0, SEQ), 2) == SAME
    # a sequential scan already on the source: more of them is a matter of cost
    assert verdict(_shape(100.0, SEQ), _shape(120.0, SEQ, SEQ), 2) == CHANGED
