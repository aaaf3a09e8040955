"""`mover rehearse` as text: per table, each recorded statement's plan on the source and on the
target under the source's name, with its verdict; and the wait (exit 3) while one plans markedly
worse there."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from mover.engines.swap.query_rehearsal import marked_message
from mover.errors import Waiting
from mover.views import console
from mover.views.console import Consoles, say

_VERDICTS = {"seq_scan": "SEQ SCAN", "cost_up": "COST UP", "fails": "FAILS", "changed": "changed", "same": "same",
             "skipped": "skipped"}


def show(con: Consoles, result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, result)
        return
    out = con.out
    for t in result["tables"]:
        analyzed = "analyzed" if t["analyzed"] else "not analyzed"
        say(out, f"{t['source']} -> {t['target']} ({analyzed}): {t['rehearsed']} statements rehearsed of "
                 f"{t['considered']} recorded that name it")
        if t["analyze_note"]:
            say(out, f"  note: {t['analyze_note']}")
        if t["hidden"]:
            say(out, f"  note: {t['hidden']} statements of other roles are hidden from mover's role (GRANT "
                     f"pg_read_all_stats to it to rehearse them)")
        table = Table(show_lines=False)
        for col in ("verdict", "calls", "cost before -> after", "plan before -> after", "statement"):
            table.add_column(col, overflow="fold")
        for s in t["statements"]:
            b, a = s["before"], s["after"]
            cost = "-" if b is None else f"{b['cost']:,.1f} -> " + ("-" if a is None else f"{a['cost']:,.1f}")
            if s["cost_factor"] is not None and s["verdict"] != "same":
                cost += f" (x{s['cost_factor']:g})"
            plans = f"{_plan_words(b)} -> {_plan_words(a)}" if s["verdict"] != "skipped" else s["note"] or ""
            if s["error"]:
                plans += f": {s['error']}"
            table.add_row(_VERDICTS.get(s["verdict"], s["verdict"]), f"{s['calls']:,}", cost, escape(plans),
                          escape(_statement_words(s["statement"])))
        if t["statements"]:
            console.table(out, table)


def _plan_words(p: dict[str, Any] | None) -> str:
    """A plan in a few words: the scans of the migrated table, else its top node."""
    if p is None:
        return "-"
    scans = [f"{s['node']}" + (f" using {s['index']}" if s["index"] else "") for s in p["scans"]]
    return ", ".join(dict.fromkeys(scans)) or (p["plan"][0] if p["plan"] else "-")


def _statement_words(text: str, width: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[:width - 3] + "..."


def marked(name: str, result: dict[str, Any]) -> Waiting | None:
    """When a statement plans markedly worse on the target: the wait (exit 3) that says which."""
    if not result["marked"]:
        return None
    return Waiting(marked_message(name, result),
                   hint=f"each marked statement plans worse on the target than on the source (`--json` has "
                        f"both plans whole); change what makes it worse (an index, a type, the statement) and "
                        f"run `mover rehearse {name}` again, or go ahead: `mover cutover {name}`")
