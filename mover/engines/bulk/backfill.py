"""Backfill engine: copy the original table into the new one, range by range, with N workers.

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
  holds the workers between ranges, the applier between batches, and the index builds and ANALYZE
  before each starts (a CREATE INDEX cannot be paced inside; how many run at once can), never
  inside a unit of work.
- Secondary indexes are built after the copy with a plain CREATE INDEX, each in a transaction of
  its own, up to [backfill] index_builds at once in sessions of their own. Nothing but mover
  writes the new table before the cutover, and no applier runs while they build, so their SHARE
  lock blocks nobody, and a build is faster than CONCURRENTLY (one pass, no waits for other
  transactions) and transactional: a crash leaves no index, or a whole one. A build whose client
  was killed goes on in its backend until it next checks the client (client_connection_check_interval)
  or is cancelled by the resume, which stops mover's orphaned builders before its drain. An
  invalid index (left by an interrupted CONCURRENTLY build of an earlier version) is dropped and
  rebuilt.
- An exclusion constraint (or a temporal key of PostgreSQL 18, PRIMARY KEY / UNIQUE ... WITHOUT
  OVERLAPS, one underneath) is built after them, by ADD CONSTRAINT (its index only comes with it),
  one at a time (ACCESS EXCLUSIVE on the new table, which only mover uses), in a transaction that
  first replays the change log under the applier lock until a batch finds it caught up: the
  constraint then meets the source's rows as of one snapshot, which satisfy it. Rows that still
  break it (values the type change made equal, a row whose replay failed) stop the step with
  their keys' values named (ConstraintBuildFailed); `mover run` builds it again once they fit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from mover import faults, names, threads
from mover.catalog import introspect, shape
from mover.db import Database, bind, is_retryable, one
from mover.engines.bulk import rangework
from mover.engines.capture import changelog
from mover.engines.context import Context, Reporter
from mover.engines.governor import pacing, throttle
from mover.engines.partitioning import partitions
from mover.errors import ConstraintBuildFailed, Failed, LeaseLost
from mover.plan import BackfillSettings, plan_from_canonical
from mover.sql import copy as q
from mover.sql import ddl
from mover.sql import partitions as sql_partitions
from mover.sql.mapping import Mapping
from mover.state import control, ranges

log = logging.getLogger("mover.backfill")

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
                    self.done.wait(throttle.RECHECK_SECONDS)
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


def deferred_index_name(mid: int, source_index: str) -> str:
    return names.derived(source_index, f"_m{mid}")


def deferred_indexes(cur: psycopg.Cursor, ctx: Context) -> list[tuple[str, introspect.Index]]:
    """(name in the new table, source index) for every index still to build."""
    original = introspect.describe(cur, ctx.original)
    # Not the transient index of a concurrent build running on the source (a REINDEX CONCURRENTLY's
    # <index>_ccnew): not part of its shape (shape.transient), gone when the build ends.
    running = shape.builds(cur, [original.oid]).get(original.oid, [])
    return [(deferred_index_name(ctx.mid, ix.name), ix) for ix in original.indexes
            if ix.name != original.key_index and not shape.transient_index(ix.name, ix.is_valid, running)]


INDEX_ATTEMPTS = 6


def _transient_ddl_error(exc: BaseException) -> bool:
    """Worth another try: a lock or deadlock timeout, or the catalog race of two backends that
    end and drop the same index at once ("tuple concurrently updated", SQLSTATE XX000)."""
    if isinstance(exc, psycopg.errors.InternalError_):
        return (exc.diag.message_primary or "") == "tuple concurrently updated"
    return is_retryable(exc)


def stop_orphaned_builders(ctx: Context) -> None:
    """A process killed while it builds an index leaves its backend building on until it notices
    the lost client (a plain build within client_connection_check_interval where the server's
    system tells, CONCURRENTLY only at its end). The build never commits (its COMMIT would come
    from the dead client), but its SHARE lock would hold up the step's drain and builds. Only the
    lease holder builds on the new table, and it calls this before it starts: any mover backend
    holding or awaiting a build's lock (SHARE, or SHARE UPDATE EXCLUSIVE for an earlier version's
    concurrent build or an ANALYZE, or ACCESS EXCLUSIVE for a constraint's ADD CONSTRAINT, which
    also holds the applier lock) on the new table or its partitions is an orphan. Cancel them
    and wait until they are gone."""
    def builders(cur: psycopg.Cursor) -> list[int]:
        cur.execute(
            "SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database"
            "   WHERE datname = current_database())"
            " AND l.relation IN (SELECT %s::regclass UNION ALL SELECT relid FROM pg_partition_tree(%s::regclass))"
            " AND l.mode IN ('ShareLock', 'ShareUpdateExclusiveLock', 'AccessExclusiveLock')"
            " AND l.pid <> pg_backend_pid()"
            " AND a.application_name LIKE 'mover%%'", (str(ctx.new), str(ctx.new)))
        return [r[0] for r in cur.fetchall()]

    db = ctx.db
    deadline = time.monotonic() + 60
    while pids := db.transaction(builders):
        if time.monotonic() > deadline:
            raise Failed(f"the orphaned index builds on {ctx.new} (backends {pids}) do not stop",
                         hint=f"end them with pg_terminate_backend(), then `mover run {ctx.migration.name}`")
        log.warning("cancelling the orphaned index builds on %s in backends %s", ctx.new, pids)
        db.transaction(lambda cur: cur.execute("SELECT pg_cancel_backend(pid) FROM unnest(%s::int[]) pid",
                                               (pids,)))
        time.sleep(0.2)


def _check_client(cur: psycopg.Cursor) -> None:
    """Have a long build notice within a second that its client died (PostgreSQL 14+, on the
    systems that report a closed socket): its orphan then ends by itself. Elsewhere the setting
    is refused, and the resume cancels the orphan instead (stop_orphaned_builders)."""
    cur.execute("SAVEPOINT mover_check_client")
    try:
        cur.execute("SET LOCAL client_connection_check_interval = '1s'")
    except psycopg.errors.InvalidParameterValue as exc:
        cur.execute("ROLLBACK TO SAVEPOINT mover_check_client")
        log.debug("client_connection_check_interval not available on this server: %s", exc)
    cur.execute("RELEASE SAVEPOINT mover_check_client")


def _copy_index_comment(ctx: Context, name: str, ix: introspect.Index) -> None:
    def copy(cur: psycopg.Cursor) -> None:
        comment, constraint_comment = introspect.index_comments(cur, ix.oid)
        if comment is not None:
            cur.execute(ddl.comment_on_index(names.QualifiedName(ctx.new.schema, name), comment))
        if constraint_comment is not None and ix.by_constraint:
            # The constraint's own comment: it is named like its index (the swap renames both).
            cur.execute(ddl.comment_on_constraint(ctx.new, name, constraint_comment))
    ctx.db.transaction(copy, label="index comment")


@dataclass(frozen=True)
class IndexBuild:
    """One CREATE INDEX: index `name` on `table` (the new table, or one of its
    partitions), defined as the source's index `ix`; or, for an index only its constraint makes
    (an exclusion constraint's, a temporal key's), one ADD CONSTRAINT of that name on the new table."""
    name: str
    ix: introspect.Index
    table: names.QualifiedName

    def statement(self) -> sql.Composed:
        if self.ix.constraint_def is not None:
            return ddl.add_constraint(self.table, self.name, self.ix.constraint_def)
        return ddl.create_index(self.name, self.table, self.ix, concurrently=False)


def _build_one(ctx: Context, db: Database, b: IndexBuild, governed: bool) -> None:
    """Build index `b.name` on `b.table` in one transaction on `db` (this build session's
    connection), dropping an invalid one that an interrupted concurrent build left first;
    `governed` (turn()'s): without parallel workers."""
    schema = b.table.schema
    assert schema is not None  # the new table and its partitions are named with their schema
    state = db.transaction(lambda cur: introspect.index_state(cur, schema, b.name))
    if state is True:
        return
    faults.point("index_building")
    if state is False:
        log.warning("index %s.%s is invalid (a build was interrupted); rebuilding", schema, b.name)
        db.transaction(bind(psycopg.Cursor.execute, ddl.drop_index(schema, b.name)), lock_timeout="10s",
                       label="drop invalid index")
    started = time.monotonic()
    ctx.report("index", name=b.name, state="building")

    def build(cur: psycopg.Cursor) -> None:
        _check_client(cur)
        if governed:
            # A build cannot be paced once it runs, and a parallel worker is a core more that no
            # probe can take back: under the governor a build keeps to one process, and builds
            # run side by side only as the ramp adds them (turn()).
            cur.execute("SET LOCAL max_parallel_maintenance_workers = 0")
        cur.execute(b.statement())
        faults.point("index_build_done")  # built, not committed: a crash here leaves no index
        control.event(cur, ctx.mid, ctx.owner, "backfill", "index_built", f"index {b.name} built",
                      {"source_index": b.ix.name, "table": str(b.table)}, (time.monotonic() - started) * 1000)

    # One attempt per call: _retried() runs it again after a lock timeout, reading the catalog afresh.
    db.transaction(build, statement_timeout="0", lock_timeout="10s", attempts=1, label="create index")
    ctx.report("index", name=b.name, state="built")
    faults.point("index_built")


def _replay_to_one_snapshot(cur: psycopg.Cursor, ctx: Context) -> int:
    """In the caller's transaction, under the applier lock (which it keeps to its end): replay the
    change log until a batch finds fewer entries than it asks for. That batch read the log and
    the source in one snapshot and took every entry it showed, so each key of the new table
    holds its source row as of that snapshot: rows the source held together, which satisfy the
    source's constraints. (Between batches, the new table can hold a row moved into a place whose
    leaving row is replayed by the next batch only: harmless while no constraint is built.)
    Returns the log entries replayed."""
    changelog.lock_applier(cur, ctx.mid, reverse=False)
    mapping = ctx.mapping(cur)
    total = 0
    while True:
        got = changelog.apply_batch(cur, ctx, mapping, reverse=False, backfill_done=True, wait_for_lock=True,
                                  limit=changelog.BATCH)
        total += got.log_rows
        if got.log_rows < changelog.BATCH:
            return total


def build_constraint(ctx: Context, b: IndexBuild) -> None:
    """Add the constraint `b` (its index comes with it) to the new table, in one transaction on
    the session's connection: the log replayed to one snapshot first (_replay_to_one_snapshot),
    then ADD CONSTRAINT, which checks every row. Transactional: a crash leaves no constraint, or
    a whole one. Rows that break it stop the step (ConstraintBuildFailed): the constraint cannot
    be carried while they exist, and nothing else is at fault."""
    schema = b.table.schema
    assert schema is not None  # the new table is named with its schema
    if ctx.db.transaction(lambda cur: introspect.index_state(cur, schema, b.name)) is True:
        return
    faults.point("index_building")
    started = time.monotonic()
    ctx.report("index", name=b.name, state="building")

    def build(cur: psycopg.Cursor) -> None:
        _check_client(cur)
        replayed = _replay_to_one_snapshot(cur, ctx)
        cur.execute(b.statement())
        faults.point("index_build_done")  # built, not committed: a crash here leaves no constraint
        control.event(cur, ctx.mid, ctx.owner, "backfill", "index_built", f"constraint {b.name} built",
                      {"source_index": b.ix.name, "table": str(b.table), "constraint": True, "replayed": replayed},
                      (time.monotonic() - started) * 1000)

    try:
        ctx.db.transaction(build, statement_timeout="0", lock_timeout="10s", attempts=1, label="add constraint")
    except (psycopg.errors.ExclusionViolation, psycopg.errors.UniqueViolation) as exc:
        m = ctx.migration
        detail = f" ({exc.diag.message_detail.rstrip('.')})" if exc.diag.message_detail else ""
        raise ConstraintBuildFailed(
            f"the constraint {names.display_ident(b.ix.name)} of {m.source} cannot be built on {b.table} as"
            f" {names.display_ident(b.name)}: rows of the new table break it{detail}. The copy holds the source's"
            f" rows as of one snapshot, converted to the new column types: values the conversion made equal (a"
            f" lossy type change), or a row whose replay failed (`mover divergences {m.name}`), break it there"
            f" though not in {m.source}",
            hint=f"change those rows in {m.source} so that they no longer conflict once converted (or repair the"
                 f" divergences), then `mover run {m.name}` builds it again; or `mover abort {m.name}`") from None
    ctx.report("index", name=b.name, state="built")
    faults.point("index_built")


def _retried(ctx: Context, what: str, fn: Callable[[], object]) -> None:
    """fn() again after a lock or deadlock timeout (or a catalog race), a few times; anything else
    is raised. Outside any transaction: each attempt reads the index's state afresh."""
    for attempt in range(1, INDEX_ATTEMPTS + 1):
        ctx.checkpoint()
        try:
            fn()
            return
        except psycopg.Error as exc:
            if attempt == INDEX_ATTEMPTS or not _transient_ddl_error(exc):
                raise
            log.warning("%s failed (%s: %s); attempt %d of %d", what, type(exc).__name__,
                        exc.diag.message_primary or exc, attempt + 1, INDEX_ATTEMPTS)
            time.sleep(min(0.2 * 2 ** attempt, 5.0))


@contextmanager
def turn(ctx: Context, db: Database, session: int = 0, sessions: int = 1,
         what: str = "index builds") -> Iterator[bool]:
    """Around a statement the throttle cannot pace inside (an index build, a constraint, ANALYZE):
    wait while mover is paused or a guard holds, while the governor's duty allows fewer sessions
    at once than `session` + 1 (session 0 always goes when nothing holds it), and, while another
    such statement runs, until the governor has read it (throttle.Ramp). Says why once a wait
    on the throttle begins (an `index_waiting` report: `what` waits, and the reason). Yields
    whether a governed duty holds the statement (the plan as read now)."""
    pacer = throttle.Throttle(throttle.Limits(), governor=throttle.of(ctx))
    governor = throttle.of(ctx)
    ramp = governor.ramp if governor is not None else None
    said = governed = False
    while True:
        ctx.checkpoint()
        m = db.transaction(lambda cur: control.get_by_id(cur, ctx.mid), label="throttle")
        reason = pacer.reason(m.paused)
        if reason is None and session >= (allowed := pacing.sessions_allowed(sessions, pacer.duty)):
            assert governor is not None  # a duty under 1 is a governor's
            reason = f"{governor.throttled()} ({allowed} of {sessions} at once)"
        if reason is None:
            if ramp is None:
                break
            # Read now, as the build sessions are: `mover set backfill.index_builds` counts.
            plan = plan_from_canonical(m.plan)
            governed = plan.throttle.governed
            if (settle := ramp.claim(governed, plan.backfill.index_sessions(governed))) == 0:
                break
            ramp.wait(min(settle, throttle.RECHECK_SECONDS))
            continue
        if not said:
            ctx.report("index_waiting", what=what, reason=reason)
            said = True
        ctx.stop.wait(throttle.RECHECK_SECONDS)
    try:
        yield governed
    finally:
        if ramp is not None:
            ramp.release()


def rest_after(ctx: Context, seconds: float) -> None:
    """After a build that took `seconds`: rest as the governor's duty says, in slices, so that a
    duty back to full (the application quiet again) ends the rest early."""
    governor = throttle.of(ctx)
    if governor is None:
        return
    until = time.monotonic() + governor.rest(seconds)
    while (left := until - time.monotonic()) > 0 and governor.duty < 1:
        ctx.checkpoint()
        ctx.stop.wait(min(left, throttle.RECHECK_SECONDS))


class _Builds:
    """`sessions` build sessions (threads, each with its own connection) taking builds from one
    list; several may build on one table (a plain build's SHARE lock does not conflict with
    itself). Each session waits for its turn before it takes a build (turn(): the governor
    decides how many run at once) and rests after it (rest_after). After the first failure no
    session takes another build; the ones under way finish, and the failure is raised once all
    have stopped (mover/threads.py)."""

    def __init__(self, ctx: Context, builds: list[IndexBuild], sessions: int):
        self.ctx = ctx
        self.todo = list(builds)
        self.group = threads.Group()
        self.lock = threading.Lock()
        self.sessions = min(sessions, len(builds))

    def _next(self) -> IndexBuild | None:
        with self.lock:
            if not self.group.failed and self.todo:
                return self.todo.pop(0)
            return None

    def _session(self, db: Database, session: int = 0) -> None:
        try:
            while True:
                with turn(self.ctx, db, session, self.sessions) as governed:
                    if (b := self._next()) is None:
                        return
                    started = time.monotonic()
                    _retried(self.ctx, f"building index {b.name}", partial(_build_one, self.ctx, db, b, governed))
                rest_after(self.ctx, time.monotonic() - started)
        finally:
            if db is not self.ctx.db:
                db.close()

    def run(self) -> None:
        if self.sessions <= 1:
            self._session(self.ctx.db)
            return
        for i in range(1, self.sessions):
            self.group.start(partial(self._session, self.ctx.db.sibling(), i), f"mover-index-{i}")
        self.group.call(partial(self._session, self.ctx.db))
        self.group.join()


def planned_builds(name: str, ix: introspect.Index, table: names.QualifiedName,
                   parts: list[names.QualifiedName] | None) -> list[IndexBuild]:
    """The builds of the deferred index `name`: on `table` itself, or, when `parts` (the
    partitions of a partitioned `table`) are given, each partition's part of it (each then
    resumable by itself). Plan check lists these, and the step runs them. A constraint's index is
    the constraint's one build on `table`, partitioned or not (PostgreSQL 17 and later build each
    partition's part in that statement)."""
    if parts is None or ix.by_constraint:
        return [IndexBuild(name, ix, table)]
    return [IndexBuild(partitions.child_index_name(p.name, name), ix, p) for p in parts]


def index_statements(ctx: Context, indexes: list[tuple[str, introspect.Index]],
                     parts: list[names.QualifiedName] | None) -> list[sql.Composable | str]:
    """What build_indexes runs for `indexes`, for plan check: the builds, then on a partitioned
    table each parent index ON ONLY and its partitions' attached."""
    out: list[sql.Composable | str] = []
    for name, ix in indexes:
        if ix.by_constraint:
            continue  # after the plain builds, one at a time (build_indexes, build_constraint)
        out += [b.statement() for b in planned_builds(name, ix, ctx.new, parts)]
        if parts is not None:
            assert ctx.new.schema is not None  # the control tables hold schema-qualified names
            out.append(sql_partitions.create_index_on_only(name, ctx.new, ix.is_unique, ix.definition_tail))
            parent_index = names.QualifiedName(ctx.new.schema, name)
            out += [sql_partitions.attach_index(parent_index, names.QualifiedName(b.table.schema, b.name))
                    for b in planned_builds(name, ix, ctx.new, parts)]
    constraints = [b for name, ix in indexes if ix.by_constraint for b in planned_builds(name, ix, ctx.new, parts)]
    if constraints:
        out.append("-- then each exclusion constraint and temporal key (WITHOUT OVERLAPS), one at a time, in a"
                   " transaction that first replays the change log under the applier lock until a batch finds it"
                   " caught up (the rows as of one snapshot of the source)")
        out += [b.statement() for b in constraints]
    return out


def build_indexes(ctx: Context) -> None:
    """Every deferred index: the builds (a plain table's indexes, or every partition's part of
    each index of a partitioned one) by up to [backfill] index_builds sessions at once, then, on a
    partitioned table, each parent index ON ONLY with its partitions' attached (valid with the
    last). Re-entrant: what is built, valid or attached is left as it is."""
    schema = ctx.new.schema
    assert schema is not None  # the control tables hold schema-qualified names
    todo = ctx.db.transaction(lambda cur: deferred_indexes(cur, ctx))
    parts = ctx.db.transaction(lambda cur: partitions.live_partitions(cur, ctx.new))
    partitioned = parts is not None
    pending: list[tuple[str, introspect.Index]] = []
    builds: list[IndexBuild] = []
    constraints: list[tuple[str, introspect.Index]] = []
    for name, ix in todo:
        if ctx.db.transaction(bind(introspect.index_state, schema, name)) is True:
            _copy_index_comment(ctx, name, ix)  # again: a crash may have come between build and comment
            continue
        if ix.by_constraint:
            constraints.append((name, ix))
            continue
        pending.append((name, ix))
        # A partitioned table: each partition's index, then (below) the parent's ON ONLY,
        # invalid until the last of its partitions' is attached.
        builds += planned_builds(name, ix, ctx.new, parts)
    # Read now: `mover set backfill.index_builds` during the copy counts.
    plan = plan_from_canonical(ctx.db.transaction(lambda cur: control.get_by_id(cur, ctx.mid)).plan)
    sessions = plan.backfill.index_sessions(plan.throttle.governed)
    started = time.monotonic()
    if builds or constraints:
        ctx.report("index_builds", total=len(builds) + len(constraints), sessions=sessions,
                   table=str(ctx.migration.source))
    _Builds(ctx, builds, sessions).run()
    for name, ix in pending:
        if partitioned:
            attach = partial(ctx.db.transaction, bind(partitions.attach_indexes, ctx.new, name, ix),
                             lock_timeout="10s", label="attach partition indexes")
            _retried(ctx, f"attaching the partitions' indexes to {name}", attach)
            faults.point("index_built")
        _copy_index_comment(ctx, name, ix)
    # After the plain builds, one at a time: ADD CONSTRAINT takes ACCESS EXCLUSIVE on the new
    # table, which would wait for every build's SHARE lock (and they for it).
    for name, ix in constraints:
        for b in planned_builds(name, ix, ctx.new, parts):
            with turn(ctx, ctx.db, what="constraint builds"):
                started_one = time.monotonic()
                _retried(ctx, f"building constraint {name}", partial(build_constraint, ctx, b))
            rest_after(ctx, time.monotonic() - started_one)
        _copy_index_comment(ctx, name, ix)
    if builds or constraints:
        ms = (time.monotonic() - started) * 1000
        ctx.db.transaction(lambda cur: control.event(
            cur, ctx.mid, ctx.owner, "backfill", "indexes_built",
            f"{len(builds) + len(constraints)} index builds on {ctx.new}, up to {sessions} at once",
            {"builds": len(builds), "indexes": len(pending), "constraints": len(constraints), "sessions": sessions},
            ms))


class Analyze:
    """ANALYZE of the new table after the copy, so that reconcile's and the application's plans
    have statistics (autovacuum never analyzes a partitioned parent).

    Beside the index builds where it can: in a session of its own, out of a transaction block,
    where PostgreSQL analyzes each partition in a transaction of its own and so holds one
    partition's lock at a time (inside a block it would keep every partition it analyzed locked
    against the builds until its end). Not where a deferred index has expressions (ANALYZE
    gathers their statistics only from indexes that exist), not where an exclusion constraint is
    built (its ADD CONSTRAINT would wait for ANALYZE), and not behind a transaction-mode pooler (no
    session timeouts there): then after the builds, in a transaction, as before."""

    # A partition's build holds the lock ANALYZE waits for as long as that build takes.
    LOCK_TIMEOUT = "30min"

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.thread: threads.Group | None = None  # beside the builds: its session's thread
        self.started = 0.0
        self.ms = 0.0

    @property
    def beside(self) -> bool:
        return self.thread is not None

    def statement(self) -> sql.Composed:
        return sql.SQL("ANALYZE {}").format(self.ctx.new.ident)

    def beside_builds(self) -> bool:
        def after_builds(cur: psycopg.Cursor) -> bool:
            deferred = deferred_indexes(cur, self.ctx)
            if any(ix.by_constraint for _, ix in deferred):
                # ADD CONSTRAINT's ACCESS EXCLUSIVE lock would wait for ANALYZE's (it holds SHARE
                # UPDATE EXCLUSIVE as long as it reads).
                return True
            oids = [ix.oid for _, ix in deferred]
            cur.execute("SELECT coalesce(bool_or(indexprs IS NOT NULL), false) FROM pg_index"
                        " WHERE indexrelid = ANY(%s)", (oids,))
            return bool(one(cur)[0])
        return not self.ctx.db.pooled() and not self.ctx.db.transaction(after_builds)

    def start(self) -> None:
        """Start it beside the builds, where it can."""
        if not self.beside_builds():
            return
        self.started = time.monotonic()
        self.thread = threads.Group()
        self.thread.start(self._beside, "mover-analyze")

    def _beside(self) -> None:
        db = self.ctx.db.sibling()
        try:
            with turn(self.ctx, db, what="ANALYZE"):  # one statement: the throttle decides only when it starts
                self.started = time.monotonic()  # its own time, not its wait for a turn
                db.autocommit(self.statement(), statement_timeout="0", lock_timeout=self.LOCK_TIMEOUT)
            self.ms = (time.monotonic() - self.started) * 1000
        finally:
            db.close()

    def finish(self) -> float:
        """Wait for it, or run it now; its duration in ms."""
        if self.thread is None:
            with turn(self.ctx, self.ctx.db, what="ANALYZE"):
                started = time.monotonic()
                # In a transaction (ANALYZE allows one): its timeout is SET LOCAL, which a pooler cannot leak.
                self.ctx.db.transaction(bind(psycopg.Cursor.execute, self.statement()), statement_timeout="0",
                                        label="analyze")
                return (time.monotonic() - started) * 1000
        self.thread.join()  # raises what ANALYZE raised, in the step's thread
        return self.ms

    def abandon(self) -> None:
        """The builds failed: wait for ANALYZE to end (the builds' error is the one raised; a
        failure of its own is said here). The resume runs it again."""
        if self.thread is None:
            return
        self.thread.wait()
        if (error := self.thread.error) is not None:
            log.error("ANALYZE of %s beside the index builds also failed: %s: %s", self.ctx.new,
                      type(error).__name__, error)


def build_and_analyze(ctx: Context) -> tuple[Analyze, float]:
    """The deferred indexes, and ANALYZE beside them where it can run there, under the migration's
    governor (the backfill step's, or led from here when called alone). Returns the ANALYZE,
    finished, and how long it took (ms)."""
    with throttle.governing(ctx, "index builds"):
        analyze = Analyze(ctx)
        analyze.start()
        try:
            build_indexes(ctx)
        except BaseException:
            analyze.abandon()
            raise
        return analyze, analyze.finish()


# The WAL a backfill writes, per byte of what it builds (bench/README.md, the profile of the
# narrow table: the copy wrote 1.8x the heap with its key index; a plain index build logs the
# index whole, before wal_compression).
WAL_PER_HEAP_BYTE = 1.3
WAL_PER_KEY_INDEX_BYTE = 2.5


def preflight(cur: psycopg.Cursor, source: names.QualifiedName, columns: dict[str, str]) -> dict[str, Any]:
    """What the target and its indexes will take and the WAL the backfill will write, estimated
    from the source's size (its dead rows left out: the copy is compact) and the plan's type
    changes, for `mover plan check` to print beside the free space the operator knows of."""
    cur.execute("SELECT c.oid, pg_table_size(c.oid), pg_indexes_size(c.oid), greatest(c.reltuples, 0)::bigint,"
                " coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0)"
                " FROM pg_class c LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid WHERE c.oid = to_regclass(%s)",
                (str(source),))
    oid, table_bytes, index_bytes, rows, live, dead = one(cur)
    live_share = live / (live + dead) if live + dead else 1.0
    info = introspect.describe(cur, source)
    cur.execute("SELECT coalesce(pg_relation_size(to_regclass(%s)), 0)",
                (str(names.QualifiedName(source.schema, info.key_index)),))
    key_bytes = int(one(cur)[0])
    widened = 0
    for col, new_type in columns.items():
        cur.execute("SELECT (SELECT typlen FROM pg_type WHERE oid = a.atttypid), (SELECT typlen FROM pg_type"
                    " WHERE oid = to_regtype(%s)) FROM pg_attribute a WHERE a.attrelid = %s AND a.attname = %s",
                    (new_type, oid, col))
        got = cur.fetchone()
        if got and got[0] and got[1] and got[0] > 0 and got[1] > 0:
            widened += (got[1] - got[0]) * int(rows)
    heap = max(0, int(table_bytes * live_share) + widened)
    indexes = int(index_bytes * live_share)
    wal_copy = int(heap * WAL_PER_HEAP_BYTE + key_bytes * live_share * WAL_PER_KEY_INDEX_BYTE)
    wal_builds = max(0, indexes - int(key_bytes * live_share))
    h = pacing.human_bytes
    lines = [
        f"the target will take about {h(heap + indexes)}: {h(heap)} of rows ({int(rows):,} estimated; the source "
        f"takes {h(table_bytes)}, {1 - live_share:.0%} of its rows dead) and {h(indexes)} of indexes",
        f"the backfill writes about {h(wal_copy + wal_builds)} of WAL: {h(wal_copy)} copying (each row and its key "
        f"index entry), {h(wal_builds)} building the other indexes (less with wal_compression); the change log "
        f"adds what the application writes meanwhile",
        "compare with the free space where the data directory and pg_wal live: that WAL stays until a checkpoint, "
        "the archiver and every replication slot are done with it",
    ]
    return {"target_bytes": heap + indexes, "heap_bytes": heap, "index_bytes": indexes,
            "wal_bytes": wal_copy + wal_builds, "lines": lines}


def wal_segments(cur: psycopg.Cursor, wal_bytes: int) -> dict[str, Any]:
    """Whether the backfill's WAL finds segment files ready: a segment that is not (recycled at a
    checkpoint, up to min_wal_size) is a new file, written out whole when wal_init_zero is on by
    the backend that needs it while it holds WALWriteLock, and every commit of the application
    waits meanwhile (bench/README.md, "WAL segments ready ahead": with them the copy's p99 had a
    median of 85 ms over six runs, 144 ms without). pg_ls_waldir() needs pg_monitor: without it,
    what lies ahead is not known."""
    cur.execute("SELECT pg_size_bytes(current_setting('wal_segment_size')),"
                " pg_size_bytes(current_setting('min_wal_size')), current_setting('wal_recycle')::bool,"
                " current_setting('wal_init_zero')::bool, has_function_privilege('pg_ls_waldir()', 'EXECUTE')"
                " AND NOT pg_is_in_recovery()")
    segment, keep, recycle, zero, readable = one(cur)
    ahead = None
    if readable:
        cur.execute("SELECT count(*) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'"
                    " AND name > pg_walfile_name(pg_current_wal_insert_lsn())")
        ahead = int(one(cur)[0])
    needed = -(-wal_bytes // segment)
    h = pacing.human_bytes
    made = ("each written out whole (wal_init_zero) while the application's commits wait" if zero
            else "each made while the application's commits wait")
    if not recycle:
        line = (f"WAL segments: this server recycles none (wal_recycle = off): each of the backfill's {needed:,} is a "
                f"new file, {made}")
    elif ahead is not None and ahead >= needed:
        line = f"WAL segments: {ahead:,} ready for reuse in pg_wal, enough for the backfill's {needed:,}"
    else:
        held = (f"{ahead:,} ready for reuse in pg_wal" if ahead is not None
                else "how many pg_wal holds ready for reuse is not readable (pg_ls_waldir needs pg_monitor)")
        line = (f"WAL segments: {held}; the backfill's WAL needs about {needed:,}: the others are new files, {made}"
                + (f"; a min_wal_size of at least {h(wal_bytes)} (now {h(keep)}) keeps them for reuse once made"
                   if keep < wal_bytes else "")
                + " (docs/operating.md, \"WAL segments\")")
    return {"wal_segments_needed": needed, "wal_segments_ahead": ahead, "line": line}
