"""Backfill engine: copy the original table into the new one, range by range, with N workers,
and apply the change log beside the copy. What follows the copy (the deferred index and
constraint builds, ANALYZE) is builds.py; what the copy will cost, preflight.py.

Invariants:
- Each range is one transaction: lock the range's range row and check we own it, copy the
  range with one INSERT ... SELECT (no conflict clause: see sql/copy.py), mark it done. A crash
  loses both or neither, which is why these transactions may commit with
  synchronous_commit = off (a later synchronous commit flushes the WAL before it anyway).
- Ranges are claimed from mover/state/ranges.py (SKIP LOCKED, expiring leases, attempt ceiling)
  by the loop every range worker runs (mover/engines/bulk/rangework.py); Worker is its copy.
- Range sizes adapt so that one range takes about [backfill] target_range_ms, within
  min_rows / max_rows; the process never holds more than one range's bounds per worker.
- The change log is applied while the copy runs, so that it stays short: by an applier session
  of its own beside the orchestrator's workers (so they need not stop copying for it), and by
  `mover worker` processes between their ranges (one applier at a time, changelog.py).
- The throttle (mover/engines/governor/throttle.py: pause, the governor's guards and duty, the rows/s cap)
  holds the workers between ranges and the applier between batches, never inside a unit of work.
"""

from __future__ import annotations

import threading
import time

import psycopg

from mover import faults, threads
from mover.catalog import introspect
from mover.db import bind
from mover.engines.bulk import rangework
from mover.engines.capture import changelog
from mover.engines.context import Context, Reporter
from mover.engines.governor import throttle
from mover.errors import LeaseLost
from mover.plan import BackfillSettings, plan_from_canonical
from mover.sql import copy as q
from mover.sql.mapping import Mapping
from mover.state import control, ranges

KIND = "backfill"
APPLY_IDLE_SECONDS = 0.2


def next_range_rows(current: int, rows: int, ms: float, s: BackfillSettings) -> int:
    """Aim the next range at target_range_ms from the last one's speed; move halfway each time so
    one slow range (a checkpoint, a lock) does not swing the size."""
    if rows <= 0 or ms <= 0:
        return current
    aimed = rows * s.target_range_ms / ms
    return int(min(max((current + aimed) / 2, s.min_rows), s.max_rows))


def limits(s: BackfillSettings) -> throttle.Limits:
    """The backfill's settings as a worker's throttle reads them (the governor reads the rest)."""
    return throttle.Limits(max_rows_per_second=s.max_rows_per_second, max_rows=s.max_rows, burst_ms=s.target_range_ms)


