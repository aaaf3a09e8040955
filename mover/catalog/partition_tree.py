"""A partitioned source's tree: every partition under its parent, as the catalog holds it.

A partitioned table is many relations behind one name. mover moves it as one table (the parent
is what the application names, what capture, copy and compare read through), and reads the tree
only where the relations themselves matter: the new table's partitions (created with the same
bounds, or a new layout), what each partition carries of its own (owner, grants, storage options,
tablespace, comment), their names through the swap, and the refusals plan check names.

Nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from mover.catalog import reading
from mover.names import QualifiedName

# One row per relation under %(root)s (oid), parents before their partitions (from pg_inherits:
# pg_partition_tree() leaves out a partition whose concurrent detach is pending): its parent's oid,
# schema and name, kind ('r', 'p' for a sub-partitioned one, 'f' a foreign table), the bound as
# PostgreSQL prints it, the sub-partitioned one's PARTITION BY clause, a concurrent detach still
# pending, tablespace (NULL: the database's default), owner, storage options, comment.
TREE = """
WITH RECURSIVE t(relid, parentrelid, level) AS (
    SELECT i.inhrelid, i.inhparent, 1 FROM pg_inherits i WHERE i.inhparent = %(root)s
    UNION ALL
    SELECT i.inhrelid, i.inhparent, t.level + 1 FROM pg_inherits i JOIN t ON i.inhparent = t.relid
)
SELECT t.relid, t.parentrelid, n.nspname, c.relname, c.relkind::text,
       pg_get_expr(c.relpartbound, c.oid),
       CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END,
       coalesce((SELECT i.inhdetachpending FROM pg_inherits i WHERE i.inhrelid = c.oid), false),
       (SELECT s.spcname FROM pg_tablespace s WHERE s.oid = c.reltablespace),
       pg_get_userbyid(c.relowner), coalesce(c.reloptions, '{}'), obj_description(c.oid, 'pg_class'),
       t.level
FROM t JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
ORDER BY t.level, c.relname
"""

# Grants of one relation to roles other than its owner (None: PUBLIC).
GRANTS = ("SELECT CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END, a.privilege_type,"
          " a.is_grantable FROM pg_class c, aclexplode(c.relacl) a"
          " WHERE c.oid = %s AND a.grantee <> c.relowner ORDER BY 1, 2")


@dataclass(frozen=True)
class Partition:
    """One relation of the tree below the root."""
    oid: int
    parent_oid: int
    name: QualifiedName
    kind: str  # 'r', 'p' (itself partitioned), 'f' (a foreign table)
    bound: str  # "FOR VALUES FROM (...) TO (...)", "FOR VALUES IN (...)", "... WITH (MODULUS ...)", "DEFAULT"
    partition_by: str | None  # pg_get_partkeydef() of a sub-partitioned one: "RANGE (created_at)"
    detach_pending: bool
    tablespace: str | None
    owner: str
    reloptions: tuple[str, ...]
    comment: str | None
    level: int
    grants: tuple[tuple[str | None, str, bool], ...] = ()

    @property
    def is_default(self) -> bool:
        return self.bound == "DEFAULT"


@dataclass(frozen=True)
class Tree:
    partition_by: str  # the root's PARTITION BY clause, as pg_get_partkeydef() prints it
    partitions: tuple[Partition, ...]  # parents before their partitions

    def under(self, parent_oid: int) -> list[Partition]:
        return [p for p in self.partitions if p.parent_oid == parent_oid]


def is_partitioned(cur: psycopg.Cursor, oid: int) -> bool:
    cur.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = %s", (oid,))
    row = cur.fetchone()
    return bool(row and row[0])


def read(cur: psycopg.Cursor, oid: int) -> Tree | None:
    """The tree under the partitioned table `oid`, or None when it is not partitioned."""
    if not is_partitioned(cur, oid):
        return None
    root = reading.read_one(cur, "SELECT pg_get_partkeydef(%s)", (oid,),
                            missing=reading.printed(0, name=lambda r: "the partition key of the source"))
    assert root is not None
    rows = reading.read(cur, TREE, {"root": oid}, missing=lambda r: None if r[5] is not None else
                        f"the bound of partition {QualifiedName(r[2], r[3])}")
    out = []
    for (rel, parent, schema, name, kind, bound, partition_by, pending, tablespace, owner, reloptions, comment,
         level) in rows:
        cur.execute(GRANTS, (rel,))
        out.append(Partition(oid=rel, parent_oid=parent, name=QualifiedName(schema, name), kind=kind, bound=bound,
                             partition_by=partition_by, detach_pending=pending, tablespace=tablespace, owner=owner,
                             reloptions=tuple(reloptions), comment=comment, level=level,
                             grants=tuple(cur.fetchall())))
    return Tree(partition_by=root[0], partitions=tuple(out))


def relations(cur: psycopg.Cursor, oid: int) -> list[QualifiedName]:
    """Every relation below `oid` (none when it is not partitioned), parents first: one catalog
    query, cheap enough for every drain."""
    cur.execute("SELECT n.nspname, c.relname FROM pg_partition_tree(%s) t JOIN pg_class c ON c.oid = t.relid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.level > 0 ORDER BY t.level, c.relname",
                (oid,))
    return [QualifiedName(schema, name) for schema, name in cur.fetchall()]

