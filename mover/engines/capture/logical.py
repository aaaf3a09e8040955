"""Logical capture (`[capture] method = "logical"`): the source's changes read from the WAL instead
of a trigger in the application's transactions, fed into the same change log.

A *feeder* reads the changes of mover's replication slot (pgoutput, through a publication of the
source only, with the SQL functions on an ordinary connection), turns each into the rows the
capture trigger writes (the key; the new key on INSERT and UPDATE, the old one on DELETE and on an
UPDATE that changes the key: mover/engines/capture/pgoutput.py keys_of) and inserts them into the change log in a
short transaction of its own; after that commits, it advances the slot. Everything downstream (the
applier, the backfill's watermark, reconcile's pending keys, repair, the cutover's drain) reads the
log as it reads the trigger's.

Invariants:
- The publication, then the slot, exist before the first range's snapshot (invariant 13): every
  change committed after a range's snapshot is in the stream. The slot is created in a transaction
  of its own, first (PostgreSQL refuses it after a write), and waits for the transactions running
  then to end: bounded by [capture] slot_wait, in attempts that name the sessions it waits for.
- The slot's position moves only to a point whose keys are committed in the log (fed_lsn, in the
  feed transaction, which commits with synchronous_commit = local). It is advanced after that
  commit, and again at the start of the next feed if a crash came between: a kill -9 anywhere
  feeds at most one batch twice, which replay by state makes harmless.
- Decoding reads only flushed WAL, and the application may commit with synchronous_commit off:
  "everything committed until now" is fed only after a transaction of mover's own that wrote WAL
  committed with synchronous_commit = local after reading the insert position (q.flush).
- Only one session uses the slot at a time: every feed, advance, peek and drop holds the feeder
  lock (a transaction-scoped advisory lock; a takeover ends a stalled holder, control.APPLIER_LOCKS).
- A slot that is missing or lost (wal_status 'lost') stops the migration with SlotLost (exit 1),
  never a silent gap; `mover recapture NAME` starts a new slot and a full reconcile pass.
- A key the stream cannot say (a replica identity that does not cover the key, a TRUNCATE that
  got past its trigger) stops the feed with an error: a change is never dropped.
- The rollback window's reverse direction uses the trigger (docs/design.md says why); the slot is
  dropped after the swap commits, and again by cleanup() if a crash came first.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from mover import faults, names
from mover.catalog import introspect
from mover.db import Database, bind, one
from mover.engines.capture import pgoutput as wire
from mover.engines.context import Context
from mover.errors import Failed, PlanError, SlotLost, Waiting
from mover.names import QualifiedName
from mover.sql import logical as q
from mover.state import control, gaps, ranges

log = logging.getLogger("mover.logical")

FEED_LOCK = "mover.feed"  # advisory lock (name, migration): one session uses the slot at a time
FEED_CHANGES = 20_000  # messages per feed transaction (whole transactions: a bigger one comes whole)
INSERT_CHUNK = 5_000  # keys per insert into the log
FETCH = 2_000  # rows fetched at a time from the slot
FEED_STATEMENT_TIMEOUT = "600s"  # a single application transaction of millions of rows is decoded whole
SLOT_ATTEMPT_MS = 5_000  # one attempt to create the slot; the sessions it waits for are named after each
# A stretch of WAL without any change of the source's is not recorded as fed (no write) while it is
# shorter than IDLE_BYTES and the position was recorded less than IDLE_SECONDS ago: each record is
# WAL itself, and an idle feeder would otherwise feed on its own writes forever. Past either bound
# it is recorded, so that the slot lets the WAL go and the status's lag stays a few seconds.
IDLE_BYTES = 1 << 20
IDLE_SECONDS = 10.0
# Every read of the slot decodes again from its restart point, which moves only at the server's
# snapshots of running transactions (every 15 s under load): read every 0.2 s, the decoding was
# nearly all done again (12 % of a core at 2,500 tps here, 0.7 % read every 5 s). So a bounded
# feed (the background's) reads only once the last feed is this old or this much WAL waits;
# a whole feed (catch_up: the gate, the cutover, reconcile's pass) always reads.
FEED_SPACING_SECONDS = 5.0
FEED_SPACING_BYTES = 64 << 20
_last_read: dict[str, float] = {}  # slot -> when this process last read it (monotonic)
_idle: dict[str, tuple[int, int]] = {}  # slot -> (position, WAL read to from there with nothing in it)
CAPTURE_STEPS = ("install_capture", "backfill", "reconcile", "cutover")  # where the forward capture runs


def enabled(ctx: Context) -> bool:
    """Whether the forward capture of this migration is logical (the reverse one never is)."""
    return ctx.plan.capture.logical


def slot_name(cur: psycopg.Cursor, mid: int) -> str:
    cur.execute("SELECT oid FROM pg_catalog.pg_database WHERE datname OPERATOR(pg_catalog.=) "
                "pg_catalog.current_database()")
    return names.capture_slot(mid, int(one(cur)[0]))


def lock_feeder(cur: psycopg.Cursor, mid: int, *, wait: bool = True) -> bool:
    """The feeder lock, for the rest of the caller's transaction; False (without waiting) when another
    session holds it."""
    fn = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    cur.execute(sql.SQL("SELECT pg_catalog.{}(pg_catalog.hashtext(%s), %s::int)").format(sql.Identifier(fn)),
                (FEED_LOCK, mid))
    return True if wait else bool(one(cur)[0])


def _encoding(conn: psycopg.Connection) -> str:
    """Python's name of the server's encoding (names in pgoutput's messages are in it)."""
    server = conn.info.parameter_status("server_encoding") or "UTF8"
    try:
        from psycopg._encodings import pg2pyenc  # psycopg's own table of PostgreSQL's encoding names
        return pg2pyenc(server.encode())
    except Exception:  # an encoding psycopg does not know: names are ASCII in practice
        return "utf-8"


# ---------------------------------------------------------------------------------------------
# The publication and the slot


def install_sql(cur: psycopg.Cursor, mid: int) -> list[sql.Composed]:
    """What the capture's install transaction adds for logical capture (after prepare() made the
    publication and the slot): the feed state, starting where the slot starts."""
    return [q.create_feed_state(names.feed_state(mid), slot_name(cur, mid))]


def install(cur: psycopg.Cursor, mid: int) -> None:
    for stmt in install_sql(cur, mid):
        cur.execute(stmt)
    require_slot(cur, mid)  # made by prepare(), before this transaction: still there


def remove_sql(mid: int) -> list[sql.Composed]:
    """What stops logical capture, in the transaction that removes the capture (the swap, abort,
    retire): the publication and the feed state. The slot is not transactional: drop_slot() after
    that transaction commits (a crash before it leaves a slot cleanup() drops)."""
    return [q.drop_publication(names.capture_publication(mid)), q.drop_feed_state(names.feed_state(mid))]


def prepare_sql(ctx: Context, cur: psycopg.Cursor, table: QualifiedName) -> list[sql.Composable | str]:
    """What prepare() runs, for `plan check`."""
    pub = names.capture_publication(ctx.mid)
    return [q.create_publication(pub, table), q.comment_publication(pub, ctx.migration.name), "COMMIT",
            f"-- then, first in a transaction of its own (waits up to [capture] slot_wait = "
            f"{ctx.plan.capture.slot_wait_ms} ms for the transactions running then to end):",
            sql.SQL("SELECT pg_catalog.pg_create_logical_replication_slot({}, 'pgoutput')").format(
                sql.Literal(slot_name(cur, ctx.mid)))]


def prepare(ctx: Context, table: QualifiedName) -> str:
    """Before the transaction that installs the capture on `table` (install_capture, the swap
    back): mover's publication of `table`, committed, then the slot (invariant 13: a publication
    made after the slot would not publish what came before it). Re-entrant: what exists is kept
    when it is usable (a slot nothing has been fed from yet is dropped and made again if not)."""
    pub = names.capture_publication(ctx.mid)
    key = tuple(ctx.migration.key_columns)

    def publish(cur: psycopg.Cursor) -> None:
        oid = introspect.table_oid(cur, table)
        cur.execute("SELECT array(SELECT r.prrelid::bigint FROM pg_catalog.pg_publication_rel r"
                    " WHERE r.prpubid OPERATOR(pg_catalog.=) p.oid AND r.prqual IS NULL AND r.prattrs IS NULL),"
                    " p.pubinsert AND p.pubupdate AND p.pubdelete AND p.pubtruncate"
                    " FROM pg_catalog.pg_publication p WHERE p.pubname OPERATOR(pg_catalog.=) %s", (pub,))
        row = cur.fetchone()
        if row is not None and (list(row[0]) != [oid] or not row[1]):
            # Left by an earlier attempt for another table, or altered behind mover's back (invariant
            # 14: a table dropped from it, a row filter, fewer actions published): made again whole.
            cur.execute(q.drop_publication(pub))
            row = None
        if row is None:
            cur.execute(q.create_publication(pub, table))
            cur.execute(q.comment_publication(pub, ctx.migration.name))
        # Checked once the publication holds the table (CREATE PUBLICATION's lock keeps ALTER TABLE
        # out until commit): with updates and deletes published, a replica identity that does not
        # cover the key would make the application's UPDATE and DELETE fail, or the stream lack keys.
        problem = identity_problem(cur, table, key)
        if problem is not None:
            raise problem

    c = ctx.plan.cutover
    ctx.db.transaction(publish, lock_timeout=f"{c.lock_timeout_ms}ms", attempts=c.attempts, label="publication")
    slot = ctx.db.transaction(lambda cur: slot_name(cur, ctx.mid))
    _ensure_slot(ctx, slot)
    return slot


def _ensure_slot(ctx: Context, slot: str) -> None:
    row = ctx.db.transaction(lambda cur: _slot_row(cur, slot), label="slot")
    if row is not None:
        why = _unusable(ctx.db, row)
        if why is None:
            return
        # Nothing was fed from it yet (the capture that would read it is not installed): made again.
        log.warning("replication slot %s %s; dropping it and making it again", slot, why)
        ctx.db.transaction(lambda cur: cur.execute(q.drop_slot(), (slot,)), label="drop slot")
    create_slot(ctx, slot)


def create_slot(ctx: Context, slot: str) -> None:
    """pg_create_logical_replication_slot, first in its transaction. It waits until every transaction
    that has a transaction id when it starts has ended (cluster-wide): each attempt is bounded
    (lock_timeout: the wait is on their transaction locks), the sessions still running are named,
    and after [capture] slot_wait in all, Waiting (exit 3) names them; nothing is left behind (a
    slot whose creation failed is dropped by the server)."""
    wait_ms = ctx.plan.capture.slot_wait_ms
    deadline = time.monotonic() + wait_ms / 1000
    delay = 0.1
    while True:
        attempt = max(200, min(SLOT_ATTEMPT_MS, int((deadline - time.monotonic()) * 1000)))
        started = time.monotonic()
        try:
            ctx.db.transaction(lambda cur: cur.execute(q.create_slot(), (slot,)), lock_timeout=f"{attempt}ms",
                               statement_timeout=f"{attempt + 5000}ms", attempts=1, label="create replication slot")
            ms = (time.monotonic() - started) * 1000
            ctx.db.transaction(bind(control.event, ctx.mid, ctx.owner, ctx.migration.step, "capture_slot_created",
                                    f"replication slot {slot} created (logical capture)", {"slot": slot}, ms),
                               label="record")
            ctx.report("capture_slot", slot=slot, created=True)
            return
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
            waiting = ctx.db.transaction(running_transactions, label="running transactions")
        if time.monotonic() >= deadline:
            raise Waiting(
                f"could not create the replication slot {slot} of migration {ctx.migration.name!r} within "
                f"{wait_ms} ms: it waits for every transaction running when it starts to end; still running: "
                f"{'; '.join(waiting) or 'none now'}; nothing was created",
                hint=f"end those transactions (`SELECT pg_terminate_backend(pid)`, or COMMIT/ROLLBACK PREPARED) or "
                     f"wait for them, then `mover run {ctx.migration.name}`; a longer wait: [capture] slot_wait in "
                     f"the plan")
        ctx.report("capture_slot_waiting", slot=slot, sessions="; ".join(waiting))
        if ctx.stop.wait(delay):
            ctx.checkpoint()
        delay = min(delay * 2, 2.0)


def running_transactions(cur: psycopg.Cursor) -> list[str]:
    """The transactions a new logical slot waits for: those with a transaction id, in any database,
    oldest first; prepared ones by their gid (they have no session)."""
    cur.execute("SELECT a.pid, a.usename, a.application_name, a.datname, a.state,"
                " EXTRACT(epoch FROM pg_catalog.clock_timestamp() - a.xact_start)::float8"
                " FROM pg_catalog.pg_stat_activity a WHERE a.backend_xid IS NOT NULL"
                " AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid() ORDER BY a.xact_start")
    out = [f"pid {pid} (user {user}, application {app!r}, database {db}, {state or '-'}, transaction open "
           f"{age or 0:.1f} s)" for pid, user, app, db, state, age in cur.fetchall()]
    cur.execute("SELECT gid, owner, database, EXTRACT(epoch FROM pg_catalog.clock_timestamp()"
                " - prepared)::float8 FROM pg_catalog.pg_prepared_xacts ORDER BY prepared")
    out += [f"prepared transaction {gid!r} (owner {owner}, database {db}, prepared {age:.1f} s ago)"
            for gid, owner, db, age in cur.fetchall()]
    return out


@dataclass(frozen=True)
class _Slot:
    database: str | None
    plugin: str | None
    slot_type: str
    temporary: bool
    active_pid: int | None
    wal_status: str | None
    confirmed: int | None
    restart: int | None


def _slot_row(cur: psycopg.Cursor, slot: str) -> _Slot | None:
    cur.execute(q.slot(), (slot,))
    r = cur.fetchone()
    if r is None:
        return None
    return _Slot(r[0], r[1], r[2], r[3], r[4], r[5], wire.lsn_int(r[6]) if r[6] else None,
                 wire.lsn_int(r[7]) if r[7] else None)


def _unusable(db: Database | psycopg.Cursor, s: _Slot) -> str | None:
    if s.slot_type != "logical" or s.plugin != "pgoutput" or s.temporary:
        return f"is not a permanent pgoutput slot (type {s.slot_type}, plugin {s.plugin})"
    if s.wal_status == "lost" or s.confirmed is None:
        return "was invalidated (wal_status lost: the WAL it needed was removed, e.g. past max_slot_wal_keep_size)"
    return None


def require_slot(cur: psycopg.Cursor, mid: int, slot: str | None = None) -> _Slot:
    """The migration's slot, usable, or SlotLost."""
    slot = slot or slot_name(cur, mid)
    row = _slot_row(cur, slot)
    why = "is missing (dropped by someone, or never made)" if row is None else _unusable(cur, row)
    if why is not None or row is None:
        m = control.get_by_id(cur, mid)
        raise SlotLost(
            f"the replication slot {slot} of migration {m.name!r} {why}: the changes to {m.source} committed "
            f"since the change log was last fed from it may never reach it; nothing was applied past that point, "
            f"and mover stops rather than go on with a gap",
            hint=f"`mover recapture {m.name}` makes a new slot and has the next reconcile pass compare every range "
                 f"(then `mover repair {m.name}` what it finds), or `mover abort {m.name}` and start again; see "
                 f"docs/operating.md \"Choosing a capture method\"")
    return row


def drop_slot(db: Database, mid: int) -> bool:
    """After the transaction that removed the capture committed: drop the slot (under the feeder
    lock: no session is reading it). False when it could not be dropped now (cleanup() retries)."""
    def drop(cur: psycopg.Cursor) -> bool:
        lock_feeder(cur, mid)
        slot = slot_name(cur, mid)
        cur.execute(q.drop_slot(), (slot,))
        return cur.fetchone() is not None

    try:
        return db.transaction(drop, lock_timeout="10s", attempts=3, label="drop replication slot")
    except psycopg.errors.ObjectInUse as exc:  # someone else reads it (not under mover's lock)
        log.warning("could not drop the replication slot of migration %s (%s); the next run drops it", mid, exc)
        return False


def needs_slot(m: control.Migration) -> bool:
    """Whether a migration's forward capture is logical and installed (or being installed) now."""
    plan = m.plan.get("capture") or {}
    return (plan.get("method") == "logical" and m.state not in control.TERMINAL and m.cutover_at is None
            and m.step in CAPTURE_STEPS)


def cleanup(ctx: Context) -> list[str]:
    """Slots and publications of mover's capture that nothing needs any more: this migration's when
    its capture is not logical-and-installed now, and those of migrations that ended (or are gone).
    A crash between a swap, abort or retire and the slot's drop leaves one that would keep WAL
    forever. Other live migrations' are left to their own runs (one of them may be preparing its
    slot right now). Returns what was dropped."""
    def find(cur: psycopg.Cursor) -> tuple[list[tuple[str, int]], list[tuple[str, int]], dict[int, bool]]:
        cur.execute(q.own_slots())
        slots = [(s, int(mid)) for s, mid in cur.fetchall()]
        cur.execute(q.own_publications())
        pubs = [(p, int(mid)) for p, mid in cur.fetchall()]
        keep: dict[int, bool] = {}
        for mid in {mid for _, mid in slots + pubs}:
            found = control.find_by_id(cur, mid)
            if found is None:  # no such migration (the schema was restored from elsewhere)
                keep[mid] = False
                continue
            m = found
            if m.id == ctx.mid:
                keep[mid] = needs_slot(m)
            else:
                keep[mid] = m.state not in control.TERMINAL  # another live migration's: its own runs decide
        return slots, pubs, keep

    slots, pubs, keep = ctx.db.transaction(find, label="capture slots")
    dropped: list[str] = []
    for pub, mid in pubs:
        if not keep[mid]:
            c = ctx.plan.cutover
            try:
                ctx.db.transaction(bind(psycopg.Cursor.execute, q.drop_publication(pub)),
                                   lock_timeout=f"{c.lock_timeout_ms}ms", attempts=c.attempts, label="drop publication")
                dropped.append(f"publication {pub}")
            except psycopg.errors.LockNotAvailable:
                log.warning("could not drop publication %s yet (lock busy); the next run retries", pub)
    for slot, mid in slots:
        if not keep[mid] and drop_slot(ctx.db, mid):
            dropped.append(f"replication slot {slot}")
    if dropped:
        ctx.db.transaction(lambda cur: control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "capture_cleaned",
                                                     f"dropped {', '.join(dropped)}: left by an interrupted run,"
                                                     f" no longer used", {"dropped": dropped}), label="record")
        ctx.report("capture_cleaned", dropped=", ".join(dropped))
    return dropped


