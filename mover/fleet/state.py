"""The fleet's own state, in its home database's control schema (alembic revision 0012): the fleet's
row, one row per member, the fleet's events. The only code that writes them.

What a member's migration does is recorded where it runs, as for any migration; these rows say
where the fleet has taken each member (its wave, its state), how far the rollout and the cutover
got (run_wave, cutover_wave: a member is never cut over before its wave was reached), what
stopped the rollout and why, and who did what. The fleet runner holds a lease on the fleet's row
(owner, expiry, heartbeat), as a migration's orchestrator does on its own: two runners at once
are refused, and one killed is taken over by the next, here at once (its process is gone) or
elsewhere when the lease runs out.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from mover.db import mask, one
from mover.errors import BadInput, LeaseHeld, NotFound
from mover.state.control import LEASE_SECONDS, process_alive

MEMBER_STATES = ("pending", "checked", "running", "at_gate", "cut_over", "rolled_back", "retired", "aborted",
                 "skipped", "failed", "unreachable")
# A member in one of these is past the rollout's reach: the run leaves it alone.
SETTLED = ("at_gate", "cut_over", "retired", "aborted", "skipped")


@dataclass(frozen=True)
class MemberRow:
    name: str
    position: int
    wave: int
    server: str
    migration: str
    dsn: str
    state: str
    detail: str | None
    updated_at: datetime


@dataclass(frozen=True)
class FleetRow:
    name: str
    plan_hash: str
    run_wave: int
    cutover_wave: int
    wave_done_at: datetime | None
    stopped_reason: str | None
    stopped_member: str | None
    stopped_message: str | None
    stopped_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    members: tuple[MemberRow, ...]

    @property
    def waves(self) -> int:
        return 1 + max((m.wave for m in self.members), default=0)


def find(cur: psycopg.Cursor, name: str) -> FleetRow | None:
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT name, plan_hash, run_wave, cutover_wave, wave_done_at, stopped_reason, stopped_member,"
                     " stopped_message, stopped_at, lease_owner, lease_expires_at FROM mover.fleets WHERE name = %s",
                     (name,))
        row = dcur.fetchone()
        if row is None:
            return None
        dcur.execute("SELECT name, position, wave, server, migration, dsn, state, detail, updated_at"
                     " FROM mover.fleet_members WHERE fleet = %s ORDER BY position", (name,))
        members = tuple(MemberRow(**r) for r in dcur.fetchall())
    return FleetRow(**row, members=members)


def get(cur: psycopg.Cursor, name: str) -> FleetRow:
    fleet = find(cur, name)
    if fleet is None:
        raise NotFound(f"fleet {name!r} is not recorded in its home database",
                       hint="`mover fleet check FLEET` or `mover fleet run FLEET` records it")
    return fleet


def record(cur: psycopg.Cursor, name: str, plan_hash: str, members: list[dict[str, Any]], actor: str) -> FleetRow:
    """The fleet's row and its members' (each: name, wave, server, migration, dsn), made on first
    use; after that the same members and plan, or BadInput naming what changed (nothing written)."""
    existing = find(cur, name)
    if existing is None:
        cur.execute("INSERT INTO mover.fleets (name, plan_hash) VALUES (%s, %s)", (name, plan_hash))
        for i, m in enumerate(members):
            cur.execute("INSERT INTO mover.fleet_members (fleet, name, position, wave, server, migration, dsn)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                        (name, m["name"], i, m["wave"], m["server"], m["migration"], mask(m["dsn"])))
        waves = 1 + max(m["wave"] for m in members)
        event(cur, name, actor, None, "recorded",
              f"fleet {name!r} recorded: {len(members)} members in {waves} waves (wave 0: the canaries)",
              {"members": len(members), "waves": waves})
        return get(cur, name)
    if existing.plan_hash != plan_hash:
        raise BadInput(f"fleet {name!r}: its plan changed since the fleet was recorded",
                       hint="put the plan back as it was; a changed plan is a new fleet (another [fleet] name)")
    before = {m.name: m for m in existing.members}
    now = {m["name"]: m for m in members}
    added, gone = sorted(now.keys() - before.keys()), sorted(before.keys() - now.keys())
    moved = sorted(n for n in now.keys() & before.keys() if now[n]["wave"] != before[n].wave)
    if added or gone or moved:
        parts = [f"{what}: {', '.join(names)}" for what, names in
                 (("new members", added), ("members gone", gone), ("members in another wave", moved)) if names]
        raise BadInput(f"fleet {name!r}: its members changed since the fleet was recorded ({'; '.join(parts)})",
                       hint="put the fleet file back as it was; a changed fleet is a new fleet (another [fleet] name)")
    return existing


def event(cur: psycopg.Cursor, fleet: str, actor: str, member: str | None, kind: str, message: str,
          detail: dict[str, Any] | None = None) -> None:
    cur.execute("INSERT INTO mover.fleet_events (fleet, actor, member, kind, message, detail)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (fleet, actor, member, kind, mask(message), json.dumps(detail, default=str) if detail else None))


def events(cur: psycopg.Cursor, fleet: str, limit: int = 100) -> list[dict[str, Any]]:
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT * FROM (SELECT id, at, actor, member, kind, message, detail FROM mover.fleet_events"
                     " WHERE fleet = %s ORDER BY id DESC LIMIT %s) e ORDER BY id", (fleet, limit))
        return dcur.fetchall()


def set_member(cur: psycopg.Cursor, fleet: str, member: str, state: str, actor: str, *,
               detail: str | None = None, message: str | None = None) -> None:
    """A member's new state (and why), with its event when there is something to say."""
    cur.execute("UPDATE mover.fleet_members SET state = %s, detail = %s, updated_at = now()"
                " WHERE fleet = %s AND name = %s", (state, mask(detail) if detail else None, fleet, member))
    if cur.rowcount != 1:
        raise NotFound(f"fleet {fleet!r} has no member {member!r}", hint=f"`mover fleet status {fleet}`")
    if message is not None:
        event(cur, fleet, actor, member, state, message, {"detail": detail} if detail else None)


