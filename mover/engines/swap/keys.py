"""The foreign keys between a migration's tables (issue 27: a migration of several tables, `[[also]]`).

Each table of a migration is a row of its own (its own id: its own change logs, ranges, shapes and
divergences), tied to the head's row (mover/state/control.py `family`); every engine works on a
table's Context as for a migration of one table, and the swap, retire and abort take every table
in one transaction (mover/engines/swap/cutover.py). What is left that only several tables have is
here: the keys between them, on the side the application does not write.

Invariants:
- The foreign keys between the tables hold on both sides at every moment. The sources hold them
  as the application wrote them. The targets get them (`link`) once every table is copied,
  validated while only mover writes the targets, in the transaction that first drains every log,
  so that the targets hold the sources' state of one snapshot. The swap renames the tables and
  the keys stay with them (mover/engines/swap/carry.py leaves a key between two of the tables
  alone): the new tables hold them after it, and the old ones keep theirs through the rollback
  window. Every replay of the tables' logs is one statement (changelog.apply_family_batch), at
  whose end the keys are checked: a legal sequence of the application's writes never becomes a
  divergence.
- Reconcile checks them with plain queries (`check_keys`): a row whose reference finds no row on
  the other side means a trigger or session_replication_role bypassed them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg
from psycopg import sql

from mover import faults
from mover.catalog import family as family_catalog
from mover.catalog import introspect, shape
from mover.db import one
from mover.engines.capture import changelog
from mover.engines.context import Context
from mover.errors import Failed
from mover.names import QualifiedName
from mover.sql import ddl
from mover.state import control

log = logging.getLogger("mover.family")



def parents_first(cur: psycopg.Cursor, members: Sequence[Context]) -> list[Context]:
    """`members` with each table after the tables its keys reference (by the keys between the
    tables carrying the names the application uses: the sources, the new tables after the swap)."""
    if len(members) < 2:
        return list(members)
    oids = [introspect.table_oid(cur, t.migration.source) or 0 for t in members]
    by_oid = dict(zip(oids, members, strict=True))
    return [by_oid[o] for o in family_catalog.parents_first(oids, family_catalog.between(cur, oids))]


# ---------------------------------------------------------------------------------------------
# The keys between the family's tables, on the targets


def _has_constraint(cur: psycopg.Cursor, table: QualifiedName, name: str) -> bool:
    cur.execute("SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass(%s) AND conname = %s)",
                (str(table), name))
    return bool(one(cur)[0])


def link_sql(cur: psycopg.Cursor, members: Sequence[Context], *, missing_only: bool = True) -> list[sql.Composed]:
    """The foreign keys between the family's sources, each added to the targets between the same
    two tables: same name, columns, match, actions and deferral, validated (NOT VALID where the
    source's is not; plan check refuses one in a table's drop_foreign_keys). What `link` runs
    (the keys the targets lack) and what plan check prints (all of them)."""
    by_oid = {introspect.table_oid(cur, t.original) or 0: t for t in members}
    out = []
    for k in family_catalog.between(cur, list(by_oid)):
        child, parent = by_oid[k.child], by_oid[k.parent]
        if missing_only and _has_constraint(cur, child.new, k.name):
            continue
        out.append(ddl.add_foreign_key(child.new, k.name, k.columns, parent.new, k.ref_columns, match=k.match,
                                       on_update=k.on_update, on_delete=k.on_delete, delete_set=k.delete_set,
                                       deferrable=k.deferrable, deferred=k.deferred, not_valid=not k.validated,
                                       not_enforced=not k.enforced, period=k.period))
    return out


def link(ctx: Context, members: Sequence[Context]) -> int:
    """Once every table of the family is copied (before the first reconcile pass): the keys between
    the sources added to the targets, where missing (so a resumed run adds what a crash left out).
    In one transaction: every log drained first (the targets then hold the sources' state of one
    snapshot, which the keys hold), the keys added and validated (only mover writes the targets;
    SHARE ROW EXCLUSIVE on them blocks nobody else), the targets' shapes recorded again (the keys
    are part of them). Returns the keys added."""
    if len(members) < 2:
        return 0  # keys between tables need two

    def go(cur: psycopg.Cursor) -> int:
        for t in members:
            control.guard(cur, t.mid, t.migration.step, t.owner)
        stmts = link_sql(cur, members)
        if not stmts:
            return 0
        for t in members:
            t.check_shape(cur)  # recorded again below: nothing else may have changed meanwhile
        changelog.apply_family_batch(cur, ctx, reverse=False, limit=None, wait_for_lock=True)
        for stmt in stmts:
            try:
                with cur.connection.transaction():
                    cur.execute(stmt)
            except psycopg.errors.ForeignKeyViolation as exc:
                raise Failed(f"migration {ctx.migration.name!r}: a foreign key between the family's targets "
                             f"finds a row without its referenced row: {str(exc).splitlines()[0]}",
                             hint=f"`mover divergences {ctx.migration.name}` lists the rows a target could not "
                                  f"take; fix them in the source, then `mover run {ctx.migration.name}`") from exc
        for t in members:
            shape.record(cur, t.mid, target=t.new)
        faults.point("family:keys")  # inside the transaction: a crash here adds none of them
        texts = [s.as_string(cur) for s in stmts]
        control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "family_keys",
                      f"{len(stmts)} foreign keys between the family's tables added to their targets",
                      {"statements": texts})
        return len(stmts)

    added = ctx.db.transaction(go, statement_timeout="0", label="family keys")
    if added:
        ctx.report("family_keys", added=added)
    return added


def orphans(cur: psycopg.Cursor, members: Sequence[Context]) -> tuple[int, list[str]]:
    """The keys between the family's tables on the side the application does not write (the
    targets before the swap, the old tables in the window), each checked with a plain query: rows
    whose reference finds no row. Only the keys the live side holds validated (a NOT VALID one may
    hold such rows on both sides). The keys checked, and one line per key that finds such rows."""
    live = {introspect.table_oid(cur, t.migration.source) or 0: t for t in members}
    out = []
    checked = 0
    for k in family_catalog.between(cur, list(live)):
        if not k.validated:
            continue
        checked += 1
        child, parent = live[k.child], live[k.parent]
        c_tab, p_tab = (child.original, parent.original) if child.swapped else (child.new, parent.new)
        cur.execute(sql.SQL("SELECT count(*) FROM {c} c WHERE {notnull} AND NOT EXISTS"
                            " (SELECT 1 FROM {p} p WHERE {match})").format(
            c=c_tab.ident, p=p_tab.ident,
            notnull=sql.SQL(" AND ").join(sql.SQL("c.{} IS NOT NULL").format(sql.Identifier(col)) for col in k.columns),
            match=sql.SQL(" AND ").join(sql.SQL("p.{} = c.{}").format(sql.Identifier(r), sql.Identifier(col))
                                        for col, r in zip(k.columns, k.ref_columns, strict=True))))
        n = int(one(cur)[0])
        if n:
            out.append(f"{n} rows of {c_tab} reference no row of {p_tab} (foreign key {k.name})")
    return checked, out


def check_keys(ctx: Context, members: Sequence[Context]) -> int:
    """Reconcile's check of the family's keys: no row of the other side references a missing row.
    Returns the keys checked."""
    if len(members) < 2:
        return 0
    checked, found = ctx.db.transaction(lambda cur: orphans(cur, members), statement_timeout="0",
                                        label="family keys check")
    if found:
        raise Failed(f"migration {ctx.migration.name!r}: " + "; ".join(found),
                     hint=f"`mover status {ctx.migration.name}`; the tables' keys were validated, so a trigger or "
                          f"session_replication_role bypassed them: report it, and `mover abort {ctx.migration.name}`")
    return checked
