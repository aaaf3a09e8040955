"""Family engine (issue 27): several tables moved by one migration, swapped in one transaction.

Each table of a family is a migration row of its own (its own id: its own change logs, ranges,
shapes and divergences), tied to the head's row (mover/state/control.py `family`); every per-table
engine works on a table's Context as it does for a migration of one table. What is the family's
is here: the foreign keys between its tables on the side the application does not write, the
order of its locks and drops, and the swap's, retire's and abort's one transaction for all of
them (their sequences read top to bottom in mover/steps/family.py).

Invariants:
- The foreign keys between the family's tables hold on both sides at every moment. The sources
  hold them as the application wrote them. The targets get them (`link`) once every table is
  copied, validated while only mover writes the targets, in the transaction that first drains
  every log, so that the targets hold the sources' state of one snapshot. The swap renames the
  tables and the keys stay with them (mover/engines/swap/carry.py leaves a key between two tables of
  the family alone): the new tables hold them after it, and the old ones keep theirs through the
  rollback window. Every replay of the family's logs is one statement
  (changelog.apply_family_batch), at whose end the keys are checked: a legal sequence of the
  application's writes never becomes a divergence.
- One transaction swaps every table, in phases over all of them (lock, verify, drain, rebuild,
  execute, check parity, record): a crash anywhere in it leaves every table swapped or none, and
  nothing is executed before every table's digest was verified (a table's statements were read
  from the catalog before any other table's ran).
- Locks are taken one relation at a time (lockwatch.lock_all, each under lock_timeout, the one
  waited on named): the live tables, referenced ones first, the other side's in the same order,
  the other tables the swap changes (outside the family: referencing tables, views), then
  mover's logs. The same retries, backoff and blocker handling as for one table (lockwatch),
  and one more: a live table an attempt timed out on is locked first by the next (race 9).
- Retire and abort drop the family's tables referencing ones first (a key between them refuses
  the drop of its parent), in one transaction each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from mover import faults
from mover.catalog import family as family_catalog
from mover.catalog import introspect, shape
from mover.db import one
from mover.engines.capture import changelog
from mover.engines.context import Context
from mover.engines.swap import carry, cutover, lockwatch
from mover.errors import Failed
from mover.names import QualifiedName
from mover.sql import ddl
from mover.state import control, ranges

log = logging.getLogger("mover.family")

T = TypeVar("T")


def tables(ctx: Context) -> list[Context]:
    """The family's tables (ctx's own among them), in the plan's order, as their rows read now."""
    return ctx.db.transaction(ctx.family, label="family")


def parents_first(cur: psycopg.Cursor, members: Sequence[Context]) -> list[Context]:
    """`members` with each table after the tables its keys reference (by the keys between the
    tables carrying the names the application uses: the sources, the new tables after the swap)."""
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
    checked, found = ctx.db.transaction(lambda cur: orphans(cur, members), statement_timeout="0",
                                        label="family keys check")
    if found:
        raise Failed(f"migration {ctx.migration.name!r}: " + "; ".join(found),
                     hint=f"`mover status {ctx.migration.name}`; the tables' keys were validated, so a trigger or "
                          f"session_replication_role bypassed them: report it, and `mover abort {ctx.migration.name}`")
    return checked


# ---------------------------------------------------------------------------------------------
# The swap's one transaction


def swap_locks(cur: psycopg.Cursor, members: Sequence[Context], forward: bool) -> list[QualifiedName]:
    """What the family's swap locks, in this order (ACCESS EXCLUSIVE, one at a time, those that
    exist): the live tables, referenced ones first; the other side's tables, in the same order;
    the other tables the swap changes (referencing tables outside the family, views); the logs."""
    ordered = parents_first(cur, members)
    live = [t.original if forward else t.new for t in ordered]
    other = [t.new if forward else t.original for t in ordered]
    outside = [x for table in live for x in carry.also_locked(cur, table)]
    own = [x for t in ordered for x in lockwatch.own_tables(t.mid)]
    return list(dict.fromkeys([*live, *other, *outside, *own]))


