"""The status read model: what `mover status` and the commands' results report, read from the
control schema and the catalog in one transaction. Reads only."""

from __future__ import annotations

import socket
from datetime import datetime
from typing import Any

import psycopg

from mover.catalog import introspect
from mover.db import one
from mover.engines.capture import changelog, integrity, logical
from mover.engines.partitioning import partitions
from mover.names import QualifiedName
from mover.state import control, gaps, ranges
from mover.state import throttle as throttle_row


def _backfill_status(cur: psycopg.Cursor, m: control.Migration) -> dict[str, Any]:
    st = ranges.state(cur, m.id, "backfill")
    workers, range_rows, waiting = _workers(cur, m)
    # Speed over the last 30 s of finished ranges: what the copy does now, not on average.
    cur.execute("SELECT sum(rows) / nullif(extract(epoch FROM now() - min(finished_at)), 0) FROM mover.ranges"
                " WHERE migration_id = %s AND kind = 'backfill' AND status = 'done'"
                " AND finished_at > now() - interval '30 seconds'", (m.id,))
    rate = one(cur)[0]
    estimate = None if m.step not in control.BUILDING else \
        introspect.estimate_rows(cur, m.source)
    if not workers:
        rate = None  # the speed of copies that stopped is no speed now
    eta = None
    if rate and estimate and not st["finished"]:
        eta = max(estimate - st["rows"], 0) / float(rate)
    return {"rows_copied": st["rows"], "ranges_done": st["done"], "ranges_total": st["total"],
            "ranges_failed": st["failed"], "rows_estimate": estimate, "workers": workers,
            "range_rows": range_rows, "rows_per_second": None if rate is None else round(float(rate)),
            "eta_seconds": None if eta is None else round(eta), "waiting_for": waiting or [],
            "paused": m.paused, **_old_backfill_keys(st, range_rows)}


def _old_backfill_keys(st: dict[str, Any], range_rows: int | None) -> dict[str, Any]:
    """The backfill's JSON keys from before "chunk" became "range", kept for one release
    (docs/commands.md lists them); new readers use the ranges_* keys."""
    return {"chunks_done": st["done"], "chunks_total": st["total"], "chunks_failed": st["failed"],
            "chunk_rows": range_rows}


def _workers(cur: psycopg.Cursor, m: control.Migration) -> tuple[int, int | None, list[str]]:
    """Live range workers (fresh heartbeats, and on this host a process that still exists: a
    worker killed with -9 keeps a fresh heartbeat for a while), the range size they ask for, what
    they wait for."""
    cur.execute("SELECT host, pid, range_rows, waiting_for FROM mover.workers WHERE migration_id = %s"
                " AND heartbeat_at > now() - make_interval(secs => %s)", (m.id, control.LEASE_SECONDS))
    live = [(rows, waiting) for host, pid, rows, waiting in cur.fetchall() if worker_alive(host, pid)]
    sizes = [rows for rows, _ in live if rows is not None]
    waiting = sorted({w for _, w in live if w is not None})
    return len(live), max(sizes) if sizes else None, waiting


def worker_alive(host: str, pid: int | None) -> bool:
    """Whether a worker row with a fresh heartbeat is a live process: a worker killed with -9 keeps
    a fresh heartbeat for a while, so on this host its process says."""
    return not (host == socket.gethostname() and pid is not None and not control.process_alive(pid))


def status_of(cur: psycopg.Cursor, m: control.Migration) -> dict[str, Any]:
    """A migration's status; a family's (issue 27) is the whole family's: its step (the earliest of
    its tables'), and backfill, capture, reconcile and divergences summed over its tables, with
    each table's own under `family.tables` (the first table's names stay under `tables`)."""
    out = _status_of(cur, m)
    rows = control.family(cur, m) if m.head else [m]
    if len(rows) == 1:
        return out  # one table: its own status is the whole
    each = [out if row.id == m.id else _status_of(cur, row) for row in rows]
    out["family"] = {"tables": [_table(x, row) for x, row in zip(each, rows, strict=True)]}
    order = [*control.STEPS, control.FINISHED]
    earliest = min((row.step for row in rows), key=order.index)
    out["step"] = control.shown_step(earliest)
    # The family's steps: one done when every table's is, running while some tables are at it.
    out["steps"] = _steps(_family_steps([control.steps(cur, row.id) for row in rows]), out["state"], earliest)
    for part in ("backfill", "reconcile", "capture"):
        out[part] = _summed([x[part] for x in each])
    out["divergences"] = sum(x["divergences"] for x in each)
    return out


