"""`mover report`: one self-contained HTML page a team attaches to the change ticket.

The plan, the step timeline, rows/s and capture backlog over time (from the progress samples,
mover/state/samples.py), divergences and how each was resolved, lock waits and hold times, and who
ran what when. Inline CSS and SVG drawn here: no script, no font or image fetched, so the page
reads the same offline and years later. Every value is HTML-escaped (names, messages and keys
come from the database).
"""

from __future__ import annotations

import html
import json
from datetime import datetime
from typing import Any

import psycopg

from mover.state import control, samples
from mover.views import history, status

# ---------------------------------------------------------------------------------------------
# The model (also what `mover report --json` prints)


def gather(cur: psycopg.Cursor, name: str) -> dict[str, Any]:
    """The whole migration's (a family's: every table's events, attempts and divergences, each
    naming its table; the status holds each table's progress and the whole's; the samples are
    the whole's)."""
    m = control.head_of(cur, control.get(cur, name))
    rows = history.speaks_for(cur, m)
    tables = history.names(rows)
    story = control.story(cur, list(tables))
    points = samples.read(cur, m.id)
    return {
        "name": m.name,
        "status": status.status_of(cur, m),
        "plan": m.plan,
        "attempts": history.gone(history.attempts(story, tables if len(rows) > 1 else None),
                                 status.holder_gone(cur, m)),
        "events": [_event(e, tables) for e in story],
        "samples": [{**p, "at": status.iso(p["at"])} for p in points],
        "rates": {kind: [(status.iso(at), round(r, 1)) for at, r in samples.rates(points, f"{kind}_rows")]
                  for kind in ("backfill", "reconcile")},
        "divergences": [{**d, "found_at": status.iso(d["found_at"]), "resolved_at": status.iso(d["resolved_at"]),
                         "checked_at": status.iso(d["checked_at"]), "table": tables[row.id]}
                        for row in rows for d in control.list_divergences(cur, row.id, include_resolved=True)],
        "locks": [_event(e, tables) for e in story if _lock_event(e) and e["table_id"] == m.id],
        "actors": _actors(story),
    }


def _event(e: dict[str, Any], tables: dict[int, str]) -> dict[str, Any]:
    return {**{k: v for k, v in e.items() if k != "table_id"}, "at": status.iso(e["at"]),
            "table": tables.get(e["table_id"])}


def _lock_event(e: dict[str, Any]) -> bool:
    """Hold times: the swap (cutover step_done, its duration is the lock held) and the swap back;
    waits: an outcome that gave up on a lock (lock_timeout in every attempt)."""
    if (e["kind"] == "step_done" and e["step"] == "cutover") or e["kind"] == "rolled_back":
        return True
    return e["kind"] in ("waiting", "failed") and "lock" in (e["message"] or "")


def _actors(story: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by: dict[str, dict[str, Any]] = {}
    for e in story:
        a = by.setdefault(e["actor"], {"actor": e["actor"], "first": e["at"], "last": e["at"], "events": 0,
                                       "did": []})
        a["last"] = e["at"]
        a["events"] += 1
        what = e["step"] or e["kind"]
        if what not in a["did"]:
            a["did"].append(what)
    return [{**a, "first": status.iso(a["first"]), "last": status.iso(a["last"])} for a in by.values()]


# ---------------------------------------------------------------------------------------------
# SVG charts

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 760, 220, 64, 28, 16, 12
COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea")


def _t(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def line_chart(title: str, series: dict[str, list[tuple[str, float]]], unit: str) -> str:
    """One SVG line chart, time on x; series: label -> [(iso time, value)]. A series with fewer
    than two points is listed in the legend as 'no data' rather than drawn as nothing."""
    pts = [(_t(t), v) for s in series.values() for t, v in s]
    esc = html.escape
    if not pts:
        return f'<p class="nodata">{esc(title)}: no samples recorded</p>'
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y1 = max(max(p[1] for p in pts), 1.0)
    x1 = x1 if x1 > x0 else x0 + 1

    def xy(t: float, v: float) -> tuple[float, float]:
        return (PAD_L + (t - x0) / (x1 - x0) * (W - PAD_L - PAD_R),
                H - PAD_B - v / y1 * (H - PAD_B - PAD_T))

    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
             f'aria-label="{esc(title)}" xmlns="http://www.w3.org/2000/svg">',
             f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_B - PAD_T}" '
             'fill="#f8fafc" stroke="#cbd5e1"/>']
    for frac in (0, 0.5, 1):
        y = H - PAD_B - frac * (H - PAD_B - PAD_T)
        parts.append(f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
                     f'{_num(frac * y1)}</text>')
        parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e2e8f0"/>')
    parts.append(f'<text x="{PAD_L}" y="{H - 8}" class="tick">{esc(_clock(x0))}</text>')
    parts.append(f'<text x="{W - PAD_R}" y="{H - 8}" text-anchor="end" class="tick">{esc(_clock(x1))}</text>')
    parts.append(f'<text x="{PAD_L + 4}" y="{PAD_T + 12}" class="tick">{esc(unit)}</text>')
    legend = []
    for i, (label, s) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        if len(s) >= 2:
            d = " ".join(f"{'M' if j == 0 else 'L'}{x:.1f},{y:.1f}"
                         for j, (x, y) in enumerate(xy(_t(t), v) for t, v in s))
            parts.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="2" '
                         f'data-series="{esc(label)}"/>')
        legend.append(f'<span style="color:{colour}">&#9632;</span> {esc(label)}'
                      + ("" if len(s) >= 2 else " (no data)"))
    parts.append("</svg>")
    return f'<figure><figcaption>{esc(title)}</figcaption>{"".join(parts)}' \
           f'<div class="legend">{" &nbsp; ".join(legend)}</div></figure>'


