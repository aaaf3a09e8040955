"""Reconcile engine: compare the original and the new table completely, range by range.

Invariants:
- Each range of both tables, and the change log, are read by one statement: one snapshot, so a
  concurrent write cannot make equal tables look different (no false positives). Rows are
  compared by their typed values, exactly (mover/sql/compare.py says why not by hash).
- A key that differs while a change to it is still pending in the log is re-checked, alone,
  after the applier has caught up, a bounded number of rounds; only a difference that
  persists is recorded as a divergence, in the transaction that marks the range done.
- Ranges are claimed from mover/state/ranges.py (kind 'reconcile': SKIP LOCKED, leases, attempt
  ceiling), by [reconcile] workers threads running the range loop (mover/engines/bulk/rangework.py;
  Worker is its comparison); a crashed reconcile resumes with the ranges it had not finished,
  and a range's result commits with its done mark (race 6 included).
- Each verified range keeps its row counts, and its fingerprints with [reconcile] fingerprints
  (the source side's row hash is most of what a pass costs over the typed comparison, and no
  decision here reads it: off by default). A later pass re-verifies only
  the ranges that changed since: those holding a key the applier replayed after the range was
  verified (noted by a trigger on the change log, see compare.create_notes), or an open
  divergence. The same incremental pass runs just before the cutover's lock.

Why notes of applied keys, rather than recomputing the stored fingerprints to spot a changed
range: recomputing a fingerprint reads the whole range, which is most of what comparing it
costs; a note costs one upsert per applied key, and only while reconcile or the cutover is
ahead. Why a trigger on the log rather than in the applier: every path that applies a change
(batch replay, key-by-key fallback, the cutover's drain under its lock) deletes the log rows
in the same transaction, so the note can neither be missed nor commit without the change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from mover import faults, names
from mover.catalog import introspect, server
from mover.db import Database, bind, is_retryable, one
from mover.engines.bulk import rangework
from mover.engines.capture import changelog, integrity, logical
from mover.engines.context import Context, Reporter
from mover.engines.governor import throttle
from mover.errors import Failed
from mover.plan import Plan, ReconcileSettings, plan_from_canonical
from mover.sql import compare as q
from mover.sql import trusted
from mover.sql.capture import replay_keys as replay_keys_sql
from mover.sql.mapping import Mapping
from mover.state import control, ranges

log = logging.getLogger("mover.reconcile")

KIND = "reconcile"
RANGE_STATEMENT_TIMEOUT = "300s"
REPAIR_BATCH = 200
DRAIN_EVERY_SECONDS = 0.5


@dataclass
class PassResult:
    mode: str  # full | incremental | resume
    ranges: int = 0  # ranges verified by this run
    rows: int = 0  # source rows compared
    seconds: float = 0.0
    found: int = 0  # divergences recorded
    still_open: int = 0  # divergences found again
    resolved: int = 0  # divergences whose rows were equal when checked again
    rechecked: int = 0  # keys that differed while a change to them was pending: re-checked alone
    unsettled: int = 0  # keys still changing after every re-check round
    open: int = 0  # open divergences after the pass, every kind
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "lock"}
        d["seconds"] = round(self.seconds, 3)
        d["rows_per_second"] = round(self.rows / self.seconds) if self.seconds > 0 else None
        return d


# ---------------------------------------------------------------------------------------------
# How each column is compared


def spec_for(cur: psycopg.Cursor, m: Mapping, *, fingerprints: bool = True) -> q.Spec:
    """Decide per column (by the target's type): typed, typed but hashed through its send form,
    or by text when PostgreSQL cannot hash or compare the type. Probed on the server, so that
    composites and arrays follow their fields and elements, and extensions' types are covered.
    `fingerprints`: whether each range's source rows are hashed for its stored fingerprint."""
    if not server.of(cur).hash_record_extended:
        raise Failed("reconcile needs PostgreSQL 14 or later (hash_record_extended)",
                     hint="upgrade the server, or compare the tables with your own tooling")
    dst = introspect.describe(cur, m.dst)
    types = {c.name: c for c in dst.columns}
    src_types = {c.name: c for c in introspect.describe(cur, m.src).columns}
    # Compared in the target's type, or in the source's where the conversion can lose information.
    compared_as = {c.name: src_types[c.name] if c.back_to and c.name not in m.key else types[c.name]
                   for c in m.columns}
    oids = sorted({compared_as[c.name].type_oid for c in m.columns})
    cur.execute(
        """
        WITH RECURSIVE b AS (
            SELECT oid AS start, oid, typtype, typbasetype FROM pg_type WHERE oid = ANY(%s)
            UNION ALL
            SELECT b.start, t.oid, t.typtype, t.typbasetype FROM b JOIN pg_type t ON t.oid = b.typbasetype
            WHERE b.typtype = 'd')
        SELECT start, oid FROM b WHERE typtype <> 'd'
        """, (oids,))
    base: dict[int, int] = dict(cur.fetchall())
    usable: dict[str, bool] = {}
    for c in m.columns:
        t = compared_as[c.name].type
        if t in usable:
            continue
        cur.execute("SAVEPOINT mover_probe")
        try:
            cur.execute(q.hash_probe(t))
            # The equality operator, found by name as IS DISTINCT FROM will find it.
            cur.execute(psycopg.sql.SQL("SELECT CAST(NULL AS {0}) IS DISTINCT FROM CAST(NULL AS {0})").format(
                trusted(t, "format_type")))
            usable[t] = True
        except psycopg.errors.Error as exc:
            if isinstance(exc, psycopg.OperationalError) or is_retryable(exc):
                raise
            usable[t] = False
        finally:
            if not cur.connection.broken:
                cur.execute("ROLLBACK TO SAVEPOINT mover_probe")
                cur.execute("RELEASE SAVEPOINT mover_probe")
    cols = []
    for c in m.columns:
        col = compared_as[c.name]
        send = q.SEND_FUNCTIONS.get(base.get(col.type_oid, col.type_oid))
        mode = "send" if send else "value" if usable[col.type] else "text"
        back_to = c.back_to if c.name not in m.key else None
        cols.append(q.Compared(c.name, c.cast_to, mode, send, c.name in m.key, back_to))
    return q.Spec(mapping=m, columns=tuple(cols), dst_key_types=tuple(types[k].type for k in m.key),
                  fingerprints=fingerprints)


# ---------------------------------------------------------------------------------------------
# One range


def _rows(cur: psycopg.Cursor) -> list[dict[str, Any]]:
    names_ = [d.name for d in cur.description or ()]
    return [dict(zip(names_, r, strict=True)) for r in cur.fetchall()]


# The comparison's statements as the server receives them, composed once per spec (and open
# bound, for a range): composing and encoding them is linear in the columns, 190 ms a range for
# 1600 of them (measured, issue 34), and a range's statement differs from the next one's only in
# its parameters. Keyed by the spec (a changed shape builds another) and the encoding.
_STATEMENTS: dict[tuple[Any, ...], bytes] = {}
_STATEMENTS_KEPT = 32  # specs change only with the tables' shapes: keep few


def _statement(cur: psycopg.Cursor, key: tuple[Any, ...], build: Callable[[], psycopg.sql.Composable]) -> bytes:
    key = (*key, cur.connection.info.encoding)
    stmt = _STATEMENTS.get(key)
    if stmt is None:
        if len(_STATEMENTS) >= _STATEMENTS_KEPT:
            _STATEMENTS.clear()
        stmt = _STATEMENTS[key] = build().as_bytes(cur)
    return stmt


def _compare(cur: psycopg.Cursor, spec: q.Spec, mid: int,
             key_range: ranges.KeyRange) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lo, hi = key_range.lo, key_range.hi
    stmt = _statement(cur, ("range", spec, mid, lo is None, hi is None),
                      lambda: q.compare_range(spec, names.change_log(mid), names.applied_notes(mid), lo, hi)[0])
    cur.execute(stmt, q.range_params(spec, lo, hi))
    rows = _rows(cur)
    agg = {k: rows[0][k] for k in ("src_rows", "dst_rows", "src_sum", "mark")}
    return agg, [r for r in rows if r["key"] is not None]


def _recheck(cur: psycopg.Cursor, spec: q.Spec, mid: int, keys: list[list[str]], *,
             columns: bool = True) -> list[dict[str, Any]]:
    """The keys compared again, alone; without `columns` only whether each still differs and is
    pending (the settle rounds): on a wide table naming the differing columns is most of the
    statement."""
    if not keys:
        return []
    stmt = _statement(cur, ("keys", spec, mid, columns),
                      lambda: q.recheck_keys(spec, names.change_log(mid), columns=columns))
    cur.execute(stmt, (json.dumps(keys),))
    return _rows(cur)


def _record(cur: psycopg.Cursor, spec: q.Spec, mid: int, key_range: ranges.KeyRange, actor: str, agg: dict[str, Any],
            first_diffs: list[dict[str, Any]], settled: list[dict[str, Any]],
            unsettled: list[dict[str, Any]]) -> dict[str, int]:
    """What a verified range leaves behind, in the transaction of its done mark: divergences
    recorded, found again or resolved, the range's fingerprints, its notes forgotten."""
    stmt, params = q.divergences_in_range(spec, key_range.lo, key_range.hi)
    cur.execute(stmt, [mid, *params])
    # A key may hold several open divergences: apply_errors (one per failed copy or replay) and
    # the one reconcile keeps up to date.
    open_by_key: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    accepted: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for did, key, kind, columns, is_open, _how in cur.fetchall():
        if is_open:
            open_by_key.setdefault(tuple(key), []).append((did, kind, columns))
        else:
            accepted.setdefault(tuple(key), []).append((kind, columns))
    found = again = 0
    seen: set[tuple[Any, ...]] = set()
    for d in settled:
        key = tuple(d["key"])
        seen.add(key)
        if key in open_by_key:
            # An apply_error keeps its kind: its error says why the row differs.
            for did, kind, columns in open_by_key[key]:
                if kind != "apply_error" and (kind, columns) != (d["kind"], d["columns"]):
                    control.update_divergence(cur, mid, did, d["kind"], d["columns"])
            again += 1
        elif (d["kind"], d["columns"]) in accepted.get(key, []):
            continue  # the operator accepted exactly this difference
        else:
            control.record_divergence(cur, mid, list(key), d["kind"], d["columns"])
            found += 1
    seen |= {tuple(d["key"]) for d in unsettled}  # unknown yet: left as they are
    resolved = control.resolve_divergences_as(
        cur, mid, [e[0] for k, v in open_by_key.items() if k not in seen for e in v], "equal_on_recheck",
        f"rows equal when reconcile range {key_range.range_no} was verified again", actor)
    stmt, params = q.forget_notes(spec.mapping, names.applied_notes(mid), key_range.lo, key_range.hi)
    cur.execute(stmt, [*params, agg["mark"]])
    # Every row of a range that was equal when last verified differs now, nothing pending: a write
    # pattern only a bypassed capture produces (invariant 14): named as such, not as bare divergences.
    integrity.whole_range_differs(cur, mid, actor, key_range.kind, key_range.range_no, len(settled),
                                  max(agg["src_rows"], agg["dst_rows"]))
    src_fp, dst_fp = q.fingerprint(agg["src_sum"], first_diffs) if agg["src_sum"] is not None else (None, None)
    ranges.store_fingerprint(cur, mid, key_range, agg["src_rows"], src_fp, agg["dst_rows"], dst_fp, len(settled))
    return {"found": found, "still_open": again, "resolved": len(resolved), "unsettled": len(unsettled)}


def verify_range(db: Database, ctx: Context, spec: q.Spec, key_range: ranges.KeyRange, worker: str,
                 settings: ReconcileSettings) -> dict[str, int]:
    """Compare one claimed range; commit its findings with its done mark.

    The comparison's statement is built by mover/sql/compare.py and run here; the queue's part
    of the transaction (ranges.hold first: the lease check of race 6; ranges.done last) is
    mover/state/ranges.py's, called inside it, so findings, fingerprints and the done mark
    commit together, or not at all when the range was taken over.

    Committed without waiting for the WAL flush (synchronous_commit off): a crash loses the
    findings and the done mark together, and the range is compared again; any later durable
    commit (the pass's end, the cutover) flushes them first, so nothing acts on a lost one."""
    mid = ctx.mid
    started = time.monotonic()
    from_wal = logical.enabled(ctx) and not ctx.swapped

    def first(cur: psycopg.Cursor) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, int] | None]:
        ranges.hold(cur, mid, key_range, worker)
        # JIT pays off on none of these statements: below jit_above_cost at the default range size
        # it is not used; above (ranges of 500k+ rows) it compiled for 30-55 ms and the statement
        # ran no faster (bench/README.md, the reconcile profile).
        cur.execute("SET LOCAL jit = off")
        agg, diffs = _compare(cur, spec, mid, key_range)
        ctx.check_shape(cur)  # nothing is compared across a change of either table's shape
        if any(d["pending"] for d in diffs) or (diffs and from_wal):
            # Nothing written: settle the pending keys first. With logical capture a change can be
            # committed and not in the log yet (fed after it): no difference counts before the
            # re-check below, whose snapshot sees the log fed up to it (invariant 13).
            return agg, diffs, None
        settled, unsettled = diffs, []
        if any(d["kind"] == "different" and d["columns"] is None for d in diffs):
            # A wide table's range statement does not name the differing columns: asked of those
            # keys alone, here, as the settle rounds' last re-check does (its own snapshot; a key
            # changed since is pending there, or equal, and then no divergence).
            now = _recheck(cur, spec, mid, [d["key"] for d in diffs])
            settled, unsettled = [d for d in now if not d["pending"]], [d for d in now if d["pending"]]
        outcome = _record(cur, spec, mid, key_range, worker, agg, diffs, settled, unsettled)
        faults.point(f"reconcile_compared:{key_range.range_no}")  # inside the transaction: a crash loses the range
        ranges.done(cur, mid, key_range, worker, agg["src_rows"], (time.monotonic() - started) * 1000)
        return agg, diffs, outcome

    agg, diffs, outcome = db.transaction(first, statement_timeout=RANGE_STATEMENT_TIMEOUT,
                                         synchronous_commit=False, label="reconcile range")
    rechecked = 0
    if outcome is None:
        rechecked = sum(1 for d in diffs if d["pending"] or from_wal)
        # Some keys differ while a change to them waits in the log: let the applier catch up, then
        # look at those keys alone (not the range) until none is pending, a bounded number of rounds.
        keys = [d["key"] for d in diffs]
        for round_no in range(settings.settle_rounds):
            ctx.checkpoint()
            changelog.drain(ctx, reverse=False, backfill_done=True)
            now = db.transaction(bind(_recheck, spec, mid, keys, columns=False), label="reconcile re-check")
            keys = [d["key"] for d in now]
            if not any(d["pending"] for d in now):
                break
            # Another worker may hold the applier: give it a moment (no transaction is open here).
            ctx.stop.wait(min(0.02 * (round_no + 1), 0.5))

        def final(cur: psycopg.Cursor) -> dict[str, int]:
            ranges.hold(cur, mid, key_range, worker)
            now = _recheck(cur, spec, mid, keys)
            if flusher is not None and any(not d["pending"] for d in now):
                # In this transaction's snapshot (repeatable read, taken at its first statement): the
                # keys of every change committed before it are in the log it reads, fed here if the
                # feeder has not yet; a key that still differs is a divergence, never feeder lag.
                # Only a key that differs with nothing waiting for it in the log can be feeder lag:
                # a feed decodes the slot from its restart point, so it is read then, not for every range.
                logical.feed_in(cur, ctx, flusher)
                now = _recheck(cur, spec, mid, keys)
            ctx.check_shape(cur)
            settled = [d for d in now if not d["pending"]]
            unsettled = [d for d in now if d["pending"]]
            result = _record(cur, spec, mid, key_range, worker, agg, diffs, settled, unsettled)
            faults.point(f"reconcile_compared:{key_range.range_no}")
            ranges.done(cur, mid, key_range, worker, agg["src_rows"], (time.monotonic() - started) * 1000)
            return result

        faults.point("reconcile_settled")  # the keys re-checked; their range's last transaction next
        flusher = logical.Flusher(db) if from_wal else None
        with flusher or contextlib.nullcontext():
            outcome = db.transaction(final, statement_timeout=RANGE_STATEMENT_TIMEOUT, synchronous_commit=False,
                                     label="reconcile range", repeatable_read=flusher is not None)
    return {**outcome, "rows": agg["src_rows"], "rechecked": rechecked,
            "ms": round((time.monotonic() - started) * 1000, 1)}


