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


# What is made on a partition alone (not on the parent, which gives it to every partition), under
# %(root)s: the new table's partitions would not have it, and nothing would say so.
LOCAL_OBJECTS = """
WITH RECURSIVE t(relid) AS (
    SELECT inhrelid FROM pg_inherits WHERE inhparent = %(root)s
    UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN t ON i.inhparent = t.relid
)
SELECT format('trigger %%I on %%s', g.tgname, g.tgrelid::regclass) FROM pg_trigger g JOIN t ON g.tgrelid = t.relid
    WHERE NOT g.tgisinternal AND g.tgparentid = 0 AND g.tgname !~ '^mover_m[0-9]+_'
UNION ALL SELECT format('index %%s on %%s', i.indexrelid::regclass, i.indrelid::regclass)
    FROM pg_index i JOIN t ON i.indrelid = t.relid
    WHERE NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)
UNION ALL SELECT format('constraint %%I on %%s', k.conname, k.conrelid::regclass)
    FROM pg_constraint k JOIN t ON k.conrelid = t.relid
    WHERE k.conislocal AND k.coninhcount = 0 AND k.conparentid = 0 AND k.contype <> 'n'
UNION ALL SELECT format('foreign key %%I on %%s referencing %%s', k.conname, k.conrelid::regclass,
                         k.confrelid::regclass)
    FROM pg_constraint k JOIN t ON k.confrelid = t.relid WHERE k.contype = 'f' AND k.conparentid = 0
UNION ALL SELECT format('policy %%I on %%s', p.polname, p.polrelid::regclass)
    FROM pg_policy p JOIN t ON p.polrelid = t.relid
UNION ALL SELECT format('row level security on %%s', c.oid::regclass) FROM pg_class c JOIN t ON c.oid = t.relid
    WHERE c.relrowsecurity OR c.relforcerowsecurity
UNION ALL SELECT format('rule %%I on %%s', r.rulename, r.ev_class::regclass)
    FROM pg_rewrite r JOIN t ON r.ev_class = t.relid WHERE r.rulename <> '_RETURN'
UNION ALL SELECT DISTINCT format('view %%s reading %%s', r.ev_class::regclass, d.refobjid::regclass)
    FROM pg_depend d JOIN t ON d.refobjid = t.relid JOIN pg_rewrite r ON r.oid = d.objid
    WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass AND r.ev_class <> d.refobjid
UNION ALL SELECT format('publication %%I listing %%s', p.pubname, pr.prrelid::regclass)
    FROM pg_publication_rel pr JOIN t ON pr.prrelid = t.relid JOIN pg_publication p ON p.oid = pr.prpubid
UNION ALL SELECT format('statistics %%I on %%s', x.stxname, x.stxrelid::regclass)
    FROM pg_statistic_ext x JOIN t ON x.stxrelid = t.relid
"""


def refuse_local_objects(cur: psycopg.Cursor, oid: int, source: QualifiedName) -> None:
    """Objects bound to one partition of the source, which the new table's partitions would lack
    (invariant 14: carried, or refused naming the fix)."""
    cur.execute(LOCAL_OBJECTS, {"root": oid})
    found = [r[0] for r in cur.fetchall()]
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise PlanError(f"[migration] source: objects made on partitions of {source} alone, which the new table's "
                        f"partitions would not have: {shown}",
                        hint=f"make them on {source} itself (PostgreSQL gives them to every partition, and mover "
                             f"carries them), or drop them and make them again on the new partitions after the cutover")


def kept_sql(tree: Tree, source_oid: int, target: QualifiedName) -> list[sql.Composed]:
    """The new table's partitions as the source's (parents first, each under its new parent), with
    what each carries of its own (plan check refuses a `<name>_new` that is taken)."""
    made: dict[int, QualifiedName] = {source_oid: target}
    out: list[sql.Composed] = []
    for p in tree.partitions:
        assert p.name.schema is not None
        new = QualifiedName(p.name.schema, new_name(p.name.name))
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
