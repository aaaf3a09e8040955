"""The history read model: every migration, done, aborted or under way, with its outcome and
how long each step took (`mover history`). Reads only."""

from __future__ import annotations

from typing import Any

import psycopg

from mover import control
from mover.status import iso


def outcome(m: control.Migration) -> str:
    """How the migration ended, or where it stands: its state (`done`, `aborted`, ...), the words
    `mover status` uses."""
    return "done" if m.step == control.FINISHED else m.state


def history(cur: psycopg.Cursor, name: str | None = None) -> list[dict[str, Any]]:
    """The migrations (one name: it and its aborted attempts, which registration set aside as
    NAME#id), oldest first."""
    migrations = control.list_all(cur)
    if name is not None:
        migrations = [m for m in migrations if m.name == name or m.name.startswith(f"{name}#")]
    cur.execute("SELECT migration_id, count(*) FILTER (WHERE kind = 'rolled_back'),"
                " count(*) FILTER (WHERE kind = 'failed') FROM mover.events GROUP BY migration_id")
    counts = {mid: (rolled_back, failed) for mid, rolled_back, failed in cur.fetchall()}
    result = []
    for m in migrations:
        steps = []
        for s in control.steps(cur, m.id):
            seconds = None
            if s["started_at"] is not None and s["finished_at"] is not None:
                seconds = round((s["finished_at"] - s["started_at"]).total_seconds(), 3)
            steps.append({"name": s["name"], "status": s["status"], "started_at": iso(s["started_at"]),
                          "finished_at": iso(s["finished_at"]), "seconds": seconds})
        total = None if m.finished_at is None else round((m.finished_at - m.created_at).total_seconds(), 3)
        rolled_back, failures = counts.get(m.id, (0, 0))
        result.append({"name": m.name, "id": m.id, "outcome": outcome(m),
                       "step": control.STEPS[-1] if m.step == control.FINISHED else m.step, "state": m.state,
                       "source": str(m.source), "created_at": iso(m.created_at), "finished_at": iso(m.finished_at),
                       "seconds": total, "cutover_lock_ms": m.cutover_lock_ms, "rollbacks": rolled_back,
                       "failures": failures, "steps": steps})
    return result
