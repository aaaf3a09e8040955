"""`mover partitions maintain` as text: per converted table, the partitions made (or to be made
with --dry-run), those that could not be, the rows in the default partition, and retention."""

from __future__ import annotations

from typing import Any

from mover.views import console
from mover.views.console import Consoles, say


def maintained(con: Consoles, results: list[dict[str, Any]], dry_run: bool, as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, results)
        return
    out = con.out
    for r in results:
        if r.get("skipped"):
            say(out, f"{r['table']}: skipped, {r['skipped']}")
            continue
        verb = "would create" if dry_run else "created"
        made = [p["name"] for p in r["create"]] if dry_run else r["created"]
        say(out, f"{r['table']}: {r['partitions']} partitions; {verb} {len(made)}: {', '.join(made) or '-'}")
        if r.get("manager"):
            verb = "would defer" if dry_run else "deferred"
            say(out, f"  managed by {r['manager']}" + (f"; {verb} to pg_partman run_maintenance" + (
                ", after handing the table over (create_parent)" if not r["registered"] else "")
                if r["manager"] == "pg_partman" else ""))
        for b in r["blocked"]:
            say(out, f"  not created {b['name']}: {b['error']}")
        if r["default_rows"]:
            say(out, f"  {r['default_rows']} rows in the default partition")
        gone = r["detach"] if dry_run else r["detached"]
        if gone:
            dropped = f"; dropped: {', '.join(r['dropped'])}" if r["dropped"] else ""
            say(out, f"  {'would detach' if dry_run else 'detached'}: {', '.join(gone)}{dropped}")
