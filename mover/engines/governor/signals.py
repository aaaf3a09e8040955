"""What the governor (mover/engines/governor/throttle.py) reads from the server: the probe (a one-row write
and commit on mover.throttle, timed), and the guards' views (standbys, replication slots, the
archiver, the WAL position, the application's sessions: busy, or quiet for how long). Server statistics only: nothing
here asks the application anything.

Invariants:
- The probe is one transaction with synchronous_commit on, sent in one round trip (a pipeline:
  BEGIN, its SET LOCALs, the UPDATE, COMMIT), on a connection of its own: its time is a write
  and a WAL flush on the server, as the application's commits pay them, plus one round trip.
- Every reading is a plain read of statistics views, in one short transaction under SET LOCAL
  timeouts. A view this role may not read in full (pg_stat_replication without
  pg_read_all_stats) is said so, never read as "no standby".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from mover.db import one
from mover.engines.capture import logical
from mover.engines.governor.pacing import Archiver, Slot, Standby

PROBE_STATEMENT_TIMEOUT = "2s"  # a probe this slow is read as this slow: the engines back off hard


@dataclass(frozen=True)
class Application:
    """The application's sessions as pg_stat_activity shows them, server-wide (mover's own sessions
    and this one left out): what the governor protects, if anything. Another role's sessions
    show no state without pg_read_all_stats: those are `hidden`, and count as busy."""

    active: int = 0  # running a statement now
    quiet_for: float | None = None  # seconds since the latest statement of an idle session ended; None: none
    hidden: int = 0  # sessions whose state this role cannot read
    busiest: tuple[str, ...] = ()  # the application names (or roles) of the latest ones, up to three

    def busy(self, idle_after_s: float) -> str | None:
        """What makes the application present with `idle_after_s` as its quiet window, as status
        says it, or None: nothing to protect. A window of 0: always present (govern an idle server)."""
        who = f" ({', '.join(self.busiest)})" if self.busiest else ""
        if idle_after_s <= 0:
            return "governed whether or not the application is busy ([throttle] idle_after = \"0s\")"
        if self.hidden:
            return (f"{self.hidden} session(s) of other roles whose activity this role cannot read (GRANT "
                    f"pg_read_all_stats): counted as busy")
        if self.active:
            return f"{self.active} application session(s) running a statement{who}"
        if self.quiet_for is not None and self.quiet_for < idle_after_s:
            return f"the application ran a statement {self.quiet_for:.1f} s ago{who}"
        return None

    def quiet(self, idle_after_s: float) -> str:
        """Why nothing needs protecting (busy() is None), as status says it."""
        since = "" if self.quiet_for is None else f" for {self.quiet_for:.0f} s"
        return (f"no application session has run a statement{since} (quiet over {idle_after_s:g} s: "
                f"[throttle] idle_after)")


def session_names(latest: list[str | None] | None) -> tuple[str, ...]:
    """The latest application sessions' names, each once. A session PostgreSQL 18 shows while it
    authenticates has no role yet: its pid names it, and a name still missing is left out."""
    return tuple(dict.fromkeys(str(name) for name in latest or () if name))


@dataclass(frozen=True)
class Readings:
    """One look at the server, at `at` (monotonic seconds)."""

    at: float
    lsn: int  # pg_current_wal_lsn() as bytes from 0/0
    standbys: tuple[Standby, ...] = ()
    standbys_visible: bool = True  # False: this role cannot read pg_stat_replication's columns
    slots: tuple[Slot, ...] = ()
    keep_size: int = -1  # max_slot_wal_keep_size in bytes; -1: unlimited
    archiver: Archiver | None = None
    sessions: dict[str, int] = field(default_factory=dict)  # active application sessions by what they wait on
    own: logical.SlotHealth | None = None  # the migration's own slot (logical capture), as `mover status` reads it
    application: Application = field(default_factory=Application)

    @property
    def own_slots(self) -> frozenset[str]:
        """The slots the migration's own capture consumes (its logical capture's, while installed)."""
        return frozenset({self.own.slot}) if self.own is not None and self.own.exists else frozenset()

    def as_dict(self) -> dict[str, Any]:
        """For the status and plan check (JSON)."""
        a = self.archiver
        return {
            "standbys": [{"name": s.name, "state": s.state, "replay_lag_s": s.replay_lag_s} for s in self.standbys],
            "standbys_visible": self.standbys_visible,
            "slots": [{"name": s.name, "type": s.kind, "active": s.active, "wal_status": s.wal_status,
                       "retained_bytes": s.retained, "safe_wal_size": s.safe_wal_size} for s in self.slots],
            "max_slot_wal_keep_size": self.keep_size,
            "archiver": None if a is None else {
                "archive_mode": a.mode, "last_archived_wal": a.archived_wal, "current_wal": a.current_wal,
                "last_failed_wal": a.failed_wal,
                "failing": bool(a.failed_at and (a.archived_at is None or a.failed_at > a.archived_at))},
            "application_sessions": self.sessions,
            "application": {"active": self.application.active, "quiet_for_s": self.application.quiet_for,
                            "hidden": self.application.hidden, "latest": list(self.application.busiest)},
            "own_slot": None if self.own is None else self.own.as_dict(),
        }


_SIZE_UNITS = {"B": 1, "kB": 1024, "8kB": 8192, "MB": 1024**2, "GB": 1024**3}


def _setting_bytes(value: str, unit: str | None) -> int:
    n = int(value)
    return n if n < 0 else n * _SIZE_UNITS.get(unit or "B", 1)


def read(cur: psycopg.Cursor, mid: int | None = None) -> Readings:
    """The guards' view of the server, in the caller's transaction (on the primary); with `mid`,
    that migration's own slot as logical capture reads it (mover/engines/capture/logical.py health: the
    WAL it retains and its wal_status, the same figures `mover status` shows), in place of its
    row of pg_replication_slots."""
    at = time.monotonic()
    cur.execute(
        "SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), '0/0')::bigint,"
        " pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()),"
        " pg_catalog.current_setting('archive_mode'),"
        " (SELECT setting FROM pg_catalog.pg_settings WHERE name OPERATOR(pg_catalog.=) 'max_slot_wal_keep_size'),"
        " (SELECT unit FROM pg_catalog.pg_settings WHERE name OPERATOR(pg_catalog.=) 'max_slot_wal_keep_size'),"
        " (SELECT setting FROM pg_catalog.pg_settings WHERE name OPERATOR(pg_catalog.=) 'wal_segment_size'),"
        " (SELECT unit FROM pg_catalog.pg_settings WHERE name OPERATOR(pg_catalog.=) 'wal_segment_size'),"
        " pg_catalog.pg_has_role('pg_read_all_stats', 'MEMBER')"
        "   OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user)")
    lsn, current_wal, mode, keep, keep_unit, seg, seg_unit, visible = one(cur)
    cur.execute("SELECT application_name, pg_catalog.host(client_addr), state,"
                " extract(epoch FROM replay_lag)::float8 FROM pg_catalog.pg_stat_replication ORDER BY pid")
    standbys = tuple(Standby(f"{app or '?'} ({addr or 'local'})", state, lag)
                     for app, addr, state, lag in cur.fetchall())
    cur.execute("SELECT slot_name, slot_type, active, wal_status,"
                " CASE WHEN restart_lsn IS NOT NULL"
                "  THEN pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn)::bigint END,"
                " safe_wal_size FROM pg_catalog.pg_replication_slots ORDER BY slot_name")
    slots = tuple(Slot(name, kind, bool(active), status, retained, safe)
                  for name, kind, active, status, retained, safe in cur.fetchall())
    archiver = None
    if mode in ("on", "always"):
        cur.execute("SELECT last_archived_wal, last_archived_time, last_failed_wal, last_failed_time"
                    " FROM pg_catalog.pg_stat_archiver")
        archived, archived_at, failed, failed_at = one(cur)
        archiver = Archiver(mode, current_wal, _setting_bytes(seg, seg_unit), archived, archived_at, failed, failed_at)
    cur.execute("SELECT coalesce(wait_event_type, 'CPU'), count(*)::int FROM pg_catalog.pg_stat_activity"
                " WHERE backend_type OPERATOR(pg_catalog.=) 'client backend' AND state OPERATOR(pg_catalog.=) 'active'"
                " AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()"
                " AND application_name OPERATOR(pg_catalog.!~) '^mover[^:]*:' GROUP BY 1 ORDER BY 1")
    sessions = {str(kind): int(n) for kind, n in cur.fetchall()}
    # Every session on the server, not only this database's: they share its WAL, disks and cores.
    # state 'disabled' (track_activities off) says nothing either: counted with the hidden ones.
    cur.execute(
        "SELECT count(*) FILTER (WHERE state IS NULL OR state OPERATOR(pg_catalog.=) 'disabled')::int,"
        " count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'active')::int,"
        " min(extract(epoch FROM pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) state_change))"
        "   FILTER (WHERE state OPERATOR(pg_catalog.<>) 'active' AND state OPERATOR(pg_catalog.<>) 'disabled')::float8,"
        " (pg_catalog.array_agg(coalesce(nullif(application_name, ''), usename::text,"
        "                                'pid ' OPERATOR(pg_catalog.||) pid::text)"
        "   ORDER BY state_change DESC)"
        "   FILTER (WHERE state IS NOT NULL))[1:3]"
        " FROM pg_catalog.pg_stat_activity WHERE backend_type OPERATOR(pg_catalog.=) 'client backend'"
        " AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()"
        " AND application_name OPERATOR(pg_catalog.!~) '^mover[^:]*:'")
    hidden, active, quiet_for, latest = one(cur)
    application = Application(active=active, quiet_for=quiet_for, hidden=hidden, busiest=session_names(latest))
    own = logical.health(cur, mid) if mid is not None else None
    if own is not None and own.exists:
        slots = tuple(s for s in slots if s.name != own.slot) + (
            Slot(own.slot, "logical", own.active_pid is not None, own.wal_status, own.retained_bytes,
                 own.safe_wal_size),)
    return Readings(at, int(lsn), standbys, bool(visible), slots, _setting_bytes(keep, keep_unit), archiver,
                    sessions, own, application)


def probe(conn: psycopg.Connection, write: Callable[[psycopg.Cursor], None]) -> tuple[float, bool]:
    """The probe: `write` (the governor row's update, mover/state/throttle.py publish) in one
    transaction that commits with synchronous_commit on, sent as one pipeline and timed from the
    first byte sent to the commit's answer. Returns (milliseconds, whether the last statement of
    `write` changed a row: read after the commit, so that nothing waits in between). A probe that
    times out is read as PROBE_STATEMENT_TIMEOUT."""
    started = time.perf_counter()
    try:
        with conn.cursor() as cur:
            with conn.pipeline(), conn.transaction():
                cur.execute("SELECT pg_catalog.set_config('statement_timeout', %s, true),"
                            " pg_catalog.set_config('lock_timeout', %s, true),"
                            " pg_catalog.set_config('synchronous_commit', 'on', true)",
                            (PROBE_STATEMENT_TIMEOUT, PROBE_STATEMENT_TIMEOUT))
                write(cur)
            return (time.perf_counter() - started) * 1000, cur.rowcount > 0
    except psycopg.errors.QueryCanceled:
        return float(PROBE_STATEMENT_TIMEOUT.rstrip("s")) * 1000, True