def identity_problem(cur: psycopg.Cursor, table: QualifiedName, key: tuple[str, ...]) -> PlanError | None:
    """None when `table`'s replica identity covers every key column (then pgoutput sends the old key
    of every DELETE and of every UPDATE that changes it); else the problem, with the statement that
    fixes it."""
    cur.execute("SELECT c.oid, c.relreplident FROM pg_catalog.pg_class c WHERE c.oid = %s::regclass",
                (str(table),))
    oid, ident = one(cur)
    if ident == "f":
        return None
    cur.execute("SELECT i.indexrelid::regclass::text, i.indisprimary, i.indisreplident,"
                " array(SELECT a.attname::text FROM pg_catalog.pg_attribute a WHERE a.attrelid = i.indrelid"
                "       AND a.attnum = ANY (i.indkey::int2[]))"
                " FROM pg_catalog.pg_index i WHERE i.indrelid = %s", (oid,))
    indexes = cur.fetchall()
    covering = [r for r in indexes if (r[2] if ident == "i" else r[1] and ident == "d")]
    if covering and set(key) <= set(covering[0][3]):
        return None
    info = introspect.describe(cur, table)
    fix = sql.SQL("ALTER TABLE {} REPLICA IDENTITY USING INDEX {}").format(
        table.ident, sql.Identifier(info.key_index)).as_string(cur)
    full = sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(table.ident).as_string(cur)
    what = {"d": "DEFAULT (the primary key)" if any(r[1] for r in indexes) else "DEFAULT, and it has no primary key",
            "n": "NOTHING", "i": f"USING INDEX {covering[0][0] if covering else '?'}"}.get(ident, ident)
    return PlanError(
        f"the replica identity of {table} is {what}, which does not hold every key column "
        f"({', '.join(key)}): logical capture would not be sent the old key of an UPDATE that changes it or of a "
        f"DELETE, and with its publication the application's UPDATE and DELETE could fail",
        hint=f"run `{fix}` (the key's own unique index; no rewrite, a short lock), or `{full}` (more WAL for every "
             f"update), or set [capture] method = \"trigger\"; if the table is published to subscribers, their "
             f"old keys change with it")


