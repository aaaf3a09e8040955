"""Cutover engine: the swap, its mirror image (rollback), retire and abort.

Invariants:
- The swap is one short transaction under the plan's lock_timeout, retried with backoff on
  55P03: lock both tables, drain the last logged changes, rename, hand over sequences, and
  reverse the capture. A write that committed before the lock is in the log and drained; a
  write that waits for the lock runs after the commit against the table that then carries the
  name (PostgreSQL re-resolves the name after a lock wait), so no write falls between (race 4).
- The application's queries wait at most as long as one attempt holds or waits for the lock.
- Rollback is the same transaction in the other direction; afterwards the forward capture runs
  again and the migration is back before the cutover gate, with reconcile to do again.
"""

from __future__ import annotations

import logging
import time

import psycopg
from psycopg import sql

from mover import capture, chunks, control, faults, introspect, names, reconcile
from mover.context import Context
from mover.errors import Failed, Waiting
from mover.sql import ddl

log = logging.getLogger("mover.cutover")

LOCK_STATEMENT_TIMEOUT = "30s"


class _ReplayFailedUnderLock(Failed):
    """The drain under the swap's lock met a change it could not apply; the swap rolled back."""


def preflight(ctx: Context) -> None:
    def check(cur):
        problems = []
        n = control.open_divergences(cur, ctx.mid)
        if n:
            raise Waiting(f"migration {ctx.migration.name!r} has {n} unresolved divergences; cutover refused",
                          hint=f"see them with `mover divergences {ctx.migration.name}`")
        for ix in introspect.describe(cur, ctx.new).indexes:
            if not ix.is_valid:
                problems.append(f"index {ix.name!r} on {ctx.new} is invalid")
        if problems:
            raise Failed("; ".join(problems), hint=f"run `mover run {ctx.migration.name}` to rebuild it")
    ctx.db.transaction(check)
    # Drain outside the lock so the locked transaction has little left to apply.
    capture.drain(ctx, reverse=False, backfill_done=True)
    if ctx.plan.reconcile.before_cutover:
        # The last check, outside the lock: re-verify every range that received an applied change
        # since reconcile verified it (mover/reconcile.py). What the lock's own drain applies after
        # this is the same state replay whose results this pass has just checked.
        result = reconcile.run(ctx)
        if result.open:
            raise Waiting(f"the last reconcile before the cutover of {ctx.migration.name!r} found {result.open}"
                          f" unresolved divergences; cutover refused",
                          hint=f"see them with `mover divergences {ctx.migration.name}`")


def _hand_over_sequences(cur, from_table: names.QualifiedName, to_table: names.QualifiedName) -> None:
    """Serial sequences change owner (so dropping the old table keeps them); identity columns
    have one sequence per table, so the receiving one continues where the other stands."""
    from_oid = introspect.table_oid(cur, from_table)
    to_oid = introspect.table_oid(cur, to_table)
    assert from_oid is not None and to_oid is not None and to_table.schema is not None  # both resolved, both exist
    to_identity = {s.column: s.sequence for s in introspect.owned_sequences(cur, to_oid) if s.identity}
    to_types = {c.name: c.type for c in introspect.describe(cur, to_table).columns}
    for seq in introspect.owned_sequences(cur, from_oid):
        if not seq.identity:
            cur.execute(sql.SQL("ALTER SEQUENCE {} OWNED BY {}").format(
                seq.sequence.ident, sql.Identifier(to_table.schema, to_table.name, seq.column)))
            # A serial widened to bigint needs a bigint sequence, or inserts stop at 2^31 - 1.
            # (Never narrowed back on rollback: the original column rejects what it cannot hold.)
            seq_type, _ = introspect.sequence_limits(cur, seq.sequence)
            new_type = to_types.get(seq.column, "")
            if introspect.INTEGER_MAX.get(new_type, 0) > introspect.INTEGER_MAX.get(seq_type, 0):
                cur.execute(ddl.sequence_as(seq.sequence, new_type))
        elif seq.column in to_identity:
            # Capped at the receiving sequence's maximum: after a rollback from a widened column,
            # values beyond the original's range cannot be issued there anyway (the rows that hold
            # them are apply_error divergences), and the swap back must not fail on them.
            target_seq = str(to_identity[seq.column])
            cur.execute(sql.SQL("SELECT setval(%s::regclass, least(s.last_value, (SELECT seqmax FROM pg_sequence"
                                " WHERE seqrelid = %s::regclass)), s.is_called) FROM {} s").format(seq.sequence.ident),
                        (target_seq, target_seq))