def _family_steps(each: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each step as the family's: its tables' statuses when they agree, else running (some
    tables past it, others not yet); from the first start to the last finish."""
    out = []
    for rows in zip(*each, strict=True):
        statuses = {r["status"] for r in rows}
        started = [r["started_at"] for r in rows if r["started_at"] is not None]
        status = statuses.pop() if len(statuses) == 1 else "running"
        out.append({"name": rows[0]["name"], "status": status, "started_at": min(started) if started else None,
                    "finished_at": max(r["finished_at"] for r in rows) if status == "done" else None})
    return out


def _steps(rows: list[dict[str, Any]], state: str, step: str) -> list[dict[str, Any]]:
    """The steps as `status` shows them: the migration's own step, while the migration is not
    running it (waiting at the gate or in the window, failed, interrupted, its process gone),
    shows the migration's state; the rows say "running" or "pending" there, neither of which
    is what happens (an outcome sets a running step back to pending, so that the next run starts
    it again)."""
    def status(s: dict[str, Any]) -> str:
        if s["name"] == step and s["status"] in ("running", "pending") and state not in ("running", "pending"):
            return state
        return state if s["status"] == "running" and state not in ("running", "pending") else s["status"]
    return [{"name": s["name"], "status": status(s), "started_at": iso(s["started_at"]),
             "finished_at": iso(s["finished_at"])} for s in rows]


def _summed(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The first table's part, with every count summed over the family's tables (a nested count
    too: divergences by kind)."""
    out = dict(parts[0])
    for key, value in parts[0].items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) or (value is None and any(isinstance(p.get(key), (int, float))
                                                                    for p in parts)):
            if key.endswith("eta_seconds"):
                etas = [float(p[key]) for p in parts if p.get(key) is not None]
                out[key] = max(etas) if etas else None
            elif key != "lag_seconds":
                out[key] = sum(p.get(key) or 0 for p in parts)
        elif isinstance(value, dict):
            out[key] = _summed([p.get(key) or {} for p in parts])
        elif isinstance(value, list) and key == "waiting_for":
            out[key] = sorted({w for p in parts for w in p.get(key) or []})
    return out


def _table(st: dict[str, Any], m: control.Migration) -> dict[str, Any]:
    """One table of a family, as `mover status` lists it."""
    return {"name": st["name"], "position": m.family_position, "step": st["step"], "state": st["state"],
            "tables": st["tables"], "tables_present": st["tables_present"], "key": st["key"],
            "backfill": {k: st["backfill"][k] for k in ("rows_copied", "ranges_done", "ranges_total",
                                                        "ranges_failed", "rows_estimate", "workers")},
            "capture": st["capture"], "divergences": st["divergences"],
            "reconcile": {k: st["reconcile"][k] for k in ("ranges_done", "ranges_total", "rows_compared")},
            "cutover": st["cutover"]}


def _status_of(cur: psycopg.Cursor, m: control.Migration) -> dict[str, Any]:
    pending_fwd, lag_fwd = changelog.pending(cur, m.id, reverse=False)
    pending_rev, lag_rev = changelog.pending(cur, m.id, reverse=True)
    cur.execute("SELECT coalesce(sum(applied), 0) FROM mover.capture_stats WHERE migration_id = %s", (m.id,))
    applied = int(one(cur)[0])
    slot = logical.health(cur, m.id)  # logical capture's replication slot, while it is installed
    step = control.shown_step(m.step)
    state, error = m.state, m.error
    if state in control.TERMINAL:
        # An error recorded on the way ("ready for cutover", "window is open") is history once the
        # migration ended: the events keep it.
        error = None
    died = holder_gone(cur, m)
    if died is not None:
        state, error = "failed", (error or died) + f"; `mover run {m.name}` resumes"
    return {
        "name": m.name,
        "step": step,
        "state": state,
        "steps": _steps(control.steps(cur, m.id), state, m.step),
        "tables": {"source": str(m.source), "target": str(m.target), "old": str(m.old)},
        # Which of those names exist now (after retire or abort some are gone).
        "tables_present": [role for role, qn in (("source", m.source), ("target", m.target), ("old", m.old))
                           if _exists(cur, qn)],
        "key": m.key_columns,
        "backfill": _backfill_status(cur, m),
        "capture": {"pending": pending_fwd + pending_rev, "applied": applied,
                    "lag_seconds": lag_fwd if lag_fwd is not None else lag_rev,
                    "direction": "reverse" if m.cutover_at else "forward",
                    "method": (m.plan.get("capture") or {}).get("method", "trigger"),
                    "slot": None if slot is None else {**slot.as_dict(), "summary": logical.describe_health(slot)},
                    # Invariant 14: each gap in the capture not yet covered by a full comparison after it.
                    "gaps": [] if m.state in control.TERMINAL else _gaps(cur, m)},
        "divergences": control.open_divergences(cur, m.id),
        "reconcile": _reconcile_status(cur, m),
        "throttle": _throttle_status(cur, m),
        "cutover": None if m.cutover_at is None else {"at": iso(m.cutover_at), "lock_ms": m.cutover_lock_ms},
        # Only while the window is open: after a rollback, a retire (forced or not) or an abort it is history.
        "rollback_window_ends_at": iso(m.window_ends_at) if m.step == "rollback_window" else None,
        "lease": None if m.lease_owner is None else {"owner": m.lease_owner, "expires_at": iso(m.lease_expires_at)},
        "error": error,
        "created_at": iso(m.created_at),
        "finished_at": iso(m.finished_at),
        "partitions": _partitions(cur, m),
        "family_of": None if m.head else _head_name(cur, m),
    }