# ---------------------------------------------------------------------------------------------
# Feeding


@dataclass
class Fed:
    keys: int = 0  # keys inserted into the change log
    changes: int = 0  # row changes decoded
    transactions: int = 0
    at: int | None = None  # the position fed up to
    caught_up: bool = True
    moved: bool = False  # the feed state moved: the slot can be advanced


class _Decoder:
    """Turns a stream of pgoutput messages into keys for the log, each with its transaction's commit
    time. Transactions whose commit starts before `after` are skipped (fed already)."""

    def __init__(self, source_oid: int, key: tuple[str, ...], encoding: str, after: int | None):
        self.source_oid, self.key, self.encoding, self.after = source_oid, key, encoding, after
        self.relations: dict[int, tuple[wire.Relation, tuple[int, ...]]] = {}
        self.skip = False
        self.at: datetime | None = None
        self.last_end: int | None = None
        self.transactions = self.changes = 0

    def keys(self, data: bytes) -> list[wire.Key]:
        msg = wire.parse(data, self.encoding)
        if isinstance(msg, wire.Begin):
            self.skip = self.after is not None and msg.final_lsn < self.after
            self.at = wire.timestamp(msg.commit_ts)
        elif isinstance(msg, wire.Commit):
            self.last_end = msg.end_lsn
            self.transactions += 0 if self.skip else 1
        elif isinstance(msg, wire.Relation):
            if msg.relid != self.source_oid:
                raise Failed(f"mover's publication sent a change of {msg.namespace}.{msg.name} (oid {msg.relid}), "
                             f"not of the source (oid {self.source_oid}): the publication was altered by someone",
                             hint="drop the table from it (`ALTER PUBLICATION ... DROP TABLE ...`), then run again")
            try:
                self.relations[msg.relid] = (msg, wire.key_positions(msg, self.key))
            except wire.KeyUnreadable as exc:
                raise Failed(f"logical capture cannot read the key from the stream: {exc}",
                             hint="give the table a replica identity that covers the key (`ALTER TABLE ... REPLICA "
                                  "IDENTITY USING INDEX <its key index>`), then run again") from exc
        elif isinstance(msg, (wire.Insert, wire.Update, wire.Delete)):
            if self.skip:
                return []
            self.changes += 1
            found = self.relations.get(msg.relid)
            if found is None:
                raise wire.ProtocolError(f"a change of relation {msg.relid} before its Relation message")
            rel, positions = found
            try:
                return wire.keys_of(msg, positions, rel)
            except wire.KeyUnreadable as exc:
                raise Failed(f"logical capture cannot read a changed key from the stream: {exc}",
                             hint="give the table a replica identity that covers the key, then run again") from exc
        elif isinstance(msg, wire.Truncate):
            if not self.skip and self.source_oid in msg.relids:
                raise Failed("a TRUNCATE of the source reached logical capture (its TRUNCATE trigger was disabled or "
                             "dropped): the rows it removed cannot be replayed key by key",
                             hint="`mover abort NAME` and start again (the target no longer matches the source)")
        return []  # Origin, Type, logical messages: nothing to log