def digest(cur: psycopg.Cursor, members: Sequence[Context], forward: bool) -> str:
    """One digest of the catalog rows every table's swap statements, parity description and shapes
    are built from (carry.SWAP_INPUTS over all the family's tables, one query): read before the
    lock before any table's statements, and once under it."""
    return carry.catalog_digest(cur, [x for t in members for x in ((t.original, t.new) if forward
                                                                  else (t.new, t.original))])


def drain_locked(cur: psycopg.Cursor, ctx: Context, swaps: Sequence[cutover.Swap], forward: bool) -> int:
    """Under the swap's lock: every log of the direction, all of it, in one statement (race 4,
    race 5; the keys checked at its end), with each table's mapping as its Swap holds it (checked
    before the lock, or again under it where the digest changed). Forward, a change that fails
    rolls the whole swap back (cutover.Unapplied); swapping back, what fails is left to each
    table's own refusal (rows only in the new table). Returns the changes applied."""
    got = changelog.apply_family_batch(cur, ctx, reverse=not forward, limit=None, wait_for_lock=True,
                                     copied=[(s.ctx, s.mapping()) for s in swaps])
    if forward and got.failures:
        failures: dict[str, Any] = {}
        failures.update(got.failures)  # as the Swap's own drain collects them
        raise cutover.Unapplied(failures)
    return got.claimed


def run_locked(ctx: Context, members: Sequence[Context], attempt: Callable[[psycopg.Cursor], T], *, forward: bool,
               command: str = "rollback", before_attempt: Callable[[], None] | None = None) -> T:
    """The family's swap (or swap back) under the lock discipline of one table's
    (lockwatch.run_locked: autovacuum paused on every table, blockers named, lock_timeout,
    attempts, the terminate option), watching every relation it locks."""
    m = ctx.migration
    locks = ctx.db.transaction(lambda cur: swap_locks(cur, members, forward), label="tables the swap locks")
    live = [(t.original if forward else t.new) for t in members]
    tables = live + [(t.new if forward else t.original) for t in members]
    try:
        return lockwatch.run_locked(ctx, attempt, tables=tables, what="swap in" if forward else "swap back",
                                    retry=f"mover {'cutover' if forward else command} {m.name}",
                                    label="cutover" if forward else "rollback",
                                    statement_timeout=cutover.LOCK_STATEMENT_TIMEOUT,
                                    extra_tables=[x for x in locks if x not in tables],
                                    before_attempt=before_attempt, learn_order=live)
    finally:
        for t in members:
            t._mappings.clear()  # the tables changed names (or may have)


FAMILY_PHASES = ("verify_ms", "drain_ms", "catalog_ms", "ddl_ms", "parity_ms", "finish_ms")


def record(cur: psycopg.Cursor, ctx: Context, tables: int, forward: bool, held: float, replayed: int,
           marks: Sequence[float], attempt: int) -> None:
    """The family's lock hold split into its phases, each over every table (each table's own
    transition records its share from its own marks, which interleave): an event on the head's
    row, in the swap's transaction. `marks`: locked, verified, drained, read, ddl, ran (monotonic);
    `attempt`: which attempt at the lock this was."""
    ends = [*marks[1:], time.monotonic()]
    phases = {name: (end - start) * 1000 for name, start, end in zip(FAMILY_PHASES, marks, ends, strict=True)}
    kind = "family_swapped" if forward else "family_swapped_back"
    control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, kind,
                  f"{'swapped' if forward else 'swapped back'} {tables} tables in one transaction; "
                  f"lock held {held:.1f} ms",
                  {"lock_ms": held, "drained": replayed, "attempt": attempt, **phases}, held)


# ---------------------------------------------------------------------------------------------
# Retire and abort: one transaction for the family


