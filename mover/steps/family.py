"""A family's steps where they are one for all its tables (issue 27): the foreign keys added to the
targets once every table is copied, the cutover gate, the swap and the swap back (one transaction
for every table, its sequence top to bottom below), the rollback window. The steps up to reconcile
run for each table as for one (mover/runner/keys.py calls them); each line here is a call into
the engine that does it (mover/engines/swap/keys.py, cutover.py, changelog.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NoReturn

import psycopg
from psycopg import sql

from mover import faults
from mover.catalog import introspect, shape
from mover.db import bind
from mover.engines.capture import changelog, integrity
from mover.engines.context import Context
from mover.engines.swap import carry, cutover, keys, query_rehearsal
from mover.errors import Waiting
from mover.state import control
from mover.steps.reconcile import last_check


def describe(ctx: Context, members: Sequence[Context], cur: psycopg.Cursor) -> list[sql.Composable | str]:
    """What `plan check` prints of the family's own work, from the code that runs it."""
    out: list[sql.Composable | str] = [
        "-- once every table is copied, before the first reconcile pass, in one transaction: every change log "
        "replayed by one statement, then the foreign keys between the family's tables added to the targets "
        "(validated: only mover writes them); the swap renames the tables and the keys stay with them"]
    out += keys.link_sql(cur, members, missing_only=False) or ["-- (no foreign key between these tables)"]
    ordered = keys.parents_first(cur, members)
    out += ["-- the cutover: one transaction swaps every table (each as its cutover step shows), under "
            f"lock_timeout {ctx.plan.cutover.lock_timeout_ms}ms, up to {ctx.plan.cutover.attempts} attempts; "
            "it locks, one relation at a time, in this order:",
            *(f"--   {t}" for t in keys.swap_locks(cur, ordered, forward=True)),
            "-- then verifies each table's catalog digest, replays every change log by one statement, runs each "
            "table's swap, checks each table's parity, and records the cutover of every table",
            "-- an attempt that times out on a table locks that table first in the next (race 9); before each "
            "attempt, every log is drained outside the lock"]
    deadlock_ms = introspect.setting_ms(cur, "deadlock_timeout")
    if ctx.plan.cutover.lock_timeout_ms >= deadlock_ms:
        out.append(f"-- warning: [cutover] lock_timeout ({ctx.plan.cutover.lock_timeout_ms}ms) is not below the "
                   f"server's deadlock_timeout ({deadlock_ms}ms): where the application's transactions and the swap "
                   "wait for each other (race 9), the server's deadlock check may end the application's transaction "
                   "before mover's attempt gives up; keep lock_timeout below deadlock_timeout")
    return out


def link(ctx: Context, members: Sequence[Context]) -> None:
    """Before the family's first reconcile pass: the keys between the tables on the targets."""
    keys.link(ctx, members)


def check_keys(ctx: Context, members: Sequence[Context]) -> int:
    """After the family's reconcile: the keys between the targets hold (a plain query each)."""
    return keys.check_keys(ctx, members)


def wait(ctx: Context, members: Sequence[Context]) -> NoReturn:
    """The family's cutover gate: every log drained (one statement), failed replays tried again,
    each table's divergences counted and recorded at the gate; exit 3 either way."""
    changelog.drain(ctx, reverse=False, backfill_done=True)
    counts = {}
    for t in ctx.db.transaction(bind(keys.parents_first, members)):  # a parent's row before its children's
        ctx.db.transaction(bind(cutover.retry_unapplied, t, reverse=False))
        counts[t.migration.name] = ctx.db.transaction(bind(control.divergence_counts, t.mid))
        ctx.db.transaction(bind(control.wait_at_gate, t.migration, t.owner, counts[t.migration.name]),
                           label="wait at the gate")
    name = ctx.migration.name
    open_ = {table: c for table, c in counts.items() if c["open"]}
    if open_:
        listed = "; ".join(f"{table}: {c['open']} ({', '.join(f'{n} {k}' for k, n in c['open_by_kind'].items())})"
                           for table, c in open_.items())
        raise Waiting(f"migration {name!r} is at the cutover gate, but divergences are open ({listed}); cutover "
                      f"refuses until they are resolved",
                      hint=f"see them with `mover divergences {name}`; `mover repair {name}` re-syncs them from the "
                           f"source, `mover accept {name} --reason TEXT` closes them")
    tables = ", ".join(str(t.migration.source) for t in members)
    raise Waiting(f"migration {name!r} is ready for cutover: every target equals its source ({tables})",
                  hint=f"run `mover cutover {name}` to swap them in, in one transaction")


# ---------------------------------------------------------------------------------------------
# The family's cutover and rollback, top to bottom: one table's sequence (mover/steps/cutover.py)
# for every table, with one locked transaction for all of them.


def swap_in(ctx: Context, members: Sequence[Context]) -> float:
    """The family's cutover: every table swapped in under one short lock; returns its hold (ms)."""
    query_rehearsal.before_cutover(ctx)  # [cutover] rehearse: no statement on any table plans markedly worse
    for t in members:
        cutover.preflight(t, last_check)  # no divergences, indexes valid, subscribers; drain; last check
    digest = ctx.db.transaction(bind(keys.digest, members, True), label="family digest")  # before the statements
    prepared = [cutover.prepare(t, forward=True) for t in members]  # before the lock: shapes, statements, parity
    try:
        held = keys.run_locked(ctx, members, lambda cur: _swap(cur, ctx, members, prepared, digest, forward=True),
                                 forward=True,  # before each attempt: every log drained (one statement a batch)
                                 before_attempt=lambda: cutover.drain_before_lock(ctx, prepared, members))
    except cutover.Unapplied as exc:  # rolled back whole: nothing was swapped
        raise cutover.refused(ctx, exc, forward=True) from None
    except integrity.Bypassed as exc:  # a table's capture not continuously in force: recorded, refused
        raise integrity.refused(exc, "cutover") from None
    for t in members:
        cutover.finish(t, held, forward=True, report=t is ctx)  # VALIDATE keys from outside the family added NOT VALID
    return held


