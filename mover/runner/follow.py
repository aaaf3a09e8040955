"""The follower (`mover follow NAME`, `mover run NAME --wait`): keeps the change log drained at
the cutover gate and in the rollback window, so the drain under the swap's lock stays small.

It holds no lease while it follows: the operator's `cutover`, `rollback`, `retire` or `abort`
from another terminal takes the lease as usual. The two appliers cannot conflict:
- each follower batch first takes ROW EXCLUSIVE on both tables with NOWAIT, then the applier
  lock (mover/engines/capture.py) without waiting. A swap, rollback or retire that holds or waits for its
  ACCESS EXCLUSIVE lock makes the batch give up at once (the operator's drain goes first), and a
  batch that got its table locks never waits for anything the operator's transaction holds, so
  the swap's own drain at most waits for one short batch to commit (no deadlock).
- after its table locks, the batch re-reads the migration row: if the step or side of the swap
  changed since this round began (a swap committed meanwhile), it applies nothing.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from mover.db import bind
from mover.engines import capture, logical
from mover.engines.context import Context
from mover.errors import Interrupted
from mover.state import control

log = logging.getLogger("mover.follow")

INTERVAL_SECONDS = 2.0


def following(m: control.Migration) -> bool:
    """Whether the follower drains now: at the gate (before the swap) or in the window."""
    if m.state in control.TERMINAL:
        return False
    return (m.step == "cutover" and m.cutover_at is None) or m.step == "rollback_window"


def window_over(m: control.Migration) -> bool:
    return m.step == "rollback_window" and m.window_ends_at is not None and m.window_ends_at <= datetime.now(UTC)


def _batch(cur: psycopg.Cursor, ctx: Context, reverse: bool) -> capture.Applied | None:
    live, other = (ctx.new, ctx.original) if reverse else (ctx.original, ctx.new)
    try:
        with cur.connection.transaction():  # a savepoint: a lock refused ends only this round
            cur.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE NOWAIT").format(
                sql.SQL(", ").join(t.ident for t in (live, other))))
    except (psycopg.errors.LockNotAvailable, psycopg.errors.UndefinedTable):
        return None  # an operator command holds or waits for the tables (or just renamed them)
    now = control.get_by_id(cur, ctx.mid)
    if (now.step, now.cutover_at) != (ctx.migration.step, ctx.migration.cutover_at):
        return None
    return capture.apply_batch(cur, ctx, ctx.mapping(cur, reverse), reverse=reverse, backfill_done=True)


def drain_round(ctx: Context) -> dict[str, Any]:
    """Apply what is logged now (a few batches at most) in the direction the migration's step
    calls for; return the backlog left, for the report."""
    m = ctx.migration
    reverse = m.step == "rollback_window"
    applied = 0
    if not reverse:
        logical.feed(ctx, catch_up=False)  # logical capture: the log fed from the slot, which then lets its WAL go
    for _ in range(20):  # bounded: the loop must notice the operator's command soon
        ctx.checkpoint()
        got = ctx.db.transaction(bind(_batch, ctx, reverse), attempts=1, statement_timeout="120s",
                                 label="follow")
        if got is None:
            break
        applied += got.claimed
        if got.claimed < capture.BATCH:
            break
    pending, lag = ctx.db.transaction(bind(capture.pending, ctx.mid, reverse), label="backlog")
    return {"direction": "reverse" if reverse else "forward", "applied": applied, "backlog": pending,
            "lag_s": round(lag, 1) if lag is not None else None}


def follow(ctx: Context, *, interval: float = INTERVAL_SECONDS) -> str:
    """Drain while the migration stays at the gate or in the window. Returns why it stopped:
    "left" (another step now: the operator cut over, rolled back, retired or aborted; the
    caller decides whether to go on), "window_over" (the window ended: the caller retires), or
    "stopped" (SIGTERM / Ctrl-C)."""
    seen = None
    while True:
        m = ctx.refresh()
        if not following(m):
            return "left"
        if window_over(m):
            return "window_over"
        where = (m.step, m.cutover_at)
        if where != seen:
            ctx._mappings.clear()  # the tables may have changed names
            seen = where
        try:
            got = drain_round(ctx)
        except Interrupted:
            return "stopped"
        if m.step == "rollback_window":  # the line `run --wait` always printed in the window
            ctx.report("window_sync", name=m.name, ends_at=m.window_ends_at.isoformat() if m.window_ends_at else None,
                       pending=got["backlog"], lag_seconds=got["lag_s"])
        else:
            ctx.report("follow", step=m.step, **got)
        if ctx.stop.wait(interval):
            return "stopped"
