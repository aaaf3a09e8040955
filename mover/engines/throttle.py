"""The throttler both range engines (backfill and reconcile) wait on between ranges, never
inside one: the operator's pause flag (`mover pause`), replica lag, and a rows/s cap.

A range is read or written in one burst, so a cap is kept by two means: a range is no bigger
than the cap allows in `burst_ms` (at most a second), and after it the worker waits out the
rest of the time its rows are worth. The cap is shared evenly by the process's workers.

The range engines ask it from one place, their shared loop (mover/engines/rangework.py): gate()
before each range (wait, and why, or go with how many keys), pace() after it (what the rows were
worth). Those two calls are where an application-impact governor (issue 25) takes the throttle's
place. (The backfill's applier session asks reason() too, to wait on pause and lag as the
workers do.)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg

log = logging.getLogger("mover.throttle")

REPLICA_CHECK_SECONDS = 5.0
RECHECK_SECONDS = 1.0  # how long a worker waits on a reason before asking again


@dataclass
class Limits:
    """What a throttle holds a worker to; re-read between ranges (`mover set` takes effect there)."""

    max_rows_per_second: int = 0  # 0: no cap
    max_replica_lag_ms: int = 0  # 0: do not check
    max_rows: int = 10**9  # the largest range the engine wants
    burst_ms: int = 1000  # how long one range is meant to take: its share of the cap is sized on it


@dataclass(frozen=True)
class Gate:
    """The answer before a range: wait `seconds` and ask again (`wait` says why), or go with a
    range of `rows` keys."""

    wait: str | None = None
    seconds: float = 0.0
    rows: int = 0


@dataclass
class Throttle:
    """Reasons to wait before the next range, and the size and pacing of ranges under a cap."""

    limits: Limits
    workers: int = 1
    _lag_checked: float = 0.0
    _lag: float | None = None
    _lag_visible: bool = True

    def reason(self, cur: psycopg.Cursor, paused: bool) -> str | None:
        """Why the next range must wait (the caller reads the pause flag in the same transaction
        as this, from the migration's row), or None."""
        if paused:
            return "paused (mover unpause)"
        limit = self.limits.max_replica_lag_ms
        if limit and self._lag_visible and time.monotonic() - self._lag_checked > REPLICA_CHECK_SECONDS:
            self._lag_checked = time.monotonic()
            # Without pg_read_all_stats the lag columns read as NULL rather than failing: say so once.
            cur.execute("SELECT pg_has_role('pg_read_all_stats', 'MEMBER') OR"
                        " (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)")
            row = cur.fetchone()
            if not (row and row[0]):
                self._lag_visible = False
                log.warning("this role cannot read the standbys' replay lag, so [backfill] max_replica_lag "
                            "(%gs) is not enforced", limit / 1000,
                            extra={"next": "GRANT pg_read_all_stats TO the role mover runs as, or set "
                                           "[backfill] max_replica_lag = \"0s\" in the plan (no standby to "
                                           "watch); the next range reads it again"})
            else:
                cur.execute("SELECT max(extract(epoch FROM replay_lag)) FROM pg_stat_replication")
                row = cur.fetchone()
                self._lag = None if row is None or row[0] is None else float(row[0])
        if limit and self._lag is not None and self._lag * 1000 > limit:
            return f"replica lag {self._lag:.1f}s above {limit / 1000:g}s"
        return None

    def gate(self, cur: psycopg.Cursor, paused: bool, hint: int) -> Gate:
        """Before each range: wait (pause, replica lag), or go with a range of about `hint` keys
        within what the limits allow. In the caller's transaction, which read `paused`."""
        reason = self.reason(cur, paused)
        if reason:
            return Gate(wait=reason, seconds=RECHECK_SECONDS)
        return Gate(rows=self.range_rows(hint))

    def range_rows(self, hint: int) -> int:
        """Keys to ask for in the next range: the engine's hint, within max_rows (so `mover set`
        reaches the very next range), and within the rows/s cap's budget. A range bigger than the
        cap allows in burst_ms (at most a second) would break the cap within the second it runs,
        however long we wait after it: the cap wins over any minimum size."""
        lim = self.limits
        rows = min(hint, lim.max_rows)
        if lim.max_rows_per_second:
            per_worker = lim.max_rows_per_second / max(self.workers, 1)
            rows = min(rows, max(1, int(per_worker * min(lim.burst_ms, 1000) / 1000)))
        return max(rows, 1)

    def pace(self, rows: int, elapsed: float) -> float:
        """Seconds to wait after handling `rows` in `elapsed` seconds to respect the rows/s cap,
        shared evenly among the workers."""
        cap = self.limits.max_rows_per_second
        if not cap:
            return 0.0
        return max(0.0, rows / (cap / max(self.workers, 1)) - elapsed)

    def cap_reason(self) -> str:
        return f"rows/s cap {self.limits.max_rows_per_second}"