class Worker(rangework.RangeWorker):
    """One backfill worker: claims ranges, copies them, applies the change log in between.
    Runs in the orchestrator's process (as a thread) or alone (`mover worker NAME`)."""

    kind = KIND

    def __init__(self, dsn: str, migration: control.Migration, wid: str, *, stop: threading.Event,
                 lost: threading.Event, registry: set[str], report: Reporter, n_workers: int = 1,
                 applier_beside: bool = False, governor: throttle.Governor | None = None):
        super().__init__(dsn, migration, wid, stop=stop, lost=lost, registry=registry, report=report,
                         n_workers=n_workers, governor=governor)
        # An Applier runs in this process (copy_all): the worker goes straight on to its next
        # range. A `mover worker` process on its own applies between its ranges.
        self.applier_beside = applier_beside
        self._pending_checked = 0.0
        self._settings = self.ctx.plan.backfill
        self._configured = 0  # [backfill] range_rows as last read
        self._rows = 0  # the next range's size: adapts toward target_range_ms (next_range_rows)
        self._mapping: Mapping | None = None

    def settings(self, m: control.Migration) -> rangework.Settings | None:
        if m.step != KIND:
            return None
        s = self._settings = plan_from_canonical(m.plan).backfill
        if s.range_rows != self._configured:
            # The first range, or `mover set backfill.range_rows`: the next range starts again from that size.
            self._configured = self._rows = s.range_rows
        return rangework.Settings(limits(s), self._rows, s.max_attempts)

    def mapping(self, cur: psycopg.Cursor) -> Mapping:
        # Checks, between ranges, that both tables still have their recorded shape (invariant 7).
        self._mapping = self.ctx.mapping(cur)
        return self._mapping

    def work(self, key_range: ranges.KeyRange) -> rangework.Done:
        assert self._mapping is not None  # built by the claim
        rows, ms = ranges.work(self.db, self.ctx.mid, key_range, self.wid,
                               bind(self._copy, self._mapping, key_range),
                               synchronous_commit=self._settings.synchronous_commit)
        return rangework.Done(rows, ms)

    def finished(self, key_range: ranges.KeyRange, done: rangework.Done) -> None:
        self._rows = next_range_rows(self._rows, done.rows, done.ms, self._settings)
        if not self.applier_beside:
            changelog.drain(self.ctx, reverse=False, backfill_done=False, max_rounds=1)
        pending = None
        if time.monotonic() - self._pending_checked > 2:
            self._pending_checked = time.monotonic()
            pending = self.db.transaction(lambda cur: changelog.pending(cur, self.ctx.mid)[0])
        self.report("backfill", range_no=key_range.range_no, rows=done.rows, ms=round(done.ms, 1),
                    range_rows=self.pacer.range_rows(self._rows), worker=self.wid, capture_pending=pending)

    def idle(self) -> None:
        # Waiting for the other workers' last ranges: keep the change log short meanwhile.
        changelog.drain(self.ctx, reverse=False, backfill_done=False, max_rounds=1)

    def _copy(self, cur: psycopg.Cursor, mapping: Mapping, key_range: ranges.KeyRange) -> int:
        rows = copy_range(cur, self.ctx, mapping, key_range.lo, key_range.hi)
        # After the copy, in its transaction: the copy holds a lock that keeps ALTER TABLE out
        # until commit, so a shape seen unchanged here is the shape the range was copied under.
        if self.ctx.mapping(cur) is not mapping:
            # `mover adopt` recorded a new shape since this worker built its mapping: copy again.
            raise LeaseLost(f"the shape of {mapping.src} was adopted while range {key_range.range_no} was copied;"
                            f" copying it again", hint="nothing to do: the range is copied again with the new shape")
        # Inside the transaction: a crash here loses the copy and keeps the range claimed.
        faults.point(f"range_copied:{key_range.range_no}")
        faults.point("range_copied")  # whichever range this process copies first
        return rows


def _fails_on_data(exc: psycopg.Error) -> bool:
    """A value that does not convert or a constraint the target holds: the row's problem, not the
    range's. A unique violation is not one: no key can be copied twice (see sql/copy.py)."""
    return isinstance(exc, (psycopg.DataError, psycopg.IntegrityError)) \
        and not isinstance(exc, psycopg.errors.UniqueViolation)


def _try_copy(cur: psycopg.Cursor, m: Mapping, lo: list[str] | None,
              hi: list[str] | None) -> tuple[int, psycopg.Error | None]:
    stmt, params = q.copy_range(m, lo, hi)
    cur.execute("SAVEPOINT mover_copy")
    try:
        cur.execute(stmt, params)
    except psycopg.Error as exc:
        if not _fails_on_data(exc):
            raise
        cur.execute("ROLLBACK TO SAVEPOINT mover_copy")
        return 0, exc
    rows = cur.rowcount
    cur.execute("RELEASE SAVEPOINT mover_copy")
    return rows, None


