"""The orchestrator's progress samples (read back by mover/state/samples.py for `mover watch` and
`mover report`): what the status read model counts (mover/views/status.py sample_of), recorded
as a `sample` event.

Written by the orchestrator's heartbeat (mover/runner/lifecycle.py leased) on the heartbeat's own
connection, in a savepoint: a sample that fails costs a warning, never the lease. Cheap and
bounded: one sample per beat at most (every 5 s), and the interval grows with the run (a
thousandth of its age), so that a week-long run keeps some thousands of samples rather than a
hundred thousand. Lock waits and hold times need no sample: the cutover, swap-back and
lock-timeout outcomes are events of their own.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from mover.state import control
from mover.state.samples import KIND
from mover.views import status

log = logging.getLogger("mover.samples")

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
    # Debug: one every few seconds, for charts; not a line of the story (`mover events` leaves them out).
    control.event(cur, mid, owner, m.step, KIND, "progress sample", detail, level=logging.DEBUG)
    return detail
