"""The fleet file (TOML): which databases (or tenant schemas) a plan is rolled out to, and how.

    [fleet]      name, plan (a plan file, relative to this one), home (optional: the member whose
                 database keeps the fleet's own state; default the first canary)
    [[members]]  name, dsn          -- a libpq string or URL, or "service=NAME"
    [discover]   dsn, query         -- or: a query on a catalog database returning (name, dsn)
    [tenants]    dsn, schemas       -- or: one member per schema LIKE `schemas` in one database
    [rollout]    canary, wave_size, concurrency, per_server, bake, stop_on, skip_refused

Exactly one of [[members]], [discover] and [tenants]. A password is never taken from the file
(nor printed): it comes from the environment, ~/.pgpass or a service file, as libpq finds it.
Every problem of the file is reported at once (exit 2), each naming its key. No database is read
here; the members of [discover] and [tenants] are found by mover/fleet/members.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from mover.db import dsn_problem
from mover.errors import PlanError, combined
from mover.plan import parse_duration_ms, read_toml

# Kept apart in a name: a member's name joins the plan's in its migration's name (tenants).
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}$")
STOP_ON = ("refusal", "failure", "divergence", "governor_floor", "unreachable")
FILE_HINT = "fix each of them, then `mover fleet check FLEET` again"


@dataclass(frozen=True)
class Member:
    """One database of the fleet (or one tenant schema in a database: `schema`)."""

    name: str
    dsn: str
    schema: str | None = None


@dataclass(frozen=True)
class Discover:
    dsn: str
    query: str


@dataclass(frozen=True)
class Tenants:
    dsn: str
    schemas: str  # a LIKE pattern


@dataclass(frozen=True)
class Rollout:
    canary: tuple[str, ...] = ()
    wave_size: int = 10
    concurrency: int = 4  # members in flight at once, over the whole fleet
    per_server: int = 2  # members in flight at once on one server (host:port)
    bake_ms: int = 0  # between two waves: time for the last wave's members to show trouble
    stop_on: tuple[str, ...] = STOP_ON
    skip_refused: bool = False


@dataclass(frozen=True)
class FleetFile:
    name: str
    path: Path
    plan: Path
    rollout: Rollout
    members: tuple[Member, ...] = ()
    discover: Discover | None = None
    tenants: Tenants | None = None
    home: str | None = None


def load_fleet(path: str | Path) -> FleetFile:
    path = Path(path)
    doc = read_toml(path, unreadable=f"cannot read fleet file {str(path)!r}",
                    invalid=f"fleet file {str(path)!r} is not valid TOML")
    return parse_fleet(doc, path)


class _Problems:
    def __init__(self, origin: str):
        self.origin = origin
        self.found: list[PlanError] = []

    def add(self, message: str, hint: str) -> None:
        self.found.append(PlanError(f"fleet {self.origin!r}: {message}", hint=hint))


def parse_fleet(doc: dict[str, Any], path: Path) -> FleetFile:
    """Every problem of the file in one PlanError (exit 2), none of it read from a database."""
    problems = _Problems(str(path))
    for section in doc:
        if section not in ("fleet", "members", "discover", "tenants", "rollout"):
            problems.add(f"unknown section [{section}]",
                         "known: [fleet], [[members]], [discover], [tenants], [rollout]")
    fleet = _table(doc, "fleet", problems, ("name", "plan", "home"))
    name = _string(fleet, "fleet", "name", problems, required=True)
    if name and not NAME.match(name):
        problems.add("[fleet] name must be 1-63 characters of letters, digits, '_', '.', '-'",
                     'e.g. name = "orders-bigint"')
    plan = _string(fleet, "fleet", "plan", problems, required=True)
    home = _string(fleet, "fleet", "home", problems)

    members = _members(doc.get("members"), problems)
    discover = tenants = None
    if "discover" in doc:
        d = _table(doc, "discover", problems, ("dsn", "query"))
        dsn, query = _dsn(d, "discover", problems), _string(d, "discover", "query", problems, required=True)
        if dsn is not None and query:
            discover = Discover(dsn=dsn, query=query)
    if "tenants" in doc:
        t = _table(doc, "tenants", problems, ("dsn", "schemas"))
        dsn, pattern = _dsn(t, "tenants", problems), _string(t, "tenants", "schemas", problems, required=True)
        if dsn is not None and pattern:
            tenants = Tenants(dsn=dsn, schemas=pattern)
    sources = [s for s in ("members", "discover", "tenants") if s in doc]
    if len(sources) != 1:
        problems.add(f"name the members one way: [[members]], [discover] or [tenants] (found "
                     f"{', '.join(sources) or 'none'})", "keep exactly one of them")

    rollout = _rollout(_table(doc, "rollout", problems, (
        "canary", "wave_size", "concurrency", "per_server", "bake", "stop_on", "skip_refused")), problems)
    names = {m.name for m in members}
    if members:
        for c in rollout.canary:
            if c not in names:
                problems.add(f"[rollout] canary names {c!r}, which is not a member",
                             f"members: {', '.join(sorted(names))}")
        if home is not None and home not in names:
            problems.add(f"[fleet] home names {home!r}, which is not a member", "name a member, or leave home out")
    if problems.found:
        raise combined(problems.found, hint=FILE_HINT)
    assert name is not None and plan is not None
    return FleetFile(name=name, path=path, plan=(path.parent / plan), rollout=rollout, members=tuple(members),
                     discover=discover, tenants=tenants, home=home)


def _table(doc: dict[str, Any], section: str, problems: _Problems, keys: tuple[str, ...]) -> dict[str, Any]:
    value = doc.get(section, {})
    if not isinstance(value, dict):
        problems.add(f"[{section}] must be a table", f"write [{section}] above its keys")
        return {}
    for key in value:
        if key not in keys:
            problems.add(f"unknown key [{section}] {key}", f"known: {', '.join(keys)}")
    return value


def _string(table: dict[str, Any], section: str, key: str, problems: _Problems, *,
            required: bool = False) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            problems.add(f"[{section}] {key} is missing", f'add {key} = "..."')
        return None
    if not isinstance(value, str) or not value.strip():
        problems.add(f"[{section}] {key} must be a non-empty string, got {value!r}", f'write {key} = "..."')
        return None
    return value


def _dsn(table: dict[str, Any], where: str, problems: _Problems) -> str | None:
    """A connection string without a password (one in the file would be printed, copied, committed)."""
    dsn = _string(table, where, "dsn", problems, required=True)
    if dsn is None:
        return None
    problem = dsn_problem(dsn)
    if problem:
        problems.add(f"[{where}] dsn is malformed: {problem}",
                     "write a libpq string (host=... dbname=...), a URL or service=NAME")
        return None
    if "password" in psycopg.conninfo.conninfo_to_dict(dsn):
        problems.add(f"[{where}] dsn holds a password",
                     "take it out; give it through PGPASSWORD, ~/.pgpass or a service file (PGSERVICEFILE)")
        return None
    return dsn


def _members(value: Any, problems: _Problems) -> list[Member]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.add("[members] must be an array of tables", "write [[members]] above each member's name and dsn")
        return []
    out: list[Member] = []
    seen: set[str] = set()
    for i, m in enumerate(value, 1):
        where = f"members #{i}"
        if not isinstance(m, dict):
            problems.add(f"[{where}] must be a table", "write [[members]] then name and dsn")
            continue
        for key in m:
            if key not in ("name", "dsn"):
                problems.add(f"unknown key [{where}] {key}", "known: name, dsn")
        name = _string(m, where, "name", problems, required=True)
        dsn = _dsn(m, where, problems)
        if name is None:
            continue
        if not NAME.match(name):
            problems.add(f"[{where}] name {name!r} must be 1-63 characters of letters, digits, '_', '.', '-'",
                         'e.g. name = "eu-1"')
        if name in seen:
            problems.add(f"member {name!r} is named twice", "give each member its own name")
        seen.add(name)
        if dsn is not None:
            out.append(Member(name=name, dsn=dsn))
    return out


def _rollout(r: dict[str, Any], problems: _Problems) -> Rollout:
    values: dict[str, Any] = {}
    canary = r.get("canary", [])
    if not isinstance(canary, list) or not all(isinstance(c, str) and c for c in canary):
        problems.add("[rollout] canary must be an array of member names", 'e.g. canary = ["eu-1"]')
    elif len(set(canary)) != len(canary):
        problems.add("[rollout] canary names a member twice", "name each canary once")
    else:
        values["canary"] = tuple(canary)
    for key in ("wave_size", "concurrency", "per_server"):
        if key in r:
            v = r[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                problems.add(f"[rollout] {key} must be a whole number of at least 1, got {v!r}", f"e.g. {key} = 4")
            else:
                values[key] = v
    if "bake" in r:
        try:
            values["bake_ms"] = parse_duration_ms(str(r["bake"]))
        except ValueError as exc:
            problems.add(f"[rollout] bake: {exc}", 'e.g. bake = "10min"')
    if "stop_on" in r:
        stop_on = r["stop_on"]
        if not isinstance(stop_on, list) or any(s not in STOP_ON for s in stop_on):
            problems.add(f"[rollout] stop_on must list some of {', '.join(STOP_ON)}, got {stop_on!r}",
                         'e.g. stop_on = ["failure", "divergence"]')
        else:
            values["stop_on"] = tuple(stop_on)
    if "skip_refused" in r:
        if not isinstance(r["skip_refused"], bool):
            problems.add("[rollout] skip_refused must be true or false", "e.g. skip_refused = true")
        else:
            values["skip_refused"] = r["skip_refused"]
    return Rollout(**values)