def holder_gone(cur: psycopg.Cursor, m: control.Migration) -> str | None:
    """Why a migration recorded as running has nobody running it, or None: its lease holder ran
    here and its process is gone (kill -9: known now, not when the lease runs out), or no live
    process holds the lease any more (it died mid-step, elsewhere)."""
    if m.state != "running":
        return None
    if m.lease_host == socket.gethostname() and m.lease_pid is not None and not control.process_alive(m.lease_pid):
        return f"process {m.lease_pid} ended without finishing (killed, or it lost its connection to the server)"
    if m.lease_expires_at is None or m.lease_expires_at < _now(cur):
        return "the process running it stopped"
    return None


def _gaps(cur: psycopg.Cursor, m: control.Migration) -> list[dict[str, Any]]:
    out = []
    for g in gaps.open_gaps(cur, m.id):
        what = "not in force: " + (g.fix or "") if g.restored_at is None else (
            f"in force again; `mover run {m.name}` " + ("compares every range" if g.direction == "forward"
                                                         else "re-syncs the old table"))
        out.append({**{k: iso(v) if isinstance(v, datetime) else v for k, v in g.as_dict().items()},
                    "summary": f"{g.direction}: {integrity.explain(g)}; {what}"})
    return out


def _head_name(cur: psycopg.Cursor, m: control.Migration) -> str:
    return control.head_of(cur, m).name


def named(cur: psycopg.Cursor, name: str) -> dict[str, Any]:
    """`mover status NAME`."""
    return status_of(cur, control.get(cur, name))


def every(cur: psycopg.Cursor) -> list[dict[str, Any]]:
    """`mover status`: every migration's (a family's once, its tables within it)."""
    return [status_of(cur, m) for m in control.list_all(cur) if m.head]


def divergences(cur: psycopg.Cursor, name: str, include_resolved: bool = False) -> list[dict[str, Any]]:
    """`mover divergences NAME [--all]`: the open ones (or all), oldest first."""
    m = control.get(cur, name)
    rows = control.family(cur, m) if m.head else [m]  # a family's: every table's, each naming its table
    return [{**d, "found_at": iso(d["found_at"]), "resolved_at": iso(d["resolved_at"]),
             "checked_at": iso(d["checked_at"]), **({"table": str(row.source)} if len(rows) > 1 else {})}
            for row in rows for d in control.list_divergences(cur, row.id, include_resolved)]


def events(cur: psycopg.Cursor, name: str, limit: int = 50) -> list[dict[str, Any]]:
    """`mover events NAME`: the last `limit` events, progress samples left out, each naming the
    `table` it concerns. A family's name: every table's events as one story; a table's own name
    (NAME/schema.table): that table's, with those the family recorded about it."""
    m = control.get(cur, name)
    rows = control.family(cur, m) if m.head else [m]
    tables = {row.id: str(row.source) for row in rows}
    if m.head:
        found = control.events(cur, list(tables), limit)
    else:
        found = control.events(cur, [m.id, control.head_of(cur, m).id], limit, only=m.id)
    return [{**{k: v for k, v in e.items() if k != "table_id"}, "at": iso(e["at"]),
             "table": tables.get(e["table_id"], str(m.source))} for e in found]