# ---------------------------------------------------------------------------------------------
# Workers and passes


class Worker(rangework.RangeWorker):
    """One reconcile worker: claims ranges and verifies them until none is left."""

    kind = KIND
    role = "mover-reconcile"

    def __init__(self, dsn: str, migration: control.Migration, wid: str, spec: q.Spec, result: PassResult, *,
                 stop: threading.Event, lost: threading.Event, registry: set[str], report: Reporter,
                 n_workers: int = 1, governor: throttle.Governor | None = None):
        super().__init__(dsn, migration, wid, stop=stop, lost=lost, registry=registry, report=report,
                         n_workers=n_workers, governor=governor)
        self.spec, self.result = spec, result
        self._settings = self.ctx.plan.reconcile
        self._drained = time.monotonic()  # run() drained the log as the pass started

    def settings(self, m: control.Migration) -> rangework.Settings:
        # It reads both whole tables: held by the governor, the pause and its cap like the backfill.
        plan = plan_from_canonical(m.plan)
        s = self._settings = plan.reconcile
        return rangework.Settings(limits(plan), s.range_rows, s.max_attempts)

    def mapping(self, cur: psycopg.Cursor) -> Mapping:
        return self.spec.mapping  # checked against both tables' shape in each range's transaction

    def work(self, key_range: ranges.KeyRange) -> rangework.Done:
        faults.point(f"reconcile_claimed:{key_range.range_no}")  # claimed, not read yet
        got = verify_range(self.db, self.ctx, self.spec, key_range, self.wid, self._settings)
        return rangework.Done(got["rows"], got["ms"], got)

    def finished(self, key_range: ranges.KeyRange, done: rangework.Done) -> None:
        got = done.counts
        self.result.add(ranges=1, rows=done.rows, found=got["found"], still_open=got["still_open"],
                        resolved=got["resolved"], unsettled=got["unsettled"], rechecked=got["rechecked"])
        self.report("reconcile_range", range_no=key_range.range_no, rows=done.rows, ms=done.ms,
                    differences=got["found"] + got["still_open"], worker=self.wid)
        # Keep the log short between ranges, so few keys are pending when the next one is read;
        # at most every DRAIN_EVERY_SECONDS: on a quiet log a drain per range is a transaction
        # and a shape check per range for nothing (pending keys are settled by the range anyway).
        if time.monotonic() - self._drained >= DRAIN_EVERY_SECONDS:
            changelog.drain(self.ctx, reverse=False, backfill_done=True, max_rounds=1)
            self._drained = time.monotonic()

    def waiting(self, reason: str) -> None:
        self.report("reconcile_waiting", reason=reason, worker=self.wid)


