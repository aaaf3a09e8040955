"""`mover parity NAME`: the metadata differences between the live table and what it was (after the
swap, after a rollback) or the two tables (before the swap), as mover/engines/swap/parity.py compares
them, with the swap's own judgement of what is planned, and that as text. A family's name: every
table's comparisons, each naming its table (the keys between the family's tables are planned: the
swap renames the tables and the keys stay with them). Reads only."""

from __future__ import annotations

from typing import Any

import psycopg

from mover.db import Database
from mover.engines.context import Context
from mover.engines.swap import parity
from mover.errors import Waiting
from mover.state import control
from mover.views import console
from mover.views.console import Consoles, say


def report(db: Database, name: str) -> dict[str, Any]:
    def read(cur: psycopg.Cursor) -> dict[str, Any]:
        m = control.get(cur, name)
        head = Context(db=db, migration=control.head_of(cur, m), owner="parity")
        members = head.family(cur)
        family = parity.family_names(cur, members)
        chosen = members if m.head else [t for t in members if t.mid == m.id]
        each = [parity.report(cur, t, family) for t in chosen]
        if len(members) == 1:
            return each[0]
        out = {**each[0], "name": m.name,
               "equal": all(r["equal"] for r in each),
               "comparisons": [{**c, "table": str(t.migration.source)} for t, r in zip(chosen, each, strict=True)
                               for c in r["comparisons"]]}
        return out
    return db.transaction(read, label="parity")


def show(con: Consoles, result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, result)
        return
    for c in result["comparisons"]:
        table = f"{c['table']}: " if c.get("table") else ""
        say(con.out, f"{table}{c['mode']}: {c['before']} -> {c['after']}: {'equal' if c['equal'] else 'DIFFERENT'}")
        for d in c["differences"]:
            why = f" ({d['reason']})" if d["reason"] else ""
            say(con.out, f"  {d['status']:<9} {d['key']}: {d['before']} -> {d['after']}{why}")


def unplanned(name: str, result: dict[str, Any]) -> Waiting | None:
    """A difference neither planned nor accepted: the wait (exit 3) that names the keys to accept."""
    if result["equal"]:
        return None
    keys = ", ".join(f'"{d["key"]}"' for c in result["comparisons"] for d in c["differences"]
                     if d["status"] == "unplanned")
    return Waiting(f"the metadata of migration {name!r} differs where nothing planned it: {keys}",
                   hint=f"undo the change, or accept it in the plan: [cutover] accept_parity = [{keys}]"
                        f" (`mover set` cannot change it: edit the plan, then `mover run PLAN`)")
