"""The target's and the old table's names: in the source's schema, all three different, free; and
every other name mover derives for a migration (indexes, statistics, change logs, functions,
triggers, logical capture's publication and slot): free too, checked by plan check and at
registration, not found taken after the whole copy (issue 34)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from mover import names
from mover.catalog import introspect
from mover.checks.subject import Subject
from mover.db import one
from mover.engines.bulk import builds
from mover.engines.partitioning import partitions
from mover.engines.swap import metadata
from mover.errors import PlanError
from mover.names import QualifiedName
from mover.plan import Plan
from mover.sql import capture as capture_sql
from mover.state import control


def _sibling(source: QualifiedName, name: QualifiedName | None, key: str, suffix: str) -> QualifiedName:
    assert source.schema is not None
    if name is None:
        return QualifiedName(source.schema, names.derived(source.name, suffix))
    if name.schema is None:
        name = name.with_schema(source.schema)
    if name.schema != source.schema:
        raise PlanError(f"{key}: {name} must be in the source's schema {names.display_ident(source.schema)}",
                        hint="the swap renames tables within one schema")
    return name


def resolve(s: Subject) -> None:
    source = s.src
    target = old = None
    try:
        target = _sibling(source, s.plan.target, "[target] name", "_new")
    except PlanError as exc:
        s.report(exc)
    old = _sibling(source, s.plan.rollback.old_name, "[rollback] old_name", "_old")
    if target is None:
        return
    if len({target, old, source}) < 3:
        raise PlanError(f"source {source}, target {target} and old name {old} must all differ",
                        hint="set [target] name and [rollback] old_name to two new names")
    s.target, s.old = target, old


def not_being_moved(s: Subject) -> None:
    # Another migration of the same source first: its target explains why a name is taken.
    other = control.active_on_source(s.cur, s.src) if control.schema_ready(s.cur) else None
    if other is not None and other.name != s.plan.name:
        other = control.as_one(control.family(s.cur, other))  # a table of several: its migration
        if other.name != s.plan.name:
            # Only commands that work where it stands (after its cutover, abort does not).
            raise PlanError(f"table {s.src} is already being moved by migration {other.name!r}",
                            hint=f"{control.ways_out(other)} first")


def free(s: Subject) -> None:
    assert s.old is not None
    for name, key in ((s.new, "[target] name"), (s.old, "[rollback] old_name")):
        if introspect.exists(s.cur, name):
            s.report(PlanError(f"{key}: {name} already exists", hint="choose another name or drop that table"))
            continue
        # A table brings a row type of its own name: an enum or a domain of that name blocks it too.
        s.cur.execute("SELECT EXISTS (SELECT 1 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
                      " WHERE n.nspname = %s AND t.typname = %s)", (name.schema, name.name))
        if one(s.cur)[0]:
            s.report(PlanError(f"{key}: {name} already exists as a type",
                               hint="choose another name or drop that type"))


@dataclass(frozen=True)
class Derived:
    """A name mover gives an object it creates for a migration (as plan check prints it)."""
    kind: str  # index | table | function | trigger | statistics | publication | slot
    name: QualifiedName  # schema-qualified, but a trigger's (on `table`), a publication's, a slot's
    why: str  # what mover makes under that name, for the message
    table: QualifiedName | None = None  # the table a trigger is on


def derived(cur: psycopg.Cursor, m: control.Migration, plan: Plan) -> list[Derived]:
    """Every name mover creates an object under for migration `m` (its table's `plan`) besides the
    target and the old table (free() checks those): the target's key index, the deferred indexes
    and statistics (all per migration id: `<name>_m<id>`), a partitioned target's partitions'
    indexes, the change logs with their indexes, the capture functions and trigger, the
    notes, and logical capture's feed table, publication and slot."""
    out: list[Derived] = []
    schema = m.target.schema
    assert schema is not None and m.source.schema is not None
    info = introspect.describe(cur, m.source)
    parts = [] if plan.new_layout is None else \
        partitions.layout(cur, plan.new_layout, m.source, m.source.name, schema).partitions
    # (the partitions' own names: checks/partitioning.py)
    for ix in info.indexes:
        if ix.name == info.key_index:
            name = names.derived(m.target.name, "_pkey" if ix.is_primary else "_key")
            out.append(Derived("index", QualifiedName(schema, name), f"the key of {m.target}"))
            continue
        name = builds.deferred_index_name(m.id, ix.name)
        what = f"the copy of index {names.display_ident(ix.name)} the backfill builds on {m.target}"
        out.append(Derived("index", QualifiedName(schema, name), what))
        if not ix.by_constraint:
            out += [Derived("index", QualifiedName(schema, partitions.child_index_name(p.name, name)),
                            f"{what} (on its partition {names.display_ident(p.name)})") for p in parts]
    cur.execute("SELECT stxname FROM pg_statistic_ext WHERE stxrelid = %s ORDER BY 1", (info.oid,))
    out += [Derived("statistics", QualifiedName(schema, metadata.statistics_name(m.id, s)),
                    f"the copy of statistics {names.display_ident(s)} on {m.target}") for (s,) in cur.fetchall()]
    for reverse in (False, True):
        log = names.change_log(m.id, reverse)
        what = "reverse change log" if reverse else "change log"
        out += [Derived("table", log, f"the {what}"),
                Derived("index", QualifiedName(log.schema, log.name + "_seq"), f"the index of the {what}"),
                Derived("function", names.capture_function(m.id, reverse), f"the {what}'s capture function")]
    trigger = names.capture_trigger(m.id)
    out += [Derived("trigger", QualifiedName(None, t), "the capture trigger", m.source)
            for t in (trigger, capture_sql.truncate_trigger(trigger))]
    out += [
            Derived("table", names.applied_notes(m.id), "the reconcile's notes"),
            Derived("function", names.notes_function(m.id), "the reconcile's notes function")]
    if plan.capture.logical:
        cur.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        out += [Derived("table", names.feed_state(m.id), "the logical capture's feed state"),
                Derived("publication", QualifiedName(None, names.capture_publication(m.id)),
                        "the logical capture's publication"),
                Derived("slot", QualifiedName(None, names.capture_slot(m.id, one(cur)[0])),
                        "the logical capture's replication slot")]
    return out


# What holds a name already, by kind: (schema, name[, table]) -> what it is.
_RELKINDS = {"r": "table", "i": "index", "S": "sequence", "v": "view", "m": "materialized view", "c": "type",
             "f": "foreign table", "p": "partitioned table", "I": "partitioned index"}
_HOLDERS = {
    # indexes and tables share the schema's relation names
    "relation": "SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid ="
                " c.relnamespace WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
    "function": "SELECT n.nspname, p.proname, 'function' FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE p.pronargs = 0 AND (n.nspname, p.proname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
    "statistics": "SELECT n.nspname, s.stxname, 'statistics' FROM pg_statistic_ext s JOIN pg_namespace n"
                  " ON n.oid = s.stxnamespace WHERE (n.nspname, s.stxname) IN"
                  " (SELECT * FROM unnest(%s::text[], %s::text[]))",
}


def collisions(cur: psycopg.Cursor, m: control.Migration, plan: Plan) -> list[PlanError]:
    """The derived names another object holds already: mover would fail creating its own, after
    the copy for a deferred index. Each named with what holds it and the fix."""
    found = derived(cur, m, plan)
    held: dict[tuple[str, Any, Any], str] = {}
    for kind, query in _HOLDERS.items():
        mine = [d for d in found if (d.kind in ("index", "table")) == (kind == "relation") and
                (kind == "relation" or d.kind == kind)]
        if mine:
            cur.execute(query, ([d.name.schema for d in mine], [d.name.name for d in mine]))
            held.update({(kind, s, n): str(_RELKINDS.get(k, k)) for s, n, k in cur.fetchall()})
    triggers = [d for d in found if d.kind == "trigger"]
    for d in triggers:
        cur.execute("SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname = %s)",
                    (str(d.table), d.name.name))
        if one(cur)[0]:
            held[("trigger", None, d.name.name)] = f"trigger on {d.table}"
    for d in found:
        if d.kind == "publication":
            cur.execute("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s)", (d.name.name,))
        elif d.kind == "slot":
            cur.execute("SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)", (d.name.name,))
        else:
            continue
        if one(cur)[0]:
            held[(d.kind, None, d.name.name)] = d.kind.replace("slot", "replication slot")
    out = []
    for d in found:
        kind = "relation" if d.kind in ("index", "table") else d.kind
        holder = held.get((kind, d.name.schema, d.name.name))
        if holder is None:
            continue
        shown = d.name if d.name.schema is not None else names.display_ident(d.name.name)
        keyword = _ALTER.get(holder)
        fix = f" (ALTER {keyword} {shown}{'()' if keyword == 'FUNCTION' else ''} RENAME TO ...)" if keyword else ""
        out.append(PlanError(f"the name {shown} that mover gives {d.why} is taken by an existing {holder}: creating it"
                             f" would fail" + (", after the whole copy" if "backfill builds" in d.why else ""),
                             hint=f"rename or drop that {holder}{fix}, then check the plan again"))
    return out


_ALTER = {"index": "INDEX", "table": "TABLE", "sequence": "SEQUENCE", "view": "VIEW",
          "materialized view": "MATERIALIZED VIEW", "statistics": "STATISTICS", "function": "FUNCTION",
          "partitioned index": "INDEX", "partitioned table": "TABLE", "foreign table": "FOREIGN TABLE",
          "publication": "PUBLICATION"}
