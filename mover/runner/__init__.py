"""Drives a migration through its steps under the orchestrator's lease.

The lease is a row in mover.migrations (owner, expiry, heartbeat), kept alive by a heartbeat
thread on its own connection (mover/state/heartbeat.py); every step transaction re-checks it (control.guard), so a
process that lost it cannot commit anything. Failures are recorded on the migration row and
re-raised; the next `mover run NAME` resumes from the recorded step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from mover import faults, steps
from mover.catalog import shape
from mover.db import Database, bind, is_connection_lost, mask
from mover.engines import capture, hooks, lockwatch, logical
from mover.engines import cutover as cutover_engine
from mover.engines.context import Context, Reporter, log_reporter
from mover.errors import Interrupted, LeaseHeld, LeaseLost, MoverError, ServerGone, ShapeChanged, Waiting
from mover.state import control, ranges, samples
from mover.state.heartbeat import Heartbeat
from mover.steps import rollback_window

log = logging.getLogger("mover.runner")


@contextmanager
def leased(db: Database, migration: control.Migration, owner: str, *, report: Reporter = log_reporter,
           stop: threading.Event | None = None, command: str | None = None) -> Iterator[Context]:
    """Hold the migration's lease for the duration; record how the work ended (an operator
    command's outcome under the command's name: an abort that could not lock is the abort's
    event, not the step's)."""
    sample = samples.Sampler(migration.id, owner)

    def acquire(cur: psycopg.Cursor) -> None:
        control.acquire_lease(cur, migration, owner)
        sample(cur, force=True)

    db.transaction(acquire, label="acquire lease")
    ctx = Context(db=db, migration=migration, owner=owner, report=report, stop=stop or threading.Event())
    ctx.refresh()

    def beat_once(cur: psycopg.Cursor) -> bool:
        if ctx.workers:
            ranges.keep_leases(cur, migration.id, sorted(ctx.workers))
        alive = control.heartbeat(cur, migration.id, owner)
        if alive:
            sample(cur)  # what `mover watch` and `mover report` chart; never costs the lease
        return alive

    beat = Heartbeat(db.dsn, beat_once, ctx.lease_lost, ctx.stop, name=f"lease-{migration.id}")
    beat.start()
    gone = False
    try:
        lockwatch.restore_pending(ctx)  # a crash between pausing autovacuum and restoring it
        capture.upgrade(ctx)  # a capture an older mover installed (granted to PUBLIC)
        logical.cleanup(ctx)  # a replication slot a crash left behind would keep WAL forever
        yield ctx
    except (LeaseLost, LeaseHeld):
        raise
    except Waiting as exc:
        _record(db, ctx, "waiting", str(exc), command=command)
        raise
    except (Interrupted, KeyboardInterrupt):
        how = getattr(ctx.stop, "reason", None) or "Ctrl-C"
        _record(db, ctx, "interrupted", None, kind="interrupted", message=f"stopped by the operator ({how})",
                command=command)
        raise
    except MoverError as exc:
        _record(db, ctx, "failed", str(exc), kind=getattr(exc, "event_kind", "failed"), message=str(exc),
                detail=getattr(exc, "detail", None), command=command)
        raise
    except Exception as exc:
        if is_connection_lost(exc):
            # Nothing can be recorded without the server, and trying would only retry and warn again.
            gone = True
            raise server_gone(migration.name, exc) from exc
        changed = _shape_change(ctx)
        if changed is not None:  # e.g. a statement that met a dropped column: say what changed
            _record(db, ctx, "failed", str(changed), kind=changed.event_kind, message=str(changed),
                    detail=changed.detail)
            raise changed from exc
        _record(db, ctx, "failed", f"{type(exc).__name__}: {exc}", kind="failed", message=str(exc),
                command=command)
        raise
    else:
        _clear_error(db, ctx)
    finally:
        beat.stop()
        if not ctx.lease_lost.is_set() and not gone:
            try:
                def release(cur: psycopg.Cursor) -> None:
                    sample(cur, force=True)
                    control.release_lease(cur, migration.id, owner)

                db.transaction(release, label="release lease")
            except psycopg.Error as exc:  # the lease expires by itself; say so and go on
                log.warning("could not release the lease (%s); it expires in %ss", exc, control.LEASE_SECONDS)


def server_gone(name: str, exc: BaseException) -> ServerGone:
    """The typed error for a server that went away mid-command, naming the migration."""
    cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return ServerGone(f"migration {name!r}: lost the connection to the database server ({mask(cause)}); the "
                      f"open transaction was rolled back, the migration is resumable",
                      hint=f"once the server is back, `mover run {name}` resumes where it stopped "
                           f"(`mover status {name}` shows where that is)")


def _shape_change(ctx: Context) -> ShapeChanged | None:
    """After an unexpected error: the shape change behind it, if a table's shape changed."""
    try:
        ctx.db.transaction(ctx.check_shape, label="shape check")
    except ShapeChanged as exc:
        return exc
    except psycopg.Error:
        pass  # the original error is the one to report
    return None