def _partitions(cur: psycopg.Cursor, m: control.Migration) -> dict[str, Any] | None:
    if not m.plan.get("partition"):
        return None
    out = partitions.status(cur, m.source, m.target)
    if out is not None:
        out["manager"] = (m.plan.get("partitions") or {}).get("manager", "mover")
    return out


def _throttle_status(cur: psycopg.Cursor, m: control.Migration) -> dict[str, Any] | None:
    """The governor's state (mover/engines/governor/throttle.py), as the process that probes published it;
    None for a migration never governed. A row nobody has probed for a while is idle: its
    process stopped (or died) and nothing is governed now."""
    row = throttle_row.get(cur, m.id)
    if row is None:
        return None
    live = throttle_row.live(row)
    state = row["state"] if live else "idle"
    throttled = state in ("throttled", "floor")
    return {"state": state, "phase": row["phase"] if live else None,
            "reason": row["reason"] if live else None, "wait": row["wait"] if live else None,
            "duty": round(float(row["duty"]), 3) if live else 1.0,
            "latency_ms": _round(row["latency_ms"]), "budget_ms": _round(row["budget_ms"]),
            "baseline_ms": _round(row["baseline_ms"]),
            "throttled_for_seconds": round(float(row["throttled_for"] or 0), 1) if throttled else None,
            "throttled_seconds": round(float(row["throttled_seconds"] or 0), 1),
            "readings": row["readings"]}


def throttle_line(t: dict[str, Any] | None) -> str | None:
    """The governor's state in one line, as `mover status` and `mover watch` print it (None when
    there is nothing to say: never governed, or idle and never throttled)."""
    if t is None:
        return None
    total = f"{_duration(t['throttled_seconds'])} throttled in all" if t["throttled_seconds"] else ""
    state = t["state"]
    if state == "idle":
        return f"idle ({total})" if total else None
    if state == "waiting":
        line = f"waiting: {t['wait']}"
    elif state in ("throttled", "floor"):
        line = ("at the floor, " if state == "floor" else "") + f"throttled: {t['reason']}, working " \
            f"{t['duty']:.0%} of the time for {_duration(t['throttled_for_seconds'] or 0)}"
    elif state == "measuring":
        line = f"{t['phase']}: measuring the probe's latency before the work"
    elif state == "quiet":
        line = f"full speed, nothing to protect: {t['reason']}"
    elif state == "off":
        line = "no latency budget (" + (t["reason"] or '[throttle] max_latency_increase = "off"') + "); the guards hold"
    else:
        line = f"governed: {t['reason']}" if t["reason"] else "governed"
    return line + (f" ({total})" if total else "")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 \
        else f"{seconds:.1f}s"


def _round(v: float | None) -> float | None:
    return None if v is None else round(float(v), 2)


def _reconcile_status(cur: psycopg.Cursor, m: control.Migration) -> dict[str, Any]:
    verified = control.reconcile_ranges(cur, m.id)
    counts = control.divergence_counts(cur, m.id)
    # The ranges are cut as the pass goes, so their count is no denominator: the source's row estimate is.
    estimate = introspect.estimate_rows(cur, m.source) if m.step in control.COMPARING else None
    return {"ranges_done": verified["ranges_done"], "ranges_total": verified["ranges_total"],
            "rows_estimate": estimate,
            "ranges_failed": verified["ranges_failed"], "rows_compared": verified["source_rows"],
            "verified_at": iso(verified["newest_verification"]),
            # The range workers of the migration (backfill and reconcile alike) wait on one throttle.
            "waiting_for": _workers(cur, m)[2], "paused": m.paused,
            "divergences": {"open": counts["open_by_kind"], "resolved": counts["resolved_by_how"]},
            # The backfill has no conflict clause (mover/sql/copy.py): a key conflict fails the
            # range instead of skipping a row, so nothing is ever skipped silently. Kept as a field
            # so that scripts need not change if a conflict policy is ever added.
            "skipped_on_conflict": 0}


def _exists(cur: psycopg.Cursor, qn: QualifiedName) -> bool:
    cur.execute("SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = coalesce(%s, current_schema()) AND c.relname = %s)", (qn.schema, qn.name))
    return bool(one(cur)[0])