def _locked_swap(ctx: Context, *, forward: bool) -> float:
    """One attempt: returns how long the lock was held, in ms."""
    m = ctx.migration
    lock_timeout = f"{ctx.plan.cutover.lock_timeout_ms}ms"

    def swap(cur) -> float:
        control.guard(cur, ctx.mid, m.step, ctx.owner)
        live, other = (ctx.original, ctx.new) if forward else (ctx.new, ctx.original)
        cur.execute(ddl.lock_tables([live, other]))
        locked_at = time.monotonic()
        # Everything logged so far committed before our lock: drain it all.
        mapping = ctx.mapping(cur, reverse=not forward)
        while True:
            got = capture.apply_batch(cur, ctx, mapping, reverse=not forward, backfill_done=True,
                                      wait_for_lock=True, limit=50_000)
            if got.failed:
                raise _ReplayFailedUnderLock(f"{got.failed} changes could not be applied during the swap;"
                                             f" nothing was swapped", hint=f"see `mover divergences {m.name}`")
            if got.claimed == 0:
                break
        capture.remove(cur, ctx.mid, live, reverse=not forward)
        if forward:
            cur.execute(ddl.rename_table(m.source, m.old.name))
            cur.execute(ddl.rename_table(m.target, m.source.name))
            _hand_over_sequences(cur, m.old, m.source)
            capture.install(cur, ctx.mid, m.source, tuple(m.key_columns), m.name, reverse=True)
        else:
            cur.execute(ddl.rename_table(m.source, m.target.name))
            cur.execute(ddl.rename_table(m.old, m.source.name))
            _hand_over_sequences(cur, m.target, m.source)
            capture.install(cur, ctx.mid, m.source, tuple(m.key_columns), m.name, reverse=False)
        faults.point("swap:locked" if forward else "swap_back:locked")
        held_ms = (time.monotonic() - locked_at) * 1000
        if forward:
            window = ctx.plan.rollback.window_ms
            control.finish_step(cur, m, "cutover", "rollback_window", ctx.owner, state="waiting",
                                message=f"swapped {m.source} in; lock held {held_ms:.1f} ms",
                                detail={"lock_ms": held_ms}, duration_ms=held_ms)
            cur.execute("UPDATE mover.migrations SET cutover_at = now(), cutover_lock_ms = %s,"
                        " window_ends_at = now() + make_interval(secs => %s / 1000.0) WHERE id = %s",
                        (held_ms, window, ctx.mid))
        else:
            cur.execute("UPDATE mover.migrations SET step = 'reconcile', state = 'pending', cutover_at = NULL,"
                        " cutover_lock_ms = NULL, window_ends_at = NULL, updated_at = now()"
                        " WHERE id = %s AND lease_owner = %s", (ctx.mid, ctx.owner))
            control.reopen_steps(cur, ctx.mid, ["reconcile", "cutover", "rollback_window"])
            chunks.reset(cur, ctx.mid, "reconcile")
            control.event(cur, ctx.mid, ctx.owner, "rollback_window", "rolled_back",
                          f"swapped back; lock held {held_ms:.1f} ms", {"lock_ms": held_ms}, held_ms)
        return held_ms

    held = ctx.db.transaction(swap, lock_timeout=lock_timeout, statement_timeout=LOCK_STATEMENT_TIMEOUT,
                              attempts=ctx.plan.cutover.attempts, label="cutover")
    ctx._mappings.clear()  # the tables changed names
    return held


def lock_not_granted(ctx: Context, table, what: str, retry: str) -> Waiting:
    """Every lock on the live table waits at most lock_timeout per attempt; once the attempts
    are spent the operator decides (exit 3), rather than a bare database error (exit 1)."""
    c = ctx.plan.cutover
    return Waiting(f"could not lock {table} within {c.lock_timeout_ms} ms in {c.attempts} attempts to {what}"
                   f" migration {ctx.migration.name!r}; nothing was changed",
                   hint=f"retry `{retry}` when the table is quieter, or raise [cutover] lock_timeout / attempts"
                        f" (`mover set {ctx.migration.name} cutover.attempts=...`)")