def copy_range(cur: psycopg.Cursor, ctx: Context, m: Mapping, lo: list[str] | None, hi: list[str] | None) -> int:
    """Copy the range lo < key <= hi in the caller's transaction. When it fails on a row's data,
    split it in halves by its current keys (savepoints), copy what converts, and record each row
    that does not as an apply_error divergence in the same transaction: the range is done, the
    rows are named, and cutover waits for them (fix the source row and `mover repair`, or accept).
    Each statement reads a fresh snapshot, but the halves always cover (lo, hi] whole."""
    rows, exc = _try_copy(cur, m, lo, hi)
    if exc is None:
        return rows
    stmt, params = q.range_keys(m, lo, hi)
    cur.execute(stmt, params)
    keys = [list(r) for r in cur.fetchall()]
    if len(keys) <= 1:
        rows, exc = _try_copy(cur, m, lo, hi)  # the row may have changed or gone since
        if exc is not None and keys:
            message = str(exc).splitlines()[0]
            control.record_divergence(cur, ctx.mid, keys[0], "apply_error",
                                      {**changelog.data_error(exc), "direction": "forward", "during": "backfill"})
            control.event(cur, ctx.mid, ctx.owner, KIND, "apply_error",
                          f"copying key {keys[0]} into {m.dst} failed: {message}")
        elif exc is not None:
            raise exc  # a range without rows cannot fail on a row's data
        return rows
    middle = keys[(len(keys) - 1) // 2]
    return copy_range(cur, ctx, m, lo, middle) + copy_range(cur, ctx, m, middle, hi)


class Applier:
    """Applies the change log while the workers copy, in a session of its own: what the writers
    changed in copied ranges is replayed beside the copy instead of between its ranges. The
    same batches as the workers' (changelog.drain: the applier lock, keys of done ranges only),
    so they never replay a key concurrently. Held by the same throttle as the workers: waits
    while mover is paused or a guard holds, and rests after each batch as the governor's duty
    says. Ends when `done` is set (the workers have stopped)."""

    def __init__(self, ctx: Context, done: threading.Event):
        # Its own name in pg_stat_activity: its transactions are not a worker's.
        self.ctx = Context(db=ctx.db.sibling(role="mover-applier"), migration=ctx.migration,
                           owner=f"{control.new_owner_id()}:applier", report=ctx.report, stop=ctx.stop,
                           lease_lost=ctx.lease_lost)
        self.done = done
        self.pacer = throttle.Throttle(throttle.Limits(), governor=throttle.of(ctx))

    def _look(self, cur: psycopg.Cursor) -> control.Migration:
        return control.get_by_id(cur, self.ctx.mid)

    def run(self) -> None:
        try:
            while not self.done.is_set():
                self.ctx.checkpoint()
                m = self.ctx.db.transaction(self._look)
                self.ctx.use(m)
                if m.state == "aborted" or m.step != KIND:
                    return
                # consumer: the slot the capture reads never holds the one who frees it.
                if self.pacer.reason(m.paused, consumer=True):
                    self.done.wait(self.pacer.recheck_seconds())
                    continue
                started = time.monotonic()
                applied = changelog.drain(self.ctx, reverse=False, backfill_done=False, max_rounds=1).claimed
                rest, _ = self.pacer.pace(applied, time.monotonic() - started)
                if applied < changelog.BATCH:
                    rest = max(rest, APPLY_IDLE_SECONDS)  # caught up: let the writers' changes gather
                if rest:
                    self.done.wait(rest)
        finally:
            self.ctx.db.close()


def copy_all(ctx: Context) -> None:
    """Run [backfill] workers in this process, and the applier beside them, until every range is
    copied, under the migration's governor (led from here). A failure of either stops the others
    (their shared stop flag) and is raised here."""
    with throttle.governing(ctx, KIND):
        _copy_all(ctx)


def _copy_all(ctx: Context) -> None:
    settings = ctx.plan.backfill
    def prepare(cur: psycopg.Cursor) -> tuple[int, int]:
        ranges.ensure_frontier(cur, ctx.mid, KIND)
        ranges.retry_failed(cur, ctx.mid, KIND)
        ranges.release_dead_local_owners(cur, ctx.mid)
        return introspect.estimate_rows(cur, ctx.original), ranges.state(cur, ctx.mid, KIND)["rows"]

    estimate, copied = ctx.db.transaction(prepare)
    ctx.report("backfill_start", estimate=estimate, rows=copied, workers=settings.workers,
               table=str(ctx.migration.source))
    workers = [Worker(ctx.db.dsn, ctx.migration, ranges.worker_id(i), stop=ctx.stop, lost=ctx.lease_lost,
                      registry=ctx.workers, report=ctx.report, n_workers=settings.workers, applier_beside=True,
                      governor=throttle.of(ctx))
               for i in range(settings.workers)]
    done = threading.Event()
    group = threads.Group(on_error=lambda _: ctx.stop.set())
    group.start(Applier(ctx, done).run, "mover-applier")
    try:
        rangework.run_workers(workers, "worker", group)
    finally:
        done.set()
        group.wait()
    group.join()
    ctx.checkpoint()
    ranges.require_finished(ctx.db, ctx.mid, KIND, ctx.migration.name, "mover run")
