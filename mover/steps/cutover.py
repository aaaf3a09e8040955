"""The cutover step: the gate it waits at until the operator says go (wait), what `plan check`
prints of the swap (describe), and the swap itself (run). The cutover's sequence and the
rollback's (swap_in, swap_back, at the end of this file) read top to bottom, each line a call into
the engine that does it (mover/engines/swap/cutover.py).
"""

from __future__ import annotations

from typing import NoReturn

import psycopg
from psycopg import sql

from mover.catalog import introspect
from mover.db import bind
from mover.engines import hooks
from mover.engines.capture import changelog, integrity, logical
from mover.engines.context import Context
from mover.engines.swap import carry, cutover, lockwatch, query_rehearsal
from mover.errors import Waiting
from mover.state import control
from mover.steps.base import Step
from mover.steps.create_target import target_ddl
from mover.steps.reconcile import last_check


class Cutover(Step):
    name = "cutover"
    gate = True

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
            return [s for _, s in lockwatch.lock_statements(cur, cutover.swap_locks(cur, ctx, m.source, m.target))]

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

    def wait(self, ctx: Context) -> NoReturn:
        """The gate (`mover run` stops here until `mover cutover`, or [cutover] auto): keep the
        target in step with the source while waiting, and tell the truth about it."""
        m = ctx.migration
        changelog.drain(ctx, reverse=False, backfill_done=True)
        integrity.refuse_forward(ctx)  # invariant 14: a capture gap refuses here too, naming it and its fix
        # A replay that failed since reconcile left open divergences: replayed once more first (the
        # application may have fixed the row since).
        ctx.db.transaction(bind(cutover.retry_unapplied, ctx, reverse=False))
        counts = ctx.db.transaction(bind(control.divergence_counts, m.id))
        ctx.db.transaction(bind(control.wait_at_gate, m, ctx.owner, counts), label="wait at the gate")
        if counts["open"]:
            kinds = ", ".join(f"{n} {kind}" for kind, n in counts["open_by_kind"].items())
            note = ctx.db.transaction(bind(integrity.bypassed_note, m.id))  # a recorded gap explains them
            raise Waiting(f"migration {m.name!r} is at the cutover gate, but {m.target} differs from {m.source}: "
                          f"{counts['open']} divergences ({kinds}) open; cutover refuses until they are resolved"
                          f"{note}",
                          hint=f"see them with `mover divergences {m.name}`; `mover repair {m.name}` re-syncs "
                               f"them from the source, `mover accept {m.name} --reason TEXT` closes them")
        # What the swap would leave on the old table is named here already (invariant 15).
        ctx.db.transaction(lambda cur: cutover.refuse_identity_bound(cur, ctx, forward=True), label="identity")
        raise Waiting(f"migration {m.name!r} is ready for cutover: {m.target} equals {m.source}",
                      hint=f"run `mover cutover {m.name}` to swap it in")

    def run(self, ctx: Context) -> None:
        hooks.run(ctx, "before_cutover")
        swap_in(ctx)
        hooks.run(ctx, "after_cutover")


# ---------------------------------------------------------------------------------------------
# The cutover's sequence, top to bottom, and the rollback's (the same the other way). Each line is
# a call into the engine that does it: mover/engines/swap/cutover.py (with carry.py, lockwatch.py,
# parity.py, changelog.py). docs/design.md, "The seven steps", says what each does and why.


def swap_in(ctx: Context) -> float:
    """The cutover: swap the target in under one short lock; returns how long it was held (ms)."""
    query_rehearsal.before_cutover(ctx)  # [cutover] rehearse: no recorded statement plans markedly worse
    cutover.preflight(ctx, last_check)  # no divergences, indexes valid, no subscriber broken; drain; last check
    prepared = cutover.prepare(ctx, forward=True)  # before the lock: digest, shapes, statements, parity
    try:
        with logical.flusher(ctx) as flusher:  # logical capture: a second session, to flush the WAL under the lock
            held = cutover.run_locked(ctx, lambda cur: _swap(cur, ctx, prepared, forward=True, flusher=flusher),
                                      forward=True,  # before each attempt: what came meanwhile drained, outside
                                      before_attempt=lambda: cutover.drain_before_lock(ctx, [prepared]))
    except cutover.Unapplied as exc:  # rolled back whole: nothing was swapped
        raise cutover.refused(ctx, exc, forward=True) from None
    except integrity.Bypassed as exc:  # capture not continuously in force, seen under the lock: recorded, refused
        raise integrity.refused(exc, "cutover") from None
    cutover.finish(ctx, held, forward=True)  # the slot dropped; VALIDATE the foreign keys added NOT VALID
    return held


def swap_back(ctx: Context, give_up_rows: bool = False, command: str = "rollback") -> float:
    """The rollback (within the window): the old table takes the name back, losing nothing (or
    refusing, invariant 9); the migration returns to before the gate."""
    cutover.refuse_rows_only_in_new(ctx, give_up_rows, command)  # reverse log drained; refused early
    integrity.refuse_reverse(ctx, give_up_rows, command)  # invariant 14: a gap in the reverse capture refuses
    with logical.preparing_back(ctx):  # logical capture: its publication and slot made before the lock
        prepared = cutover.prepare(ctx, forward=False)  # before the lock: digest, shapes, statements, parity
        try:
            held = cutover.run_locked(ctx, lambda cur: _swap(cur, ctx, prepared, forward=False,
                                                             give_up_rows=give_up_rows, command=command),
                                      forward=False, command=command,  # before each attempt: reverse drain, snapshots
                                      before_attempt=lambda: cutover.drain_before_swap_back(ctx, [prepared],
                                                                                            command=command))
        except cutover.Unapplied as exc:
            raise cutover.refused(ctx, exc, forward=False, command=command) from None
        except integrity.Bypassed as exc:  # seen under the lock: recorded, refused
            raise integrity.refused(exc, command) from None
    cutover.finish(ctx, held, forward=False)
    return held


def _swap(cur: psycopg.Cursor, ctx: Context, prepared: cutover.Prepared, *, forward: bool,
          give_up_rows: bool = False, command: str = "rollback", flusher: logical.Flusher | None = None) -> float:
    """The swap's one transaction (retried whole by lockwatch under lock_timeout, invariant 3)."""
    s = cutover.Swap(cur, ctx, prepared, forward=forward, give_up_rows=give_up_rows, command=command,
                     flusher=flusher)
    s.lock()  # ACCESS EXCLUSIVE: both tables, referencing tables, views, the logs; one at a time, in order
    s.verify()  # the catalog digest (shape, invariant 7): unchanged, what was built before the lock stands
    s.verify_capture()  # invariant 14: the capture drained next was continuously in force, no gap uncovered
    s.drain()  # logical capture fed to the lock first; the last logged changes (race 4, race 5)
    s.rebuild()  # only if the digest changed: statements and parity description read again, under the lock
    s.execute()  # swap and carry: capture off, objects off, renames, sequences, objects on, capture reversed
    s.check_parity()  # the table that takes the name looks as the other did; both shapes recorded again
    return s.record()  # capture path checked, the transition and the lock's phases recorded
