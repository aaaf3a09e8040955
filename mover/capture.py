"""Capture engine: install and remove the change-log trigger, apply the log by state.

Invariants:
- The trigger only appends keys; it cannot fail on the application's data (invariant 3).
- A logged key is replayed only once the backfill chunk covering it is done; otherwise a chunk
  still copying from an older snapshot could insert a row the replay already deleted (race 1).
- One applier at a time per migration and direction (a transaction-scoped advisory lock), so
  two replays of one key from different snapshots cannot commit out of order (race 2).
- A replay that fails on data (overflow, constraint) does not stop the others: the key becomes
  a recorded divergence, and cutover refuses until it is resolved.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from mover import chunks, control, introspect, names, privileges
from mover.context import Context
from mover.db import one
from mover.sql import capture as q
from mover.sql.copy import covered_by
from mover.sql.mapping import Mapping, named_bound

log = logging.getLogger("mover.capture")

BATCH = 5000


def log_name(ctx: Context, reverse: bool = False) -> names.QualifiedName:
    return names.change_log(ctx.mid, reverse)


def install_sql(cur: psycopg.Cursor, mid: int, table: names.QualifiedName, key: tuple[str, ...],
                migration: str, reverse: bool = False) -> list[sql.Composed]:
    """The statements that start capturing `table` into migration `mid`'s log."""
    info = introspect.describe(cur, table)
    key_types = tuple(info.column(k).type for k in key)
    log_table = names.change_log(mid, reverse)
    fn = names.capture_function(mid, reverse)
    return [q.create_log(log_table, key, key_types), *q.grant_log(log_table),
            q.create_trigger_function(fn, log_table, key, migration),
            *q.create_trigger(names.capture_trigger(mid, reverse), table, fn)]


def install(cur: psycopg.Cursor, mid: int, table: names.QualifiedName, key: tuple[str, ...], migration: str,
            reverse: bool = False) -> None:
    for stmt in install_sql(cur, mid, table, key, migration, reverse):
        cur.execute(stmt)
    # In the same transaction: a writer that could not run the trigger refuses the install (or the
    # swap that installs the reverse capture), instead of failing the application's writes.
    privileges.require_capture_path(cur, table, names.change_log(mid, reverse), migration)


def remove(cur: psycopg.Cursor, mid: int, table: names.QualifiedName | None, reverse: bool = False) -> None:
    if table is not None and introspect.exists(cur, table):
        trigger = names.capture_trigger(mid, reverse)
        cur.execute(q.drop_trigger(trigger, table))
        cur.execute(q.drop_trigger(q.truncate_trigger(trigger), table))
    cur.execute(q.drop_function(names.capture_function(mid, reverse)))
    cur.execute(q.drop_table(names.change_log(mid, reverse)))
    if not reverse:
        # Reconcile's notes of applied keys (mover/reconcile.py) live and die with the forward log;
        # the log's drop took their trigger with it.
        cur.execute(q.drop_table(names.applied_notes(mid)))
        cur.execute(q.drop_function(names.notes_function(mid)))


@dataclass
class Applied:
    claimed: int = 0
    deleted: int = 0
    upserted: int = 0
    failed: int = 0


def _lock_applier(cur: psycopg.Cursor, mid: int, reverse: bool, wait: bool) -> bool:
    fn = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    cur.execute(sql.SQL("SELECT {}(hashtext(%s), %s::int)").format(sql.Identifier(fn)),
                ("mover.apply.reverse" if reverse else "mover.apply", mid))
    got = one(cur)[0]
    return True if wait else bool(got)


def covered_condition(cur: psycopg.Cursor, ctx: Context, m: Mapping, backfill_done: bool):
    """Which log rows may be replayed now: all once the backfill is done, else the keys at or
    below the done prefix of the backfill's ranges; None when nothing is covered yet."""
    if backfill_done:
        return sql.SQL("true"), {}
    everything, hi = chunks.watermark(cur, ctx.mid, "backfill")
    if everything:
        return sql.SQL("true"), {}
    if hi is None:
        return None
    return covered_by("c", m, "wm"), named_bound("wm", hi)


def apply_batch(cur: psycopg.Cursor, ctx: Context, m: Mapping, *, reverse: bool, backfill_done: bool,
                limit: int = BATCH, wait_for_lock: bool = False) -> Applied:
    """Replay up to `limit` logged changes inside the caller's transaction."""
    if not _lock_applier(cur, ctx.mid, reverse, wait_for_lock):
        return Applied()
    cond = covered_condition(cur, ctx, m, backfill_done)
    if cond is None:
        return Applied()
    covered, params = cond
    log_table = names.change_log(ctx.mid, reverse)
    cur.execute("SAVEPOINT mover_replay")
    try:
        cur.execute(q.replay(m, log_table, covered=covered, skip_locked=not wait_for_lock),
                    {**params, "limit": limit})
        claimed, deleted, upserted = one(cur)
        cur.execute("RELEASE SAVEPOINT mover_replay")
        _count(cur, ctx.mid, reverse, claimed)
        return Applied(claimed, deleted, upserted)
    except psycopg.errors.Error as exc:
        if not (exc.sqlstate or "").startswith(("22", "23")):
            raise
        cur.execute("ROLLBACK TO SAVEPOINT mover_replay")
        log.warning("replay batch failed on data (%s); replaying key by key", exc.sqlstate)
    return _apply_key_by_key(cur, ctx, m, log_table, covered, params, limit)


