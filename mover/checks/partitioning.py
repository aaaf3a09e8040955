"""A conversion to a partitioned table: the key that changes, the partitions to create, and the
values no partition would take (mover/engines/partitioning/partitions.py); a partitioned source:
its tree kept, re-partitioned, or made one table (mover/engines/partitioning/source_tree.py)."""

from __future__ import annotations

from mover import names
from mover.catalog import partition_tree
from mover.checks.subject import Subject
from mover.engines.partitioning import partitions, source_tree
from mover.errors import PlanError


def plan(s: Subject) -> None:
    if s.plan.new_layout is not None:
        s.partitioning = partitions.check_plan(s.cur, s.plan.new_layout, s.src, s.table, s.new, s.plan.columns)
        if s.plan.upkeep.manager == "pg_partman":
            # Refused now, not after the cutover: the upkeep the plan asks for must be possible.
            s.partitioning["manager"] = f"pg_partman (schema {partitions.check_partman(s.cur, s.src)})"


def source(s: Subject) -> None:
    """A partitioned source: what mover cannot move among its partitions is refused; with the
    layout kept, the partitions the new table gets (each under `<name>_new` until the swap)."""
    tree = partition_tree.read(s.cur, s.table.oid)
    if tree is None:
        if s.plan.one_table:
            raise PlanError(f'[target.partition] by = "none": {s.src} is not partitioned',
                            hint="remove [target.partition]")
        return
    source_tree.refuse_unmovable(tree, s.src)
    if s.plan.partition is not None:
        return  # a new layout (plan() above), or one table
    s.partitioning = {"by": tree.partition_by.split(" ", 1)[0].lower(),
                      "columns": list(partitions.partition_columns(s.cur, s.src)), "key": list(s.table.key),
                      "key_change": None, "kept": tree.partition_by,
                      "partitions": [{"name": source_tree.new_name(p.name.name), "bound": p.bound,
                                      "for": str(p.name)} for p in tree.partitions]}
    for p in tree.partitions:
        assert p.name.schema is not None
        made = names.QualifiedName(p.name.schema, source_tree.new_name(p.name.name))
        if partition_tree.exists(s.cur, made):
            raise PlanError(f"[migration] source: the new table's partition for {p.name} would be named {made}, "
                            f"and a relation of that name exists", hint=f"rename or drop {made}")