def _insert(cur: psycopg.Cursor, log_table: QualifiedName, key: tuple[str, ...], key_types: tuple[str, ...],
            batch: dict[wire.Key, datetime]) -> int:
    if not batch:
        return 0
    params: dict[str, Any] = {f"k_{i}": [k[i] for k in batch] for i in range(len(key))}
    params["at"] = list(batch.values())
    cur.execute(q.insert_keys(log_table, key, key_types), params)
    n = len(batch)
    batch.clear()
    return n


@dataclass(frozen=True)
class Source:
    """What the feeder needs of the source: its oid (the relation pgoutput names) and its key."""
    oid: int
    key: tuple[str, ...]
    key_types: tuple[str, ...]


def _source(cur: psycopg.Cursor, ctx: Context) -> Source:
    m = ctx.mapping(cur)  # checks both shapes: nothing is fed across a change (invariant 7)
    oid = introspect.table_oid(cur, ctx.original)
    assert oid is not None
    return Source(oid, m.key, m.src_key_types)


def _read_stream(cur: psycopg.Cursor, ctx: Context, src: Source, slot: str, upto: int, limit: int,
                 after: int | None) -> tuple[Fed, int | None, int]:
    """Peek the slot up to `upto` (at most about `limit` messages; 0: no limit) and insert the keys
    of the transactions committed from `after` on into the change log, in the caller's
    transaction. Returns what was fed, the end of the last transaction read, and the rows read."""
    decoder = _Decoder(src.oid, src.key, _encoding(cur.connection), after)
    log_table = names.change_log(ctx.mid)
    batch: dict[wire.Key, datetime] = {}
    fed = Fed()
    rows = 0
    with cur.connection.cursor(name=f"mover_feed_{ctx.mid}") as stream:
        stream.itersize = FETCH
        try:
            stream.execute(q.peek(names.capture_publication(ctx.mid)),
                           {"slot": slot, "upto": wire.lsn_text(upto), "changes": limit})
            for (data,) in stream:
                rows += 1
                for k in decoder.keys(bytes(data)):
                    if k not in batch:
                        assert decoder.at is not None
                        batch[k] = decoder.at
                if len(batch) >= INSERT_CHUNK:
                    fed.keys += _insert(cur, log_table, src.key, src.key_types, batch)
        except psycopg.errors.ObjectNotInPrerequisiteState as exc:  # "can no longer get changes from ..."
            raise SlotLost(f"the replication slot {slot} of migration {ctx.migration.name!r} can no longer be read "
                           f"({str(exc).splitlines()[0]}): changes to {ctx.migration.source} since it was last fed "
                           f"may never reach the change log; mover stops rather than go on with a gap",
                           hint=f"`mover recapture {ctx.migration.name}` makes a new slot and has the next reconcile "
                                f"pass compare every range, or `mover abort {ctx.migration.name}`") from exc
    fed.keys += _insert(cur, log_table, src.key, src.key_types, batch)
    fed.changes, fed.transactions = decoder.changes, decoder.transactions
    return fed, decoder.last_end, rows


