"""`mover status` as a person reads it: the table of one migration, which is also what the
commands that move a migration print as their result (or, with --json, the status itself), and
the lines some commands print before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from mover.state import control
from mover.views import console
from mover.views.console import Consoles, say
from mover.views.status import throttle_line


def show(con: Consoles, st: dict[str, Any]) -> None:
    # Every value is escaped: rich would take "[cutover]" in a hint for markup and drop it.
    table = Table(title=escape(f"migration {st['name']}"), show_header=False)
    table.add_row("step / state", escape(f"{st['step']} / {st['state']}"))
    present = st.get("tables_present", list(st["tables"]))
    table.add_row("tables", escape(", ".join(f"{role} {st['tables'][role]}" for role in ("source", "target", "old")
                                             if role in present) or "none left"))
    b = st["backfill"]
    line = f"{b['rows_copied']:,} rows in {b['ranges_done']} ranges"
    if b["ranges_failed"]:
        line += f", {b['ranges_failed']} FAILED"
    if b["workers"]:
        line += f", {b['workers']} workers, {b['rows_per_second'] or 0:,} rows/s"
        if b["eta_seconds"] is not None:
            line += f", ETA {b['eta_seconds']}s"
    if (b["paused"] or b["waiting_for"]) and st["step"] in control.RANGE_STEPS:
        line += f" (waiting: {', '.join(b['waiting_for']) or 'paused'})"
    table.add_row("backfill", escape(line))
    if (throttle := throttle_line(st.get("throttle"))) is not None:
        table.add_row("throttle", escape(throttle))
    c = st["capture"]
    if st["state"] not in ("done", "aborted") or c["pending"]:  # after retire or abort no log is left
        wal = ", from the WAL" if c.get("method") == "logical" and c["direction"] == "forward" else ""
        table.add_row("capture", f"{c['pending']:,} pending, {c['applied']:,} applied ({c['direction']}{wal})")
    if c.get("slot"):
        table.add_row("slot", escape(c["slot"]["summary"]))
    for gap in c.get("gaps") or []:  # invariant 14: the capture was bypassed; no swap until covered
        table.add_row("CAPTURE GAP", escape(gap["summary"]))
    r = st.get("reconcile")
    if r and r["ranges_total"]:
        table.add_row("reconcile", f"{r['ranges_done']}/{r['ranges_total']} ranges verified, {r['rows_compared']:,} "
                                   f"rows" + (f", {r['ranges_failed']} FAILED" if r["ranges_failed"] else "")
                      + (f", last at {r['verified_at']}" if r["verified_at"] else ""))
    by_kind = ", ".join(f"{k} {v}" for k, v in (r or {}).get("divergences", {}).get("open", {}).items())
    retired = (r or {}).get("divergences", {}).get("resolved", {}).get("retired")  # with the old table
    table.add_row("divergences", str(st["divergences"]) + (f" ({by_kind})" if by_kind else "")
                  + (f"; {retired} resolved with the old table at retire" if retired else ""))
    for t in (st.get("family") or {}).get("tables", []):
        # Each table of a family (issue 27); the rows above are the whole family's.
        b, r = t["backfill"], t["reconcile"]
        where = "source" if "source" in t["tables_present"] else "target"
        line = (f"{t['step']} / {t['state']}: {b['rows_copied']:,} rows copied, {t['capture']['pending']:,} pending, "
                f"{r['ranges_done']}/{r['ranges_total']} ranges verified, {t['divergences']} divergences")
        table.add_row(escape(f"table {t['tables'][where]}"), escape(line))
    if st.get("family_of"):
        table.add_row("family", escape(f"a table of migration {st['family_of']!r}: its commands take that name"))
    if st["cutover"]:
        table.add_row("cutover", f"{st['cutover']['at']} (lock held {st['cutover']['lock_ms']:.1f} ms)")
    if st["rollback_window_ends_at"]:
        table.add_row("rollback window ends", st["rollback_window_ends_at"])
    p = st.get("partitions")
    if p:
        line = f"{p['count']} in {p['table']} (upkeep: {p.get('manager', 'mover')})"
        if p["newest_bound"] is not None:
            line += f", newest up to {p['newest_bound']}" + (f" ({p['ahead']} ahead)" if p["ahead"] else "")
        if p["next_boundary"] is not None:
            line += f", next boundary {p['next_boundary']}"
        if p["default_rows_estimate"] is not None:
            line += f", ~{p['default_rows_estimate']:,} rows in the default partition"
        table.add_row("partitions", line)
    if st["error"]:
        # A migration waiting for the operator (the gate, the window, a lock not had) says why; that is no error.
        table.add_row("waiting" if st["state"] == "waiting" else "error", escape(st["error"]))
    console.table(con.out, table)


def result(con: Consoles, st: dict[str, Any], as_json: bool) -> None:
    """A command's result: the migration's status, as a table or (--json) as `mover status --json`."""
    if as_json:
        console.as_json(con.out, st)
    else:
        show(con, st)


def every(con: Consoles, st: dict[str, Any] | list[dict[str, Any]], as_json: bool) -> None:
    """`mover status`: one migration, or every one."""
    if as_json:
        console.as_json(con.out, st)
    elif isinstance(st, list):
        if not st:
            con.out.print("no migrations")
        for one in st:
            show(con, one)
    else:
        show(con, st)


def initialised(con: Consoles, revision: str, as_json: bool) -> None:
    con.err.print(f"control schema at revision {revision}")
    if as_json:
        console.as_json(con.out, {"revision": revision})


def adopted(con: Consoles, out: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, {"adopted": out["adopted"], "status": out["status"]})
        return
    for change in out["adopted"]:
        con.err.print(f"adopted: {change['message']}")
    if not out["adopted"]:
        con.err.print("nothing to adopt: both tables have their recorded shape")
    show(con, out["status"])


def recaptured(con: Consoles, name: str, out: dict[str, Any], as_json: bool) -> None:
    if not as_json:
        con.err.print(f"capturing again from the new replication slot {out['slot']}; `mover run {name}` compares "
                      f"every range, then `mover repair {name}` re-syncs what the lost slot did not deliver")
    result(con, out["status"], as_json)


def report(con: Consoles, name: str, r: dict[str, Any], html_file: Path | None, as_json: bool) -> None:
    """`mover report`: where the page went, the JSON, or the status with the way to the page."""
    if html_file is not None:
        say(con.err, f"report of {name!r} written to {html_file}")
    if as_json:
        console.as_json(con.out, r)
    elif html_file is None:
        show(con, r["status"])
        say(con.err, f"next: `mover report {name} --html FILE` writes the page with the charts")
