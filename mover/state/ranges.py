"""A queue of key ranges that several workers share: backfill ranges, and reconcile ranges.

The owner of mover.ranges, mover.frontiers and mover.workers: every write to them is a function
here (claims and leases, bounds, done marks, failed attempts, worker rows, a reconcile range's
fingerprints); the engines call these, inside their own transactions where a write must commit
with their work. The loop the workers run is mover/engines/bulk/rangework.py.

Invariants:
- Ranges are cut on demand, in key order, from a frontier row that a claimant locks for the
  few milliseconds it takes to find the next bound; so the planner never holds the key list,
  ranges adapt their size to what the claimant asks for, and keys inserted above the original
  maximum fall into the last, open-ended range.
- A bound is the key `rows` keys on (an index-only OFFSET scan, which visits the heap under
  writes), or, for a one-column integer key in a dense region, lo + rows / density, the density
  (rows per value) that of the last done range (Spirit's optimistic chunker). Arithmetic only
  where that density is at least 1/DENSE: keys are unique, so a span of at most rows * DENSE
  values holds at most DENSE times the rows asked, however dense the keys it runs into. No key
  above the candidate, or a candidate past the type's maximum, makes it the open last range.
  Either way the bound is stored before any work, so ranges still tile the key space (each lo
  the previous hi) and resume, leases and the watermark are unchanged.
- A claim is `FOR UPDATE SKIP LOCKED` on the range rows: workers never wait for each other.
  A claimed range has an owner and a lease that the owner's process extends while it lives.
- The work on a range and its done mark commit in one transaction that first locks the range
  row and checks the owner (race 6): a worker whose lease expired and whose range was taken
  over cannot commit; while it holds the row lock, nobody can take the range over.
- A range that fails `max_attempts` times (errors, or leases that expired) is marked failed and
  left for the operator; the others go on.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from mover.db import Database, is_connection_lost, mask, one
from mover.errors import Failed, LeaseLost
from mover.sql import copy as copy_sql
from mover.sql.mapping import Mapping
from mover.state import control


def worker_id(n: int = 0) -> str:
    """A range worker's id: the process's owner id (host:pid:random, which
    release_dead_local_owners reads back) and the worker's number in it."""
    return f"{control.new_owner_id()}:{n}"


@dataclass(frozen=True)
class KeyRange:
    kind: str
    range_no: int
    lo: list[str] | None
    hi: list[str] | None  # None: open-ended, the last range
    # How claim() found hi: "probe" (OFFSET scan) or "arithmetic"; None for a range taken over.
    cut: str | None = field(default=None, compare=False)


# The key types whose bounds claim() may cut by arithmetic (format_type's names), and their maximum.
INTEGER_MAX = {"smallint": 2**15 - 1, "integer": 2**31 - 1, "bigint": 2**63 - 1}
DENSE = 4  # arithmetic where at least one key in DENSE values exists: at most DENSE times the rows asked
IRREGULAR = 2  # ... and the last done range held at most IRREGULAR times the rows asked now


def integer_key(m: Mapping) -> int | None:
    """The maximum of a one-column smallint / integer / bigint key, else None: only such a key's
    bounds are cut by arithmetic."""
    return INTEGER_MAX.get(m.src_key_types[0]) if len(m.key) == 1 else None