@dataclass(frozen=True)
class _State:
    slot: str
    fed: int | None  # the position fed up to (None: where the slot starts)
    age: float | None  # seconds since it was recorded


def _state(cur: psycopg.Cursor, mid: int) -> _State | None:
    feed = names.feed_state(mid)
    if not introspect.exists(cur, feed):
        return None  # logical capture is not installed (not yet, or no longer)
    cur.execute(q.read_feed_state(feed))
    slot, fed, age = one(cur)
    return _State(slot, wire.lsn_int(fed) if fed else None, age)


def _flush_position(cur: psycopg.Cursor) -> int:
    cur.execute(q.positions())
    return wire.lsn_int(one(cur)[1])


def flush(db: Database) -> int:
    """Flush the WAL up to the insert position of now (q.flush), from `db`'s session in a transaction
    of its own; returns that position: every transaction committed before this call can be decoded."""
    def go(cur: psycopg.Cursor) -> int:
        cur.execute("SET LOCAL synchronous_commit = local")
        cur.execute(q.flush())
        return wire.lsn_int(one(cur)[0])
    return db.transaction(go, statement_timeout="60s", label="flush WAL")


def _feed_once(cur: psycopg.Cursor, ctx: Context, upto: int | None, wait: bool) -> Fed | None:
    """One feed transaction: None when another session feeds now (and we would not wait), else what
    was fed; Fed(at=None) when logical capture is not installed."""
    if not lock_feeder(cur, ctx.mid, wait=wait):
        return None
    state = _state(cur, ctx.mid)
    if state is None:
        return Fed()
    slot, fed_at = state.slot, state.fed
    row = require_slot(cur, ctx.mid, slot)
    assert row.confirmed is not None
    if fed_at is not None and row.confirmed < fed_at:
        # A crash came between the last feed's commit and its advance: those keys are in the log.
        cur.execute(q.advance(), {"slot": slot, "lsn": wire.lsn_text(fed_at)})
    if fed_at is not None and row.confirmed > fed_at:
        # The slot is advanced only to a position fed first (fed_at): past it, someone advanced it or
        # dropped and created it again, and the changes in between were never fed (invariant 14).
        m = control.get_by_id(cur, ctx.mid)
        raise SlotLost(f"the replication slot {slot} of migration {m.name!r} is at {wire.lsn_text(row.confirmed)}, "
                       f"past {wire.lsn_text(fed_at)}, where mover last fed from it: it was advanced, or dropped and "
                       f"created again, by someone else; the changes in between never reached the change log",
                       hint=f"`mover recapture {m.name}` makes a new slot and has the next reconcile pass compare "
                            f"every range, or `mover abort {m.name}`")
    start = max(row.confirmed, fed_at or 0)
    flushed = _flush_position(cur)
    target = flushed if upto is None else upto
    recent = state.age is not None and state.age < IDLE_SECONDS
    if upto is None and time.monotonic() - _last_read.get(slot, -FEED_SPACING_SECONDS) < FEED_SPACING_SECONDS \
            and flushed - start < FEED_SPACING_BYTES:
        return Fed(at=start, caught_up=False)  # a bounded feed, soon after the last read: read later, in one go
    read_from, read_to = _idle.get(slot, (-1, -1))
    if start >= target or (recent and read_from == start and read_to >= target):
        return Fed(at=start)  # nothing new, or nothing of the source's since it was read last
    if flushed < target:  # the caller flushed up to target before: never decode short of it silently
        raise Failed(f"the WAL is flushed up to {wire.lsn_text(flushed)} only, short of {wire.lsn_text(target)}: "
                     f"the feed would miss changes committed before it", hint="run the command again")
    _last_read[slot] = time.monotonic()
    fed, last_end, rows = _read_stream(cur, ctx, _source(cur, ctx), slot, target, FEED_CHANGES, fed_at)
    # Fewer rows than asked: the read stopped at `target`. Else it stopped after a whole transaction.
    fed.caught_up = rows < FEED_CHANGES
    if fed.caught_up and not fed.changes and recent and target - start < IDLE_BYTES:
        _idle[slot] = (start, target)  # nothing to record: no write, no WAL of our own to read next time
        return Fed(at=start)
    fed.moved = True
    fed.at = target if fed.caught_up or last_end is None else last_end
    cur.execute(q.record_fed(names.feed_state(ctx.mid)),
                {"lsn": wire.lsn_text(fed.at), "changes": fed.changes, "keys": fed.keys})
    # The fed keys durable before the slot moves past them (the advance is not transactional).
    cur.execute("SET LOCAL synchronous_commit = local")
    faults.point("feed:inserted")  # inside the transaction: a crash loses the keys and the position together
    return fed