def limits(plan: Plan) -> throttle.Limits:
    """A reconcile worker's own limits: its rows/s cap ([reconcile] max_rows_per_second, counted in
    source rows; each is read in both tables) and ranges of range_rows keys. The governor holds it
    to the rest, as every bulk engine (the one replica-lag limit of the plan among them: [backfill]
    max_replica_lag, the lag is the server's, whoever causes it)."""
    r = plan.reconcile
    return throttle.Limits(max_rows_per_second=r.max_rows_per_second, max_rows=r.range_rows)


def _start_pass(ctx: Context, spec: q.Spec, full: bool) -> str:
    mid = ctx.mid
    notes, log_table = names.applied_notes(mid), names.change_log(mid)

    def start(cur: psycopg.Cursor) -> str:
        if not introspect.exists(cur, notes):
            # Nothing noted the changes applied since an earlier pass (if any): compare everything.
            for stmt in q.create_notes(notes, names.notes_function(mid), names.notes_trigger(mid), log_table,
                                       spec.mapping.key, spec.mapping.src_key_types,
                                       spec.mapping.key_collations):
                cur.execute(stmt)
            ranges.reset(cur, mid, KIND)
            ranges.ensure_frontier(cur, mid, KIND)
            return "full"
        st = ranges.state(cur, mid, KIND)
        exists = st["total"] > 0 or st["exhausted"]
        if full or not exists or (st["finished"] and st["total"] == 0):
            # Every range is verified after this point, and each covers the changes applied
            # before it: the notes so far say nothing new. (DELETE, not TRUNCATE: appliers run.)
            ranges.reset(cur, mid, KIND)
            ranges.ensure_frontier(cur, mid, KIND)
            cur.execute(psycopg.sql.SQL("DELETE FROM {}").format(notes.ident))
            return "full"
        if not st["finished"]:
            ranges.retry_failed(cur, mid, KIND)
            ranges.release_dead_local_owners(cur, mid)
            return "resume"
        ranges.reopen(cur, mid, KIND, q.changed_since_verified(spec, notes), [mid])
        return "incremental"

    if ctx.db.transaction(lambda cur: introspect.exists(cur, notes)):
        return ctx.db.transaction(start, label="reconcile pass")
    # Creating the notes trigger locks the change log against the application's inserts for a
    # moment: the cutover's short lock_timeout, retried like the cutover's attempts.
    return ctx.db.transaction(start, lock_timeout=f"{ctx.plan.cutover.lock_timeout_ms}ms",
                              attempts=ctx.plan.cutover.attempts, label="reconcile pass")


