"""Lock discipline around every transaction that takes a strong lock on the live table (the swap,
the swap back, retire, abort, the capture's install).

Before the attempt: autovacuum is paused on the two tables (`autovacuum_enabled = off`; on each
partition of a partitioned one), and in each attempt's transaction, just before its lock, a
running autovacuum worker on them is cancelled (it would hold SHARE UPDATE EXCLUSIVE until the
deadlock detector made it yield, about a second into our lock wait); sessions whose open
transaction holds a lock on them are named. The pause is recorded as an event in the same
transaction that sets it, and restored after the attempt, or at the next run after a crash
(`restore_pending`). When the attempts are spent, the sessions still holding locks are named in
the Waiting error (and so in `mover status`); with `[cutover] terminate_blockers` they are
cancelled, terminated after `blocker_grace`, reported, and the transaction is tried once more.

Watched: the step's tables, the tables whose foreign keys reference them, any the step names,
and the migration's own change logs and notes (the swap, retire and abort drop them; a session
of the application's role idle in a transaction that wrote the source holds the log too). A
step takes its locks one relation at a time through `lock_all`, which remembers the relation it
is waiting on: the error names that relation, then the sessions holding it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from mover import faults, names
from mover.catalog import introspect
from mover.db import bind
from mover.engines.context import Context
from mover.errors import Waiting
from mover.names import QualifiedName
from mover.state import control

log = logging.getLogger("mover.lockwatch")

T = TypeVar("T")
SHOWN = 5


@dataclass(frozen=True)
class Blocker:
    pid: int
    user: str | None
    application_name: str | None
    state: str | None
    xact_age_s: float | None
    query_start: str | None
    backend_type: str | None
    tables: tuple[str, ...]
    # CREATE INDEX / REINDEX [CONCURRENTLY] with its phase, when the session runs one: the
    # operator then waits for it to end rather than ending it (a REINDEX CONCURRENTLY ends itself)
    build: str | None = None

    @property
    def autovacuum(self) -> bool:
        return self.backend_type == "autovacuum worker"

    @property
    def ours(self) -> bool:
        return (self.application_name or "").startswith("mover")

    def describe(self) -> str:
        age = f"transaction open {self.xact_age_s:.1f} s" if self.xact_age_s is not None else "no transaction"
        who = "autovacuum worker" if self.autovacuum else f"user {self.user}, application {self.application_name!r}"
        build = f"running {self.build}, " if self.build else ""
        return (f"pid {self.pid} ({who}, {build}{self.state or '-'}, {age}, query started {self.query_start or '-'}, "
                f"holding {', '.join(self.tables)})")


_BLOCKERS = """
SELECT a.pid, a.usename, a.application_name, a.state,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8,
       to_char(a.query_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS UTC'), a.backend_type,
       -- Qualified and always quoted, as QualifiedName prints (whatever the session's search_path)
       array_agg(DISTINCT format('"%%s"."%%s"', replace(n.nspname, '"', '""'), replace(c.relname, '"', '""'))
                 ORDER BY format('"%%s"."%%s"', replace(n.nspname, '"', '""'), replace(c.relname, '"', '""'))),
       -- the view hides another role's command and phase (NULL) from a role without pg_read_all_stats
       (SELECT coalesce(p.command, 'an index build') || coalesce(' (' || p.phase || ')', '')
          FROM pg_stat_progress_create_index p WHERE p.pid = a.pid)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE l.locktype = 'relation' AND l.granted AND l.relation = ANY(%(oids)s)
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.pid <> pg_backend_pid()
GROUP BY a.pid, a.usename, a.application_name, a.state, a.xact_start, a.query_start, a.backend_type
ORDER BY a.xact_start NULLS LAST
"""


def blockers(cur: psycopg.Cursor, tables: Sequence[QualifiedName], *, min_age_s: float = 0.0) -> list[Blocker]:
    """Sessions holding a lock on any of `tables` (any granted lock conflicts with ACCESS
    EXCLUSIVE), oldest transaction first; autovacuum workers always, others from `min_age_s` on."""
    oids = [oid for t in tables if (oid := introspect.table_oid(cur, t)) is not None]
    if not oids:
        return []
    cur.execute(_BLOCKERS, {"oids": oids})
    # Not the query text: it may carry the application's data, and it would land in the events.
    out = [Blocker(r[0], r[1], r[2], r[3], r[4], r[5], r[6], tuple(r[7]), r[8]) for r in cur.fetchall()]
    return [b for b in out if b.autovacuum or (b.xact_age_s or 0.0) >= min_age_s]


# Per thread (a transaction's): the relation lock_all is waiting for (`on`), and the tables that
# earlier attempts of run_locked timed out on, which lock_all takes first (`first`).
_waiting = threading.local()


def lock_sql(table: QualifiedName, mode: str = "ACCESS EXCLUSIVE") -> sql.Composed:
    if mode == "SHARE ROW EXCLUSIVE":
        return sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(table.ident)
    assert mode == "ACCESS EXCLUSIVE", mode
    return sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table.ident)


def lock_statements(cur: psycopg.Cursor, tables: Sequence[QualifiedName],
                    mode: str = "ACCESS EXCLUSIVE") -> list[tuple[QualifiedName, sql.Composed]]:
    """lock_sql of each of `tables` that exists now, in order (one query asks which)."""
    cur.execute("SELECT to_regclass(t) IS NOT NULL FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, i) ORDER BY i",
                ([str(t) for t in tables],))
    exists = [r[0] for r in cur.fetchall()]
    return [(t, lock_sql(t, mode)) for t, there in zip(tables, exists, strict=True) if there]


def lock_all(cur: psycopg.Cursor, tables: Sequence[QualifiedName], mode: str = "ACCESS EXCLUSIVE") -> None:
    """Lock each of `tables` that exists, in order, one statement each (lock_statements: what plan
    check prints), remembering which one the transaction waits for (waiting_on): a lock_timeout
    then names it. In order: the live table first, as the application's writers take it before
    the log their trigger writes. Which exist is asked before the first lock. Tables an earlier
    attempt timed out on (run_locked's `learn_order`) come first, the latest first.

    The transaction's lock_timeout bounds all the waits together, not each: each lock waits only
    for what is left of it. The application queued behind the first table waits for the whole
    sequence, and six waits of a lock_timeout each held it past the server's deadlock_timeout,
    where its own transaction, not mover's attempt, became the deadlock's victim (race 9)."""
    first = [t for t in getattr(_waiting, "first", ()) if t in tables]
    statements = lock_statements(cur, [*first, *(t for t in tables if t not in first)], mode)
    budget_ms = introspect.setting_ms(cur, "lock_timeout")  # the transaction's own (SET LOCAL); 0: none
    started = time.monotonic()
    for i, (t, stmt) in enumerate(statements):
        if budget_ms and i:
            left = max(1, budget_ms - int((time.monotonic() - started) * 1000))
            cur.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{left}ms")))
        _waiting.on = t
        cur.execute(stmt)
    if budget_ms and len(statements) > 1:
        cur.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{budget_ms}ms")))
    _waiting.on = None


def waiting_on() -> QualifiedName | None:
    return getattr(_waiting, "on", None)


def own_tables(mid: int) -> list[QualifiedName]:
    """The migration's relations in mover's schema that its locked steps lock (create, drop)."""
    return [names.change_log(mid), names.change_log(mid, True), names.applied_notes(mid), names.feed_state(mid)]


@dataclass(frozen=True)
class PreparedBlocker:
    """A prepared transaction (two-phase commit) holding a lock on a watched table. It has no
    session: no pid to cancel or terminate, and it holds its locks until someone commits or rolls
    it back by its gid (its owner or a superuser, connected to its database)."""

    gid: str
    owner: str
    database: str
    prepared_age_s: float
    tables: tuple[str, ...]

    @property
    def literal(self) -> str:
        return "'" + self.gid.replace("'", "''") + "'"

    def describe(self) -> str:
        return (f"prepared transaction {self.literal} (owner {self.owner}, database {self.database}, prepared "
                f"{self.prepared_age_s:.1f} s ago, holding {', '.join(self.tables)})")


# A prepared transaction's locks have no pid; its own transactionid lock, held under the same
# virtual transaction, says which entry of pg_prepared_xacts it is.
_PREPARED = """
SELECT p.gid, p.owner, p.database, extract(epoch FROM clock_timestamp() - p.prepared)::float8,
       array_agg(DISTINCT l.relation::regclass::text ORDER BY l.relation::regclass::text)
FROM pg_locks l
JOIN pg_locks x ON x.locktype = 'transactionid' AND x.pid IS NULL AND x.virtualtransaction = l.virtualtransaction
JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
WHERE l.locktype = 'relation' AND l.granted AND l.pid IS NULL AND l.relation = ANY(%(oids)s)
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY p.gid, p.owner, p.database, p.prepared
ORDER BY p.prepared
"""


def prepared_blockers(cur: psycopg.Cursor, tables: Sequence[QualifiedName]) -> list[PreparedBlocker]:
    """Prepared transactions holding a lock on any of `tables`, oldest first (`blockers` cannot
    see them: they are in no session of pg_stat_activity)."""
    oids = [oid for t in tables if (oid := introspect.table_oid(cur, t)) is not None]
    if not oids:
        return []
    cur.execute(_PREPARED, {"oids": oids})
    return [PreparedBlocker(r[0], r[1], r[2], r[3], tuple(r[4])) for r in cur.fetchall()]


def referencing_tables(cur: psycopg.Cursor, tables: Sequence[QualifiedName]) -> list[QualifiedName]:
    """Tables (other than `tables`) whose foreign keys reference one of `tables`: a swap that
    re-points those keys locks them too, so their blockers are watched as well."""
    oids = [oid for t in tables if (oid := introspect.table_oid(cur, t)) is not None]
    if not oids:
        return []
    cur.execute("SELECT DISTINCT n.nspname, c.relname FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE k.contype = 'f' AND k.confrelid = ANY(%(oids)s) AND NOT k.conrelid = ANY(%(oids)s)"
                " ORDER BY 1, 2", {"oids": oids})
    return [QualifiedName(schema, name) for schema, name in cur.fetchall()]


def describe_all(found: Sequence[Blocker]) -> str:
    shown = "; ".join(b.describe() for b in found[:SHOWN])
    return shown + (f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else "")


# ---------------------------------------------------------------------------------------------
# Autovacuum paused for the duration of the locked transaction


def _autovacuum_setting(cur: psycopg.Cursor, oid: int) -> bool | None:
    cur.execute("SELECT option_value FROM pg_class c, pg_options_to_table(c.reloptions)"
                " WHERE c.oid = %s AND option_name = 'autovacuum_enabled'", (oid,))
    row = cur.fetchone()
    return None if row is None else row[0].lower() in ("true", "on", "yes", "1")


def _set_autovacuum(cur: psycopg.Cursor, oid: int, value: bool | None) -> None:
    cur.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.oid = %s", (oid,))
    row = cur.fetchone()
    if row is None:
        return  # dropped since (retire, abort): nothing to restore
    table = sql.Identifier(row[0], row[1])
    if value is None:
        cur.execute(sql.SQL("ALTER TABLE {} RESET (autovacuum_enabled)").format(table))
    else:
        cur.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = {})").format(
            table, sql.SQL("true") if value else sql.SQL("false")))


def storage_tables(cur: psycopg.Cursor, tables: Sequence[QualifiedName]) -> list[tuple[int, QualifiedName]]:
    """(oid, name) of each of `tables` that has storage, and of each partition with storage of those
    that are partitioned (a LOCK TABLE of a partitioned table locks its partitions too, and only
    they are vacuumed: a partitioned parent has no storage and takes no autovacuum setting)."""
    out: list[tuple[int, QualifiedName]] = []
    for t in tables:
        oid = introspect.table_oid(cur, t)
        if oid is None:
            continue
        # pg_partition_tree() has no row for a table outside any partition tree: the table itself.
        cur.execute("SELECT c.oid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE c.relkind = 'r'"
                    " AND (c.oid = %(oid)s OR c.oid IN (SELECT relid FROM pg_partition_tree(%(oid)s)))"
                    " ORDER BY c.oid <> %(oid)s, n.nspname, c.relname", {"oid": oid})
        out += [(o, QualifiedName(schema, name)) for o, schema, name in cur.fetchall()]
    return out


def pause_autovacuum(cur: psycopg.Cursor, ctx: Context, tables: Sequence[QualifiedName]) -> list[dict[str, Any]]:
    """Turn autovacuum off on `tables` (each partition of a partitioned one) and record what each
    had, in one transaction: a crash after the commit leaves the record that `restore_pending` reads."""
    paused: list[dict[str, Any]] = []
    for oid, t in storage_tables(cur, tables):
        prior = _autovacuum_setting(cur, oid)
        if prior is False:
            continue  # already off by the operator's choice: left as it is
        _set_autovacuum(cur, oid, False)
        paused.append({"oid": oid, "table": str(t), "prior": prior})
    if paused:
        control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "autovacuum_paused",
                      f"autovacuum paused on {', '.join(str(p['table']) for p in paused)} for the locked transaction",
                      {"tables": paused})
    return paused


def _pending_pause(cur: psycopg.Cursor, mid: int) -> list[dict[str, Any]]:
    cur.execute("SELECT detail FROM mover.events WHERE migration_id = %s AND kind = 'autovacuum_paused'"
                " AND id > coalesce((SELECT max(id) FROM mover.events WHERE migration_id = %s"
                " AND kind = 'autovacuum_restored'), 0) ORDER BY id", (mid, mid))
    return [t for (detail,) in cur.fetchall() for t in (detail or {}).get("tables", [])]


def restore(cur: psycopg.Cursor, ctx: Context) -> list[str]:
    """Give each paused table its setting back (by oid: the swap renamed them); record it."""
    paused = _pending_pause(cur, ctx.mid)
    if not paused:
        return []
    done = []
    for p in paused:
        _set_autovacuum(cur, p["oid"], p["prior"])
        done.append(str(p["table"]))
    control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "autovacuum_restored",
                  f"autovacuum setting restored on {', '.join(done)}", {"tables": paused})
    return done


def restore_pending(ctx: Context, *, after_crash: bool = True) -> None:
    """Undo a recorded pause: after the locked transaction, and at the start of a run (a pause
    a crashed process left, which is then reported)."""
    lock_timeout = f"{ctx.plan.cutover.lock_timeout_ms}ms"
    try:
        done = ctx.db.transaction(bind(restore, ctx), lock_timeout=lock_timeout, attempts=ctx.plan.cutover.attempts,
                                  label="restore autovacuum")
    except psycopg.errors.LockNotAvailable:
        log.warning("could not restore autovacuum on the tables of %s yet (lock busy); the next run retries",
                    ctx.migration.name)
        return
    if done and after_crash:
        ctx.report("autovacuum_restored", tables=", ".join(done), why="left paused by an interrupted run")


def _cancel(cur: psycopg.Cursor, pid: int, terminate: bool) -> bool:
    fn = "pg_terminate_backend" if terminate else "pg_cancel_backend"
    try:
        with cur.connection.transaction():  # a savepoint: a refusal (privilege) is reported, not fatal
            cur.execute(sql.SQL("SELECT {}(%s)").format(sql.Identifier(fn)), (pid,))
            row = cur.fetchone()
            return bool(row and row[0])
    except psycopg.errors.InsufficientPrivilege as exc:
        log.warning("could not signal pid %s: %s", pid, exc)
        return False


def _cancel_autovacuum(cur: psycopg.Cursor, tables: Sequence[QualifiedName]) -> list[int]:
    # A worker on a partition locks the partition only: the partitions are looked at too.
    found = [b for b in blockers(cur, [t for _, t in storage_tables(cur, tables)]) if b.autovacuum]
    return [b.pid for b in found if _cancel(cur, b.pid, terminate=False)]


def clearing_autovacuum(tables: Sequence[QualifiedName], fn: Callable[[psycopg.Cursor], T],
                        cancelled: list[int]) -> Callable[[psycopg.Cursor], T]:
    """`fn`, with the autovacuum workers on `tables` cancelled first in the same transaction (their
    pids added to `cancelled`). Each attempt clears anew: a cancelled worker does not exit, it goes
    on to the next table in its list -- which may be our other table -- and the cancel's signal is
    sent at once, so the lock we ask for next waits only for the worker to roll back."""
    def go(cur: psycopg.Cursor) -> T:
        cancelled.extend(pid for pid in _cancel_autovacuum(cur, tables) if pid not in cancelled)
        return fn(cur)
    return go


def record_cancelled(ctx: Context, pids: list[int]) -> None:
    """The autovacuum_cancelled event (and output line) for the workers `clearing_autovacuum` cancelled."""
    if not pids:
        return
    ctx.db.transaction(lambda cur: control.event(cur, ctx.mid, ctx.owner, ctx.migration.step,
                                                 "autovacuum_cancelled",
                                                 f"cancelled autovacuum worker(s) {pids} on the tables",
                                                 {"pids": pids}), label="record")
    ctx.report("autovacuum_cancelled", pids=pids)


def terminate_blockers(ctx: Context, tables: Sequence[QualifiedName], found: list[Blocker],
                       held: Callable[[psycopg.Cursor], list[Blocker]] | None = None) -> list[dict[str, Any]]:
    """Cancel the blockers' statements; terminate the sessions still holding a lock after
    blocker_grace (an idle transaction ignores a cancel). mover's own sessions are left alone.
    `held`: what they hold, if not a lock on `tables` (snapshots.wait: an older snapshot)."""
    grace = ctx.plan.cutover.blocker_grace_ms / 1000
    targets = {b.pid: b for b in found if not b.ours}
    if not targets:
        return []
    ctx.db.transaction(lambda cur: [_cancel(cur, pid, terminate=False) for pid in targets], label="cancel blockers")
    deadline = time.monotonic() + grace
    still: dict[int, Blocker] = dict(targets)
    while still and time.monotonic() < deadline:
        if ctx.stop.wait(min(0.05, grace)):
            break
        now = ctx.db.transaction(held or bind(blockers, tables), label="blockers")
        still = {b.pid: b for b in now if b.pid in targets}
    terminated = []
    if still:
        terminated = ctx.db.transaction(
            lambda cur: [pid for pid in still if _cancel(cur, pid, terminate=True)], label="terminate blockers")
    def action(pid: int) -> str:
        if pid in terminated:
            return "terminated"
        # Still there after the terminate: the role may not signal it (pg_signal_backend, superuser).
        return "could not signal" if pid in still else "cancelled"
    report = [{**asdict(b), "action": action(pid)} for pid, b in targets.items()]
    ctx.db.transaction(lambda cur: control.event(
        cur, ctx.mid, ctx.owner, ctx.migration.step, "blockers_cancelled",
        "[cutover] terminate_blockers: " + "; ".join(f"{r['action']} pid {r['pid']}" for r in report),
        {"sessions": report}), label="record")
    ctx.report("blockers_cancelled", sessions=", ".join(f"{r['action']} pid {r['pid']}" for r in report))
    return report


class LockBlocked(Waiting):
    """The lock was not granted within the attempts; names the sessions that held it."""

    def __init__(self, message: str, hint: str, found: list[Blocker], prepared: Sequence[PreparedBlocker] = (),
                 attempts: int = 0):
        super().__init__(message, hint=hint)
        self.blockers = found
        # lock_attempts: each one timed out (the outcome's event keeps it: `mover metrics` counts them).
        self.detail = {"blockers": [asdict(b) for b in found], "lock_attempts": attempts,
                       **({"prepared": [asdict(p) for p in prepared]} if prepared else {})}


def run_locked(ctx: Context, fn: Callable[[psycopg.Cursor], T], *, tables: Sequence[QualifiedName], what: str,
               retry: str, label: str, statement_timeout: str = "60s",
               extra_tables: Sequence[QualifiedName] = (), before_attempt: Callable[[], None] | None = None,
               learn_order: Sequence[QualifiedName] = ()) -> T:
    """Run `fn`, a transaction that takes a strong lock on `tables` (the live table first), under
    the plan's lock_timeout and attempts, with the discipline above. Tables whose foreign keys
    reference `tables` are watched for blockers too, and so are `extra_tables` (any other table
    the transaction locks); neither has its autovacuum paused. `before_attempt` runs before each
    attempt, outside its transaction (the cutover drains there what came during the last wait).

    `learn_order`: tables the application writes in orders of its own (a family's: a child's
    insert locks the child, then its parent for the key check; an order inserted with its items
    locks the parent first). Any fixed order of ours meets one of them: holding a table, it waits
    for a session that waits for that table, a cycle only lock_timeout ends, attempt after
    attempt. So one of these an attempt timed out on is taken first by the next (race 9)."""
    c = ctx.plan.cutover
    referencing = ctx.db.transaction(bind(referencing_tables, tables), label="referencing tables")
    watched = list(dict.fromkeys([*tables, *extra_tables, *referencing, *own_tables(ctx.mid)]))
    _waiting.on, _waiting.first = None, []
    restore_pending(ctx)
    cancelled: list[int] = []
    try:
        # A running worker holds the SHARE UPDATE EXCLUSIVE lock the pause's ALTER TABLE needs.
        ctx.db.transaction(clearing_autovacuum(tables, bind(pause_autovacuum, ctx, tables), cancelled),
                           lock_timeout=f"{c.lock_timeout_ms}ms", attempts=3, label="pause autovacuum")
    except (psycopg.errors.LockNotAvailable, psycopg.errors.InsufficientPrivilege) as exc:
        # ALTER TABLE SET takes SHARE UPDATE EXCLUSIVE (a running VACUUM or index build holds it)
        # and needs ownership: without the pause, the lock attempt goes on as before.
        log.warning("could not pause autovacuum on %s (%s); going on without", ", ".join(map(str, tables)),
                    type(exc).__name__)
    record_cancelled(ctx, cancelled)
    cancelled = []
    try:
        faults.point("lock:paused")
        early = ctx.db.transaction(bind(blockers, watched, min_age_s=c.lock_timeout_ms / 1000), label="blockers")
        if early:
            ctx.report("lock_blockers", what=what, sessions=describe_all(early))

        tried = 0  # attempts at the lock, each timed out but a last one that got it

        def before() -> None:
            nonlocal tried
            tried += 1
            timed_out = waiting_on()
            if timed_out is not None and timed_out in learn_order:
                _waiting.first = [timed_out, *(t for t in _waiting.first if t != timed_out)]
            if before_attempt is not None:
                before_attempt()

        def attempt() -> T:
            return ctx.db.transaction(clearing_autovacuum(tables, fn, cancelled), lock_timeout=f"{c.lock_timeout_ms}ms",
                                      statement_timeout=statement_timeout, attempts=c.attempts, label=label,
                                      before_attempt=before)
        try:
            return attempt()
        except psycopg.errors.LockNotAvailable as exc:
            found = ctx.db.transaction(bind(blockers, watched), label="blockers")
            if not (c.terminate_blockers and found):
                raise _blocked(ctx, watched, what, retry, found, tried) from exc
        terminate_blockers(ctx, watched, found)
        try:
            return attempt()
        except psycopg.errors.LockNotAvailable as exc:
            found = ctx.db.transaction(bind(blockers, watched), label="blockers")
            raise _blocked(ctx, watched, what, retry, found, tried) from exc
    finally:
        _waiting.first = []
        record_cancelled(ctx, cancelled)
        restore_pending(ctx, after_crash=False)


def _blocked(ctx: Context, watched: Sequence[QualifiedName], what: str, retry: str,
             found: list[Blocker], attempts: int) -> LockBlocked:
    """The relation the last attempt waited on (lock_all), else every watched one a session held;
    the sessions holding it first, and any prepared transaction holding a watched table."""
    c = ctx.plan.cutover
    waited = waiting_on()
    _waiting.on = None
    if waited is not None:
        held = str(waited)
        found = sorted(found, key=lambda b: held not in b.tables)
        target = str(waited)
    else:
        target = ", ".join(dict.fromkeys(t for b in found for t in b.tables)) or str(watched[0])
    prepared = ctx.db.transaction(bind(prepared_blockers, watched), label="prepared transactions")
    named = f"; held by {describe_all(found)}" if found else ""
    hint = (f"retry `{retry}` when the table is quieter, end the blocking session(s) (`SELECT "
            f"pg_terminate_backend(pid)`), set `[cutover] terminate_blockers = true`, or raise [cutover] "
            f"lock_timeout / attempts (`mover set {ctx.migration.name} cutover.attempts=...`)")
    if prepared:
        # No session to signal: only its COMMIT PREPARED or ROLLBACK PREPARED releases the lock.
        named += f"{'; and' if found else '; held by'} {'; '.join(p.describe() for p in prepared)}"
        ends = "; ".join(f"`COMMIT PREPARED {p.literal}` or `ROLLBACK PREPARED {p.literal}` (in database "
                         f"{p.database}, as {p.owner} or a superuser)" for p in prepared)
        hint = (f"end the prepared transaction(s), whose locks last until they are committed or rolled back by "
                f"their gid ({ends}; `[cutover] terminate_blockers` cannot end them: they have no session), "
                f"then retry `{retry}`" + (f"; for the session(s): {hint}" if found else ""))
    return LockBlocked(f"could not lock {target} within {c.lock_timeout_ms} ms in {c.attempts} attempts to {what}"
                       f" migration {ctx.migration.name!r}; nothing was changed{named}", hint, found, prepared,
                       attempts)
