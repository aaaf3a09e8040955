"""The history read model: every migration, done, aborted or under way, with its outcome and
how long each step took (`mover history`). Reads only."""

from __future__ import annotations

from typing import Any

import psycopg

from mover.errors import NotFound
from mover.state import control
from mover.views.status import iso


def outcome(m: control.Migration) -> str:
    """How the migration ended, or where it stands: its state (`done`, `aborted`, ...), the words
    `mover status` uses."""
    return "done" if m.step == control.FINISHED else m.state


# How an attempt of a step ended, from the events that record an outcome (control.record_outcome).
_OUTCOMES = ("failed", "waiting", "paused", "interrupted")


def attempts(story: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every attempt of every step, oldest first, each with its own time: a step run again after
    a failure, a wait at the gate, a crash or a rollback is a row per attempt (the steps table
    keeps one start and one end per step, which stretch across them all), and a rollback is a row
    of its own with its lock. An attempt still open when a later one of the same step starts was
    interrupted (its process died)."""
    rows: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}

    def close(row: dict[str, Any], e: dict[str, Any], outcome: str) -> None:
        row.update(ended_at=e["at"], outcome=outcome,
                   seconds=round((e["at"] - row["started_at"]).total_seconds(), 3))
        if outcome != "done":
            row["message"] = e["message"]

    for e in story:
        step, kind, detail = e["step"], e["kind"], e.get("detail") or {}
        if kind == "step_started" and step:
            if step in open_:
                close(open_.pop(step), e, "interrupted")
            open_[step] = {"step": step, "started_at": e["at"], "ended_at": None, "seconds": None,
                           "outcome": "running", "lock_ms": None, "message": None}
            rows.append(open_[step])
        elif kind == "step_done" and step:
            row = open_.pop(step, None)
            if row is None:  # done in the transaction that started it
                row = {"step": step, "started_at": e["at"], "lock_ms": None, "message": None}
                rows.append(row)
            close(row, e, "done")
            if step == "cutover":
                row["lock_ms"] = detail.get("lock_ms", e["duration_ms"])
        elif kind == "rolled_back":
            if "rollback_window" in open_:
                close(open_.pop("rollback_window"), e, "rolled back")
            rows.append({"step": "rollback", "started_at": e["at"], "ended_at": e["at"], "seconds": None,
                         "outcome": "done", "lock_ms": detail.get("lock_ms", e["duration_ms"]),
                         "message": e["message"]})
        elif kind in _OUTCOMES and step in open_:
            close(open_.pop(step), e, kind)
        elif kind == "aborted":
            for row in open_.values():
                close(row, e, "aborted")
            open_.clear()
    return [{**r, "started_at": iso(r["started_at"]), "ended_at": iso(r["ended_at"])} for r in rows]


def history(cur: psycopg.Cursor, name: str | None = None) -> list[dict[str, Any]]:
    """The migrations (one name: it and its aborted attempts, which registration set aside as
    NAME#id), oldest first."""
    everything = control.list_all(cur)
    # A family's tables (issue 27) are listed within it, each with its own steps.
    tables_of = control.other_tables(everything)
    migrations = [m for m in everything if m.head]
    if name is not None:
        migrations = [m for m in migrations if m.name == name or m.name.startswith(f"{name}#")]
        if not migrations:
            raise NotFound(f"no migration named {name!r}, now or in the past",
                           hint="`mover history` lists every migration")
    cur.execute("SELECT migration_id, count(*) FILTER (WHERE kind = 'rolled_back'),"
                " count(*) FILTER (WHERE kind = 'failed') FROM mover.events GROUP BY migration_id")
    counts = {mid: (rolled_back, failed) for mid, rolled_back, failed in cur.fetchall()}
    return [entry(cur, m, counts, [entry(cur, t, counts, []) for t in tables_of.get(m.id, [])])
            for m in migrations]


def entry(cur: psycopg.Cursor, m: control.Migration, counts: dict[int, tuple[int, int]],
          tables: list[dict[str, Any]]) -> dict[str, Any]:
    """One migration's history (one table's, within a family)."""
    tried = attempts(control.story(cur, m.id))
    steps = []
    for s in control.steps(cur, m.id):
        # The step's time is that of the attempt that finished it, not the span of all its attempts.
        done = [a for a in tried if a["step"] == s["name"] and a["outcome"] == "done"]
        steps.append({"name": s["name"], "status": s["status"], "started_at": iso(s["started_at"]),
                      "finished_at": iso(s["finished_at"]),
                      "seconds": done[-1]["seconds"] if done else None,
                      "attempts": sum(a["step"] == s["name"] for a in tried)})
    total = None if m.finished_at is None else round((m.finished_at - m.created_at).total_seconds(), 3)
    rolled_back, failures = counts.get(m.id, (0, 0))
    return {"name": m.name, "id": m.id, "outcome": outcome(m), "step": control.shown_step(m.step),
            "state": m.state, "source": str(m.source), "created_at": iso(m.created_at),
            "finished_at": iso(m.finished_at), "seconds": total, "cutover_lock_ms": m.cutover_lock_ms,
            "rollbacks": rolled_back, "failures": failures, "steps": steps, "attempts": tried,
            **({"tables": tables} if tables else {})}