def run(ctx: Context, *, full: bool = False) -> PassResult:
    """Run a reconcile pass: resume an unfinished one, else re-verify the ranges that changed
    since the last one (all of them with `full`, or when none was made)."""
    started = time.monotonic()
    settings = ctx.plan.reconcile
    changelog.drain(ctx, reverse=False, backfill_done=True)
    spec = ctx.db.transaction(lambda cur: spec_for(cur, ctx.mapping(cur), fingerprints=settings.fingerprints))
    # Invariant 14: after a capture gap, once capture is back in force, a pass over every range; it
    # covers the gaps restored before it started (read before its ranges are reset).
    pass_started, gap = ctx.db.transaction(lambda cur: (one(cur.execute("SELECT clock_timestamp()"))[0],
                                                        integrity.needs_full(cur, ctx.mid)))
    mode = _start_pass(ctx, spec, full or gap)
    result = PassResult(mode)

    def todo(cur: psycopg.Cursor) -> tuple[dict[str, Any], int | None]:
        st = ranges.state(cur, ctx.mid, KIND)
        estimate = introspect.estimate_rows(cur, spec.mapping.src) if mode == "full" else None
        return st, estimate
    st, estimate = ctx.db.transaction(todo)
    ctx.report("reconcile_start", mode=mode, ranges_open=st["open"], estimate=estimate, workers=settings.workers,
               table=str(ctx.migration.source))
    if st["open"] or not st["exhausted"]:
        # Under the migration's governor, led from here (a pass with nothing to compare measures nothing).
        with throttle.governing(ctx, KIND):
            workers = [Worker(ctx.db.dsn, ctx.migration, ranges.worker_id(i), spec, result, stop=ctx.stop,
                              lost=ctx.lease_lost, registry=ctx.workers, report=ctx.report,
                              n_workers=settings.workers, governor=throttle.of(ctx))
                       for i in range(settings.workers)]
            rangework.run_workers(workers, "reconcile")
    ctx.checkpoint()
    ranges.require_finished(ctx.db, ctx.mid, KIND, ctx.migration.name, "mover reconcile")
    result.seconds = time.monotonic() - started

    def finish(cur: psycopg.Cursor) -> None:
        result.open = control.open_divergences(cur, ctx.mid)
        summary = (f"reconcile pass ({mode}): {result.ranges} ranges, {result.rows} rows in {result.seconds:.1f}s;"
                   f" {result.found} new divergences, {result.resolved} resolved, {result.open} open")
        if result.unsettled:
            # Keys written on every round: capture keeps them in sync and the cutover drains them
            # under its lock; their ranges are verified again by the next pass (they are noted).
            summary += f"; {result.unsettled} keys kept changing and were left to the next pass"
        control.event(cur, ctx.mid, ctx.owner, KIND, "pass_done", summary, result.as_dict(),
                      result.seconds * 1000)
        if mode == "full":
            integrity.covered_by_pass(cur, ctx, pass_started,
                                      f"the full reconcile pass started {pass_started:%H:%M:%S}")
    ctx.db.transaction(finish)
    ctx.report("reconcile_done", table=str(ctx.migration.source), **{k: v for k, v in result.as_dict().items() if k in (
        "mode", "ranges", "rows", "seconds", "found", "resolved", "open", "unsettled")})
    return result