def _advance(cur: psycopg.Cursor, ctx: Context, lsn: int) -> None:
    lock_feeder(cur, ctx.mid)
    state = _state(cur, ctx.mid)
    if state is not None:
        cur.execute(q.advance(), {"slot": state.slot, "lsn": wire.lsn_text(lsn)})


def feed(ctx: Context, *, catch_up: bool) -> Fed:
    """Feed the change log from the slot (nothing when logical capture is not installed now).
    catch_up: every change committed before the call is in the log after it (the WAL flushed first,
    then read to that position, in as many transactions as it takes, waiting for another feeder);
    else one transaction up to the WAL flushed now, skipped when another session is feeding."""
    if not enabled(ctx) or ctx.swapped:
        return Fed()
    upto = flush(ctx.db) if catch_up else None
    total = Fed()
    while True:
        got = ctx.db.transaction(lambda cur: _feed_once(cur, ctx, upto, wait=catch_up),
                                 lock_timeout="60s" if catch_up else "2s", statement_timeout=FEED_STATEMENT_TIMEOUT,
                                 label="feed")
        if got is None or got.at is None:
            return total
        faults.point("feed:committed")  # committed, the slot not advanced yet: the next feed advances it
        if got.moved:
            ctx.db.transaction(bind(_advance, ctx, got.at or 0), lock_timeout="60s", label="advance slot")
            faults.point("feed:advanced")
        total.keys += got.keys
        total.changes += got.changes
        total.transactions += got.transactions
        total.at = got.at
        total.moved = total.moved or got.moved
        if got.caught_up or not catch_up:
            total.caught_up = got.caught_up
            return total
        ctx.checkpoint()


