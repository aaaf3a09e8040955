"""What `mover fleet status` and `mover fleet watch` read: the fleet's row and members from its
home database, and each member's migration's own status from its database (one line each: the
fleet's state for it, step, state, progress, ETA, divergences, throttle), with totals. Read-only;
a member that does not answer is shown unreachable, never guessed."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mover import api
from mover.db import bind, mask
from mover.errors import MoverError, NotFound
from mover.fleet import state
from mover.fleet.file import FleetFile
from mover.fleet.members import home_dsn
from mover.views.status import iso, throttle_line


def status(fleet: FleetFile) -> dict[str, Any]:
    with api.session(home_dsn(fleet)) as db:
        row = db.transaction(bind(state.get, fleet.name), label="fleet status")
        recent = db.transaction(bind(state.events, fleet.name, 10), label="fleet events")
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="mover-fleet-status") as pool:
        lines = list(pool.map(_member_line, row.members))
    counts = Counter(m["fleet_state"] for m in lines)
    return {
        "fleet": row.name, "members": lines, "waves": row.waves, "run_wave": row.run_wave,
        "cutover_wave": row.cutover_wave,
        "stopped": None if row.stopped_reason is None else {
            "reason": row.stopped_reason, "member": row.stopped_member, "message": row.stopped_message,
            "at": iso(row.stopped_at)},
        "runner": None if row.lease_owner is None else {"owner": row.lease_owner,
                                                       "expires_at": iso(row.lease_expires_at)},
        "totals": {"states": dict(sorted(counts.items())),
                   "rows_copied": sum(m["rows_copied"] or 0 for m in lines),
                   "divergences": sum(m["divergences"] or 0 for m in lines),
                   "unreachable": sum(1 for m in lines if not m["reachable"])},
        "events": [{**e, "at": iso(e["at"])} for e in recent],
    }


def _member_line(m: state.MemberRow) -> dict[str, Any]:
    line: dict[str, Any] = {"name": m.name, "wave": m.wave, "server": m.server, "migration": m.migration,
                            "fleet_state": m.state, "detail": m.detail, "step": None, "state": None,
                            "rows_copied": None, "rows_estimate": None, "eta_seconds": None, "divergences": None,
                            "throttle": None, "error": None, "reachable": True}
    try:
        st = api.status(m.dsn, m.migration)
    except NotFound:
        return line  # not registered there yet
    except MoverError as exc:
        return {**line, "error": mask(exc.message), "reachable": False}
    backfill = st["backfill"]
    return {**line, "step": st["step"], "state": st["state"], "rows_copied": backfill["rows_copied"],
            "rows_estimate": backfill["rows_estimate"], "eta_seconds": backfill["eta_seconds"],
            "divergences": st["divergences"], "throttle": throttle_line(st.get("throttle")), "error": st["error"]}


def watch(fleet: FleetFile, show: Callable[[dict[str, Any]], None], *, interval: float,
          stop: threading.Event) -> dict[str, Any]:
    """show(status) every `interval` seconds until every member is settled for good (retired,
    aborted or skipped) or `stop` is set; the last status."""
    while True:
        st = status(fleet)
        show(st)
        if all(m["fleet_state"] in ("retired", "aborted", "skipped") for m in st["members"]) or stop.wait(interval):
            return st
