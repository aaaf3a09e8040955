"""The cutover step: the gate it waits at until the operator says go (wait), what `plan check`
prints of the swap (describe), and the swap itself (run), for every table of the migration at
once. The cutover's sequence and the rollback's (swap_in, swap_back, at the end of this file) read
top to bottom, each line a call into the engine that does it (mover/engines/swap/cutover.py); each
phase runs for every table before the next, in one transaction.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Sequence
from typing import NoReturn

import psycopg
from psycopg import sql

from mover import faults
from mover.catalog import introspect, shape
from mover.db import bind
from mover.engines.capture import changelog, integrity, logical
from mover.engines.context import Context
from mover.engines.swap import carry, cutover, keys, lockwatch, query_rehearsal
from mover.errors import Waiting
from mover.state import control
from mover.steps.base import Step
from mover.steps.create_target import target_ddl
from mover.steps.reconcile import last_check


class Cutover(Step):
    name = "cutover"
    gate = True
    hooks = "cutover"

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        m = ctx.migration
        out: list[sql.Composable | str] = [
            *query_rehearsal.describe(ctx.plan),
            "-- before: autovacuum paused on both tables (restored after), blocking sessions named"
            + (", cancelled after [cutover] blocker_grace" if ctx.plan.cutover.terminate_blockers else ""),
            f"-- before each attempt: the log drained, then transactions with an older snapshot waited for (named; "
            f"at most {ctx.plan.cutover.snapshot_wait_ms / 1000:g} s each, [cutover] snapshot_wait; invariant 16)",
            f"-- one transaction, lock_timeout {ctx.plan.cutover.lock_timeout_ms}ms, up to "
            f"{ctx.plan.cutover.attempts} attempts:",
        ]

        def locks() -> list[sql.Composable | str]:
            return [s for _, s in lockwatch.lock_statements(cur, cutover.swap_locks(cur, [ctx], forward=True))]

        if introspect.exists(cur, m.target):
            out += locks()
            stmts, carried = cutover.swap_plan(cur, ctx, forward=True)
        else:
            # Not created yet (`plan check`): the swap's statements are read from a rehearsed
            # target, rolled back with its savepoint. (Its other indexes are built after the
            # backfill, so their renames are not listed here yet.)
            cur.execute("SAVEPOINT mover_describe_cutover")
            try:
                for stmt in target_ddl(cur, ctx.plan, m.source, m.target, m.id):
                    cur.execute(stmt)
                out += [*locks(), "-- and the migration's change log (created by install_capture)"]
                stmts, carried = cutover.swap_plan(cur, ctx, forward=True)
            finally:
                cur.execute("ROLLBACK TO SAVEPOINT mover_describe_cutover")
        out.append("-- apply the last logged changes, then:")
        out += [cutover.render(cur, s) for s in stmts]
        out.append(sql.SQL("COMMIT"))
        if carried.to_validate:
            out.append("-- after the lock, one transaction each (SHARE UPDATE EXCLUSIVE: writes go on):")
            out += [carry.validate_sql(schema, table, name) for schema, table, name in carried.to_validate]
        if carried.to_attach:
            out.append("-- then, on the partitioned table (attaches the partitions' validated copies, no scan):")
            out += [carry.attach_sql(*c) for c in carried.to_attach]
        out += [f"-- {note}" for note in carried.notes if "no partner" not in note or introspect.exists(cur, m.target)]
        if ctx.plan.drop_foreign_keys:
            out.append(f"-- foreign keys not carried over (acknowledged in [target] drop_foreign_keys): "
                       f"{', '.join(ctx.plan.drop_foreign_keys)}; they stay on the old table, so after retire "
                       f"{m.source} has no such foreign key")
        return out

    def describe_together(self, ctx: Context, tables: Sequence[Context],
                          cur: psycopg.Cursor) -> list[sql.Composable | str]:
        c = ctx.plan.cutover
        ordered = keys.parents_first(cur, tables)
        out: list[sql.Composable | str] = [
            f"-- the cutover: one transaction swaps every table (each as its cutover step shows), under "
            f"lock_timeout {c.lock_timeout_ms}ms, up to {c.attempts} attempts; it locks, one relation at a time, "
            "in this order:",
            *(f"--   {t}" for t in cutover.swap_locks(cur, ordered, forward=True)),
            "-- then verifies each table's catalog digest, replays every change log by one statement, runs each "
            "table's swap, checks each table's parity, and records the cutover of every table",
            "-- an attempt that times out on a table locks that table first in the next (race 9); before each "
            "attempt, every log is drained outside the lock"]
        warning = deadlock_warning(cur, ctx)
        if warning:
            out.append(f"-- {warning}")
        return out

    def wait(self, ctx: Context, tables: Sequence[Context]) -> NoReturn:
        """The gate (`mover run` stops here until `mover cutover`, or [cutover] auto): keep the
        targets in step with the sources while waiting (every log, one statement), and tell the
        truth about them: each table's failed replays tried again and its divergences counted and
        recorded at the gate; exit 3 either way."""
        m = ctx.migration
        changelog.drain(ctx, reverse=False, backfill_done=True)  # every table's log
        differ: list[str] = []
        for t in ctx.db.transaction(bind(keys.parents_first, tables)):  # a parent's row before its children's
            integrity.refuse_forward(t)  # invariant 14: a capture gap refuses here too, naming it and its fix
            # A replay that failed since reconcile left open divergences: replayed once more first
            # (the application may have fixed the row since).
            ctx.db.transaction(bind(cutover.retry_unapplied, t, reverse=False))
            counts = ctx.db.transaction(bind(control.divergence_counts, t.mid))
            ctx.db.transaction(bind(control.wait_at_gate, t.migration, t.owner, counts), label="wait at the gate")
            if counts["open"]:
                kinds = ", ".join(f"{n} {kind}" for kind, n in counts["open_by_kind"].items())
                note = ctx.db.transaction(bind(integrity.bypassed_note, t.mid))  # a recorded gap explains them
                differ.append(f"{t.migration.target} differs from {t.migration.source}: {counts['open']} "
                              f"divergences ({kinds}) open{note}")
        if differ:
            raise Waiting(f"migration {m.name!r} is at the cutover gate, but {'; '.join(differ)}; cutover refuses "
                          f"until they are resolved",
                          hint=f"see them with `mover divergences {m.name}`; `mover repair {m.name}` re-syncs "
                               f"them from the source, `mover accept {m.name} --reason TEXT` closes them")
        for t in tables:  # what the swap would leave on an old table is named here already (invariant 15)
            ctx.db.transaction(bind(cutover.refuse_identity_bound, t, forward=True), label="identity")
        equal = ", ".join(f"{t.migration.target} equals {t.migration.source}" for t in tables)
        raise Waiting(f"migration {m.name!r} is ready for cutover: {equal}",
                      hint=f"run `mover cutover {m.name}` to swap "
                           + ("it in" if len(tables) == 1 else "them in, in one transaction"))

    def run_all(self, ctx: Context, tables: Sequence[Context], *, give_up_rows: bool = False) -> None:
        swap_in(ctx, tables)


def deadlock_warning(cur: psycopg.Cursor, ctx: Context) -> str | None:
    """What plan check warns of a swap of several tables whose lock_timeout is not below the
    server's deadlock_timeout (race 9); None when it is."""
    lock_ms, deadlock_ms = ctx.plan.cutover.lock_timeout_ms, introspect.setting_ms(cur, "deadlock_timeout")
    if lock_ms < deadlock_ms:
        return None
    return (f"warning: [cutover] lock_timeout ({lock_ms}ms) is not below the server's deadlock_timeout "
            f"({deadlock_ms}ms): where the application's transactions and the swap wait for each other (race 9), the "
            "server's deadlock check may end the application's transaction before mover's attempt gives up; keep "
            "lock_timeout below deadlock_timeout")


