"""A partitioned source: the new table's partitions, and their names through the swap.

Three layouts, chosen by the plan (mover/plan/tables.py):
- kept (no [target.partition]): the new table is partitioned as the source is, partition for
  partition: the bounds, sub-partitions, the DEFAULT partition, each partition's tablespace,
  owner, grants, storage options and comment, as the catalog prints them. Type changes of the key
  and of the partition columns included (a bound is a value; it reads as the wider type).
- a new layout ([target.partition]): mover/engines/partitioning/partitions.py reads it from the
  rows, through the source's parent, as for a conversion.
- one table ([target.partition] by = "none").

Names: a new partition takes its final name when that is free; one whose final name a partition
of the source holds is created as `<name>_new`, and the swap gives it the name: the source's
partition becomes `<name>_old` and the new one `<name>`, in the swap's transaction (and back at a
rollback). Which partitions swap names is read from the catalog each time (both trees, by
name), never stored: what `plan check` prints is what the swap runs.

Invariants:
- Every partition of the source has its counterpart before the copy starts (kept layout), or the
  new layout takes every row (plan check refuses otherwise, as for a conversion).
- A foreign table or a partition whose detach is pending is refused at plan check: mover cannot
  copy into the one nor say which table the other belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from mover import names
from mover.catalog import partition_tree, reading
from mover.catalog.partition_tree import Tree
from mover.errors import PlanError
from mover.names import QualifiedName
from mover.sql import ddl
from mover.sql import partitions as q

NEW_SUFFIX = "_new"
OLD_SUFFIX = "_old"


def new_name(partition: str) -> str:
    return names.derived(partition, NEW_SUFFIX)


def old_name(partition: str) -> str:
    return names.derived(partition, OLD_SUFFIX)


def refuse_unmovable(tree: Tree, source: QualifiedName) -> None:
    """What mover cannot copy into or account for among the source's partitions (plan check)."""
    foreign = [p for p in tree.partitions if p.kind == "f"]
    if foreign:
        raise PlanError(f"[migration] source: {source} has the foreign table {foreign[0].name} among its partitions; "
                        f"its rows live on another server, and mover cannot move them or swap the table",
                        hint=f"detach it first (ALTER TABLE {source} DETACH PARTITION {foreign[0].name}), move the "
                             f"table, then attach it to the new table")
    pending = [p for p in tree.partitions if p.detach_pending]
    if pending:
        raise PlanError(f"[migration] source: the partition {pending[0].name} of {source} is being detached "
                        f"concurrently (an interrupted DETACH ... CONCURRENTLY)",
                        hint=f"finish it first: ALTER TABLE {source} DETACH PARTITION {pending[0].name} FINALIZE")


def kept_sql(tree: Tree, source_oid: int, target: QualifiedName, taken: set[QualifiedName]) -> list[sql.Composed]:
    """The new table's partitions as the source's (parents first, each under its new parent), with
    what each carries of its own. `taken`: names in use that are not the source's partitions."""
    made: dict[int, QualifiedName] = {source_oid: target}
    out: list[sql.Composed] = []
    for p in tree.partitions:
        assert p.name.schema is not None
        new = QualifiedName(p.name.schema, new_name(p.name.name))
        if new in taken:
            raise PlanError(f"[migration] source: the new table's partition for {p.name} would be named {new}, "
                            f"which exists", hint=f"rename or drop {new}")
        made[p.oid] = new
        out.append(q.create_partition_as(new, made[p.parent_oid], p.bound, p.partition_by, p.tablespace))
        out.append(ddl.owner_to(new, p.owner))
        out += [ddl.grant(new, privilege, role, grantable) for role, privilege, grantable in p.grants]
        if p.reloptions and p.kind == "r":
            out.append(ddl.set_reloptions(new, p.reloptions))
        if p.comment is not None:
            out.append(ddl.comment_on(new, p.comment))
    return out


def _partitions(cur: psycopg.Cursor, table: QualifiedName) -> list[QualifiedName]:
    cur.execute("SELECT to_regclass(%s)::oid", (str(table),))
    row = cur.fetchone()
    return [] if row is None or row[0] is None else partition_tree.relations(cur, row[0])


# The indexes of one partition: name, and the definition from " USING" on (the same on both sides
# of a pair for the index they share a parent index's part of).
_INDEXES = ("SELECT ic.relname, substr(pg_get_indexdef(i.indexrelid), strpos(pg_get_indexdef(i.indexrelid), ' USING '))"
            " FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = to_regclass(%s)"
            " ORDER BY 2, 1")


@dataclass
class Renames:
    """The swap's partition renames, and the names `other`'s partitions have after them."""
    statements: list[sql.Composed] = field(default_factory=list)
    taken: dict[QualifiedName, QualifiedName] = field(default_factory=dict)


def swap_names(cur: psycopg.Cursor, live: QualifiedName, other: QualifiedName, *, forward: bool) -> Renames:
    """The partition renames of the swap (forward) or the swap back, read from both trees now.
    Forward: each partition of `live` (the source) whose name the new table's `<name>_new` waits
    for becomes `<name>_old`, and that one `<name>`. Back: each partition of `live` (the new
    table) whose `<name>_old` exists in `other` becomes `<name>_new` again, and that one `<name>`.
    Their indexes likewise: the partition taking the name takes its indexes' names too."""
    theirs = {p.name for p in _partitions(cur, other)}
    out = Renames()
    for p in _partitions(cur, live):
        assert p.schema is not None
        waiting = QualifiedName(p.schema, (new_name if forward else old_name)(p.name))
        if waiting.name not in theirs:
            continue
        away = (old_name if forward else new_name)
        out.statements += [ddl.rename_table(p, away(p.name)), ddl.rename_table(waiting, p.name)]
        out.statements += _index_names(cur, p, waiting)
        out.taken[waiting] = p
    return out


def _index_names(cur: psycopg.Cursor, giving: QualifiedName, taking: QualifiedName) -> list[sql.Composed]:
    """`giving`'s indexes and `taking`'s index of the same definition swap names (through a
    parking name, so the same statements serve the swap back); an index without a counterpart
    keeps its name."""
    given = reading.read(cur, _INDEXES, (str(giving),), missing=reading.printed(1, name=lambda r: f"index {r[0]}"))
    free = reading.read(cur, _INDEXES, (str(taking),), missing=reading.printed(1, name=lambda r: f"index {r[0]}"))
    out: list[sql.Composed] = []
    schema = giving.schema
    assert schema is not None
    for name, definition in given:
        match = next((r for r in free if r[1] == definition), None)
        if match is None or match[0] == name:
            continue
        free.remove(match)
        parking = names.derived(name, "_swap")
        out += [ddl.rename_index(QualifiedName(schema, name), parking),
                ddl.rename_index(QualifiedName(schema, match[0]), name),
                ddl.rename_index(QualifiedName(schema, parking), match[0])]
    return out