def reach_wave(cur: psycopg.Cursor, fleet: str, column: str, wave: int, actor: str, message: str) -> None:
    """run_wave or cutover_wave moves on to `wave` (never back: a wave once reached stays reached)."""
    assert column in ("run_wave", "cutover_wave")
    cur.execute(sql.SQL("UPDATE mover.fleets SET {c} = greatest({c}, %s), updated_at = now() WHERE name = %s").format(
        c=sql.Identifier(column)), (wave, fleet))
    event(cur, fleet, actor, None, column.replace("_wave", "_wave_started"), message, {"wave": wave})


def lower_cutover_wave(cur: psycopg.Cursor, fleet: str, wave: int) -> None:
    """After a rollback of wave `wave`: the cutover has reached the wave before it only."""
    cur.execute("UPDATE mover.fleets SET cutover_wave = least(cutover_wave, %s), updated_at = now()"
                " WHERE name = %s", (wave - 1, fleet))


def wave_done(cur: psycopg.Cursor, fleet: str, actor: str, what: str, wave: int) -> None:
    cur.execute("UPDATE mover.fleets SET wave_done_at = now(), updated_at = now() WHERE name = %s", (fleet,))
    event(cur, fleet, actor, None, "wave_done", f"wave {wave}: every member {what}", {"wave": wave})


def seconds_since_wave_done(cur: psycopg.Cursor, fleet: str) -> float | None:
    cur.execute("SELECT extract(epoch FROM now() - wave_done_at) FROM mover.fleets WHERE name = %s", (fleet,))
    value = one(cur)[0]
    return None if value is None else float(value)


def stopped(cur: psycopg.Cursor, fleet: str, actor: str, reason: str, member: str | None, message: str) -> None:
    """What stopped the rollout, kept until a later command gets past it."""
    cur.execute("UPDATE mover.fleets SET stopped_reason = %s, stopped_member = %s, stopped_message = %s,"
                " stopped_at = now(), updated_at = now() WHERE name = %s", (reason, member, mask(message), fleet))
    event(cur, fleet, actor, member, "stopped", message, {"reason": reason})


def clear_stop(cur: psycopg.Cursor, fleet: str) -> None:
    cur.execute("UPDATE mover.fleets SET stopped_reason = NULL, stopped_member = NULL, stopped_message = NULL,"
                " stopped_at = NULL WHERE name = %s", (fleet,))


# ---------------------------------------------------------------------------------------------
# The fleet runner's lease


def take_lease(cur: psycopg.Cursor, fleet: str, owner: str, command: str) -> None:
    """Take the fleet's lease if free, expired, ours, or held by a dead process on this host; else
    LeaseHeld (exit 3, as for a second orchestrator of a migration)."""
    host, pid = socket.gethostname(), os.getpid()
    cur.execute("SELECT lease_owner, lease_host, lease_pid, lease_expires_at > clock_timestamp()"
                " FROM mover.fleets WHERE name = %s FOR UPDATE", (fleet,))
    holder, holder_host, holder_pid, live = one(cur)
    if holder is not None and holder != owner and live:
        if not (holder_host == host and holder_pid is not None and not process_alive(holder_pid)):
            raise LeaseHeld(f"fleet {fleet!r} is being run by {holder} (host {holder_host}, pid {holder_pid})",
                            hint=f"wait for it to finish, or stop that process; its lease expires {LEASE_SECONDS}s "
                                 f"after its last heartbeat")
    cur.execute("UPDATE mover.fleets SET lease_owner = %s, lease_host = %s, lease_pid = %s,"
                " lease_expires_at = clock_timestamp() + make_interval(secs => %s), heartbeat_at = clock_timestamp()"
                " WHERE name = %s", (owner, host, pid, LEASE_SECONDS, fleet))
    if holder is not None and holder != owner:
        how = "its process is gone" if live else "its lease expired"
        event(cur, fleet, owner, None, "lease_taken_over",
              f"process {holder_pid} on {holder_host} ended without finishing ({how}); {owner} took over",
              {"previous": holder})
    event(cur, fleet, owner, None, "command", f"`mover fleet {command}` started by {owner}", {"command": command})


def heartbeat(cur: psycopg.Cursor, fleet: str, owner: str) -> bool:
    cur.execute("UPDATE mover.fleets SET lease_expires_at = clock_timestamp() + make_interval(secs => %s),"
                " heartbeat_at = clock_timestamp() WHERE name = %s AND lease_owner = %s", (LEASE_SECONDS, fleet, owner))
    return cur.rowcount == 1


def release_lease(cur: psycopg.Cursor, fleet: str, owner: str) -> None:
    cur.execute("UPDATE mover.fleets SET lease_owner = NULL, lease_host = NULL, lease_pid = NULL,"
                " lease_expires_at = NULL WHERE name = %s AND lease_owner = %s", (fleet, owner))
