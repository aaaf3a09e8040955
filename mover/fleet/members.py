"""The fleet's members as they are now: listed in the file, found by the [discover] query, or one per
tenant schema; each one reached (its server's host:port named, which the rollout's per-server
limit counts) and given its plan: the fleet's plan, or for a tenant the same plan with its tables
in the tenant's schema and its migration named `<plan name>.<schema>`.

Everything that keeps the fleet from starting is reported at once (exit 2), naming each member:
a discovery query that fails or returns a bad row, duplicate names, a canary or home that is no
member, a server down, credentials refused. Nothing is written anywhere here.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg

from mover import api
from mover.db import connect, mask, redact
from mover.errors import BadInput, PlanError, combined
from mover.fleet.file import FILE_HINT, NAME, FleetFile, Member
from mover.names import QualifiedName, parse_qualified
from mover.plan import Plan, parse_plan, read_toml
from mover.sql import trusted

CONNECT_TIMEOUT = 5  # seconds: a member that does not answer in that time is named unreachable


@dataclass(frozen=True)
class Placed:
    """A member with where it runs and what: its server (host:port), its wave (0: a canary), its
    migration's plan."""

    member: Member
    server: str
    wave: int
    plan: Plan

    @property
    def name(self) -> str:
        return self.member.name

    @property
    def dsn(self) -> str:
        return self.member.dsn

    @property
    def migration(self) -> str:
        return self.plan.name


def plan_document(fleet: FleetFile) -> tuple[dict[str, Any], str]:
    """The fleet's plan as a TOML document, checked once (every member's plan derives from it), and
    its hash: the fleet refuses a plan changed under it, as a migration does."""
    doc = read_toml(fleet.plan, unreadable=f"fleet {fleet.name!r}: cannot read its plan {str(fleet.plan)!r}",
                    invalid=f"plan {str(fleet.plan)!r} is not valid TOML",
                    hint="[fleet] plan is relative to the fleet file")
    plan = parse_plan(doc, origin=str(fleet.plan))
    digest = hashlib.sha256(json.dumps(plan.canonical(), sort_keys=True, default=str).encode()).hexdigest()[:16]
    return doc, digest


def tenant_plan(doc: dict[str, Any], schema: str, origin: str) -> Plan:
    """The plan for one tenant schema: every table it names (source, target, old table, [[also]])
    in that schema, and the migration named `<name>.<schema>` (unique in the shared database)."""
    doc = json.loads(json.dumps(doc))  # a deep copy: each tenant its own

    def move(table: dict[str, Any], key: str) -> None:
        if isinstance(table.get(key), str):
            table[key] = str(QualifiedName(schema, parse_qualified(table[key]).name))

    migration = doc.setdefault("migration", {})
    name = f"{migration.get('name', '')}.{schema}"
    if not NAME.match(name):
        raise PlanError(f"tenant schema {schema!r}: the migration name {name!r} is not 1-63 letters, digits, '_', "
                        f"'.', '-'", hint="shorten [migration] name, or rename the schema")
    migration["name"] = name
    move(migration, "source")
    move(doc.get("target", {}), "name")
    move(doc.get("rollback", {}), "old_name")
    for also in doc.get("also", []):
        move(also, "source")
        move(also, "name")
    return parse_plan(doc, origin=f"{origin} for schema {schema}")


def resolve(fleet: FleetFile) -> list[Placed]:
    """The members, each reached, in waves; BadInput naming every member that keeps the fleet from
    starting (or a PlanError for the plan itself)."""
    doc, _ = plan_document(fleet)
    members = _listed(fleet)
    names = [m.name for m in members]
    problems = [PlanError(f"member {n!r} is named twice", hint="give each member its own name")
                for n in sorted({n for n in names if names.count(n) > 1})]
    known = set(names)
    problems += [PlanError(f"[rollout] canary names {c!r}, which is not a member",
                           hint=f"members: {', '.join(sorted(known)[:20])}")
                 for c in fleet.rollout.canary if c not in known]
    if fleet.home is not None and fleet.home not in known:
        problems.append(PlanError(f"[fleet] home names {fleet.home!r}, which is not a member",
                                  hint="name a member, or leave home out"))
    if problems:
        raise combined(problems, hint=FILE_HINT)
    servers = reach(members)
    waves = assign_waves(names, fleet.rollout.canary, fleet.rollout.wave_size)
    placed = []
    for m in members:
        plan = parse_plan(doc, origin=str(fleet.plan)) if m.schema is None else tenant_plan(doc, m.schema,
                                                                                           str(fleet.plan))
        placed.append(Placed(member=m, server=servers[m.name], wave=waves[m.name], plan=plan))
    return placed