def _record_replay_failures(ctx: Context, exc: _ReplayFailedUnderLock, *, reverse: bool) -> Waiting:
    """The apply_error divergences of the failed drain rolled back with the swap: replay again
    outside the lock, which records them for good, and leave the decision to the operator."""
    capture.drain(ctx, reverse=reverse, backfill_done=True)
    return Waiting(exc.message, hint=f"see them with `mover divergences {ctx.migration.name}`")


def swap_in(ctx: Context) -> float:
    preflight(ctx)
    try:
        held = _locked_swap(ctx, forward=True)
    except _ReplayFailedUnderLock as exc:
        raise _record_replay_failures(ctx, exc, reverse=False) from exc
    except psycopg.errors.LockNotAvailable as exc:
        raise Waiting(f"could not lock {ctx.migration.source} within {ctx.plan.cutover.lock_timeout_ms} ms in "
                      f"{ctx.plan.cutover.attempts} attempts; nothing was swapped",
                      hint=f"retry `mover cutover {ctx.migration.name}` when the table is quieter, or raise "
                           f"[cutover] lock_timeout / attempts") from exc
    ctx.refresh()
    ctx.report("cutover", lock_ms=round(held, 1))
    return held


def swap_back(ctx: Context) -> float:
    capture.drain(ctx, reverse=True, backfill_done=True)
    try:
        held = _locked_swap(ctx, forward=False)
    except _ReplayFailedUnderLock as exc:
        raise _record_replay_failures(ctx, exc, reverse=True) from exc
    except psycopg.errors.LockNotAvailable as exc:
        raise Waiting(f"could not lock {ctx.migration.source} for the rollback; nothing was swapped",
                      hint=f"retry `mover rollback {ctx.migration.name}`") from exc
    ctx.refresh()
    return held


def retire(ctx: Context) -> None:
    m = ctx.migration
    keep = ctx.plan.rollback.keep_old

    def drop(cur):
        control.guard(cur, ctx.mid, "retire", ctx.owner)
        capture.remove(cur, ctx.mid, m.source, reverse=True)
        capture.remove(cur, ctx.mid, None, reverse=False)
        if not keep:
            cur.execute(ddl.drop_table(m.old))
        control.finish_step(cur, m, "retire", "finished", ctx.owner, state="done",
                            message=f"retired; old table {'kept as ' + str(m.old) if keep else 'dropped'}")
        cur.execute("UPDATE mover.migrations SET finished_at = now(), lease_owner = NULL, lease_host = NULL,"
                    " lease_pid = NULL, lease_expires_at = NULL WHERE id = %s", (ctx.mid,))

    cutover = ctx.plan.cutover  # dropping the trigger locks the live table: as briefly as the swap
    try:
        ctx.db.transaction(drop, lock_timeout=f"{cutover.lock_timeout_ms}ms", attempts=cutover.attempts,
                           label="retire")
    except psycopg.errors.LockNotAvailable as exc:
        raise lock_not_granted(ctx, m.source, "retire", f"mover retire {m.name}") from exc
    ctx.refresh()


def abort(ctx: Context) -> None:
    m = ctx.migration

    def undo(cur):
        capture.remove(cur, ctx.mid, m.source, reverse=False)
        cur.execute(ddl.drop_table(m.target))
        chunks.reset(cur, ctx.mid, "backfill")
        chunks.reset(cur, ctx.mid, "reconcile")
        cur.execute("UPDATE mover.migrations SET state = 'aborted', finished_at = now(), lease_owner = NULL,"
                    " lease_host = NULL, lease_pid = NULL, lease_expires_at = NULL, updated_at = now()"
                    " WHERE id = %s", (ctx.mid,))
        cur.execute("UPDATE mover.steps SET status = 'undone' WHERE migration_id = %s AND status <> 'pending'",
                    (ctx.mid,))
        control.event(cur, ctx.mid, ctx.owner, None, "aborted", "aborted; everything mover created was removed")

    cutover = ctx.plan.cutover  # dropping the trigger locks the live table: as briefly as the swap
    try:
        ctx.db.transaction(undo, lock_timeout=f"{cutover.lock_timeout_ms}ms", attempts=cutover.attempts,
                           label="abort")
    except psycopg.errors.LockNotAvailable as exc:
        raise lock_not_granted(ctx, m.source, "abort", f"mover abort {m.name}") from exc
    ctx.refresh()
