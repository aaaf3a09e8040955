"""The loop every range worker runs. Backfill (copy a range) and reconcile (compare a range) are
its two engines: each a RangeWorker that says what to do with a claimed range (work) and the
few things they really differ by (settings, the mapping ranges are cut on, what follows a range).

Invariants:
- One range at a time: read the migration row and the engine's settings (`mover set` takes
  effect at the next range), ask the throttle, claim, work, count the range or its failure,
  pace. The throttle (mover/engines/governor/throttle.py: pause, the governor's guards and duty, the
  rows/s cap) is asked only here, between ranges, never inside one: gate() before a claim (wait,
  or how many keys), pace() after a range (how long to rest: the cap's budget, or the duty's).
- A worker holds at most one claimed range, so after kill -9 at most one range per worker is
  redone (invariant 2): its lease expires, at once when its process died on this host.
- A range's work commits with its done mark, in a transaction that first checks the worker
  still owns the range (ranges.hold ... ranges.done, race 6). A worker whose range was taken
  over gets LeaseLost there, commits nothing and goes on with another range.
- A range that fails on its data or SQL counts an attempt (ranges.record_failure) and the worker
  goes on. A lost server, a changed shape, a stop or the orchestrator's lost lease end the
  worker; run() raises it in the orchestrator's thread (mover/threads.py) and the step fails.
- Every write to the queue and to the worker's row is mover/state/ranges.py's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import psycopg

from mover import faults, threads
from mover.db import Database, bind
from mover.engines.context import Context, Reporter
from mover.engines.governor import throttle
from mover.errors import Interrupted, LeaseLost, MoverError, ShapeChanged
from mover.sql.mapping import Mapping
from mover.state import control, ranges

log = logging.getLogger("mover.rangework")

IDLE_WAIT_SECONDS = 0.2  # nothing to claim while others still work: look again after this


@dataclass(frozen=True)
class Settings:
    """An engine's settings for its next range, read from the migration row before each."""

    limits: throttle.Limits
    range_rows: int  # the size to ask for, before the throttle's limits
    max_attempts: int


@dataclass(frozen=True)
class Done:
    """A range's work, committed with its done mark."""

    rows: int  # rows copied, or source rows compared
    ms: float  # how long the work took
    counts: dict[str, int] = field(default_factory=dict)  # the engine's own tallies