class Flusher:
    """A second session of mover's: flushes the WAL while the first holds a transaction open (the
    swap's, a reconcile range's). Opened before that transaction, so that its connection is not made
    while a lock is held."""

    def __init__(self, db: Database):
        self.db = db.sibling(role="mover-flush")

    def __enter__(self) -> Flusher:
        self.db.connection()
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.close()

    def flush(self) -> int:
        return flush(self.db)


@contextlib.contextmanager
def flusher(ctx: Context) -> Iterator[Flusher | None]:
    """For the swap: the second session that flushes the WAL under its lock, connected before it;
    None when the forward capture is not logical."""
    if not enabled(ctx) or ctx.swapped:
        yield None
        return
    with Flusher(ctx.db) as f:
        yield f


@contextlib.contextmanager
def preparing_back(ctx: Context) -> Iterator[None]:
    """Around the swap back: with logical capture, the forward capture it installs reads a slot made
    now, before its lock (invariant 13: every write the application commits after the swap back is
    in it). If the swap back does not commit, the slot and publication made for it go again (they
    would keep WAL for nothing; the next run's cleanup drops them otherwise)."""
    if not enabled(ctx):
        yield
        return
    prepare(ctx, ctx.original)
    try:
        yield
    except BaseException:
        try:
            cleanup(ctx)
        except psycopg.Error as exc:
            log.warning("could not drop the slot made for the rollback (%s); the next run drops it", exc)
        raise


def feed_in(cur: psycopg.Cursor, ctx: Context, flusher: Flusher, src: Source | None = None) -> dict[str, Any]:
    """Inside the caller's transaction: every change committed before now fed into the change log,
    where the same transaction sees it. The insert position is read here, so it follows every
    commit the caller's snapshot (taken before) sees; the WAL is flushed to it from the flusher's
    session; the keys of the transactions committed from the feed state's position on are
    inserted. Neither the feed state nor the slot moves (the caller's transaction may roll back, and
    feeds it does not record are only fed again). The cutover calls it under its lock, before its
    drain (race 4); reconcile in the snapshot it re-checks a range's keys with. `src`: the source as
    the caller read it already (under the swap's lock, no catalog read more). Returns what it fed,
    with its timings."""
    started = time.monotonic()
    lock_feeder(cur, ctx.mid)
    state = _state(cur, ctx.mid)
    if state is None:
        return {}
    slot, fed_at = state.slot, state.fed
    row = require_slot(cur, ctx.mid, slot)
    cur.execute(q.positions())
    upto = wire.lsn_int(one(cur)[0])
    flushed_at = time.monotonic()
    if flusher.flush() < upto or _flush_position(cur) < upto:
        raise Failed(f"the WAL was not flushed up to {wire.lsn_text(upto)}", hint="run the command again")
    flushed = time.monotonic()
    fed, _, _ = _read_stream(cur, ctx, src or _source(cur, ctx), slot, upto, 0, fed_at)
    assert row.confirmed is not None
    return {"feed_ms": (time.monotonic() - started) * 1000, "flush_ms": (flushed - flushed_at) * 1000,
            "decode_ms": (time.monotonic() - flushed) * 1000, "fed_keys": fed.keys, "fed_changes": fed.changes,
            "decoded_bytes": upto - row.confirmed}


