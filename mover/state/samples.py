"""Periodic samples of a running migration, for what `mover watch` and `mover report` chart:
rows copied and compared, capture backlog and lag in both directions, workers, and what they
wait for (pause, rows/s cap, replica lag).

A sample is a `sample` row in mover.events (its numbers in detail), written by the orchestrator's
heartbeat (mover/runner/__init__.py) on the heartbeat's own connection, in a savepoint: a sample that
fails costs a warning, never the lease. Cheap and bounded: one sample per beat at most (every
5 s), and the interval grows with the run (a thousandth of its age), so that a week-long run
keeps some thousands of samples rather than a hundred thousand. Lock waits and hold times need
no sample: the cutover, swap-back and lock-timeout outcomes are events of their own.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

import psycopg

from mover.state import control
from mover.views import status

log = logging.getLogger("mover.samples")

KIND = "sample"
MIN_SECONDS = 5.0
AGE_FRACTION = 1 / 1000


class Sampler:
    """Decides when the next sample is due; records it in the caller's transaction."""

    def __init__(self, mid: int, owner: str, *, min_seconds: float = MIN_SECONDS) -> None:
        self.mid, self.owner, self.min_seconds = mid, owner, min_seconds
        self.started = time.monotonic()
        self.last: float | None = None

    def due(self) -> bool:
        now = time.monotonic()
        interval = max(self.min_seconds, (now - self.started) * AGE_FRACTION)
        return self.last is None or now - self.last >= interval

    def __call__(self, cur: psycopg.Cursor, *, force: bool = False) -> None:
        """force: a sample now whatever the interval (when a run starts and ends, so that even a
        short run leaves two points to draw between)."""
        if not (force or self.due()):
            return
        self.last = time.monotonic()
        try:
            with cur.connection.transaction():  # a savepoint: the beat around it commits whatever happens here
                record(cur, self.mid, self.owner)
        except Exception as exc:  # said in the log: whatever broke a sample must not stop the beat
            log.warning("could not record a progress sample of migration %s (%s: %s); the next beat tries again",
                        self.mid, type(exc).__name__, exc)


def record(cur: psycopg.Cursor, mid: int, owner: str) -> dict[str, Any]:
    m = control.get_by_id(cur, mid)
    detail = status.sample_of(cur, m)
    control.event(cur, mid, owner, m.step, KIND, "progress sample", detail)
    return detail


def read(cur: psycopg.Cursor, mid: int, since: datetime | None = None) -> list[dict[str, Any]]:
    """Samples oldest first, each {"at": datetime, **detail}; since: only those after it."""
    cur.execute("SELECT at, detail FROM mover.events WHERE migration_id = %s AND kind = %s"
                " AND (%s::timestamptz IS NULL OR at > %s) ORDER BY id", (mid, KIND, since, since))
    return [{"at": at, **(detail or {})} for at, detail in cur.fetchall()]


def rates(samples: list[dict[str, Any]], field: str) -> list[tuple[datetime, float]]:
    """Rows/s between consecutive samples of a counter. A counter that went down (a new reconcile
    pass starts its ranges again) gives no rate for that interval rather than a negative one."""
    out = []
    for a, b in zip(samples, samples[1:], strict=False):
        dt = (b["at"] - a["at"]).total_seconds()
        if dt <= 0 or a.get(field) is None or b.get(field) is None:
            continue
        rows = b[field] - a[field]
        if rows >= 0:
            out.append((b["at"], rows / dt))
    return out