class RangeWorker:
    """One worker on a queue of ranges of `kind`, in its own connection and Context (threads
    share no connection). An engine subclasses it and fills in the hooks; run() is the loop."""

    kind: ClassVar[str]
    role: ClassVar[str] = "mover-worker"  # its name in pg_stat_activity

    def __init__(self, dsn: str, migration: control.Migration, wid: str, *, stop: threading.Event,
                 lost: threading.Event, registry: set[str], report: Reporter, n_workers: int = 1,
                 governor: throttle.Governor | None = None) -> None:
        self.db = Database(dsn, role=self.role)
        self.ctx = Context(db=self.db, migration=migration, owner=wid, report=report, stop=stop, lease_lost=lost)
        self.wid, self.registry, self.report = wid, registry, report
        # The cap is shared evenly by this process's workers of the engine; the governor by every
        # engine of the migration (one per process: throttle.governing, throttle.following).
        self.pacer = throttle.Throttle(throttle.Limits(), n_workers, governor)

    # -- the hooks ------------------------------------------------------------------------------

    def settings(self, m: control.Migration) -> Settings | None:
        """The engine's settings for the next range, from the migration row `m` (in the
        transaction that read it: no I/O); None when the engine has nothing more to do at m's step."""
        raise NotImplementedError

    def mapping(self, cur: psycopg.Cursor) -> Mapping:
        """The tables the ranges are cut on, in the claim's transaction."""
        raise NotImplementedError

    def work(self, key_range: ranges.KeyRange) -> Done:
        """Do the claimed range's work and commit it with its done mark: ranges.hold() first and
        ranges.done() last in one transaction (race 6)."""
        raise NotImplementedError

    def finished(self, key_range: ranges.KeyRange, done: Done) -> None:
        """After a range: report it, keep the change log short."""

    def idle(self) -> None:
        """No range to claim while others still work on theirs."""

    def waiting(self, reason: str) -> None:
        """The throttle holds the worker for a new reason (its row says so in any case)."""

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        """Claim and work ranges until none is left (or the engine's step is over); then leave.
        Raises what ends the worker: run_workers() below hands it to the orchestrator."""
        self.registry.add(self.wid)  # from now on the heartbeat keeps its row and its ranges' leases
        try:
            self.db.transaction(bind(ranges.register_worker, self.ctx.mid, self.wid))
            try:
                self._loop()
            finally:
                self._leave()
        finally:
            self.registry.discard(self.wid)
            self.db.close()

    def _look(self, cur: psycopg.Cursor) -> tuple[control.Migration, Settings | None, throttle.Gate | None]:
        """The migration row, the engine's settings and, in the same transaction, the throttle's
        answer: wait, or claim a range of so many keys."""
        m = control.get_by_id(cur, self.ctx.mid)
        s = None if m.state == "aborted" else self.settings(m)
        if s is None:
            return m, None, None
        self.pacer.limits = s.limits
        return m, s, self.pacer.gate(m.paused, s.range_rows)

    def _loop(self) -> None:
        ctx, mid = self.ctx, self.ctx.mid
        waiting: str | None = None
        owed, owed_for = 0.0, ""  # monotonic time before which no further range may start, and why
        while True:
            ctx.checkpoint()
            m, s, gate = self.db.transaction(self._look)
            ctx.use(m)
            if s is None or gate is None:
                return
            if gate.wait:
                if gate.wait != waiting:
                    self.waiting(gate.wait)
                waiting = gate.wait
                self._wait(gate.wait, gate.seconds)
                continue
            if waiting:
                waiting = None
                self._wait(None, 0)
            # Not waiting for the WAL flush: a claim a crash loses is cut again from the frontier,
            # and nothing was done under it (the work's commit comes later in the WAL).
            attempts = s.max_attempts
            key_range = self.db.transaction(bind(self._claim, gate.rows, attempts), synchronous_commit=False,
                                            label="claim")
            if key_range is None:
                if self.db.transaction(bind(ranges.state, mid, self.kind))["open"] == 0:
                    return  # nothing left here; failed ranges are the orchestrator's to report
                # Others are still working, or a worker died: its ranges come back when its lease
                # expires, at once when it died on this host.
                self.db.transaction(bind(ranges.release_dead_local_owners, mid))
                self.idle()
                ctx.stop.wait(IDLE_WAIT_SECONDS)
                continue
            faults.point("claimed")  # between building the mapping and working with it
            if owed > time.monotonic():
                waiting = owed_for
                self._wait(waiting, owed - time.monotonic())
            started = time.monotonic()
            try:
                done = self.work(key_range)
            except LeaseLost as exc:
                log.warning("%s", exc)
                continue
            except (psycopg.Error, MoverError) as exc:
                if ends_worker(exc):
                    raise
                self.db.transaction(ctx.check_shape)  # a range that failed on a changed table says so
                outcome = ranges.record_failure(self.db, mid, key_range, self.wid, exc, attempts)
                log.error("%s range %s failed (%s): %s", self.kind, key_range.range_no, outcome, exc)
                continue
            faults.point(f"{self.kind}_range:{key_range.range_no}")
            self.finished(key_range, done)
            pause, why = self.pacer.pace(done.rows, time.monotonic() - started)
            if pause and key_range.hi is None:
                # The key space's last range: no new one follows, so no "waiting: rows/s cap" with
                # nothing left to do. A retried range claimed after it still waits out this budget
                # first (above).
                owed, owed_for = time.monotonic() + pause, why or ""
            elif pause:
                waiting = why  # cleared at the top of the loop, once it is over
                self._wait(waiting, pause)

    def _claim(self, cur: psycopg.Cursor, rows: int, attempts: int) -> ranges.KeyRange | None:
        return ranges.claim(cur, self.ctx.mid, self.kind, self.wid, self.mapping(cur), rows, attempts)

    def _wait(self, reason: str | None, seconds: float) -> None:
        """Wait between ranges (never inside one), saying why on the worker's row."""
        # A lost word on a crash is harmless (the row goes with the worker): no WAL flush to wait for.
        self.db.transaction(bind(ranges.worker_waits, self.ctx.mid, self.wid, reason), synchronous_commit=False)
        if seconds:
            self.ctx.stop.wait(seconds)

    def _leave(self) -> None:
        self.registry.discard(self.wid)
        try:
            self.db.transaction(bind(ranges.unregister_worker, self.ctx.mid, self.wid))
        except psycopg.Error as exc:  # a dead worker's row is harmless: status counts only fresh heartbeats
            log.debug("worker %s left its row behind: %s", self.wid, exc)


def ends_worker(exc: BaseException) -> bool:
    """What ends a worker instead of counting an attempt of its range: the server is gone (the
    transaction's retries are spent), a table's shape changed, or the run was stopped."""
    return ranges.is_connection_failure(exc) or isinstance(exc, (ShapeChanged, Interrupted))


def run_workers(workers: Sequence[RangeWorker], name: str, group: threads.Group | None = None) -> None:
    """Run workers[0] in this thread and the others in threads of their own until they stop. The
    first error one raises sets their stop flag, so that the others stop at their next safe
    point, and is raised once all have stopped. Given a `group` (with threads of its own beside
    the workers: the backfill's applier), the workers join it and the caller joins the group."""
    group_ = group or threads.Group(on_error=lambda _: workers[0].ctx.stop.set())
    started = [group_.start(w.run, f"mover-{name}-{i}") for i, w in enumerate(workers[1:], 1)]
    group_.call(workers[0].run)
    group_.wait(started)
    if group is None:
        group_.join()