# ---------------------------------------------------------------------------------------------
# The cutover's sequence, top to bottom, and the rollback's (the same the other way). Each line is
# a call into the engine that does it: mover/engines/swap/cutover.py (with carry.py, lockwatch.py,
# parity.py, changelog.py). docs/design.md, "The seven steps", says what each does and why.


def swap_in(ctx: Context, tables: Sequence[Context]) -> float:
    """The cutover: every table's target swapped in under one short lock; returns how long it was
    held (ms)."""
    query_rehearsal.before_cutover(ctx)  # [cutover] rehearse: no recorded statement plans markedly worse
    for t in tables:
        cutover.preflight(t, last_check)  # no divergences, indexes valid, no subscriber broken; drain; last check
    digest = ctx.db.transaction(bind(cutover.digest, tables, True), label="swap digest")  # before any statement
    prepared = [cutover.prepare(t, forward=True) for t in tables]  # before the lock: shapes, statements, parity
    try:
        with contextlib.ExitStack() as stack:  # logical capture: a second session each, to flush the WAL
            flushers = [stack.enter_context(logical.flusher(t)) for t in tables]
            held = cutover.run_locked(ctx, tables, lambda cur: _swap(cur, ctx, tables, prepared, digest, forward=True,
                                                                     flushers=flushers),
                                      forward=True,  # before each attempt: what came meanwhile drained, outside
                                      before_attempt=lambda: cutover.drain_before_lock(ctx, tables, prepared))
    except cutover.Unapplied as exc:  # rolled back whole: nothing was swapped
        raise cutover.refused(ctx, tables, exc, forward=True) from None
    except integrity.Bypassed as exc:  # capture not continuously in force, seen under the lock: recorded, refused
        raise integrity.refused(exc, "cutover") from None
    for t in tables:
        cutover.finish(t, held, forward=True, report=t is ctx)  # the slot dropped; VALIDATE keys added NOT VALID
    return held