def arithmetic_bound(lo: int, rows: int, last_lo: int, last_hi: int, last_rows: int) -> int | None:
    """lo plus the span that held `rows` keys in the last done range (lo, hi], or None where the
    probe must cut: keys sparser than 1/DENSE there (a gap, a sparse region), or that range held
    far more than asked (it ran into a denser region: its density says little about the next)."""
    width = last_hi - last_lo
    if width <= 0 or last_rows <= 0 or last_rows * DENSE < width or last_rows > IRREGULAR * rows:
        return None
    return lo + max(1, rows * width // last_rows)


def ensure_frontier(cur: psycopg.Cursor, mid: int, kind: str) -> None:
    cur.execute("INSERT INTO mover.frontiers (migration_id, kind) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (mid, kind))


def reset(cur: psycopg.Cursor, mid: int, kind: str) -> None:
    cur.execute("DELETE FROM mover.ranges WHERE migration_id = %s AND kind = %s", (mid, kind))
    cur.execute("DELETE FROM mover.frontiers WHERE migration_id = %s AND kind = %s", (mid, kind))


def retry_failed(cur: psycopg.Cursor, mid: int, kind: str) -> int:
    """A new run gives failed ranges a fresh set of attempts."""
    cur.execute("UPDATE mover.ranges SET status = 'pending', attempts = 0, owner = NULL"
                " WHERE migration_id = %s AND kind = %s AND status = 'failed'", (mid, kind))
    return cur.rowcount


def release_dead_local_owners(cur: psycopg.Cursor, mid: int) -> int:
    """Ranges held by workers that died on this host need not wait for their leases to expire:
    a worker id starts with host:pid."""
    host = socket.gethostname()
    cur.execute("SELECT DISTINCT owner FROM mover.ranges WHERE migration_id = %s AND status = 'running'", (mid,))
    dead = []
    for (owner,) in cur.fetchall():
        parts = (owner or "").split(":")
        if len(parts) >= 2 and parts[0] == host and parts[1].isdigit() and not control.process_alive(int(parts[1])):
            dead.append(owner)
    if dead:
        cur.execute("UPDATE mover.ranges SET lease_expires_at = clock_timestamp() WHERE migration_id = %s"
                    " AND status = 'running' AND owner = ANY(%s)", (mid, dead))
    return len(dead)


def claim(cur: psycopg.Cursor, mid: int, kind: str, worker: str, m: Mapping, rows: int,
          max_attempts: int) -> KeyRange | None:
    """Take over an abandoned range, or cut a new one of about `rows` keys; None when no range
    is left to hand out (others may still be working). The size asked is noted on the worker's
    row: status shows the range size the workers ask for."""
    cur.execute("UPDATE mover.workers SET range_rows = %s WHERE migration_id = %s AND worker_id = %s",
                (rows, mid, worker))
    while True:
        cur.execute(
            """
            WITH c AS (
                SELECT range_no FROM mover.ranges
                WHERE migration_id = %(mid)s AND kind = %(kind)s
                  -- A range this worker holds already comes first: a claim that committed but
                  -- whose acknowledgement was lost (server restart) is retried, and must not
                  -- leave that range owned, leased and forgotten by a live worker.
                  AND (status = 'pending' OR (status = 'running'
                       AND (lease_expires_at < clock_timestamp() OR owner = %(worker)s)))
                ORDER BY owner IS DISTINCT FROM %(worker)s, range_no LIMIT 1 FOR UPDATE SKIP LOCKED)
            UPDATE mover.ranges k
            SET status = CASE WHEN k.attempts >= %(max)s THEN 'failed' ELSE 'running' END,
                error = CASE WHEN k.attempts >= %(max)s THEN coalesce(k.error, 'lease expired ' || k.attempts
                             || ' times') ELSE k.error END,
                owner = %(worker)s, attempts = k.attempts + 1,
                lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s)
            FROM c WHERE k.migration_id = %(mid)s AND k.kind = %(kind)s AND k.range_no = c.range_no
            RETURNING k.range_no, k.lo, k.hi, k.status
            """,
            {"mid": mid, "kind": kind, "max": max_attempts, "worker": worker, "lease": control.LEASE_SECONDS},
        )
        row = cur.fetchone()
        if row is None:
            break
        if row[3] == "running":
            return KeyRange(kind, row[0], row[1], row[2])
        # it just ran out of attempts: marked failed; look for another
    cur.execute("SELECT next_lo, next_range_no, exhausted FROM mover.frontiers"
                " WHERE migration_id = %s AND kind = %s FOR UPDATE", (mid, kind))
    frontier = cur.fetchone()
    if frontier is None or frontier[2]:
        return None
    lo, range_no, _ = frontier
    hi, cut = _bound(cur, mid, kind, m, lo, max(rows, 1))
    cur.execute(
        "INSERT INTO mover.ranges (migration_id, kind, range_no, lo, hi, status, owner, attempts, lease_expires_at)"
        " VALUES (%s, %s, %s, %s, %s, 'running', %s, 1, clock_timestamp() + make_interval(secs => %s))",
        (mid, kind, range_no, lo, hi, worker, control.LEASE_SECONDS),
    )
    cur.execute("UPDATE mover.frontiers SET next_lo = %s, next_range_no = %s, exhausted = %s"
                " WHERE migration_id = %s AND kind = %s", (hi, range_no + 1, hi is None, mid, kind))
    return KeyRange(kind, range_no, lo, hi, cut)


def bound_statements(m: Mapping) -> list[Any]:
    """What _bound can run on the source, for plan check: the OFFSET scan and, for an integer
    key, the probe that ends a range cut by arithmetic."""
    out: list[Any] = [copy_sql.next_bound(m, None)[0]]
    if integer_key(m) is not None:
        out += [f"-- in a dense region of the integer key (the last done range held at least one key in {DENSE}"
                " values), the upper bound is lo + rows / that density instead, the last range when no key lies"
                " above it:", copy_sql.key_above(m, ["<lo + rows / density>"])[0]]
    return out


def _bound(cur: psycopg.Cursor, mid: int, kind: str, m: Mapping, lo: list[str] | None,
           rows: int) -> tuple[list[str] | None, str]:
    """The next range's upper bound (None: open-ended) and how it was found. Runs under the
    frontier's lock, so the last done range read here is the one the frontier has passed."""
    top = integer_key(m)
    if top is not None and lo is not None:
        # Both bounds: the first range's lo and the last one's hi are open, their span unknown.
        cur.execute("SELECT lo[1], hi[1], rows FROM mover.ranges WHERE migration_id = %s AND kind = %s"
                    " AND status = 'done' AND lo IS NOT NULL AND hi IS NOT NULL ORDER BY range_no DESC LIMIT 1",
                    (mid, kind))
        last = cur.fetchone()
        candidate = None if last is None or last[2] is None else arithmetic_bound(
            int(lo[0]), rows, int(last[0]), int(last[1]), last[2])
        if candidate is not None:
            if candidate >= top:  # nothing above the type's maximum: never sent to the server
                return None, "arithmetic"
            stmt, params = copy_sql.key_above(m, [str(candidate)])
            cur.execute(stmt, params)
            return ([str(candidate)] if cur.fetchone() else None), "arithmetic"
    stmt, params = copy_sql.next_bound(m, lo)
    cur.execute(stmt, [*params, rows - 1])
    found = cur.fetchone()
    return (list(found) if found else None), "probe"


def hold(cur: psycopg.Cursor, mid: int, key_range: KeyRange, worker: str) -> None:
    """First statement of the work transaction: lock our range row, or fail if it changed hands."""
    cur.execute("SELECT 1 FROM mover.ranges WHERE migration_id = %s AND kind = %s AND range_no = %s"
                " AND owner = %s AND status = 'running' FOR UPDATE", (mid, key_range.kind, key_range.range_no, worker))
    if cur.fetchone() is None:
        raise LeaseLost(f"{key_range.kind} range {key_range.range_no} was taken over by another worker; not "
                        f"committing", hint="nothing to do: that worker copies it")


def mark_done(cur: psycopg.Cursor, mid: int, key_range: KeyRange, rows: int, ms: float) -> None:
    cur.execute("UPDATE mover.ranges SET status = 'done', rows = %s, duration_ms = %s, finished_at = clock_timestamp(),"
                " lease_expires_at = NULL, error = NULL WHERE migration_id = %s AND kind = %s AND range_no = %s",
                (rows, ms, mid, key_range.kind, key_range.range_no))


def done(cur: psycopg.Cursor, mid: int, key_range: KeyRange, worker: str, rows: int, ms: float) -> None:
    """The range's done mark, and its rows counted on the worker's row (what `mover status` shows),
    in the transaction of the range's work, after hold() (race 6), rather than one more after it."""
    mark_done(cur, mid, key_range, rows, ms)
    cur.execute("UPDATE mover.workers SET rows_done = rows_done + %s WHERE migration_id = %s AND worker_id = %s",
                (rows, mid, worker))


def mark_failed_attempt(cur: psycopg.Cursor, mid: int, key_range: KeyRange, worker: str, error: str,
                        max_attempts: int) -> str:
    """After an error: back to pending for another try, or failed once out of attempts."""
    cur.execute(
        "UPDATE mover.ranges SET status = CASE WHEN attempts >= %s THEN 'failed' ELSE 'pending' END,"
        " owner = NULL, lease_expires_at = NULL, error = %s"
        " WHERE migration_id = %s AND kind = %s AND range_no = %s AND owner = %s RETURNING status",
        (max_attempts, error[:2000], mid, key_range.kind, key_range.range_no, worker),
    )
    row = cur.fetchone()
    return row[0] if row else "lost"


def work(db: Database, mid: int, key_range: KeyRange, worker: str, fn: Callable[[psycopg.Cursor], int], *,
         synchronous_commit: bool, statement_timeout: str = "300s") -> tuple[int, float]:
    """Run fn(cur) -> rows for the range and mark it done, all in one transaction."""

    def tx(cur: psycopg.Cursor) -> tuple[int, float]:
        hold(cur, mid, key_range, worker)
        started = time.monotonic()
        rows = fn(cur)
        ms = (time.monotonic() - started) * 1000
        done(cur, mid, key_range, worker, rows, ms)
        return rows, ms

    return db.transaction(tx, synchronous_commit=synchronous_commit, statement_timeout=statement_timeout,
                          label=f"{key_range.kind} key_range")


def store_fingerprint(cur: psycopg.Cursor, mid: int, key_range: KeyRange, src_rows: int, src_fingerprint: int | None,
                      dst_rows: int, dst_fingerprint: int | None, differences: int) -> None:
    """What a verified reconcile range held on both sides (mover/engines/bulk/reconcile.py), in the
    transaction of its done mark; fingerprints NULL when the pass computed none."""
    cur.execute("UPDATE mover.ranges SET src_rows = %s, src_fingerprint = %s, dst_rows = %s, dst_fingerprint = %s,"
                " differences = %s, verified_at = clock_timestamp()"
                " WHERE migration_id = %s AND kind = %s AND range_no = %s",
                (src_rows, src_fingerprint, dst_rows, dst_fingerprint, differences, mid, key_range.kind,
                 key_range.range_no))


def last_verified(cur: psycopg.Cursor, mid: int, kind: str, range_no: int) -> tuple[int, Any] | None:
    """A reconcile range's differences and time at its last verification (before this one stores
    its own); None when it was never verified."""
    cur.execute("SELECT differences, verified_at FROM mover.ranges WHERE migration_id = %s AND kind = %s"
                " AND range_no = %s AND verified_at IS NOT NULL", (mid, kind, range_no))
    row = cur.fetchone()
    return (int(row[0] or 0), row[1]) if row else None


def reopen(cur: psycopg.Cursor, mid: int, kind: str, where: sql.Composable, params: Sequence[Any]) -> list[int]:
    """Done ranges `c` for which `where` holds (with `params`) back to pending, with a fresh set of
    attempts; their numbers. The condition is the engine's (reconcile: a change applied in the
    range since it was verified, built by mover/sql/compare.py); the write to the queue is this
    module's."""
    cur.execute(sql.SQL("UPDATE mover.ranges c SET status = 'pending', attempts = 0, owner = NULL,"
                        " lease_expires_at = NULL, error = NULL"
                        " WHERE c.migration_id = %s AND c.kind = %s AND c.status = 'done' AND ({})"
                        " RETURNING c.range_no").format(where), [mid, kind, *params])
    return [r[0] for r in cur.fetchall()]


def state(cur: psycopg.Cursor, mid: int, kind: str) -> dict[str, Any]:
    cur.execute(
        """
        SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status IN ('pending', 'running')),
               count(*) FILTER (WHERE status = 'failed'), count(*),
               coalesce(sum(rows) FILTER (WHERE status = 'done'), 0),
               (SELECT exhausted FROM mover.frontiers f WHERE f.migration_id = %s AND f.kind = %s)
        FROM mover.ranges WHERE migration_id = %s AND kind = %s
        """,
        (mid, kind, mid, kind),
    )
    done, open_, failed, total, rows, exhausted = one(cur)
    return {"done": done, "open": open_, "failed": failed, "total": total, "rows": int(rows),
            "exhausted": bool(exhausted), "finished": bool(exhausted) and open_ == 0 and failed == 0,
            "started": exhausted is not None}  # a pass (or the backfill) has begun: its frontier exists


def failed_ranges(cur: psycopg.Cursor, mid: int, kind: str) -> list[tuple[int, str | None]]:
    cur.execute("SELECT range_no, error FROM mover.ranges WHERE migration_id = %s AND kind = %s AND status = 'failed'"
                " ORDER BY range_no", (mid, kind))
    return cur.fetchall()


def watermark(cur: psycopg.Cursor, mid: int, kind: str) -> tuple[bool, list[str] | None]:
    """(everything covered, upper bound of the done prefix). Ranges finish out of order with
    several workers; only keys below every unfinished range count as copied."""
    cur.execute(
        """
        SELECT f.exhausted,
               (SELECT min(range_no) FROM mover.ranges c WHERE c.migration_id = f.migration_id AND c.kind = f.kind
                  AND c.status <> 'done'),
               f.next_range_no
        FROM mover.frontiers f WHERE f.migration_id = %s AND f.kind = %s
        """,
        (mid, kind),
    )
    row = cur.fetchone()
    if row is None:
        return False, None
    exhausted, first_open, next_no = row
    if first_open is None and exhausted:
        return True, None
    last_done = (first_open or next_no) - 1
    if last_done < 1:
        return False, None
    cur.execute("SELECT hi FROM mover.ranges WHERE migration_id = %s AND kind = %s AND range_no = %s",
                (mid, kind, last_done))
    hi = one(cur)[0]
    return (hi is None), hi


def keep_leases(cur: psycopg.Cursor, mid: int, workers: list[str]) -> None:
    """Extend the leases of this process's ranges (skipping rows a work transaction holds:
    those cannot be taken over anyway) and its workers' heartbeats."""
    cur.execute(
        """
        UPDATE mover.ranges SET lease_expires_at = clock_timestamp() + make_interval(secs => %s)
        WHERE (migration_id, kind, range_no) IN (
            SELECT migration_id, kind, range_no FROM mover.ranges
            WHERE migration_id = %s AND owner = ANY(%s) AND status = 'running' FOR UPDATE SKIP LOCKED)
        """,
        (control.LEASE_SECONDS, mid, workers),
    )
    cur.execute("UPDATE mover.workers SET heartbeat_at = clock_timestamp() WHERE migration_id = %s"
                " AND worker_id = ANY(%s)", (mid, workers))


def register_worker(cur: psycopg.Cursor, mid: int, worker: str) -> None:
    """A row in mover.workers: status counts the live ones and shows what they wait for."""
    cur.execute("INSERT INTO mover.workers (migration_id, worker_id, host, pid) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING", (mid, worker, socket.gethostname(), os.getpid()))


def worker_waits(cur: psycopg.Cursor, mid: int, worker: str, reason: str | None) -> None:
    """What the worker waits for between ranges (None: nothing), on its row."""
    cur.execute("UPDATE mover.workers SET waiting_for = %s WHERE migration_id = %s AND worker_id = %s",
                (reason, mid, worker))


def unregister_worker(cur: psycopg.Cursor, mid: int, worker: str) -> None:
    cur.execute("DELETE FROM mover.workers WHERE migration_id = %s AND worker_id = %s", (mid, worker))


def require_finished(db: Database, mid: int, kind: str, migration: str, command: str) -> None:
    """After the workers stopped: every range done, or say which failed and what resumes."""
    st = db.transaction(lambda cur: state(cur, mid, kind))
    what = "backfill" if kind == "backfill" else "reconcile"
    if st["failed"]:
        failed = db.transaction(lambda cur: failed_ranges(cur, mid, kind))
        first_no, first_error = failed[0]
        raise Failed(f"{len(failed)} {what} ranges failed; range {first_no}: {first_error}",
                     hint=f"fix the cause, then `{command} {migration}` retries them")
    if not st["finished"]:
        raise Failed(f"{what} of {migration!r} stopped before every range was done",
                     hint=f"`{command} {migration}` continues")


def record_failure(db: Database, mid: int, key_range: KeyRange, worker: str, exc: BaseException,
                   max_attempts: int) -> str:
    """A range's work failed on data or SQL: count the attempt (back to pending, or failed
    once out of attempts) and record an event; the worker goes on with other ranges."""
    message = mask(f"{type(exc).__name__}: {exc}")  # stored: never a password, whatever raised it
    outcome = db.transaction(lambda cur: mark_failed_attempt(cur, mid, key_range, worker, message, max_attempts))
    text = f"{key_range.kind} range {key_range.range_no} failed ({outcome}): {message}"
    db.transaction(lambda cur: control.event(cur, mid, worker, key_range.kind, "range_failed", text))
    return outcome


def is_connection_failure(exc: BaseException) -> bool:
    """Retries of the transaction are spent and the server is still unreachable: stop the worker.
    (A deadlock, a serialization failure or a lock timeout are OperationalErrors too, but the
    server is there: the range counts an attempt instead.)"""
    return is_connection_lost(exc)
