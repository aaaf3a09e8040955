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

from mover.db import connect
from mover.state import control

log = logging.getLogger("mover.heartbeat")


class Heartbeat(threading.Thread):
    def __init__(self, dsn: str, beat: Callable[[psycopg.Cursor], bool], lost: threading.Event,
                 *also_set: threading.Event, interval: float = control.LEASE_SECONDS / 6, name: str = "heartbeat"):
        super().__init__(name=f"mover-{name}", daemon=True)
        self.dsn, self.beat, self.lost, self.also_set, self.interval = dsn, beat, lost, also_set, interval
        self._halt = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self._halt.wait(self.interval):
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = connect(self.dsn, role="mover-heartbeat")
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute("SET LOCAL lock_timeout = '5s'; SET LOCAL statement_timeout = '10s'")
                    alive = self.beat(cur)
                if not alive:
                    log.error("%s: lease lost; stopping", self.name)
                    self.lost.set()
                    for event in self.also_set:
                        event.set()
                    break
            except psycopg.Error as exc:
                log.warning("%s failed (%s); retrying", self.name, type(exc).__name__)
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)