def _record(db: Database, ctx: Context, state: str, error: str | None, *, kind: str | None = None,
            message: str | None = None, detail: dict[str, Any] | None = None, command: str | None = None) -> None:
    if error is not None:
        error = mask(error)  # stored and shown by `status`: no password, whatever raised it
    if message is not None:
        message = mask(message)

    try:
        db.transaction(bind(control.record_outcome, ctx.mid, ctx.owner, command or ctx.migration.step, state, error,
                            kind, message, detail), label="record outcome")
    except psycopg.Error as exc:
        log.error("could not record the outcome %r of migration %s: %s", state, ctx.mid, exc)


def _clear_error(db: Database, ctx: Context) -> None:
    try:
        db.transaction(bind(control.clear_error, ctx.mid, ctx.owner), label="clear error")
    except psycopg.Error as exc:
        log.warning("could not clear the recorded error of migration %s: %s", ctx.mid, exc)


def advance(ctx: Context, *, one_step: bool = False, through_cutover: bool = False) -> control.Migration:
    """Run steps until the migration is done, reaches a gate, or (one_step) one step ran."""
    while True:
        ctx.checkpoint()
        m = ctx.refresh()
        if m.state in ("done", "aborted") or m.step == "finished":
            return m
        # Every step starts from the recorded shapes (ShapeChanged otherwise), the gate included.
        ctx.db.transaction(bind(shape.verify_at_step, m, ctx.swapped), label="shape check")
        step = steps.BY_NAME[m.step]
        if step.gate and not (through_cutover or ctx.plan.cutover.auto):
            # Waiting at the gate still keeps the new table in step with the live one.
            capture.drain(ctx, reverse=False, backfill_done=True)
            # The gate tells the truth: a replay that failed since reconcile left open divergences
            # (replayed once more first: the application may have fixed the row since).
            ctx.db.transaction(bind(cutover_engine.retry_unapplied, ctx, reverse=False))
            counts = ctx.db.transaction(bind(control.divergence_counts, m.id))
            error = None
            if counts["open"]:
                kinds = ", ".join(f"{n} {kind}" for kind, n in counts["open_by_kind"].items())
                error = f"{counts['open']} divergences ({kinds})"
            ctx.db.transaction(bind(control.set_state, m.id, "waiting", owner=ctx.owner, error=error))
            if error:
                raise Waiting(f"migration {m.name!r} is at the cutover gate, but {m.target} differs from {m.source}: "
                              f"{error} open; cutover refuses until they are resolved",
                              hint=f"see them with `mover divergences {m.name}`; `mover repair {m.name}` re-syncs "
                                   f"them from the source, `mover accept {m.name} --reason TEXT` closes them")
            raise Waiting(f"migration {m.name!r} is ready for cutover: {m.target} equals {m.source}",
                          hint=f"run `mover cutover {m.name}` to swap it in")
        ctx.db.transaction(bind(control.start_step, m, step.name, ctx.owner))
        step.run(ctx)
        faults.point(f"after:{step.name}")
        if one_step or (through_cutover and step.name == "cutover"):
            return ctx.refresh()


# ---------------------------------------------------------------------------------------------
# Operator commands: each checks the transition table (control.COMMANDS) under the lease, then
# moves the migration through the same steps and transitions as `mover run`.


def cutover(ctx: Context) -> control.Migration:
    """`mover cutover`: pass the gate and swap; a zero-length window retires at once, otherwise
    the open window is success (the migration waits in it)."""
    control.require_command(ctx.refresh(), "cutover")
    advance(ctx, through_cutover=True)
    try:
        return advance(ctx)
    except Waiting:
        ctx.db.transaction(bind(control.set_state, ctx.mid, "waiting", owner=ctx.owner), label="window open")
        return ctx.refresh()


def rollback(ctx: Context, *, give_up_rows: bool = False) -> control.Migration:
    """`mover rollback`: swap back within the window; the migration returns to reconcile."""
    control.require_command(ctx.refresh(), "rollback")
    hooks.run(ctx, "before_rollback")
    cutover_engine.swap_back(ctx, give_up_rows)
    hooks.run(ctx, "after_rollback")
    return ctx.migration


def retire(ctx: Context, *, force: bool = False, give_up_rows: bool = False) -> control.Migration:
    """`mover retire`: close the window (early, with force), then the retire step."""
    m = ctx.refresh()
    control.require_command(m, "retire")
    if m.step == "rollback_window" and not rollback_window.close(ctx, force=force):
        ends = f" until {m.window_ends_at:%Y-%m-%d %H:%M:%S %Z}".rstrip() if m.window_ends_at else ""
        raise Waiting(f"the rollback window of {m.name!r} is still open{ends}",
                      hint=f"wait, or `mover retire {m.name} --force`")
    ctx.give_up_rows = give_up_rows
    return advance(ctx)


def abort(ctx: Context, *, give_up_rows: bool = False) -> control.Migration:
    """`mover abort`: remove what mover built (before the cutover, or after a rollback)."""
    control.require_command(ctx.refresh(), "abort")
    cutover_engine.abort(ctx, give_up_rows)
    return ctx.migration