def swap_back(ctx: Context, members: Sequence[Context], give_up_rows: bool = False,
              command: str = "rollback") -> float:
    """The family's rollback (within the window): every old table takes its name back in one
    transaction, losing nothing (or refusing, invariant 9)."""
    for t in members:
        cutover.refuse_rows_only_in_new(t, give_up_rows, command)  # reverse logs drained; refused early
    digest = ctx.db.transaction(bind(keys.digest, members, False), label="family digest")
    prepared = [cutover.prepare(t, forward=False) for t in members]
    try:
        held = keys.run_locked(ctx, members, lambda cur: _swap(cur, ctx, members, prepared, digest, forward=False,
                                                                 give_up_rows=give_up_rows, command=command),
                                 forward=False, command=command,  # before each attempt: reverse drains, snapshots
                                 before_attempt=lambda: cutover.drain_before_swap_back(ctx, prepared, members, command))
    except cutover.Unapplied as exc:
        raise cutover.refused(ctx, exc, forward=False, command=command) from None
    except integrity.Bypassed as exc:
        raise integrity.refused(exc, command) from None
    for t in members:
        cutover.finish(t, held, forward=False, report=t is ctx)
    return held


def _swap(cur: psycopg.Cursor, ctx: Context, members: Sequence[Context], prepared: list[cutover.Prepared],
          digest: str, *, forward: bool, give_up_rows: bool = False, command: str = "rollback") -> float:
    """The family's one transaction (retried whole by lockwatch under lock_timeout, invariant 3):
    each phase of one table's swap, for every table, before the next phase."""
    swaps = [cutover.Swap(cur, t, p, forward=forward, give_up_rows=give_up_rows, command=command)
             for t, p in zip(members, prepared, strict=True)]
    relations = keys.swap_locks(cur, members, forward)
    for i, s in enumerate(swaps):
        s.lock(relations if i == 0 else [])  # every lease; every lock, in the family's order, by the first
    marks = [time.monotonic()]
    changed = keys.digest(cur, members, forward) != digest  # one query: every table's catalog rows
    for s in swaps:
        s.verify(changed)  # unchanged: what was built before the lock stands
        s.verify_capture()  # invariant 14: each table's capture continuously in force, no gap uncovered
    marks.append(time.monotonic())
    replayed = keys.drain_locked(cur, ctx, swaps, forward)  # every log, one statement (race 4, 5)
    for i, s in enumerate(swaps):
        s.drain(replayed if i == 0 else 0)  # swapping back, rows only the new tables hold refuse (or are given up)
    marks.append(time.monotonic())
    for s in swaps:
        s.rebuild()  # only where a digest changed
    marks.append(time.monotonic())
    for s in swaps:
        s.execute()  # each table's swap and carry; the keys between the family's tables stay with the tables
    marks.append(time.monotonic())
    faults.point("family:swapped" if forward else "family:swapped_back")
    described = shape.describe(cur, [oid for p in prepared for oid in p.oids])  # every table, one query
    for s in swaps:
        s.check_parity(described)  # each table that takes a name looks as the other did; shapes recorded again
    marks.append(time.monotonic())
    # Each table's transition, in this transaction; the head's last, so that its hold (the one
    # `mover status NAME` shows) runs from the family's locks to all but the commit.
    held = [s.record() for s in reversed(swaps)][-1]
    keys.record(cur, ctx, len(swaps), forward, held, replayed, marks,  # where the lock's time went
                  prepared[0].attempts)
    return held


# ---------------------------------------------------------------------------------------------
# The rollback window


def window(ctx: Context, members: Sequence[Context]) -> None:
    """A run in the family's window: what the swap added NOT VALID validated, every reverse log
    applied (the old tables keep their keys, validated: the replay's one statement holds them);
    exit 3 until the window ends."""
    for t in members:
        carry.validate(t)
    if close(ctx, members, force=False):
        return
    stuck: list[dict[str, Any]] = []
    for t in members:
        stuck += ctx.db.transaction(bind(cutover.retry_unapplied, t, reverse=True))
    rejected = (f"; {len({tuple(d['key']) for d in stuck})} rows exist only in the new tables, the old tables "
                f"rejected them: {cutover.describe_rows(stuck)}") if stuck else ""
    m = ctx.refresh()
    raise Waiting(f"the rollback window of {m.name!r} is open until {m.window_ends_at:%Y-%m-%d %H:%M:%S %Z}{rejected}",
                  hint=f"`mover rollback {m.name}` swaps every table back; `mover retire {m.name} --force` ends it now")


def close(ctx: Context, members: Sequence[Context], *, force: bool) -> bool:
    """Every reverse log applied (one statement a batch), then the window ended for every table if
    it is over (or now, with force); False while it is open."""
    changelog.drain(ctx, reverse=True, backfill_done=True)

    def go(cur: psycopg.Cursor) -> bool:
        return all([control.close_window(cur, t.migration, t.owner, force=force) for t in members])

    closed = ctx.db.transaction(go, label="close rollback window")
    for t in members:
        t.refresh()
    return closed

