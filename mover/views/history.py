"""The history read model: every migration, done, aborted or under way, with its outcome and
how long each step took (`mover history`). Reads only."""

from __future__ import annotations

from typing import Any

import psycopg

from mover.errors import NotFound
from mover.state import control
from mover.views.status import holder_gone, iso


def outcome(m: control.Migration) -> str:
    """How the migration ended, or where it stands: its state (`done`, `aborted`, ...), the words
    `mover status` uses."""
    return "done" if m.step == control.FINISHED else m.state


# How an attempt of a step ended, from the events that record an outcome (control.record_outcome).
_OUTCOMES = ("failed", "waiting", "paused", "interrupted")
# A family's steps that every table takes at once (one gate, one swap, one window, one retire):
# their attempts are the head's, the family's; each table's own are the steps up to reconcile.
_AS_ONE = frozenset(control.STEPS) - control.RANGE_STEPS
_AS_ONE_KINDS = ("rolled_back", "aborted")


def attempts(story: list[dict[str, Any]], tables: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Every attempt of every step, oldest first, each with its own time: a step run again after
    a failure, a wait at the gate, a crash or a rollback is a row per attempt (the steps table
    keeps one start and one end per step, which stretch across them all), and a rollback is a row
    of its own with its lock. An attempt still open when a later one of the same step starts was
    interrupted (its process died).

    `tables` (a migration's row ids -> table names, the head's first): the story is every table's
    (control.story of them all), and each attempt names its `table`: a step up to reconcile is
    each table's own, a step the family takes as one (from the cutover on) is the head's events'
    alone, with table None (all of them)."""
    rows: list[dict[str, Any]] = []
    open_: dict[tuple[Any, str], dict[str, Any]] = {}
    head = next(iter(tables)) if tables else None

    def close(row: dict[str, Any], e: dict[str, Any], outcome: str) -> None:
        row.update(ended_at=e["at"], outcome=outcome,
                   seconds=round((e["at"] - row["started_at"]).total_seconds(), 3))
        if outcome != "done":
            row["message"] = e["message"]

    def new(table: Any, step: str, at: Any, **kw: Any) -> dict[str, Any]:
        row = {"step": step, "started_at": at, "ended_at": None, "seconds": None, "outcome": "running",
               "lock_ms": None, "message": None, **kw}
        if tables:
            row["table"] = None if table == head and step in _AS_ONE | {"rollback"} else tables.get(table)
        rows.append(row)
        return row

    for e in story:
        step, kind, detail = e["step"], e["kind"], e.get("detail") or {}
        table = e.get("table_id") if tables else None
        if tables and table != head and (step in _AS_ONE or kind in _AS_ONE_KINDS):
            continue  # the family's move, told once by the head's events
        if kind == "step_started" and step:
            if (table, step) in open_:
                close(open_.pop((table, step)), e, "interrupted")
            open_[(table, step)] = new(table, step, e["at"])
        elif kind == "step_done" and step:
            row = open_.pop((table, step), None)
            if row is None:  # done in the transaction that started it
                row = new(table, step, e["at"])
            close(row, e, "done")
            if step == "cutover":
                row["lock_ms"] = detail.get("lock_ms", e["duration_ms"])
        elif kind == "rolled_back":
            if (table, "rollback_window") in open_:
                close(open_.pop((table, "rollback_window")), e, "rolled back")
            new(table, "rollback", e["at"], ended_at=e["at"], outcome="done",
                lock_ms=detail.get("lock_ms", e["duration_ms"]), message=e["message"])
        elif kind in _OUTCOMES and (table, step) in open_:
            close(open_.pop((table, step)), e, kind)
        elif kind in _OUTCOMES and tables and table != head:
            # A family's outcome is recorded on every table with the family's step: it ended
            # whatever step this table was at.
            for key in [k for k in open_ if k[0] == table]:
                close(open_.pop(key), e, kind)
        elif kind == "aborted":
            for row in open_.values():
                close(row, e, "aborted")
            open_.clear()
    return [{**r, "started_at": iso(r["started_at"]), "ended_at": iso(r["ended_at"])} for r in rows]


def gone(tried: list[dict[str, Any]], died: str | None) -> list[dict[str, Any]]:
    """The attempts with those still running marked failed when the process running them is gone
    (`died`, status.holder_gone: killed, its lease expired) and nobody took over yet."""
    if died is None:
        return tried
    return [{**a, "outcome": "failed", "message": died} if a["outcome"] == "running" else a for a in tried]


def speaks_for(cur: psycopg.Cursor, m: control.Migration) -> list[control.Migration]:
    """The tables a name speaks for: every table of a family for the family's name (the head's),
    the one table for a table's own name (NAME/schema.table) or a migration of one table."""
    return control.family(cur, m) if m.head else [m]


def names(rows: list[control.Migration]) -> dict[int, str]:
    """Row id -> the table's name, as `mover status` shows it (the head's first)."""
    return {row.id: str(row.source) for row in rows}


def story_of(cur: psycopg.Cursor, m: control.Migration) -> tuple[list[dict[str, Any]], dict[int, str] | None]:
    """Every event `m`'s name speaks for, and (a family's) the tables they concern: for a family's
    name its every table's; for one table's own name its own and those its head recorded about it."""
    rows = speaks_for(cur, m)
    if len(rows) > 1:
        return control.story(cur, [row.id for row in rows]), names(rows)
    if m.head:
        return control.story(cur, m.id), None
    return control.story(cur, [m.id, control.head_of(cur, m).id], only=m.id), None


def history(cur: psycopg.Cursor, name: str | None = None) -> list[dict[str, Any]]:
    """The migrations (one name: it and its aborted attempts, which registration set aside as
    NAME#id), oldest first. A table's own name (NAME/schema.table): that table's history alone."""
    everything = control.list_all(cur)
    # A family's tables (issue 27) are listed within it, each with its own steps.
    tables_of = control.other_tables(everything)
    migrations = [m for m in everything if m.head]
    if name is not None:
        migrations = [m for m in migrations if m.name == name or m.name.startswith(f"{name}#")]
        if not migrations:
            migrations = [m for m in everything if m.name == name]  # one table of a family
            tables_of = {}
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
    """One migration's history (one table's, within a family): a family's attempts are every
    table's, each naming its table."""
    story, named = story_of(cur, m)
    tried = gone(attempts(story, named), holder_gone(cur, m))
    own = [a for a in tried if a.get("table", str(m.source)) in (None, str(m.source))]
    steps = []
    for s in control.steps(cur, m.id):
        # The step's time is that of the attempt that finished it, not the span of all its attempts.
        done = [a for a in own if a["step"] == s["name"] and a["outcome"] == "done"]
        steps.append({"name": s["name"], "status": s["status"], "started_at": iso(s["started_at"]),
                      "finished_at": iso(s["finished_at"]),
                      "seconds": done[-1]["seconds"] if done else None,
                      "attempts": sum(a["step"] == s["name"] for a in own)})
    total = None if m.finished_at is None else round((m.finished_at - m.created_at).total_seconds(), 3)
    rolled_back, failures = counts.get(m.id, (0, 0))
    return {"name": m.name, "id": m.id, "outcome": outcome(m), "step": control.shown_step(m.step),
            "state": m.state, "source": str(m.source), "created_at": iso(m.created_at),
            "finished_at": iso(m.finished_at), "seconds": total, "cutover_lock_ms": m.cutover_lock_ms,
            "rollbacks": rolled_back, "failures": failures, "steps": steps, "attempts": tried,
            **({"tables": tables} if tables else {})}