def _num(v: float) -> str:
    return f"{v / 1e6:.1f}M" if v >= 1e6 else f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:.0f}"


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().strftime("%H:%M:%S")


# ---------------------------------------------------------------------------------------------
# The page

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #0f172a; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #e2e8f0; }
table { border-collapse: collapse; width: 100%; } td, th { text-align: left; padding: 3px 8px; vertical-align: top; }
tr:nth-child(even) td { background: #f8fafc; } th { background: #e2e8f0; }
.done { color: #15803d; } .running { color: #1d4ed8; } .pending { color: #64748b; } .undone { color: #b45309; }
.failed, .interrupted { color: #b91c1c; } .waiting, .rolled_back { color: #b45309; }
.tick { font-size: 11px; fill: #475569; } figure { margin: 12px 0; } figcaption { font-weight: 600; }
.legend { font-size: 12px; } pre { background: #f1f5f9; padding: 8px; overflow-x: auto; font-size: 12px; }
.nodata { color: #64748b; } .bar { height: 14px; background: #60a5fa; display: inline-block; }
"""


def _table(head: list[str] | None, rows: list[list[Any]], row_class: list[str] | None = None) -> str:
    esc = html.escape
    body = "".join(
        f'<tr{f" class={chr(34)}{esc(row_class[i])}{chr(34)}" if row_class else ""}>'
        + "".join(f"<td>{esc('' if c is None else str(c))}</td>" for c in r) + "</tr>"
        for i, r in enumerate(rows))
    header = "" if head is None else f"<tr>{''.join(f'<th>{esc(h)}</th>' for h in head)}</tr>"
    return f"<table>{header}{body}</table>" \
        + ("" if rows else '<p class="nodata">none</p>')


def _duration(a: str | None, b: str | None) -> str:
    if not a or not b:
        return ""
    s = (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.0f}"


def _lock_wait(w: dict[str, Any]) -> str:
    who = "mover" if w["mover"] else (w["application_name"] or "a session")
    return f"seen waiting: {who} (pid {w['pid']}) behind pid {', '.join(map(str, w['blocked_by'])) or '?'}"


def render_html(r: dict[str, Any]) -> str:
    esc = html.escape
    st = r["status"]
    tried = r["attempts"]
    # A row per attempt: a failed cutover, a rollback and the cutover after it each with its own time and lock.
    # A family's (several tables): which table each attempt and event concerns ("all": the family's move).
    several = bool(st.get("family"))
    which: list[str] = ["table"] if several else []
    timeline = _table(which + ["step", "outcome", "started", "ended", "took", "lock held (ms)", "why"],
                      [([a.get("table") or "all"] if several else [])
                       + [a["step"], a["outcome"], a["started_at"], a["ended_at"] or "",
                          _duration(a["started_at"], a["ended_at"]),
                          "" if a["lock_ms"] is None else f"{a['lock_ms']:.1f}",
                          a["message"] if a["outcome"] not in ("done", "running") else ""] for a in tried],
                      [a["outcome"].replace(" ", "_") for a in tried])
    failed = [a for a in tried if a["outcome"] in ("failed", "interrupted")]
    rates = line_chart("rows/s over time", {"backfill": r["rates"]["backfill"],
                                            "reconcile": r["rates"]["reconcile"]}, "rows/s")
    sm = r["samples"]
    backlog = line_chart("capture backlog over time", {
        "forward (pending keys)": [(p["at"], p.get("pending_forward") or 0) for p in sm],
        "reverse (pending keys)": [(p["at"], p.get("pending_reverse") or 0) for p in sm if p.get("step") in
                                   ("rollback_window", "retire")]}, "keys")
    lag = line_chart("capture lag over time", {
        "forward": [(p["at"], p["lag_forward"]) for p in sm if p.get("lag_forward") is not None],
        "reverse": [(p["at"], p["lag_reverse"]) for p in sm if p.get("lag_reverse") is not None]}, "seconds")
    waits: dict[str, int] = {}
    for p in sm:
        for w in p.get("waiting_for") or []:
            waits[w.split(" (")[0]] = waits.get(w.split(" (")[0], 0) + 1
    divs = _table(["id", "key", "kind", "found", "resolved", "how", "by", "reason"],
                  [[d["id"], ", ".join(d["key"]), d["kind"], d["found_at"], d["resolved_at"] or "OPEN",
                    d.get("resolved_how") or ("" if d["resolved_at"] is None else "superseded"),
                    d.get("resolved_by"), d.get("reason")] for d in r["divergences"]])
    locks = _table(["at", "step", "what", "ms"],
                   [[e["at"], e["step"], e["message"], "" if e["duration_ms"] is None else f"{e['duration_ms']:.1f}"]
                    for e in r["locks"]]
                   + [[p["at"], p.get("step"), _lock_wait(w), _ms(w["seconds"])]
                      for p in sm for w in p.get("lock_waits") or []])
    actors = _table(["who", "first", "last", "events", "what"],
                    [[a["actor"], a["first"], a["last"], a["events"], ", ".join(a["did"])] for a in r["actors"]])
    story = _table(["at", "who", *which, "step", "kind", "message", "ms"],
                   [[e["at"], e["actor"], *([e.get("table") or ""] if several else []), e["step"], e["kind"],
                     e["message"], "" if e["duration_ms"] is None else f"{e['duration_ms']:.1f}"]
                    for e in r["events"]])
    family = _table(["table", "step / state", "rows copied", "rows compared", "divergences", "cutover lock (ms)"],
                    [[x["tables"]["source"], f"{x['step']} / {x['state']}", f"{x['backfill']['rows_copied']:,}",
                      f"{x['reconcile']['rows_compared']:,}", x["divergences"],
                      "" if not x["cutover"] else f"{x['cutover']['lock_ms']:.1f}"]
                     for x in (st.get("family") or {}).get("tables", [])]) if st.get("family") else ""
    t = st["tables"]
    summary = _table(None, [
        ["step / state", f"{st['step']} / {st['state']}"],
        # Only the tables that exist now: no old table before the swap, none after retire.
        ["tables", ", ".join(f"{role} {t[role]}" for role in ("source", "target", "old")
                             if role in st["tables_present"]) or "none left"],
        ["key", ", ".join(st["key"])],
        ["rows copied", f"{st['backfill']['rows_copied']:,} in {st['backfill']['ranges_done']} ranges"],
        ["rows compared", f"{st['reconcile']['rows_compared']:,} in {st['reconcile']['ranges_done']} ranges"],
        ["capture applied", f"{st['capture']['applied']:,}"],
        ["cutover", "" if not st["cutover"] else
         f"{st['cutover']['at']} (lock held {st['cutover']['lock_ms']:.1f} ms)"],
        ["open divergences", st["divergences"]],
        ["samples", f"{len(sm)} ({', '.join(f'{k} in {v}' for k, v in waits.items()) or 'never waiting'})"],
        ["failed attempts", "; ".join((f"{a['table']} " if a.get("table") else "")
                                      + f"{a['step']} {a['outcome']} at {a['started_at']}: {a['message'] or '?'}"
                                      for a in failed) or "none"],
        ["rollbacks", str(sum(a["step"] == "rollback" for a in tried))],
        ["waiting" if st["state"] == "waiting" else "error", st["error"] or ""]])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mover report: {esc(r['name'])}</title>
<style>{CSS}</style></head><body>
<h1>mover report: {esc(r['name'])}</h1>
<p>created {esc(st['created_at'] or '')}; finished {esc(st['finished_at'] or 'not yet')}</p>
<h2 id="summary">Summary</h2>{summary}{"<h2 id='tables'>Each table</h2>" + family if family else ""}
<h2 id="timeline">Step timeline</h2>{timeline}
<h2 id="charts">Throughput and backlog</h2>{rates}{backlog}{lag}
<h2 id="divergences">Divergences and their resolution</h2>{divs}
<h2 id="locks">Lock waits and hold times</h2>{locks}
<h2 id="actors">Who ran what, when</h2>{actors}
<h2 id="plan">Plan</h2><pre>{esc(json.dumps(r['plan'], indent=2, default=str))}</pre>
<h2 id="events">Events</h2>{story}
</body></html>
"""
