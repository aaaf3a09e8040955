"""A family's foreign keys, read from the catalog (issue 27): the keys between its tables, the order
they give the tables, and the columns that must widen with a key the plan widens.

Catalog reads only. mover/engines/swap/keys.py adds the keys between the family's sources to its
targets after the backfill (so both sides hold them, and the swap renames rather than re-creates
them); mover/engines/swap/carry.py leaves them where they are; `plan check` prints the [[also]] lines
that `widenings` finds, and `mover plan new` writes them into the plan (mover/runner/draft.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from mover.catalog import reading, server
from mover.catalog.introspect import INTEGER_MAX
from mover.names import QualifiedName, display_ident
from mover.plan.writer import also_block, toml_pairs


@dataclass(frozen=True)
class ForeignKey:
    """A foreign key from one table of a family (child) to another (parent), as pg_constraint holds
    it: enough to create the same key between two other tables."""
    name: str
    child: int  # oids
    parent: int
    columns: tuple[str, ...]
    ref_columns: tuple[str, ...]
    match: str  # confmatchtype: f (FULL), s (SIMPLE), p (PARTIAL)
    on_update: str  # confupdtype / confdeltype: a (NO ACTION), r, c, n, d
    on_delete: str
    delete_set: tuple[str, ...]  # ON DELETE SET NULL / SET DEFAULT (columns): only those columns
    deferrable: bool
    deferred: bool
    validated: bool
    enforced: bool = True  # NOT ENFORCED (18): neither side checks it
    period: bool = False  # a temporal key (18): the last columns of both lists are PERIOD ones





def between(cur: psycopg.Cursor, oids: Sequence[int]) -> list[ForeignKey]:
    """The foreign keys from one of the tables `oids` to another. A table's references to itself
    are not the family's: they are the table's own, which the swap carries as for one table."""
    version = server.of(cur)
    cur.execute(sql.SQL("""
SELECT k.conname, k.conrelid, k.confrelid,
       ARRAY(SELECT a.attname FROM unnest(k.conkey) WITH ORDINALITY u(n, i)
             JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n ORDER BY u.i),
       ARRAY(SELECT a.attname FROM unnest(k.confkey) WITH ORDINALITY u(n, i)
             JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = u.n ORDER BY u.i),
       k.confmatchtype, k.confupdtype, k.confdeltype,
       ARRAY(SELECT a.attname FROM unnest(coalesce(k.confdelsetcols, '{{}}')) WITH ORDINALITY u(n, i)
             JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n ORDER BY u.i),
       k.condeferrable, k.condeferred, k.convalidated, {enforced}, {period}
FROM pg_constraint k
WHERE k.contype = 'f' AND k.conparentid = 0 AND k.conrelid = ANY(%(oids)s) AND k.confrelid = ANY(%(oids)s)
  AND k.conrelid <> k.confrelid
ORDER BY k.conrelid, k.conname
""").format(enforced=version.conenforced("k"), period=version.conperiod("k")), {"oids": list(oids)})
    return [ForeignKey(name, child, parent, tuple(cols), tuple(refs), match, upd, dele, tuple(delset), deferrable,
                       deferred, validated, enforced, period)
            for name, child, parent, cols, refs, match, upd, dele, delset, deferrable, deferred, validated, enforced,
            period in cur.fetchall()]


def parents_first(oids: Sequence[int], keys: Sequence[ForeignKey]) -> list[int]:
    """`oids` ordered so that each table comes after the tables its keys reference (then in the
    given order; tables in a cycle of references keep the given order)."""
    left = list(oids)
    out: list[int] = []
    while left:
        ready = [o for o in left if not any(k.child == o and k.parent in left and k.parent != o for k in keys)]
        nxt = ready[0] if ready else left[0]
        out.append(nxt)
        left.remove(nxt)
    return out


# ---------------------------------------------------------------------------------------------
# The columns that must widen with a key


@dataclass(frozen=True)
class Widening:
    """A column narrower than the column it references becomes: `table`.`column` must become `type`."""
    oid: int
    table: QualifiedName
    column: str
    was: str  # its type now
    type: str  # the type it must take (the referenced column's new one)
    references: str  # the referenced table and column, for the reader
    constraint: str


_REFERENCING = """
SELECT k.conname, k.conrelid, n.nspname, c.relname, ca.attname, format_type(ca.atttypid, NULL), pn.nspname,
       pc.relname
