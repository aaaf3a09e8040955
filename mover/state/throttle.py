"""mover.throttle: one row per migration, the governor's (mover/engines/governor/throttle.py). The only code
that writes it.

The process that holds `prober` probes the server (its probe is this row's update), decides, and
publishes the decision here; every other process working on the migration (`mover worker` on any
host) reads it and holds its engines to it, and takes the probe over when nobody has probed for
STALE_SECONDS (the prober died). `mover status` reads it too.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

STALE_SECONDS = 5.0  # no probe for this long: the prober is gone, another process may take over


def lead(cur: psycopg.Cursor, mid: int, prober: str, phase: str) -> dict[str, Any]:
    """`prober` probes for the migration from now on, for `phase` (the orchestrator's claim at the
    start of its bulk work: it takes the probe over from whoever had it). Returns the row."""
    cur.execute(
        "INSERT INTO mover.throttle AS t (migration_id, prober, probed_at, phase, state)"
        " VALUES (%(mid)s, %(prober)s, clock_timestamp(), %(phase)s, 'measuring')"
        " ON CONFLICT (migration_id) DO UPDATE SET prober = EXCLUDED.prober, probed_at = EXCLUDED.probed_at,"
        " phase = EXCLUDED.phase, state = 'measuring', wait = NULL, baseline_ms = NULL, budget_ms = NULL,"
        " latency_ms = NULL, duty = 1, reason = NULL, throttled_since = NULL RETURNING *",
        {"mid": mid, "prober": prober, "phase": phase})
    return _one(cur)


def take_over(cur: psycopg.Cursor, mid: int, prober: str) -> dict[str, Any] | None:
    """`prober` takes the probe if nobody has probed for STALE_SECONDS (or nobody holds it);
    returns the row if it did. The baseline, the duty and the time throttled carry on."""
    cur.execute("INSERT INTO mover.throttle (migration_id) VALUES (%s) ON CONFLICT DO NOTHING", (mid,))
    cur.execute(
        "UPDATE mover.throttle SET prober = %s, probed_at = clock_timestamp()"
        " WHERE migration_id = %s AND (prober IS NULL OR probed_at IS NULL"
        "   OR probed_at < clock_timestamp() - make_interval(secs => %s)) RETURNING *",
        (prober, mid, STALE_SECONDS))
    return _fetch(cur)


def publish(cur: psycopg.Cursor, mid: int, prober: str, decision: dict[str, Any]) -> None:
    """The probe's write: the decision as `prober` holds it now, if `prober` still holds the
    probe (the statement changes no row otherwise: another process took it over). `decision`:
    phase, baseline_ms, budget_ms, latency_ms, duty, state, reason, wait, throttled (bool),
    throttled_for (seconds to add to the time throttled), readings (a dict, or None to keep)."""
    params = {**decision, "mid": mid, "prober": prober,
              "readings": None if decision.get("readings") is None else json.dumps(decision["readings"], default=str)}
    cur.execute(
        "UPDATE mover.throttle SET probed_at = clock_timestamp(), phase = %(phase)s,"
        " baseline_ms = %(baseline_ms)s, budget_ms = %(budget_ms)s, latency_ms = %(latency_ms)s,"
        " duty = %(duty)s, state = %(state)s, reason = %(reason)s, wait = %(wait)s,"
        " throttled_since = CASE WHEN %(throttled)s THEN coalesce(throttled_since, clock_timestamp()) END,"
        " throttled_seconds = throttled_seconds + %(throttled_for)s,"
        " readings = coalesce(%(readings)s::jsonb, readings)"
        " WHERE migration_id = %(mid)s AND prober = %(prober)s", params)


def step_down(cur: psycopg.Cursor, mid: int, prober: str) -> None:
    """`prober` stops probing (its bulk work is over): the row says idle, nobody holds the probe."""
    cur.execute("UPDATE mover.throttle SET prober = NULL, phase = NULL, state = 'idle', wait = NULL, duty = 1,"
                " reason = NULL, throttled_since = NULL WHERE migration_id = %s AND prober = %s", (mid, prober))


def get(cur: psycopg.Cursor, mid: int) -> dict[str, Any] | None:
    """The row, with how many seconds ago it was last probed (`age`)."""
    cur.execute("SELECT *, extract(epoch FROM clock_timestamp() - probed_at)::float8 AS age,"
                " extract(epoch FROM clock_timestamp() - throttled_since)::float8 AS throttled_for"
                " FROM mover.throttle WHERE migration_id = %s", (mid,))
    return _fetch(cur)


def live(row: dict[str, Any]) -> bool:
    """Whether a row read by `get` (or with the same `prober` and `age`) is probed now: a row
    nobody has probed for STALE_SECONDS is idle, whatever its state says (its process stopped or
    died, and nothing is governed)."""
    return row["prober"] is not None and row["age"] is not None and row["age"] <= STALE_SECONDS


def _fetch(cur: psycopg.Cursor) -> dict[str, Any] | None:
    if cur.description is None:
        return None
    names = [d.name for d in cur.description]
    row = cur.fetchone()
    return None if row is None else dict(zip(names, row, strict=True))


def _one(cur: psycopg.Cursor) -> dict[str, Any]:
    row = _fetch(cur)
    if row is None:
        raise AssertionError("the statement returned no row")
    return row


__all__ = ["STALE_SECONDS", "get", "lead", "live", "publish", "step_down", "take_over"]
