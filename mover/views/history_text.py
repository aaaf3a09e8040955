"""`mover history` and `mover events` as text: every migration with its outcome and each attempt
of each step on a line of its own; a migration's recent events as a table."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from mover.views import console
from mover.views.console import Consoles, say


def history(con: Consoles, rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, rows)
        return
    out = con.out
    if not rows:
        out.print("no migrations")
    for h in rows:
        took = "" if h["seconds"] is None else f" in {_seconds(h['seconds'])}"
        extra = "".join([f", {h['rollbacks']} rollbacks" if h["rollbacks"] else "",
                         f", {h['failures']} failures" if h["failures"] else "",
                         "" if h["cutover_lock_ms"] is None else f", cutover lock {h['cutover_lock_ms']:.1f} ms"])
        say(out, f"{h['name']}  {h['outcome']}{took} (source {h['source']}, started {h['created_at']}{extra})")
        for a in h["attempts"]:  # each attempt its own line: a failure, a rollback, a second cutover
            took = "" if a["seconds"] is None else _seconds(a["seconds"])
            lock = "" if a["lock_ms"] is None else f", lock held {a['lock_ms']:.1f} ms"
            why = f" ({a['message']})" if a["message"] and a["outcome"] not in ("done", "running") else ""
            where = f"{a['table'] or 'all tables'}  " if "table" in a else ""
            say(out, f"  {a['started_at']}  {where}{a['step']:<16} {a['outcome']:<12} {took}{lock}{why}")
        for t in h.get("tables", []):  # a family's other tables (issue 27), each with its steps
            done = [s for s in t["steps"] if s["seconds"] is not None]
            steps = ", ".join(f"{s['name']} {_seconds(s['seconds'])}" for s in done)
            say(out, f"  table {t['source']}  {t['outcome']}" + (f": {steps}" if steps else ""))


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def events(con: Consoles, rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, rows)
        return
    table = Table("at", "table", "step", "kind", "message", "ms")
    for e in rows:
        console.row(table, e["at"], e["table"] or "", e["step"] or "", e["kind"], e["message"] or "",
                    "" if e["duration_ms"] is None else f"{e['duration_ms']:.1f}")
    console.table(con.out, table)
