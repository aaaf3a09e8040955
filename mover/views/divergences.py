"""The rows that differ between the tables, as text: `mover divergences` lists them, `mover
reconcile` says what its pass found, `mover repair` and `mover accept` what they resolved; and
the wait (exit 3) while any is open, naming the commands that deal with them."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

from mover.errors import Waiting
from mover.views import console
from mover.views.console import Consoles, say


def listed(con: Consoles, rows: list[dict[str, Any]], include_resolved: bool, as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, rows)
        return
    table = Table("id", "key", "kind", "details (source -> target)", "found", "resolved")
    for d in rows:
        console.row(table, str(d["id"]), ", ".join(d["key"]), d["kind"], _details(d["kind"], d["columns"]),
                    d["found_at"], _resolution(d))
    console.table(con.out, table)
    if not rows:
        con.err.print("no open divergences" if not include_resolved else "no divergences")


def _details(kind: str, columns: Any) -> str:
    if kind == "different" and isinstance(columns, dict):
        return "; ".join(f"{c}: {_value(v[0])} -> {_value(v[1])}" for c, v in columns.items())[:300]
    if columns is None:
        return ""
    return json.dumps(columns)[:300]


def _value(v: Any) -> str:
    return "NULL" if v is None else repr(v)


def _resolution(d: dict[str, Any]) -> str:
    if d["resolved_at"] is None:
        return "open"
    how = d.get("resolved_how") or "superseded"
    return f"{how}: {d['reason']}" if how == "accepted" and d.get("reason") else how


def reconciled(con: Consoles, result: dict[str, Any], as_json: bool) -> None:
    """`mover reconcile`: what the pass compared and found, and where the migration stands."""
    if as_json:
        console.as_json(con.out, result)
        return
    p, st = result["pass"], result["status"]
    table = Table(title=f"reconcile {st['name']}", show_header=False)
    table.add_row("pass", f"{p['mode']}: {p['ranges']} ranges, {p['rows']:,} source rows in {p['seconds']:.1f}s"
                          + (f" ({p['rows_per_second']:,} rows/s)" if p["rows_per_second"] else ""))
    table.add_row("this pass", f"{p['found']} new divergences, {p['still_open']} found again, "
                               f"{p['resolved']} resolved (equal now)"
                  + (f", {p['unsettled']} keys kept changing (left to the next pass)" if p["unsettled"] else ""))
    if "foreign_keys_checked" in p:  # a family's: the keys between its tables on the other side
        table.add_row("family keys", f"{p['foreign_keys_checked']} foreign keys between the tables hold on the "
                                     f"side the application does not write")
    by_kind = st["reconcile"]["divergences"]["open"]
    table.add_row("open divergences", ", ".join(f"{k}: {v}" for k, v in by_kind.items()) or "none")
    table.add_row("step / state", f"{st['step']} / {st['state']}")
    console.table(con.out, table)


def repaired(con: Consoles, result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, result)
        return
    r = result["repair"]
    con.out.print(f"{r['repaired']} divergences repaired, {r['still_open']} still differ, {r['failed']} failed")
    for line in r["errors"]:
        say(con.err, f"  {line}")
    if r["hint"]:
        say(con.err, f"next: {r['hint']}")


def accepted(con: Consoles, result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, result)
        return
    ids = result["accepted"]
    con.out.print(f"{len(ids)} divergences accepted" + (f" (ids {', '.join(map(str, ids))})" if ids else ""))


def still_open(st: dict[str, Any]) -> Waiting | None:
    """While divergences are open: the wait (exit 3) that names the commands that deal with them."""
    n, name = st["divergences"], st["name"]
    if not n:
        return None
    return Waiting(f"migration {name!r} has {n} open divergences; cutover is refused until none remain",
                   hint=f"see them with `mover divergences {name}`; `mover repair {name}` re-syncs them from the "
                        f"source; `mover accept {name} --reason TEXT` accepts intended ones")