def retire(ctx: Context, members: Sequence[Context], give_up_rows: bool = False) -> None:
    """The family's retire, as one table's (cutover.retire) for every table in one transaction: the
    leases, every lock, a refusal while rows exist only in an old table it would drop (invariant
    9), the drops, referencing tables first, every table done."""
    keep = ctx.plan.rollback.keep_old

    def drop(cur: psycopg.Cursor) -> None:
        for t in members:
            control.guard(cur, t.mid, "retire", t.owner)
        ordered = parents_first(cur, members)
        lockwatch.lock_all(cur, _by_role([cutover.retire_locks(t) for t in ordered]))
        for t in members:
            if not keep:
                left = cutover.rows_only_on(cur, t, "original")
                if left and not give_up_rows:
                    raise cutover.refuse_losing(t, left, "retire", "original")
                cutover.give_up(cur, t, left, "retire")
        with cutover.dependents_named(ctx, "retire"):  # a 2BP01 named as mover names it (invariant 15)
            for t in reversed(ordered):
                cutover.execute_all(cur, cutover.retire_sql(cur, t))
        for t in members:
            old = f"kept as {t.migration.old}" if keep else "dropped"
            control.mark_retired(cur, t.migration, t.owner, message=f"retired; old table {old}")
        faults.point("family:retired")  # every table's drops and transitions, not committed: none retired

    live = [t.migration.source for t in members]
    lockwatch.run_locked(ctx, drop, tables=[*live, *(t.migration.old for t in members)], what="retire",
                         retry=f"mover retire {ctx.migration.name}", label="retire",
                         extra_tables=[x for t in members for x in lockwatch.own_tables(t.mid)], learn_order=live)
    for t in members:
        t.refresh()


def abort(ctx: Context, members: Sequence[Context], give_up_rows: bool = False) -> None:
    """The family's abort, as one table's (cutover.abort) for every table in one transaction: every
    lock, a refusal while rows exist only in a target it drops (invariant 9), the drops,
    referencing tables first (their targets hold keys to the others'), every table aborted."""
    def live_of(cur: psycopg.Cursor, t: Context) -> QualifiedName:
        return shape.current_name(cur, t.mid, "source") or t.migration.source

    def undo(cur: psycopg.Cursor) -> None:
        ordered = parents_first(cur, members)
        lockwatch.lock_all(cur, _by_role([[live_of(cur, t), t.migration.target, *lockwatch.own_tables(t.mid)]
                                          for t in ordered]))
        for t in members:
            left = cutover.rows_only_on(cur, t, "new")
            if left and not give_up_rows:
                raise cutover.refuse_losing(t, left, "abort", "new")
            cutover.give_up(cur, t, left, "abort")
        with cutover.dependents_named(ctx, "abort"):  # a 2BP01 named as mover names it (invariant 15)
            for t in reversed(ordered):
                cutover.execute_all(cur, cutover.abort_sql(cur, t))
                ranges.reset(cur, t.mid, "backfill")
                ranges.reset(cur, t.mid, "reconcile")
        for t in members:
            control.mark_aborted(cur, t.migration, t.owner)
        faults.point("family:aborted")  # every table's drops and transitions, not committed: none aborted

    live = ctx.db.transaction(lambda cur: [live_of(cur, t) for t in members], label="tables abort locks")
    lockwatch.run_locked(ctx, undo, tables=[*live, *(t.migration.target for t in members)], what="abort",
                         retry=f"mover abort {ctx.migration.name}", label="abort",
                         extra_tables=[x for t in members for x in lockwatch.own_tables(t.mid)], learn_order=live)
    for t in members:
        t.refresh()


def _by_role(per_table: list[list[QualifiedName]]) -> list[QualifiedName]:
    """Each table's locks (its live table, its other, its logs), taken by role across the family:
    every table's first, then every table's second..., in the family's order (the live tables
    before the others, as the swap takes them)."""
    width = max((len(x) for x in per_table), default=0)
    return list(dict.fromkeys(x[i] for i in range(width) for x in per_table if i < len(x)))
