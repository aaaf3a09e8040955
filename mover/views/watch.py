"""`mover watch`: the view an operator keeps open during a long migration, drawn from snapshots
(the status read model, the live workers, the last minutes of progress samples) read once per
interval. Full screen on a terminal; one line per interval otherwise (a log, a CI job)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from mover.db import Database, bind, one
from mover.state import control, samples
from mover.views import status

SPARK = "▁▂▃▄▅▆▇█"
WINDOW_SECONDS = 600  # the sparklines' "last minutes"


def watch(db: Database, name: str, show: Callable[[dict[str, Any]], None], *, interval: float,
          stop: threading.Event) -> dict[str, Any]:
    """Call show(snapshot) every `interval` seconds until the migration is done or aborted, or
    `stop` is set; returns the last snapshot. A snapshot is the status plus the live workers one by
    one, the samples of the last minutes, and this watch's own readings (one per interval: finer
    than the samples, which come every few seconds at best)."""
    readings: list[dict[str, Any]] = []
    while True:
        snap = db.transaction(bind(snapshot, name), label="watch")
        now = datetime.now(UTC)
        readings = [r for r in readings if (now - r["at"]).total_seconds() < WINDOW_SECONDS]
        readings.append({"at": now, "backfill_rows": snap["backfill"]["rows_copied"],
                         "reconcile_rows": snap["reconcile"]["rows_compared"],
                         "pending": snap["capture"]["pending"], "lag": snap["capture"]["lag_seconds"]})
        snap["readings"] = readings
        show(snap)
        if snap["state"] in control.TERMINAL or stop.wait(interval):
            return snap


def snapshot(cur: psycopg.Cursor, name: str) -> dict[str, Any]:
    """One reading of the migration, in one transaction (the readings are the caller's)."""
    m = control.head_of(cur, control.get(cur, name))
    snap = status.status_of(cur, m)  # a family's: the whole's, and each table's under "family"
    rows = control.family(cur, m)
    snap["worker_list"] = [w for row in rows for w in status.workers_of(cur, row)]
    snap["lock_waits"] = status.lock_waits(cur)
    cur.execute("SELECT now() - make_interval(secs => %s)", (WINDOW_SECONDS,))
    snap["samples"] = samples.read(cur, m.id, since=one(cur)[0])
    tables = {row.id: str(row.source) for row in rows}  # a family's: every table's, each naming its table
    snap["recent_events"] = [{**e, "at": status.iso(e["at"]), "table": tables.get(e["table_id"])}
                             for e in control.events(cur, list(tables), 6)]
    return snap


def sparkline(values: list[float], width: int = 40) -> str:
    """The last `width` values as block characters, scaled to their own maximum."""
    values = values[-width:]
    if not values:
        return ""
    top = max(values) or 1.0
    return "".join(SPARK[min(int(v / top * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)] for v in values)


def _rate(snap: dict[str, Any], kind: str) -> float | None:
    """Rows/s now: between this watch's last two readings, else between the last two samples."""
    readings = snap.get("readings") or []
    r = samples.rates(readings[-2:] if len(readings) >= 2 else snap["samples"], f"{kind}_rows")
    return r[-1][1] if r else None


def history(snap: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Capture backlog and lag over the last minutes: the recorded samples from before this watch
    started, then its own readings."""
    readings = snap.get("readings") or []
    first = readings[0]["at"] if readings else None
    older = [p for p in snap["samples"] if first is None or p["at"] < first]
    backlog = [float((p.get("pending_forward") or 0) + (p.get("pending_reverse") or 0)) for p in older]
    lag = [float(max(p.get("lag_forward") or 0, p.get("lag_reverse") or 0)) for p in older]
    return backlog + [float(r["pending"]) for r in readings], lag + [float(r["lag"] or 0) for r in readings]


def _waiting(snap: dict[str, Any]) -> list[str]:
    b = snap["backfill"]
    waits = list(b["waiting_for"])
    if b["paused"] and not any(w.startswith("paused") for w in waits):
        waits.insert(0, "paused (mover unpause)")
    for w in snap.get("lock_waits") or []:
        who = f"mover pid {w['pid']}" if w["mover"] else f"{w['application_name'] or 'a session'} (pid {w['pid']})"
        waits.append(f"lock: {who} waits {w['seconds'] or 0:.1f}s behind pid "
                     f"{', '.join(map(str, w['blocked_by'])) or '?'}")
    if snap["state"] == "waiting" and snap["error"]:
        waits.append(snap["error"])  # e.g. the cutover gate, or a lock not had within lock_timeout
    return waits


def _when(value: str) -> str:
    """An end the operator waits for (the rollback window's), in local time; the date too when it
    is not today."""
    at = datetime.fromisoformat(value).astimezone()
    return at.strftime("%H:%M:%S" if at.date() == datetime.now().astimezone().date() else "%Y-%m-%d %H:%M:%S")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _reconcile_eta(snap: dict[str, Any], rate: float | None) -> float | None:
    r = snap["reconcile"]
    left = (r.get("rows_estimate") or 0) - r["rows_compared"]
    if not rate or left <= 0 or snap["state"] != "running":
        return None
    return float(left / rate)


def line(snap: dict[str, Any]) -> str:
    """The non-terminal form: one line per interval, every field a script may grep."""
    b, r, c = snap["backfill"], snap["reconcile"], snap["capture"]
    brate, rrate = _rate(snap, "backfill"), _rate(snap, "reconcile")
    parts = [datetime.now().strftime("%H:%M:%S"), snap["name"], f"{snap['step']}/{snap['state']}"
             + (f" until {_when(snap['rollback_window_ends_at'])}" if snap.get("rollback_window_ends_at") else ""),
             f"backfill {b['rows_copied']:,}" + (f"/{b['rows_estimate']:,}" if b["rows_estimate"] else "")
             + f" rows {b['rows_per_second'] or round(brate or 0):,} rows/s ETA {_eta(b['eta_seconds'])}",
             f"reconcile {r['rows_compared']:,}" + (f"/{r['rows_estimate']:,}" if r.get("rows_estimate") else "")
             + f" rows in {r['ranges_done']} ranges {round(rrate or 0):,} rows/s"
             f" ETA {_eta(_reconcile_eta(snap, rrate))}",
             f"capture {c['pending']:,} pending lag {_seconds(c['lag_seconds'])}"
             f" ({c['direction']})",
             f"workers {snap['backfill']['workers']}", f"divergences {snap['divergences']}"]
    if (throttle := status.throttle_line(snap.get("throttle"))) is not None:
        parts.append(f"throttle {throttle}")
    tables = _tables(snap)
    if tables:  # a family's (issue 27): the fields above are the whole's, then each table's
        parts.append("tables: " + "; ".join(" ".join(row) for row in tables))
    waits = _waiting(snap)
    if waits:
        parts.append("waiting: " + "; ".join(waits))
    return " | ".join(parts)


def _tables(snap: dict[str, Any]) -> list[tuple[str, ...]]:
    """A family's tables, one row each: name, step/state, rows copied, pending keys, reconcile
    ranges verified, divergences (the whole's figures are the sums)."""
    return [(t["tables"]["source"], f"{t['step']}/{t['state']}", f"{t['backfill']['rows_copied']:,} copied",
             f"{t['capture']['pending']:,} pending",
             f"{t['reconcile']['ranges_done']}/{t['reconcile']['ranges_total']} verified",
             f"{t['divergences']} divergences")
            for t in (snap.get("family") or {}).get("tables", [])]


def screen(snap: dict[str, Any]) -> RenderableType:
    """The full-screen form: one panel per question an operator asks."""
    b, r, c = snap["backfill"], snap["reconcile"], snap["capture"]
    lease = snap["lease"]
    window = snap.get("rollback_window_ends_at")
    until: list[str | tuple[str, str]] = \
        [("rollback window until ", "dim"), (_when(window), "bold yellow"), "   "] if window else []
    head = Text.assemble((f"mover watch {snap['name']}", "bold"), f"   {snap['step']} / {snap['state']}   ", *until,
                         ("lease: ", "dim"), lease["owner"] if lease else "nobody",
                         ("   " + datetime.now().strftime("%H:%M:%S"), "dim"))

    timeline = Table.grid(padding=(0, 2))
    marks = {"done": ("✔", "green"), "running": ("▶", "bold blue"), "pending": ("·", "dim"), "undone": ("↺", "yellow"),
             "failed": ("✘", "red"), "waiting": ("…", "yellow"), "interrupted": ("✘", "yellow"),
             "paused": ("‖", "yellow")}
    for s in snap["steps"]:
        mark, style = marks.get(s["status"], ("?", ""))
        when = (s["finished_at"] or s["started_at"] or "")[11:19]
        if s["name"] == "rollback_window" and window and s["status"] != "done":
            when += f" .. {_when(window)}"  # the window's end, where the operator waits for it
        timeline.add_row(Text(mark, style), Text(s["name"], style), Text(s["status"], "dim"), Text(when, "dim"))

    progress = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    for col in ("", "done", "of", "rows/s", "ETA"):
        progress.add_column(col)
    brate, rrate = b["rows_per_second"] or _rate(snap, "backfill"), _rate(snap, "reconcile")
    progress.add_row("backfill", f"{b['rows_copied']:,} rows", f"{b['rows_estimate'] or 0:,} (estimate)",
                     f"{round(brate or 0):,}", _eta(b["eta_seconds"]))
    progress.add_row("reconcile", f"{r['rows_compared']:,} rows in {r['ranges_done']} ranges",
                     f"{r['rows_estimate']:,} (estimate)" if r.get("rows_estimate") else "-",
                     f"{round(rrate or 0):,}", _eta(_reconcile_eta(snap, rrate)))

    backlog, lag = history(snap)
    capture = Table.grid(padding=(0, 2))
    capture.add_row("direction", c["direction"])
    capture.add_row("pending", f"{c['pending']:,} keys", "applied", f"{c['applied']:,}")
    capture.add_row("lag", "-" if c["lag_seconds"] is None else f"{c['lag_seconds']:.1f} s")
    capture.add_row("backlog", Text(sparkline(backlog, 60), "cyan"), "max", f"{max(backlog, default=0):,.0f} keys")
    capture.add_row("lag", Text(sparkline(lag, 60), "magenta"), "max", f"{max(lag, default=0):.1f} s")

    workers = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    for col in ("worker", "host/pid", "range", "range rows", "rows done", "waiting for"):
        workers.add_column(col)
    for w in snap["worker_list"]:
        rng = w["range"]
        where = "-" if rng is None else \
            f"{rng['kind']} #{rng['range_no']} ({_bound(rng['lo'])} .. {_bound(rng['hi'])}]"
        workers.add_row(w["worker"][-18:], f"{w['host']}/{w['pid']}", where, f"{w['range_rows'] or '-'}",
                        f"{w['rows_done']:,}", w["waiting_for"] or "")
    if not snap["worker_list"]:
        workers.add_row("(none running)", "", "", "", "", "")

    opened = r["divergences"]["open"]
    divs = Text(f"{snap['divergences']} open" + (" (" + ", ".join(f"{k} {v}" for k, v in opened.items()) + ")"
                                                 if opened else ""), "red" if snap["divergences"] else "green")
    waits = _waiting(snap)
    waiting = Text("; ".join(waits) if waits else "nothing", "yellow" if waits else "green")
    throttle = status.throttle_line(snap.get("throttle"))
    governed = Text(throttle or "-", "yellow" if (snap.get("throttle") or {}).get("state") in
                    ("throttled", "floor", "waiting") else "green")

    events = Table.grid(padding=(0, 2))
    for e in snap["recent_events"]:  # a family's: each naming its table
        events.add_row(Text((e["at"] or "")[11:19], "dim"),
                       *([Text(e.get("table") or "", "cyan")] if snap.get("family") else []), e["kind"],
                       Text(e["message"][:110]))

    family = None
    if snap.get("family"):  # each table of a family (issue 27); the panels above are the whole's
        family = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
        for col in ("table", "step", "backfill", "capture", "reconcile", "divergences"):
            family.add_column(col)
        for row in _tables(snap):
            family.add_row(*row)

    grid = Table.grid(expand=True, padding=(0, 1))
    grid.add_column(ratio=1)
    grid.add_column(ratio=2)
    grid.add_row(Panel(timeline, title="steps"), Group(Panel(progress, title="progress"),
                                                       Panel(capture, title="capture")))
    return Group(Panel(head), grid, *([Panel(family, title="tables")] if family is not None else []),
                 Panel(workers, title="workers"),
                 Panel(Group(Text.assemble(("divergences: ", "bold"), divs),
                             Text.assemble(("waiting for: ", "bold"), waiting),
                             Text.assemble(("throttle: ", "bold"), governed)), title="attention"),
                 Panel(events, title="recent events"))


def _bound(b: list[str] | None) -> str:
    return "∞" if b is None else ",".join(b)


@contextmanager
def shown(out: Console) -> Iterator[Callable[[dict[str, Any]], None]]:
    """How `mover watch` shows each snapshot: the full screen on a terminal (put back when the
    watch ends, Ctrl-C included), one line otherwise."""
    if not out.is_terminal:
        yield lambda s: out.print(line(s), highlight=False, markup=False, soft_wrap=True)
        return
    from rich.live import Live  # only on a terminal
    with Live(console=out, screen=True, auto_refresh=False) as live:
        yield lambda s: live.update(screen(s), refresh=True)