FROM pg_constraint k
CROSS JOIN LATERAL unnest(k.conkey, k.confkey) AS u(child_att, parent_att)
JOIN pg_attribute ca ON ca.attrelid = k.conrelid AND ca.attnum = u.child_att
JOIN pg_attribute pa ON pa.attrelid = k.confrelid AND pa.attnum = u.parent_att
JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_class pc ON pc.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = pc.relnamespace
WHERE k.contype = 'f' AND k.conparentid = 0 AND k.confrelid = %s AND pa.attname = %s
ORDER BY n.nspname, c.relname, k.conname, ca.attname
"""


def canonical_type(cur: psycopg.Cursor, type_text: str) -> str | None:
    row = reading.read_one(cur, "SELECT format_type(to_regtype(%s), NULL)", (type_text,),
                           missing=lambda r: f"type {type_text}" if r[0] == reading.UNKNOWN_TYPE else None)
    found: str | None = row[0] if row else None
    return found


def widenings(cur: psycopg.Cursor, planned: dict[int, dict[str, str]]) -> list[Widening]:
    """Every column that references a column the plan widens (an integer type to a wider one) and
    is narrower than that column becomes, and so on from each such column (a key made of a
    referencing column is itself referenced, a table references itself): what the plan must widen
    too so that every new key can be referenced. `planned`: for each table of the plan (oid), its
    [target] columns. Those it widens already are left out."""
    wide: dict[tuple[int, str], str] = {}  # every column that becomes wider, with its new type
    for oid, columns in planned.items():
        for column, type_text in columns.items():
            canonical = canonical_type(cur, type_text)
            if canonical is not None and canonical in INTEGER_MAX:
                wide[(oid, column)] = canonical
    out: list[Widening] = []
    queue = list(wide)
    while queue:
        oid, column = queue.pop(0)
        new = wide[(oid, column)]
        for constraint, child, schema, table, child_column, child_type, p_schema, p_table in reading.read(
                cur, _REFERENCING, (oid, column), missing=reading.printed(
                    5, name=lambda r: f"the type of column {display_ident(r[4])} of {QualifiedName(r[2], r[3])}")):
            now = wide[(child, child_column)] if (child, child_column) in wide else str(child_type)
            if INTEGER_MAX.get(new, 0) <= INTEGER_MAX.get(now, 2 ** 63):
                continue
            wide[(child, child_column)] = new
            queue.append((child, child_column))
            if child_column not in planned.get(child, {}):
                out.append(Widening(child, QualifiedName(schema, table), child_column, child_type, new,
                                    f"{QualifiedName(p_schema, p_table)}.{display_ident(column)}", constraint))
    return out


def advice(found: Sequence[Widening], in_plan: dict[int, str]) -> list[str]:
    """What to write in the plan, as plan check prints it: an [[also]] table for each table the plan
    does not move yet, and for a table it moves (`in_plan`: oid -> how the plan names its section,
    "[target]" or "[[also]] source = ...") the columns to add to its `columns`."""
    by_table = per_table(found)
    lines: list[str] = []
    # The tables of the plan first (in its order), then the tables to add (as found).
    order = [o for o in in_plan if o in by_table] + [o for o in by_table if o not in in_plan]
    for oid, ws in ((o, by_table[o]) for o in order):
        columns = {w.column: w.type for w in ws}
        if oid in in_plan:
            lines += [f"# add to the columns of {in_plan[oid]}: {reasons(ws)}", f"#   {toml_pairs(columns)}", ""]
            continue
        lines += [*also_block(ws[0].table, columns, reasons(ws)), ""]
    return lines[:-1] if lines and lines[-1] == "" else lines


def per_table(found: Sequence[Widening]) -> dict[int, list[Widening]]:
    """The widenings by table (oid), in the order found."""
    out: dict[int, list[Widening]] = {}
    for w in found:
        out.setdefault(w.oid, []).append(w)
    return out


def reasons(found: Sequence[Widening]) -> str:
    """Why a table's columns must widen, for the reader: each column and what it references."""
    return "; ".join(f"{display_ident(w.column)} ({w.was}) references {w.references}" for w in found)
