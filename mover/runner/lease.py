"""The orchestrator's lease around a piece of work (mover/runner/lifecycle.py moves the migration
inside it).

The lease is a row in mover.migrations (owner, expiry, heartbeat), kept alive by a heartbeat
thread on its own connection (mover/state/heartbeat.py) that also records the progress samples
(mover/runner/sampler.py); every step transaction re-checks it (control.guard), so a process that
lost it cannot commit anything (invariant 5). How the work ended is recorded on the migration row
(waiting, interrupted, failed: control.record_outcome) and the error re-raised; the next
`mover run NAME` resumes from the recorded step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from mover.db import Database, is_connection_lost, mask
from mover.engines.capture import changelog, logical
from mover.engines.context import Context, Reporter, log_reporter
from mover.engines.swap import lockwatch
from mover.errors import Interrupted, LeaseHeld, LeaseLost, MoverError, ServerGone, ShapeChanged, Waiting
from mover.runner import sampler
from mover.state import control, ranges
from mover.state.heartbeat import Heartbeat

log = logging.getLogger("mover.runner")


@contextmanager
def leased(db: Database, migration: control.Migration, owner: str, *, report: Reporter = log_reporter,
           stop: threading.Event | None = None, command: str | None = None) -> Iterator[Context]:
    """Hold the migration's lease for the duration; record how the work ended (an operator
    command's outcome under the command's name: an abort that could not lock is the abort's
    event, not the step's)."""
    sample = sampler.Sampler(migration.id, owner)
    # A family's tables (issue 27) are held together: the same lease on every row, taken in one
    # transaction, the head's first (two takers queue on its row), kept and released together.
    rows = [migration]

    def acquire(cur: psycopg.Cursor) -> None:
        rows[:] = control.family(cur, migration)
        control.take_leases(cur, rows, owner)  # a holder that died is recorded as a failed attempt
        sample(cur, force=True)

    db.transaction(acquire, label="acquire lease")
    ctx = Context(db=db, migration=migration, owner=owner, report=report, stop=stop or threading.Event())
    ctx.refresh()

    def beat_once(cur: psycopg.Cursor) -> bool:
        if ctx.workers:
            for row in rows:
                ranges.keep_leases(cur, row.id, sorted(ctx.workers))
        alive = all([control.heartbeat(cur, row.id, owner) for row in rows])
        if alive:
            sample(cur)  # what `mover watch` and `mover report` chart; never costs the lease
        return alive

    beat = Heartbeat(db.dsn, beat_once, ctx.lease_lost, ctx.stop, name=f"lease-{migration.id}")
    beat.start()
    gone = False
    try:
        lockwatch.restore_pending(ctx)  # a crash between pausing autovacuum and restoring it
        changelog.upgrade(ctx)  # a capture an older mover installed (granted to PUBLIC)
        logical.cleanup(ctx)  # a replication slot a crash left behind would keep WAL forever
        yield ctx
    except (LeaseLost, LeaseHeld):
        raise
    except Waiting as exc:
        _record(db, ctx, rows, "waiting", str(exc), detail=getattr(exc, "detail", None), command=command)
        raise
    except (Interrupted, KeyboardInterrupt):
        how = getattr(ctx.stop, "reason", None) or "Ctrl-C"
        _record(db, ctx, rows, "interrupted", None, kind="interrupted", message=f"stopped by the operator ({how})",
                command=command)
        raise
    except MoverError as exc:
        _record(db, ctx, rows, "failed", str(exc), kind=getattr(exc, "event_kind", "failed"), message=str(exc),
                detail=getattr(exc, "detail", None), command=command)
        raise
    except Exception as exc:
        if is_connection_lost(exc):
            # Nothing can be recorded without the server, and trying would only retry and warn again.
            gone = True
            raise server_gone(migration.name, exc) from exc
        changed = _shape_change(ctx)
        if changed is not None:  # e.g. a statement that met a dropped column: say what changed
            _record(db, ctx, rows, "failed", str(changed), kind=changed.event_kind, message=str(changed),
                    detail=changed.detail)
            raise changed from exc
        _record(db, ctx, rows, "failed", f"{type(exc).__name__}: {exc}", kind="failed", message=str(exc),
                command=command)
        raise
    else:
        _clear_error(db, ctx, rows)
    finally:
        beat.stop()
        if not ctx.lease_lost.is_set() and not gone:
            try:
                def release(cur: psycopg.Cursor) -> None:
                    sample(cur, force=True)
                    for row in rows:
                        control.release_lease(cur, row.id, owner)

                db.transaction(release, label="release lease")
            except psycopg.Error as exc:  # the lease expires by itself; say so and go on
                log.warning("could not release the lease (%s); it expires in %ss", exc, control.LEASE_SECONDS)


def server_gone(name: str | None, exc: BaseException) -> ServerGone:
    """The typed error for a server that went away mid-command, naming the migration the command
    moves (None: a command that only reads, or that names no migration)."""
    cause = mask((str(exc).strip().splitlines() or [type(exc).__name__])[0])
    if name is None:
        return ServerGone(f"lost the connection to the database server ({cause}); the open transaction was "
                          f"rolled back", hint="once the server is back, run the same command again")
    return ServerGone(f"migration {name!r}: lost the connection to the database server ({cause}); the "
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


def _record(db: Database, ctx: Context, rows: list[control.Migration], state: str, error: str | None, *,
            kind: str | None = None, message: str | None = None, detail: dict[str, Any] | None = None,
            command: str | None = None) -> None:
    """How the work ended, on the migration's row (on each row of a family: it moves as one)."""
    if error is not None:
        error = mask(error)  # stored and shown by `status`: no password, whatever raised it
    if message is not None:
        message = mask(message)

    def record(cur: psycopg.Cursor) -> None:
        for row in rows:
            control.record_outcome(cur, row.id, ctx.owner, command or ctx.migration.step, state, error, kind,
                                   message, detail)
    try:
        db.transaction(record, label="record outcome")
    except psycopg.Error as exc:
        log.error("could not record the outcome %r of migration %s: %s", state, ctx.mid, exc)


def _clear_error(db: Database, ctx: Context, rows: list[control.Migration]) -> None:
    def clear(cur: psycopg.Cursor) -> None:
        for row in rows:
            control.clear_error(cur, row.id, ctx.owner)
    try:
        db.transaction(clear, label="clear error")
    except psycopg.Error as exc:
        log.warning("could not clear the recorded error of migration %s: %s", ctx.mid, exc)