def swap_back(ctx: Context, tables: Sequence[Context], give_up_rows: bool = False, command: str = "rollback") -> float:
    """The rollback (within the window): every old table takes its name back in one transaction,
    losing nothing (or refusing, invariant 9); the migration returns to before the gate."""
    for t in tables:
        cutover.refuse_rows_only_in_new(t, give_up_rows, command)  # reverse log drained; refused early
        integrity.refuse_reverse(t, give_up_rows, command)  # invariant 14: a gap in the reverse capture refuses
    with contextlib.ExitStack() as stack:
        for t in tables:
            stack.enter_context(logical.preparing_back(t))  # logical capture: publication and slot before the lock
        digest = ctx.db.transaction(bind(cutover.digest, tables, False), label="swap digest")
        prepared = [cutover.prepare(t, forward=False) for t in tables]  # before the lock: statements, parity
        try:
            held = cutover.run_locked(ctx, tables, lambda cur: _swap(cur, ctx, tables, prepared, digest, forward=False,
                                                                     give_up_rows=give_up_rows, command=command),
                                      forward=False, command=command,  # before each attempt: reverse drain, snapshots
                                      before_attempt=lambda: cutover.drain_before_swap_back(ctx, tables, prepared,
                                                                                            command=command))
        except cutover.Unapplied as exc:
            raise cutover.refused(ctx, tables, exc, forward=False, command=command) from None
        except integrity.Bypassed as exc:  # seen under the lock: recorded, refused
            raise integrity.refused(exc, command) from None
    for t in tables:
        cutover.finish(t, held, forward=False, report=t is ctx)
    return held


def _swap(cur: psycopg.Cursor, ctx: Context, tables: Sequence[Context], prepared: list[cutover.Prepared],
          digest: str, *, forward: bool, give_up_rows: bool = False, command: str = "rollback",
          flushers: Sequence[logical.Flusher | None] = ()) -> float:
    """The swap's one transaction (retried whole by lockwatch under lock_timeout, invariant 3): each
    phase, for every table, before the next."""
    swaps = [cutover.Swap(cur, t, p, forward=forward, give_up_rows=give_up_rows, command=command, flusher=f)
             for t, p, f in itertools.zip_longest(tables, prepared, flushers[:len(tables)])]
    relations = cutover.swap_locks(cur, tables, forward)
    for i, s in enumerate(swaps):
        s.lock(relations if i == 0 else [])  # ACCESS EXCLUSIVE: every relation, one at a time, in order
    marks = [time.monotonic()]
    changed = cutover.digest(cur, tables, forward) != digest  # one query: every table's catalog rows
    for s in swaps:
        s.verify(changed)  # the digest (shape, invariant 7): unchanged, what was built before the lock stands
        s.verify_capture()  # invariant 14: the capture drained next was continuously in force, no gap uncovered
    marks.append(time.monotonic())
    replayed = cutover.drain_locked(cur, ctx, swaps, forward)  # every log: logical fed first (race 4, race 5)
    marks.append(time.monotonic())
    for s in swaps:
        s.rebuild()  # only if the digest changed: statements and parity description read again, under the lock
    marks.append(time.monotonic())
    for s in swaps:
        s.execute()  # swap and carry: capture off, objects off, renames, sequences, objects on, capture reversed
    marks.append(time.monotonic())
    faults.point("swap:executed" if forward else "swap_back:executed")
    described = shape.describe(cur, [oid for p in prepared for oid in p.oids])  # every table, one query
    for s in swaps:
        s.check_parity(described)  # the table that takes the name looks as the other did; shapes recorded again
    marks.append(time.monotonic())
    # Each table's transition (capture path checked, the lock's phases recorded), in this
    # transaction; the head's last, so that its hold (the one `mover status NAME` shows) runs from
    # the locks to all but the commit.
    held = [s.record() for s in reversed(swaps)][-1]
    cutover.record_together(cur, ctx, swaps, forward, held, replayed, marks)  # several tables: where the time went
    return held