# ---------------------------------------------------------------------------------------------
# Repair and accept


def repair(ctx: Context, did: int | None = None) -> dict[str, Any]:
    """Re-sync every open divergence's row (or one) from the source's current state, through the
    applier's state replay and under its lock, then check those keys again in the same
    transaction: the equal ones (or those with a newer change pending, which capture will apply)
    are resolved as repaired; the others stay open."""
    spec = ctx.db.transaction(lambda cur: spec_for(cur, ctx.mapping(cur)))
    # The divergences' keys are text in the target's types: replay casts them to those, and
    # compares them with the source's key across types (int = bigint), so an extra row whose
    # key the source type could not even hold is still deleted.
    m = dataclasses.replace(spec.mapping, src_key_types=spec.dst_key_types)
    stmt = replay_keys_sql(m)
    rows = ctx.db.transaction(lambda cur: control.open_divergence_rows(cur, ctx.mid, did))
    out: dict[str, Any] = {"repaired": 0, "still_open": 0, "failed": 0, "errors": [], "hint": None}
    with logical.flusher(ctx) as flusher:
        _repair_batches(ctx, rows, spec, m, stmt, out, flusher)
    return out


def _repair_batches(ctx: Context, rows: list[dict[str, Any]], spec: q.Spec, m: Mapping, stmt: Any,
                    out: dict[str, Any], flusher: logical.Flusher | None) -> None:
    for i in range(0, len(rows), REPAIR_BATCH):
        ctx.checkpoint()
        batch = rows[i:i + REPAIR_BATCH]

        def tx(cur: psycopg.Cursor, batch: list[dict[str, Any]]) -> tuple[int, int, int, list[str]]:
            errors = changelog.replay_keys(cur, ctx, stmt, [list(r["key"]) for r in batch], mapping=m)
            if flusher is not None:
                # Logical capture: the changes committed since the replay read the source, fed into
                # the log this transaction reads, are pending there as the trigger's would be.
                logical.feed_in(cur, ctx, flusher)
            now = {tuple(d["key"]): d for d in _recheck(cur, spec, ctx.mid, [list(r["key"]) for r in batch])}
            done, kept, failed, messages = [], 0, 0, []
            for r in batch:
                key = tuple(r["key"])
                d = now.get(key)
                if key in errors:
                    failed += 1
                    e = changelog.data_error(errors[key])
                    detail = f" ({e['detail']})" if "detail" in e else ""
                    messages.append(f"key {list(key)}: {e['error']}{detail} [{e['sqlstate']}]")
                    if changelog.no_partition(errors[key]):
                        out["hint"] = (f"no partition of {m.dst} takes the value shown: create one that does "
                                       f"(CREATE TABLE ... PARTITION OF {m.dst} FOR VALUES ...), then run "
                                       f"`mover repair {ctx.migration.name}` again")
                elif d is None or d["pending"]:
                    done.append(r["id"])
                else:
                    if r["kind"] != "apply_error":
                        control.update_divergence(cur, ctx.mid, r["id"], d["kind"], d["columns"])
                    kept += 1
            control.resolve_divergences_as(cur, ctx.mid, done, "repaired",
                                           "re-synced from the source by `mover repair`", ctx.owner)
            control.event(cur, ctx.mid, ctx.owner, None, "repair",
                          f"repair: {len(done)} divergences repaired, {kept} still differ, {failed} failed",
                          {"repaired": done, "errors": messages})
            return len(done), kept, failed, messages

        done, kept, failed, messages = ctx.db.transaction(bind(tx, batch), statement_timeout="300s", label="repair")
        out["repaired"] += done
        out["still_open"] += kept
        out["failed"] += failed
        out["errors"] += messages


def accept(cur: psycopg.Cursor, mid: int, reason: str, actor: str, did: int | None = None) -> list[int]:
    rows = control.open_divergence_rows(cur, mid, did)
    ids = control.resolve_divergences_as(cur, mid, [r["id"] for r in rows], "accepted",
                                         f"accepted by the operator: {reason}", actor, reason)
    if ids:
        control.event(cur, mid, actor, None, "divergences_accepted",
                      f"{len(ids)} divergences accepted: {reason}", {"ids": ids, "reason": reason})
    return ids


__all__ = ["run", "repair", "accept", "spec_for", "verify_range", "PassResult", "KIND"]