def assign_waves(names: list[str], canary: tuple[str, ...], wave_size: int) -> dict[str, int]:
    """Wave 0: the canaries (by default the first member); then the others in order, `wave_size` a wave."""
    first = list(canary) or names[:1]
    rest = [n for n in names if n not in first]
    waves = {n: 0 for n in first}
    waves.update({n: 1 + i // wave_size for i, n in enumerate(rest)})
    return waves


def home_of(fleet: FleetFile, placed: list[Placed]) -> Placed:
    """The member whose database keeps the fleet's own state: [fleet] home, else the first canary."""
    by_name = {p.name: p for p in placed}
    if fleet.home is not None:
        return by_name[fleet.home]
    return min(placed, key=lambda p: (p.wave, [q.name for q in placed].index(p.name)))


def _listed(fleet: FleetFile) -> list[Member]:
    if fleet.discover is not None:
        return _discovered(fleet)
    if fleet.tenants is not None:
        return _tenants(fleet)
    return list(fleet.members)


def _discovered(fleet: FleetFile) -> list[Member]:
    """[discover]: the query's rows, (name, dsn) each, as [[members]] would list them."""
    assert fleet.discover is not None
    where = f"fleet {fleet.name!r}: [discover]"
    try:
        with connect(fleet.discover.dsn, role="mover-fleet", connect_timeout=CONNECT_TIMEOUT) as conn:
            rows = conn.execute(trusted(fleet.discover.query, "fleet discover")).fetchall()
    except psycopg.Error as exc:
        raise BadInput(f"{where} query failed on {redact(fleet.discover.dsn)}: {mask(str(exc).strip())}",
                       hint="fix [discover] dsn or query (it returns name, dsn)") from exc
    problems: list[PlanError] = []
    members = []
    for i, row in enumerate(rows, 1):
        if len(row) < 2 or not isinstance(row[0], str) or not isinstance(row[1], str):
            problems.append(PlanError(f"{where} row {i} is not (name text, dsn text)", hint="fix the query"))
            continue
        name, dsn = row[0], row[1]
        if not NAME.match(name):
            problems.append(PlanError(f"{where} member name {name!r} is not 1-63 letters, digits, '_', '.', '-'",
                                      hint="fix the catalog, or the query"))
        elif "password" in _conninfo(dsn):
            problems.append(PlanError(f"{where} member {name!r}: its dsn holds a password",
                                      hint="give passwords through ~/.pgpass or a service file"))
        else:
            members.append(Member(name=name, dsn=dsn))
    if not rows:
        problems.append(PlanError(f"{where} query returned no members", hint="fix the query or the catalog"))
    if problems:
        raise combined(problems, hint=FILE_HINT)
    return members


def _tenants(fleet: FleetFile) -> list[Member]:
    """[tenants]: one member per schema matching the pattern, named by the schema."""
    assert fleet.tenants is not None
    try:
        with connect(fleet.tenants.dsn, role="mover-fleet", connect_timeout=CONNECT_TIMEOUT) as conn:
            schemas = [r[0] for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s ORDER BY nspname",
                (fleet.tenants.schemas,)).fetchall()]
    except psycopg.Error as exc:
        raise BadInput(f"fleet {fleet.name!r}: cannot list the tenant schemas on {redact(fleet.tenants.dsn)}: "
                       f"{mask(str(exc).strip())}", hint="check [tenants] dsn and that the server is up") from exc
    if not schemas:
        raise BadInput(f"fleet {fleet.name!r}: no schema matches {fleet.tenants.schemas!r}",
                       hint="fix [tenants] schemas (a LIKE pattern, e.g. \"tenant_%\")")
    bad = [s for s in schemas if not NAME.match(s)]
    if bad:
        raise BadInput(f"fleet {fleet.name!r}: tenant schemas {', '.join(repr(s) for s in bad)} cannot name members",
                       hint="members are named by their schema: 1-63 letters, digits, '_', '.', '-'")
    return [Member(name=s, dsn=fleet.tenants.dsn, schema=s) for s in schemas]


def _conninfo(dsn: str) -> dict[str, Any]:
    try:
        return psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return {}


def reach(members: list[Member]) -> dict[str, str]:
    """Each member's server (host:port, as libpq reached it: a service name resolved); BadInput
    naming every member that cannot be reached (down, credentials refused, no such database)."""
    dsns = sorted({m.dsn for m in members})
    with ThreadPoolExecutor(max_workers=min(16, len(dsns) or 1)) as pool:
        found = dict(zip(dsns, pool.map(server_of, dsns), strict=True))
    problems = [PlanError(f"member {m.name!r} ({redact(m.dsn)}): {found[m.dsn]}",
                          hint="start its server, or fix its dsn, ~/.pgpass or service file")
                for m in members if found[m.dsn].startswith("unreachable")]
    if problems:
        raise combined(problems, hint="fix each of them (or take the member out of the fleet), then run the "
                                      "same command again; nothing was started")
    return {m.name: found[m.dsn] for m in members}


def server_of(dsn: str) -> str:
    """host:port of the server `dsn` reaches, or "unreachable: why"."""
    try:
        with psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT, autocommit=True) as conn:
            host = conn.info.host if not conn.info.host.startswith("/") else "local"
            return f"{host}:{conn.info.port}"
    except psycopg.Error as exc:
        return "unreachable: " + mask(" ".join(str(exc).split()))


def home_dsn(fleet: FleetFile) -> str:
    """The home database's DSN without reaching every member (`fleet status` must answer while
    some are down): [fleet] home, else the first canary, else the first member."""
    if fleet.tenants is not None:
        return fleet.tenants.dsn
    listed = _listed(fleet)
    by_name = {m.name: m for m in listed}
    name = fleet.home or (fleet.rollout.canary[0] if fleet.rollout.canary else listed[0].name)
    if name not in by_name:
        raise BadInput(f"fleet {fleet.name!r}: its home {name!r} is not a member", hint="fix [fleet] home or canary")
    return by_name[name].dsn


def init(fleet: FleetFile) -> dict[str, str]:
    """`mover fleet init`: mover's control schema on every member's database (each once: tenants
    share theirs); the revision in force, by member."""
    members = _listed(fleet)
    reach(members)
    done: dict[str, str] = {}
    for dsn in dict.fromkeys(m.dsn for m in members):
        done[dsn] = api.init(dsn)
    return {m.name: done[m.dsn] for m in members}