def _now(cur: psycopg.Cursor) -> datetime:
    cur.execute("SELECT clock_timestamp()")
    now: datetime = one(cur)[0]
    return now


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def sample_of(cur: psycopg.Cursor, m: control.Migration) -> dict[str, Any]:
    """What a periodic sample records (mover/runner/sampler.py): counters and gauges only, from the same
    reads as status_of, so that a chart and the status never disagree on what a number means."""
    each = [_sample_of(cur, row) for row in control.family(cur, m) if row.id != m.id] if m.head else []
    own = _sample_of(cur, m)
    if each:  # several tables: the head's sample is the whole migration's
        for key in ("backfill_rows", "reconcile_rows", "pending_forward", "pending_reverse", "workers"):
            own[key] = own[key] + sum(x[key] for x in each)
        own["waiting_for"] = sorted({*own["waiting_for"], *(w for x in each for w in x["waiting_for"])})
    return own


def _sample_of(cur: psycopg.Cursor, m: control.Migration) -> dict[str, Any]:
    pending_fwd, lag_fwd = changelog.pending(cur, m.id, reverse=False)
    pending_rev, lag_rev = changelog.pending(cur, m.id, reverse=True)
    workers, range_rows, waiting = _workers(cur, m)
    return {"step": m.step, "backfill_rows": ranges.state(cur, m.id, "backfill")["rows"],
            "reconcile_rows": ranges.state(cur, m.id, "reconcile")["rows"],
            "pending_forward": pending_fwd, "lag_forward": lag_fwd,
            "pending_reverse": pending_rev, "lag_reverse": lag_rev,
            "workers": workers, "range_rows": range_rows, "lock_waits": lock_waits(cur)[:5],
            "waiting_for": waiting if not m.paused or any(w.startswith("paused") for w in waiting)
            else ["paused (mover unpause)", *waiting]}


def workers_of(cur: psycopg.Cursor, m: control.Migration) -> list[dict[str, Any]]:
    """The live range workers one by one (fresh heartbeats): where they run, the range each holds
    now (lo exclusive, hi inclusive, NULL an open end), the range size they ask for, what they wait for."""
    cur.execute(
        """
        SELECT w.worker_id, w.host, w.pid, w.range_rows, w.rows_done, w.waiting_for, r.kind, r.range_no, r.lo, r.hi
        FROM mover.workers w
        LEFT JOIN mover.ranges r ON r.migration_id = w.migration_id AND r.owner = w.worker_id AND r.status = 'running'
        WHERE w.migration_id = %s AND w.heartbeat_at > now() - make_interval(secs => %s)
        ORDER BY w.worker_id, r.range_no
        """, (m.id, control.LEASE_SECONDS))
    return [{"worker": wid, "host": host, "pid": pid, "range_rows": range_rows, "rows_done": rows_done,
             "waiting_for": waiting, "range": None if kind is None else
             {"kind": kind, "range_no": no, "lo": lo, "hi": hi}}
            for wid, host, pid, range_rows, rows_done, waiting, kind, no, lo, hi in cur.fetchall()
            if worker_alive(host, pid)]


def lock_waits(cur: psycopg.Cursor) -> list[dict[str, Any]]:
    """Lock waits in this database that involve mover, now: a mover session waiting for a lock (the
    cutover behind a long transaction), or a session waiting behind a mover session (the
    application behind the swap). Seen through pg_stat_activity: without pg_read_all_stats, other
    roles' sessions are not visible, and then neither are their waits. mover's sessions are those
    named ROLE:HOST:PID with a role starting "mover" (mover.db.application_name)."""
    cur.execute(
        """
        WITH movers AS (SELECT pid FROM pg_stat_activity
                        WHERE datname = current_database() AND application_name ~ '^mover[^:]*:')
        SELECT a.pid, a.application_name, a.application_name ~ '^mover[^:]*:',
               extract(epoch FROM clock_timestamp() - a.query_start), pg_blocking_pids(a.pid)
        FROM pg_stat_activity a
        WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' AND a.pid <> pg_backend_pid()
          AND (a.application_name ~ '^mover[^:]*:' OR pg_blocking_pids(a.pid) && ARRAY(SELECT pid FROM movers))
        ORDER BY a.query_start
        """)
    return [{"pid": pid, "application_name": app, "mover": bool(is_mover),
             "seconds": None if secs is None else round(float(secs), 1), "blocked_by": list(blockers or [])}
            for pid, app, is_mover, secs, blockers in cur.fetchall()]
