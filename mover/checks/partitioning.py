"""A conversion to a partitioned table: the key that changes, the partitions to create, and the
values no partition would take (mover/engines/partitioning/partitions.py); a partitioned source:
its tree kept, re-partitioned, or made one table (mover/engines/partitioning/source_tree.py)."""

from __future__ import annotations

from psycopg import sql

from mover import names
from mover.catalog import introspect, partition_tree
from mover.checks.subject import Subject
from mover.engines.partitioning import partitions, source_tree
from mover.errors import PlanError


def plan(s: Subject) -> None:
    if s.plan.new_layout is not None:
        s.partitioning = partitions.check_plan(s.cur, s.plan.new_layout, s.src, s.table, s.new, s.plan.columns)
        if s.plan.upkeep.manager == "pg_partman":
            # Refused now, not after the cutover: the upkeep the plan asks for must be possible.
            s.partitioning["manager"] = f"pg_partman (schema {partitions.check_partman(s.cur, s.src)})"


def movable(s: Subject) -> None:
    """Partitions mover cannot move (a foreign table, a pending concurrent detach), before the key:
    PostgreSQL allows no unique index over a foreign partition, so such a table has no key either,
    and "add a primary key" would send the operator to a statement PostgreSQL refuses."""
    s.cur.execute("SELECT to_regclass(%s)::oid", (str(s.src),))
    row = s.cur.fetchone()
    tree = partition_tree.read(s.cur, row[0]) if row and row[0] is not None else None
    if tree is not None:
        source_tree.refuse_unmovable(tree, s.src)


def source(s: Subject) -> None:
    """A partitioned source: what is bound to one partition alone is refused (what mover cannot move
    at all, movable() refused before the key was read); with the layout kept, the partitions the new
    table gets (each under `<name>_new` until the swap)."""
    tree = partition_tree.read(s.cur, s.table.oid)
    if tree is None:
        if s.plan.one_table:
            raise PlanError(f'[target.partition] by = "none": {s.src} is not partitioned',
                            hint="remove [target.partition]")
        return
    source_tree.refuse_local_objects(s.cur, s.table.oid, s.src)
    _managed_by_partman(s)
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
        if introspect.exists(s.cur, made):
            raise PlanError(f"[migration] source: the new table's partition for {p.name} would be named {made}, "
                            f"and a relation of that name exists", hint=f"rename or drop {made}")


def _managed_by_partman(s: Subject) -> None:
    """A source pg_partman manages: its maintenance would create and drop partitions behind
    mover's back (the shape check stops the migration on the first), and its part_config names
    the parent by text. The layout kept, the new table takes the name, the partitions' names and
    bounds: part_config holds for it as it is, once maintenance is off for the migration's time.
    A new layout or one table: part_config would describe a layout that is gone."""
    schema = partitions.partman_schema(s.cur)
    if schema is None:
        return
    s.cur.execute(sql.SQL("SELECT automatic_maintenance FROM {} WHERE parent_table = %s").format(
        sql.Identifier(schema, "part_config")), (partitions.partman_parent(s.src),))
    row = s.cur.fetchone()
    if row is None:
        return
    config = f"{names.display_ident(schema)}.part_config"
    where = f"WHERE parent_table = '{partitions.partman_parent(s.src)}'"
    if s.plan.partition is not None:
        raise PlanError(f"[target.partition]: pg_partman manages {s.src} ({config}), for the layout this plan "
                        f"replaces", hint=f"take it out of pg_partman first (DELETE FROM {config} {where}); "
                                          f'[partitions] manager = "pg_partman" hands the new layout to it after '
                                          f"retire")
    if row[0] != "off":
        raise PlanError(f"[migration] source: pg_partman manages {s.src} ({config}) and its maintenance is on: it "
                        f"would create and drop partitions behind mover's back during the migration",
                        hint=f"UPDATE {config} SET automatic_maintenance = 'off' {where} for the migration; after "
                             f"retire set it back to 'on' (the new table keeps the name, the partitions' names and "
                             f"bounds, so pg_partman goes on with it as it was)")
