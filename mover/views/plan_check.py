"""`mover plan check` as text: what the plan will create, copy, carry and swap, each step with
the SQL it will run (or, for a plan already registered, its edits and the migration's status);
and the JSON of a plan that does not pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mover.db import mask
from mover.errors import MoverError
from mover.views import console, status_text
from mover.views.console import Consoles, say


def problems(con: Consoles, plan: Path, exc: MoverError) -> None:
    """--json stays JSON when the plan is invalid: every problem listed, the exit code kept."""
    found = getattr(exc, "problems", [exc])
    console.as_json(con.out, {"plan": str(plan), "ok": False, "exit_code": exc.exit_code,
                              "problems": [{"message": mask(p.message), "next": p.hint} for p in found]})


def show(con: Consoles, plan: Path, result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, result)
        return
    out = con.out
    if result["registered"]:
        say(out, f"plan {plan} is registered as migration {result['name']!r}:")
        for e in result.get("edits", []):
            say(out, f"changed: {e['key']}, takes effect {e['takes_effect']}")
        status_text.show(con, result["status"])
        _throttle(con, result)
        _hooks(con, result)
        return
    t = result["tables"]
    say(out, f"plan {plan}: OK. migration {result['name']!r} (id {result['migration_id']} when registered now)")
    say(out, f"  copies {t['source']} into {t['target']}, keyed by ({', '.join(result['key'])}); after the "
             f"cutover the original is kept as {t['old']}")
    _throttle(con, result)
    _hooks(con, result)
    for col, why in result.get("lossy_accepted", {}).items():
        say(out, f"lossy type change accepted ([target] accept_lossy): {col!r} {why}")
    if result.get("rollback_carries_back"):
        say(out, "in the rollback window, a value goes back to the old table only if it converts to the old type "
                 "unchanged; a row whose value does not stays only in the new table (`mover rollback` refuses "
                 "while one exists, `--give-up-rows` gives it up, `mover retire` keeps it):")
        for col, why in result["rollback_carries_back"].items():
            say(out, f"  {col!r} {why}")
    part = result.get("partitioning")
    if part:
        say(out, f"partitioned by {part['by']} ({', '.join(part['columns'])}), unique key ({', '.join(part['key'])})")
        if part["key_change"]:
            say(out, f"key change accepted ([target.partition] accept_key_change): {part['key_change']}")
        if part.get("row_movement"):
            say(out, f"note: {part['row_movement']}")
        say(out, f"{len(part['partitions'])} partitions to create:")
        for p in part["partitions"]:
            say(out, f"  {p['name']}  {p['bound']}")
    meta = result.get("metadata") or {}
    for key, title in (("at_create_target", "carried to the new table at create_target"),
                       ("at_swap", "carried over at the swap"),
                       ("not_carried", "not carried over (`mover parity` lists it as planned)")):
        if meta.get(key):
            say(out, f"{title}:")
            for line in meta[key]:
                say(out, f"  {line}")
    _also(con, result)
    _steps(con, result["steps"])
    family = result.get("family")
    if family:
        for table in family["tables"][1:]:
            t = table["tables"]
            out.print(f"\n[bold]table {table['name']!r}[/bold] (id {table['migration_id']} when registered now): "
                      f"copies {t['source']} into {t['target']}, keyed by ({', '.join(table['key'])}); after the "
                      f"cutover the original is kept as {t['old']}", highlight=False)
            _steps(con, table["steps"])
        out.print("\n[bold]the family[/bold]")
        for stmt in family["sql"]:
            say(out, stmt)


def _steps(con: Consoles, described: list[dict[str, Any]]) -> None:
    for step in described:
        con.out.print(f"\n[bold]{step['name']}[/bold]")
        for stmt in step["sql"]:
            say(con.out, stmt)


def _throttle(con: Consoles, result: dict[str, Any]) -> None:
    """The governor's inputs and the backfill's preflight."""
    for title, key in (("throttle", "throttle"), ("preflight", "preflight")):
        if result.get(key):
            say(con.out, f"{title}:")
            for line in result[key]:
                say(con.out, f"  {line}")


def _also(con: Consoles, result: dict[str, Any]) -> None:
    """The [[also]] lines that widen every column referencing a key the plan widens: to paste."""
    if result.get("also"):
        say(con.out, "\nto widen the columns that reference the widened key in the same migration (one cutover), add "
                     "to the plan:")
        for line in result["also"]:
            say(con.out, line)


def _hooks(con: Consoles, result: dict[str, Any]) -> None:
    for event, hook in result["hooks"].items():
        say(con.out, f"hook {event}: {hook}")
    for warning in result["warnings"]:
        say(con.out, f"warning: {warning}")
