"""After the copy: the new table's deferred indexes and constraints built, then ANALYZE, under the
migration's governor (the backfill step's, mover/steps/backfill.py, which runs them after the copy
of backfill.py and its drain; this module does not import that one).

Invariants:
- The new table's copy of the source's index X is named deferred_index_name(mid, X) (X with _m<mid>,
  names.derived): plan check refuses the run when that name is taken (checks/names.py), and the
  swap (carry.py partner_index) and parity map it back to X.
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
- The throttle (mover/engines/governor/throttle.py) holds the index builds and ANALYZE before each
  starts (a CREATE INDEX cannot be paced inside; how many run at once can: turn(), rest_after()),
  never inside one.
- ANALYZE runs beside the builds where it can, else after them (Analyze says where and why).
- Re-entrant: what is built, valid or attached is left as it is; a resume builds the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import psycopg
from psycopg import sql

from mover import faults, names, threads
from mover.catalog import introspect, shape
from mover.db import Database, bind, is_retryable, one
from mover.engines.capture import changelog
from mover.engines.context import Context
from mover.engines.governor import pacing, throttle
from mover.engines.partitioning import partitions
from mover.errors import ConstraintBuildFailed, Failed
from mover.plan import plan_from_canonical
from mover.sql import ddl
from mover.sql import partitions as sql_partitions
from mover.state import control

log = logging.getLogger("mover.builds")


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
    if (governor := throttle.of(ctx)) is not None and not governor.protecting:
        # Quiet (nothing to protect): as many as ungoverned; each next one still asks turn().
        sessions = max(sessions, plan.backfill.index_sessions(False))
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
            # A quiet application (governor.protecting False) pays nothing: the ungoverned build.
            governed = plan.throttle.governed and governor is not None and governor.protecting
            if (settle := ramp.claim(governed, plan.backfill.index_sessions(governed))) == 0:
                break
            ramp.wait(min(settle, throttle.RECHECK_SECONDS))
            continue
        if not said:
            ctx.report("index_waiting", what=what, reason=reason)
            said = True
        ctx.stop.wait(pacer.recheck_seconds())
    try:
        yield governed
    finally:
        if ramp is not None:
            ramp.release()


def rest_after(ctx: Context, seconds: float) -> None:
    """After a build that took `seconds`: rest as the governor's duty says, in slices, until the
    application no longer pays for it: a duty back to full (quiet again), or the probe back under
    its budget. A rest between builds cannot lower what the next one costs while it runs (it is
    one statement); it only lets the application's queue drain, and once the probe reads it
    drained, resting on lengthens the backfill, and the capture's cost with it, for nothing
    (bench/README.md, "Copy budget and index-build rests")."""
    governor = throttle.of(ctx)
    if governor is None:
        return
    until = time.monotonic() + governor.rest(seconds)
    while (left := until - time.monotonic()) > 0 and governor.duty < 1 and not governor.recovered:
        ctx.checkpoint()
        ctx.stop.wait(min(left, pacing.PROBE_SECONDS))


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


INDEX_ATTEMPTS = 6


def _transient_ddl_error(exc: BaseException) -> bool:
    """Worth another try: a lock or deadlock timeout, or the catalog race of two backends that
    end and drop the same index at once ("tuple concurrently updated", SQLSTATE XX000)."""
    if isinstance(exc, psycopg.errors.InternalError_):
        return (exc.diag.message_primary or "") == "tuple concurrently updated"
    return is_retryable(exc)


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
