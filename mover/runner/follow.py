"""The follower (`mover follow NAME`, `mover run NAME --wait`): runs the steps that need no
decision under the lease, then keeps the change log drained at the cutover gate and in the
rollback window (control.FOLLOWED), so the drain under the swap's lock stays small, and retires
when the window ends.

It holds no lease while it drains: the operator's `cutover`, `rollback`, `retire` or `abort`
from another terminal takes the lease as usual. The two appliers cannot conflict:
- each follower batch first takes ROW EXCLUSIVE on both tables with NOWAIT, then the applier
  lock (mover/engines/capture/changelog.py) without waiting. A swap, rollback or retire that holds or waits for its
  ACCESS EXCLUSIVE lock makes the batch give up at once (the operator's drain goes first), and a
  batch that got its table locks never waits for anything the operator's transaction holds, so
  the swap's own drain at most waits for one short batch to commit (no deadlock).
- after its table locks, the batch re-reads the migration row: if the step or side of the swap
  changed since this round began (a swap committed meanwhile), it applies nothing.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from mover.db import Database, bind
from mover.engines.capture import changelog, logical
from mover.engines.context import Context, Reporter
from mover.errors import Interrupted, LeaseHeld, Waiting
from mover.runner import lifecycle
from mover.runner.lease import leased
from mover.state import control

log = logging.getLogger("mover.follow")

INTERVAL_SECONDS = 2.0


def following(m: control.Migration) -> bool:
    """Whether the follower drains now: at the gate (before the swap) or in the window."""
    if m.state in control.TERMINAL:
        return False
    return m.step in control.FOLLOWED and not (m.step == "cutover" and m.cutover_at is not None)


def window_over(m: control.Migration) -> bool:
    return m.step == "rollback_window" and m.window_ends_at is not None and m.window_ends_at <= datetime.now(UTC)


def _batch(cur: psycopg.Cursor, ctx: Context, reverse: bool) -> changelog.Applied | None:
    members = ctx.family(cur)  # every table: all of them replayed by one statement
    tables = [x for t in members for x in ((t.new, t.original) if reverse else (t.original, t.new))]
    try:
        with cur.connection.transaction():  # a savepoint: a lock refused ends only this round
            cur.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE NOWAIT").format(
                sql.SQL(", ").join(t.ident for t in tables)))
    except (psycopg.errors.LockNotAvailable, psycopg.errors.UndefinedTable):
        return None  # an operator command holds or waits for the tables (or just renamed them)
    now = control.get_by_id(cur, ctx.mid)
    if (now.step, now.cutover_at) != (ctx.migration.step, ctx.migration.cutover_at):
        return None
    if any(t.migration.step != ctx.migration.step for t in members):
        return None  # not every table at the gate (or in the window): the steps first
    return changelog.apply_tables_batch(cur, ctx, reverse=reverse)


def drain_round(ctx: Context) -> dict[str, Any]:
    """Apply what is logged now (a few batches at most) in the direction the migration's step
    calls for; return the backlog left, for the report."""
    m = ctx.migration
    reverse = m.step == "rollback_window"
    applied = 0
    if not reverse:
        logical.feed(ctx, catch_up=False)  # logical capture: the log fed from the slot, which lets its WAL go
    for _ in range(20):  # bounded: the loop must notice the operator's command soon
        ctx.checkpoint()
        got = ctx.db.transaction(bind(_batch, ctx, reverse), attempts=1, statement_timeout="120s",
                                 label="follow")
        if got is None:
            break
        applied += got.claimed
        if got.log_rows < changelog.BATCH:  # log rows: a closure's batch claims fewer keys than rows
            break
    def backlog(cur: psycopg.Cursor) -> tuple[int, float | None]:
        each = [changelog.pending(cur, t.mid, reverse) for t in ctx.family(cur)]
        lags = [lag for _, lag in each if lag is not None]
        return sum(n for n, _ in each), max(lags) if lags else None

    pending, lag = ctx.db.transaction(backlog, label="backlog")
    return {"direction": "reverse" if reverse else "forward", "applied": applied, "backlog": pending,
            "lag_s": round(lag, 1) if lag is not None else None}


def follow(db: Database, m: control.Migration, owner: str, *, report: Reporter, stop: threading.Event,
           interval: float = INTERVAL_SECONDS) -> None:
    """Steps under the lease; the gate and the window without it (the operator's commands take it).
    Ends when the migration is done or aborted, when the operator took it elsewhere than the window
    (a rollback, a retire, an abort), or on SIGTERM / Ctrl-C."""
    ctx = Context(db=db, migration=m, owner=owner, report=report, stop=stop)
    followed = False
    while not stop.is_set():
        m = _refresh(ctx)
        if m.state in control.TERMINAL or m.step == control.FINISHED:
            return
        if following(m):
            followed = True
            why = drain_while_waiting(ctx, interval=interval)
            if why == "stopped":
                report("follow_stopped", step=ctx.migration.step, reason="signal")
                return
            if why == "left" and not following(_refresh(ctx)):
                report("follow_done", step=ctx.migration.step, state=ctx.migration.state)
                return  # a rollback, retire or abort from another terminal: the operator decides what next
            if why != "window_over":
                continue
        elif followed:
            return
        # A step to run (or the window is over: close it and retire), under the lease.
        try:
            with leased(db, m, owner, report=report, stop=stop) as leased_ctx:
                lifecycle.advance(leased_ctx)
        except Waiting:
            if not following(_refresh(ctx)):
                raise  # waiting for something else than the gate or window (divergences are at the gate)
        except LeaseHeld:
            # An operator command runs now; look again shortly.
            if stop.wait(interval):
                return
        except Interrupted:
            return


def _refresh(ctx: Context) -> control.Migration:
    """The head's row as it is now, with the migration's step (its tables' earliest)."""
    ctx.refresh()
    return control.as_one([t.migration for t in ctx.tables()])


def drain_while_waiting(ctx: Context, *, interval: float = INTERVAL_SECONDS) -> str:
    """Drain while the migration stays at the gate or in the window. Returns why it stopped:
    "left" (another step now: the operator cut over, rolled back, retired or aborted; the
    caller decides whether to go on), "window_over" (the window ended: the caller retires), or
    "stopped" (SIGTERM / Ctrl-C)."""
    seen = None
    while True:
        m = _refresh(ctx)
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
