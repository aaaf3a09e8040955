"""A thread that keeps leases alive on its own connection.

The orchestrator's lease (a migration row) and the leases of the ranges this process's
workers hold are extended every LEASE/6 seconds. A lease lasts several beats, so one lost
connection is not yet a lost lease; a beat that finds the lease gone sets `lost` and the
workers stop at their next safe point without writing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from mover import threads
from mover.db import connect
from mover.state import control

log = logging.getLogger("mover.heartbeat")


class Heartbeat:
    """Beats every `interval` seconds on a connection of its own until stop(). A beat that says
    the lease is gone sets `lost` (and `also_set`). A database error is retried at the next beat;
    any other error (a bug in a beat) is not a lease kept: it sets `lost` and `also_set` too, so
    that the workers stop without writing, and stop() raises it (mover/threads.py)."""

    def __init__(self, dsn: str, beat: Callable[[psycopg.Cursor], bool], lost: threading.Event,
                 *also_set: threading.Event, interval: float = control.LEASE_SECONDS / 6, name: str = "heartbeat"):
        self.name = f"mover-{name}"
        self.dsn, self.beat, self.lost, self.also_set, self.interval = dsn, beat, lost, also_set, interval
        self._halt = threading.Event()
        self._thread = threads.Group(on_error=lambda exc: self._stop_all())

    def start(self) -> None:
        self._thread.start(self._run, self.name)

    def _stop_all(self) -> None:
        self.lost.set()
        for event in self.also_set:
            event.set()

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        try:
            while not self._halt.wait(self.interval):
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = connect(self.dsn, role="mover-heartbeat")
                    with conn.transaction(), conn.cursor() as cur:
                        cur.execute("SET LOCAL lock_timeout = '5s'; SET LOCAL statement_timeout = '10s'")
                        alive = self.beat(cur)
                    if not alive:
                        log.error("%s: lease lost; stopping", self.name)
                        self._stop_all()
                        break
                except psycopg.Error as exc:
                    log.warning("%s failed (%s); retrying", self.name, type(exc).__name__)
        finally:
            if conn is not None:
                conn.close()

    def stop(self) -> None:
        """Stop beating; raise what a beat raised (other than a database error), if one did."""
        self._halt.set()
        self._thread.join(timeout=15)
