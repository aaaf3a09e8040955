"""`mover plan check` as text: what the plan will create, copy, check and swap and what it leaves
behind, table by table, in a summary a person reads; with --sql each step with the SQL it will
run instead (or, for a plan already registered, its edits and the migration's status); and the
JSON of a plan that does not pass."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mover.db import mask
from mover.engines.governor.pacing import human_bytes
from mover.errors import MoverError
from mover.names import display_ident
from mover.views import console, status_text
from mover.views.console import Consoles, say


def problems(con: Consoles, plan: Path, exc: MoverError) -> None:
    """--json stays JSON when the plan is invalid: every problem listed, the exit code kept."""
    found = getattr(exc, "problems", [exc])
    console.as_json(con.out, {"plan": str(plan), "ok": False, "exit_code": exc.exit_code,
                              "problems": [{"message": mask(p.message), "next": p.hint} for p in found]})


# Names listed in a summary line before "and N more" (--sql and --json list them all).
SHOWN = 6


def show(con: Consoles, plan: Path, result: dict[str, Any], as_json: bool, statements: bool = False) -> None:
    """The plan check's result: JSON; the registered plan's edits and status; or what the plan
    will do, as a summary per table or (`statements`, --sql) each step with its SQL."""
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
    if part and part.get("kept"):
        say(out, f"partitioned as the source is ({part['kept']}), unique key ({', '.join(part['key'])}); each "
                 f"partition takes its source partition's name at the swap")
    elif part:
        say(out, f"partitioned by {part['by']} ({', '.join(part['columns'])}), unique key ({', '.join(part['key'])})")
        if part["key_change"]:
            say(out, f"key change accepted ([target.partition] accept_key_change): {part['key_change']}")
        if part.get("row_movement"):
            say(out, f"note: {part['row_movement']}")
    if part:
        say(out, f"{len(part['partitions'])} partitions to create:")
        shown = part["partitions"] if statements or len(part["partitions"]) <= 2 * SHOWN else part["partitions"][:SHOWN]
        for p in shown:
            # A kept layout's partition names the source partition it stands for.
            say(out, f"  {p['name']}  {p['bound']}" + (f"  (for {p['for']})" if "for" in p else ""))
        if len(shown) < len(part["partitions"]):
            say(out, f"  and {len(part['partitions']) - len(shown)} more")
    meta = result.get("metadata") or {}
    for key, title in (("at_create_target", "carried to the new table at create_target"),
                       ("at_swap", "carried over at the swap"),
                       ("not_carried", "not carried over (`mover parity` lists it as planned)")):
        if meta.get(key):
            say(out, f"{title}:")
            for line in meta[key]:
                say(out, f"  {line}")
    _also(con, result)
    if not statements:
        _summary(con, plan, result)
        return
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


def _summary(con: Consoles, plan: Path, result: dict[str, Any]) -> None:
    """Per table (the head first): what is created, copied, checked, swapped, refused and left
    behind, from the result's structured fields; then the swap's one transaction, and where the
    statements are."""
    out = con.out
    family = result.get("family")
    tables = family["tables"] if family else [result]
    n = len(tables)
    new = {t["tables"]["source"]: t["tables"]["target"] for t in tables}
    keys = [{**k, "references": new[k["references"]]} for k in family["keys"]] if family else []
    say(out, "")
    say(out, "what it does" + (f", table by table ({n} tables, swapped together):" if n > 1 else ":"))
    for table in tables:
        _table(con, table, n, [k for k in keys if k["table"] == table["tables"]["source"]])
    swap = result["swap"]
    others = len(swap["locks"]) - 2 * n
    say(out, f"the swap: one transaction, lock_timeout {swap['lock_timeout_ms']}ms, up to {swap['attempts']} "
             f"attempts; it locks {len(swap['locks'])} relations one at a time ("
             + (f"the {n} tables, their new tables" if n > 1 else "the table, its new table")
             + (f", {others} outside the migration that reference {'them' if n > 1 else 'it'}" if others else "")
             + ") and mover's change logs")
    if swap["warning"]:
        say(out, swap["warning"])
    say(out, f"the statements each step runs: `mover plan check {plan} --sql`")


def _table(con: Consoles, table: dict[str, Any], n: int, keys: list[dict[str, Any]]) -> None:
    """One table's lines of the summary (a second line of a label indented under its text)."""
    s, t = table["summary"], table["tables"]
    made, copied, checked, swapped, left = s["created"], s["copied"], s["checked"], s["swapped"], s["left_behind"]
    say(con.out, f"table {table['name']!r} ({t['source']}):")

    def line(label: str, text: str) -> None:
        say(con.out, f"  {label + ':' if label else '':<13}{text}")

    shape = [_types(made["columns"])] if made["columns"] else []
    shape += [f"{made['partitions']} partitions"] if made["partitions"] else []
    after = [_count(made["indexes"], "index", "indexes"), _count(made["constraints"], "constraint", "constraints")]
    after += [f"{len(keys)} foreign key{'s' if len(keys) != 1 else ''} to "
              f"{', '.join(dict.fromkeys(k['references'] for k in keys))} (between the migration's tables)"
              ] if keys else []
    after = [a for a in after if a]
    line("created", f"{made['target']}" + (f" ({'; '.join(shape)})" if shape else "") + " with its key's index"
         + (f"; after the copy {', '.join(after)}" if after else ""))
    capture = (f"trigger {display_ident(made['trigger'])}" if made["capture"] == "trigger"
               else "logical decoding (a publication and a replication slot)")
    line("", f"the capture: {capture} on {t['source']} into {made['change_log']} (a TRUNCATE of it is refused "
             f"meanwhile)")
    rows = copied["rows_estimate"]
    line("copied", f"{t['source']} -> {made['target']}, keyed by ({_idents(table['key'])}), {copied['range_rows']} "
                   f"keys a transaction; about {rows:,} row{'s' if rows != 1 else ''}, "
                   f"{human_bytes(copied['target_bytes'])} with its indexes")
    workers = checked["workers"]
    line("checked", f"every row compared (ranges of about {checked['range_rows']} keys, {workers} worker"
                    f"{'s' if workers != 1 else ''})"
         + (", the ranges changed since again before the swap" if checked["before_cutover"] else "")
         + ("; the recorded statements planned on it first ([cutover] rehearse)" if checked["rehearse"] else "")
         + "; at the swap, parity (it looks as the original did)")
    line("swapped", f"{made['target']} takes the name {t['source']}, the original kept as {t['old']} (rollback "
                    f"window {swapped['window']})" + (f", in one transaction with the other {n - 1} tables" if n > 1
                                                      else ""))
    if swapped["also_changed"]:
        line("", f"the {len(swapped['also_changed'])} tables and views that reference it move onto it: "
                 f"{_names(swapped['also_changed'])}")
    back = table.get("rollback_carries_back") or {}
    if back:
        line("refused", f"`mover rollback` while a value of {_idents(back)} in the new table does not convert back "
                        f"to the old type (`--give-up-rows` gives those rows up)")
    behind = [f"foreign key {display_ident(k)} ([target] drop_foreign_keys): it stays on {t['old']}"
              for k in left["drop_foreign_keys"]]
    behind += left["not_carried"]
    if behind:
        line("not carried", "; ".join(behind))


def _count(idents: list[str], one: str, many: str) -> str:
    if not idents:
        return ""
    return f"{len(idents)} {one if len(idents) == 1 else many} ({_names([display_ident(i) for i in idents])})"


def _idents(idents: Iterable[str]) -> str:
    return ", ".join(display_ident(i) for i in idents)


def _names(names: list[str]) -> str:
    shown = names if len(names) <= SHOWN + 1 else names[:SHOWN]
    return ", ".join(shown) + (f" and {len(names) - len(shown)} more" if len(shown) < len(names) else "")


def _types(columns: dict[str, str]) -> str:
    """The changed columns with their new types: "a, b as bigint", or each column's own."""
    if len(set(columns.values())) == 1:
        return f"{_idents(columns)} as {next(iter(columns.values()))}"
    return ", ".join(f"{display_ident(c)} as {typ}" for c, typ in columns.items())


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