def _apply_key_by_key(cur, ctx: Context, m: Mapping, log_table, covered, params, limit) -> Applied:
    cur.execute(q.claim_keys(log_table, covered, m.key), {**params, "limit": limit})
    keys = list(dict.fromkeys(tuple(r) for r in cur.fetchall()))
    result = Applied(claimed=len(keys))
    stmt = q.replay_keys(m)
    failures: list[tuple[tuple, psycopg.errors.Error]] = []
    for _attempt in range(2):  # a second pass lets keys blocked by another key's old value go through
        retry = []
        for key in keys:
            cur.execute("SAVEPOINT mover_key")
            try:
                cur.execute(stmt, list(key))
                deleted, upserted = cur.fetchone()
                result.deleted += deleted
                result.upserted += upserted
                cur.execute("RELEASE SAVEPOINT mover_key")
            except psycopg.errors.Error as exc:
                if not (exc.sqlstate or "").startswith(("22", "23")):
                    raise
                cur.execute("ROLLBACK TO SAVEPOINT mover_key")
                retry.append(key)
                failures.append((key, exc))
        keys = retry
        if not keys:
            break
    failed = {k: e for k, e in failures if k in keys}
    for key, error in failed.items():
        control.record_divergence(cur, ctx.mid, list(key), "apply_error",
                                  {"error": str(error).splitlines()[0], "sqlstate": error.sqlstate,
                                   "direction": "reverse" if m.src == ctx.new else "forward"})
        control.event(cur, ctx.mid, ctx.owner, None, "apply_error",
                      f"replaying key {list(key)} into {m.dst} failed: {str(error).splitlines()[0]}")
    result.failed = len(failed)
    _count(cur, ctx.mid, m.src == ctx.new, result.claimed)
    return result


def _count(cur: psycopg.Cursor, mid: int, reverse: bool, n: int) -> None:
    # Appliers of one direction are serialized by the advisory lock: no contention on this row.
    if n:
        cur.execute("INSERT INTO mover.capture_stats (migration_id, direction, applied, last_applied_at)"
                    " VALUES (%s, %s, %s, now()) ON CONFLICT (migration_id, direction)"
                    " DO UPDATE SET applied = capture_stats.applied + EXCLUDED.applied, last_applied_at = now()",
                    (mid, "reverse" if reverse else "forward", n))


def pending(cur: psycopg.Cursor, mid: int, reverse: bool = False) -> tuple[int, float | None]:
    log_table = names.change_log(mid, reverse)
    if not introspect.exists(cur, log_table):
        return 0, None
    try:
        with cur.connection.transaction():  # a savepoint
            cur.execute(q.pending_count(log_table))
            count, lag = one(cur)
    except psycopg.errors.UndefinedTable:
        # Dropped since the check by a retire, abort or swap committing meanwhile (`mover status`
        # runs beside them): a log that is gone holds nothing pending.
        return 0, None
    return count, (float(lag) if lag is not None else None)


def drain(ctx: Context, *, reverse: bool, backfill_done: bool, max_rounds: int | None = None) -> Applied:
    """Apply batches until caught up: a batch that finds less than a full batch means the log
    is within one batch of empty. (Under a busy writer "empty" may never come; the cutover
    empties the log under its lock, where writers wait.)"""
    total = Applied()
    rounds = 0
    while max_rounds is None or rounds < max_rounds:
        ctx.checkpoint()

        def one(cur):
            return apply_batch(cur, ctx, ctx.mapping(cur, reverse), reverse=reverse, backfill_done=backfill_done)

        got = ctx.db.transaction(one, statement_timeout="120s", label="apply")
        total.claimed += got.claimed
        total.deleted += got.deleted
        total.upserted += got.upserted
        total.failed += got.failed
        rounds += 1
        if got.claimed < BATCH:
            break
    if total.claimed:
        ctx.report("capture", applied=total.claimed, deleted=total.deleted, upserted=total.upserted)
    return total


def replay_keys(cur: psycopg.Cursor, ctx: Context, statement: sql.Composed,
                keys: list[list[str]]) -> dict[tuple, str]:
    """Replay the given keys by state now (`mover repair`), in the caller's transaction, holding
    the forward applier's lock so no batch replays the same keys from another snapshot (race 2).
    `statement` is sql.capture.replay_keys() for the mapping whose key types the keys are in.
    Returns the keys that failed on data (class 22 or 23), with the error."""
    _lock_applier(cur, ctx.mid, False, wait=True)
    failed: dict[tuple, str] = {}
    for key in dict.fromkeys(tuple(k) for k in keys):
        cur.execute("SAVEPOINT mover_key")
        try:
            cur.execute(statement, list(key))
            cur.execute("RELEASE SAVEPOINT mover_key")
        except psycopg.errors.Error as exc:
            if not (exc.sqlstate or "").startswith(("22", "23")):
                raise
            cur.execute("ROLLBACK TO SAVEPOINT mover_key")
            failed[key] = f"{str(exc).splitlines()[0]} [{exc.sqlstate}]"
    return failed