# ---------------------------------------------------------------------------------------------
# Recovery


def recapture(ctx: Context) -> str:
    """`mover recapture NAME`, after SlotLost: a new slot (the old one dropped), the feed started
    from it, and the next reconcile pass made to compare every range (a migration at the gate goes
    back to reconcile): the changes the lost slot did not deliver are found there as differences,
    and `mover repair` re-syncs them."""
    m = ctx.refresh()
    if not enabled(ctx):
        raise PlanError(f"migration {m.name!r} captures with a trigger, not a replication slot: nothing to recapture",
                        hint=f"`mover status {m.name}`")
    installed = ctx.db.transaction(lambda cur: _state(cur, ctx.mid) is not None)
    if not needs_slot(m) or not installed:
        raise PlanError(f"migration {m.name!r} has no logical capture installed at step {m.step!r}",
                        hint=f"`mover run {m.name}` installs it" if needs_slot(m) else f"`mover status {m.name}`")
    slot = ctx.db.transaction(lambda cur: slot_name(cur, ctx.mid))
    drop_slot(ctx.db, ctx.mid)
    prepare(ctx, ctx.original)

    def restart(cur: psycopg.Cursor) -> None:
        lock_feeder(cur, ctx.mid)
        cur.execute(q.reset_feed_state(names.feed_state(ctx.mid)), (slot,))
        # The notes of applied keys say which ranges changed since the last pass; with a gap in the
        # capture any range may have: with its ranges forgotten the next pass compares every one.
        ranges.reset(cur, ctx.mid, "reconcile")
        # Invariant 14: the changes the old slot did not deliver are a capture gap, named by the
        # refusals until the full pass covers it.
        gaps.restored_now(cur, ctx.mid, f"slot:{slot}", str(ctx.original),
                          "the replication slot was lost, dropped or replaced, and `mover recapture` made a new one: "
                          "the changes committed between the last feed and the new slot were not captured")
        control.mark_recaptured(cur, m, ctx.owner, slot=slot)

    ctx.db.transaction(restart, lock_timeout=f"{ctx.plan.cutover.lock_timeout_ms}ms",
                       attempts=ctx.plan.cutover.attempts, label="recapture")
    ctx.report("capture_recovered", slot=slot)
    return slot


# ---------------------------------------------------------------------------------------------
# What status and the governor read


@dataclass(frozen=True)
class SlotHealth:
    """mover's own slot as `mover status` shows it and the governor (issue 25) watches it."""

    slot: str
    exists: bool
    wal_status: str | None  # reserved, extended, unreserved (about to be lost), lost
    active_pid: int | None
    lag_bytes: int | None  # WAL written since the position fed (not all of it is the source's)
    lag_seconds: float | None  # the oldest change not fed yet is at most this old (since the last feed)
    retained_bytes: int | None  # WAL the slot keeps from being recycled
    safe_wal_size: int | None  # bytes the slot may still fall behind before it is lost (max_slot_wal_keep_size)
    fed_lsn: str | None
    confirmed_lsn: str | None
    changes: int
    keys: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def health(cur: psycopg.Cursor, mid: int) -> SlotHealth | None:
    """The migration's slot now, or None when it has no logical capture installed."""
    feed = names.feed_state(mid)
    if not introspect.exists(cur, feed):
        return None
    try:
        with cur.connection.transaction():  # a savepoint: dropped since by a swap committing meanwhile
            cur.execute(q.health(feed))
            r = one(cur)
    except psycopg.errors.UndefinedTable:
        return None
    return SlotHealth(r[0], bool(r[1]), r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], int(r[10]), int(r[11]))


def describe_health(h: SlotHealth) -> str:
    """One line for `mover status`."""
    if not h.exists:
        return f"{h.slot} MISSING: `mover recapture` (see docs/operating.md)"
    parts = [h.slot, f"{h.wal_status or '?'}"]
    if h.lag_bytes is not None:
        parts.append(f"lag {_bytes(h.lag_bytes)}" + (f", {h.lag_seconds:.0f} s" if h.lag_seconds is not None else ""))
    if h.retained_bytes is not None:
        parts.append(f"retains {_bytes(h.retained_bytes)} of WAL")
    if h.safe_wal_size is not None:
        parts.append(f"{_bytes(h.safe_wal_size)} before it is lost")
    return ", ".join(parts)


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"

