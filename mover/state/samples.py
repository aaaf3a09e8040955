"""The stored progress samples of a migration, for what `mover watch` and `mover report` chart:
rows copied and compared, capture backlog and lag in both directions, workers, and what they
wait for (pause, rows/s cap, replica lag).

A sample is a `sample` row in mover.events (its numbers in detail). The orchestrator's heartbeat
records them (mover/runner/sampler.py); this module reads them back and derives rates.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

KIND = "sample"


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
