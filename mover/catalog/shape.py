"""A table's shape: its catalog description, a fingerprint of it, and what changed between two.

The shape is fixed from registration to retire (invariant 7, docs/design.md; race 8): mover's copy, replay,
comparison and swap all work from a column list read once, so a change the application makes
to either table (a column added, a type changed, an index dropped...) would otherwise be copied
past or swapped across. The description of each table is stored on the migration row
(mover.migrations source_shape / target_shape, with their fingerprints): "source" is the
original table and "target" the new one, whatever names the swap gives them, since both are
found by oid. Checking is one catalog query (readable by any role: no superuser, no event
trigger), run at every step start, in every range's transaction, in every replay transaction
(through Context.mapping) and inside the cutover's lock (there through the digest of the
catalog rows DESCRIBE reads, mover/engines/swap/carry.py, and in full only when that digest changed since the
check before the lock). Context.check_shape, the check of ranges and replays, likewise verifies in
full only when SHAPE_INPUTS' digest changed since its last full check that passed.

describe() and diff() are the pure part; verify() and record() go through control.shapes / store_shape.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import psycopg

from mover import names
from mover.catalog import identity, reading
from mover.db import one
from mover.errors import BadInput, ShapeChanged
from mover.names import QualifiedName, display_ident
from mover.state import control

SIDES = ("source", "target")

# One statement describes any number of tables (by oid), so a check is one round trip. Index
# definitions are cut after "ON schema.table " (the prefix format() rebuilds exactly, as in
# introspect._indexes), so that a renamed table does not read as every index changed.
DESCRIBE = """
SELECT c.oid, jsonb_build_object(
    'oid', c.oid::bigint,
    'schema', n.nspname,
    'name', c.relname,
    'kind', c.relkind,
    'persistence', c.relpersistence,
    'columns', (
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'name', a.attname,
                   'position', a.attnum,
                   'type', format_type(a.atttypid, a.atttypmod),
                   'collation', CASE WHEN a.attcollation <> 0 THEN
                       (SELECT format('%%I.%%I', cn.nspname, co.collname) FROM pg_collation co
                          JOIN pg_namespace cn ON cn.oid = co.collnamespace WHERE co.oid = a.attcollation) END,
                   'not_null', a.attnotnull,
                   'default', pg_get_expr(d.adbin, d.adrelid),
                   'identity', a.attidentity,
                   'generated', a.attgenerated) ORDER BY a.attnum), '[]'::jsonb)
        FROM pg_attribute a
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
    'constraints', (
        SELECT coalesce(jsonb_object_agg(k.conname, jsonb_build_object(
                   'type', k.contype,
                   'definition', pg_get_constraintdef(k.oid),
                   'validated', k.convalidated,
                   'deferrable', k.condeferrable,
                   'deferred', k.condeferred)), '{}'::jsonb)
        FROM pg_constraint k WHERE k.conrelid = c.oid),
    'indexes', (
        SELECT coalesce(jsonb_object_agg(ic.relname, jsonb_build_object(
                   'definition', substr(pg_get_indexdef(i.indexrelid),
                                        length(format('CREATE %%sINDEX %%I ON %%s%%I.%%I ',
                                                      CASE WHEN i.indisunique THEN 'UNIQUE ' ELSE '' END,
                                                      ic.relname,
                                                      -- a partitioned table's index reads "ON ONLY"
                                                      CASE WHEN c.relkind = 'p' THEN 'ONLY ' ELSE '' END,
                                                      n.nspname, c.relname)) + 1),
                   'unique', i.indisunique,
                   'valid', i.indisvalid,
                   'constraint', (SELECT k.conname FROM pg_constraint k
                                   WHERE k.conindid = i.indexrelid AND k.conrelid = c.oid
                                     AND k.contype IN ('p', 'u', 'x')))), '{}'::jsonb)
        FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
        WHERE i.indrelid = c.oid))
    -- A typed table's type (CREATE TABLE ... OF type): only when it has one, so that the
    -- descriptions (and fingerprints) recorded for other tables stay what they were.
    || CASE WHEN c.reloftype <> 0 THEN jsonb_build_object('of_type', format_type(c.reloftype, NULL))
            ELSE '{}'::jsonb END
    -- A partitioned table's tree, by bound (the swap renames partitions, it never changes a bound):
    -- a partition attached, detached or created behind mover's back changes the rows behind the name.
    || CASE WHEN c.relkind = 'p' THEN jsonb_build_object('partitions', (
            SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'level', t.level, 'kind', pc.relkind, 'bound', pg_get_expr(pc.relpartbound, pc.oid),
                       'under', pg_get_expr(pp.relpartbound, pp.oid),
                       'partition_by', CASE WHEN pc.relkind = 'p' THEN pg_get_partkeydef(pc.oid) END)
                       ORDER BY t.level, pg_get_expr(pp.relpartbound, pp.oid), pg_get_expr(pc.relpartbound, pc.oid)),
                       '[]'::jsonb)
            FROM pg_partition_tree(c.oid) t JOIN pg_class pc ON pc.oid = t.relid
            LEFT JOIN pg_class pp ON pp.oid = t.parentrelid AND t.level > 1
            WHERE t.level > 0))
            ELSE '{}'::jsonb END,
    -- the columns with a default (or generation expression) the scan found: each must print one
    array(SELECT d.adnum FROM pg_attrdef d WHERE d.adrelid = c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = ANY(%s)
"""


@dataclass(frozen=True)
class Change:
    side: str  # source | target
    kind: str  # column_added, column_dropped, column_type, ..., index_added, renamed, dropped
    message: str
    adoptable: bool
    item: str | None = None  # the column, constraint or index name
    detail: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {"side": self.side, "kind": self.kind, "item": self.item, "message": self.message,
                "adoptable": self.adoptable}


# ---------------------------------------------------------------------------------------------
# Pure functions


def fingerprint(description: dict[str, Any] | None) -> str | None:
    if description is None:
        return None
    return hashlib.sha256(_canonical(description)).hexdigest()


def _canonical(description: dict[str, Any]) -> bytes:
    return json.dumps(description, sort_keys=True, separators=(",", ":")).encode()


def table_name(description: dict[str, Any]) -> QualifiedName:
    return QualifiedName(description["schema"], description["name"])


def _column_text(c: dict[str, Any]) -> str:
    parts = [c["type"]]
    if c.get("collation") and c["collation"] != "pg_catalog.\"default\"":
        parts.append(f"COLLATE {c['collation']}")
    if c.get("default") is not None:
        parts.append(f"DEFAULT {c['default']}")
    if c.get("not_null"):
        parts.append("NOT NULL")
    if c.get("identity"):
        parts.append("GENERATED " + ("ALWAYS" if c["identity"] == "a" else "BY DEFAULT") + " AS IDENTITY")
    if c.get("generated"):
        # 'v': virtual (PostgreSQL 18), computed when read
        parts.append(f"GENERATED ALWAYS ({'virtual' if c['generated'] == 'v' else 'stored'})")
    return " ".join(parts)


def diff(old: dict[str, Any], new: dict[str, Any] | None, side: str = "source") -> list[Change]:
    """What changed from `old` to `new` (None: the table no longer exists), in reading order."""
    t = table_name(old)
    if new is None:
        return [Change(side, "dropped", f"table {t} was dropped", False)]
    out: list[Change] = []
    now = table_name(new)
    if now != t:
        out.append(Change(side, "renamed", f"table {t} was renamed to {now}", False))
    if old["persistence"] != new["persistence"]:
        how = {"u": "UNLOGGED", "p": "LOGGED", "t": "TEMPORARY"}
        out.append(Change(side, "persistence", f"table {now} was made {how.get(new['persistence'], new['persistence'])}"
                                               f" (it was {how.get(old['persistence'], old['persistence'])})", False))
    if old.get("kind") != new.get("kind"):
        out.append(Change(side, "kind", f"table {now} changed kind from {old.get('kind')!r} to {new.get('kind')!r}",
                          False))
    if old.get("of_type") != new.get("of_type"):
        was, became = old.get("of_type"), new.get("of_type")
        out.append(Change(side, "of_type", f"table {now} " + (f"was made a typed table (OF {became})" if became else
                                                              f"is no longer a typed table (it was OF {was})")
                          + (f" (it was OF {was})" if was and became else ""), False))
    if old.get("partitions") != new.get("partitions"):
        out.append(_diff_partitions(side, now, old.get("partitions") or [], new.get("partitions") or []))
    columns = _diff_columns(side, now, old["columns"], new["columns"])
    out += columns
    out += _implied_dropped(_diff_constraints(side, now, old["constraints"], new["constraints"]), columns,
                            old["constraints"], new["constraints"])
    out += _diff_indexes(side, now, old["indexes"], new["indexes"])
    return out


def _diff_partitions(side: str, t: QualifiedName, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> Change:
    def bounds(tree: list[dict[str, Any]]) -> list[str]:
        return [p["bound"] + (f" (under {p['under']})" if p.get("under") else "") for p in tree]
    gone = [b for b in bounds(old) if b not in bounds(new)]
    came = [b for b in bounds(new) if b not in bounds(old)]
    what = "; ".join([*(f"a partition {b} was detached or dropped" for b in gone[:3]),
                      *(f"a partition {b} was attached or created" for b in came[:3])]) or "a partition changed kind"
    return Change(side, "partitions", f"the partitions of {t} changed: {what} (rows came or went without a "
                                      f"write mover captures)", False)


def _diff_columns(side: str, t: QualifiedName, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[Change]:
    out: list[Change] = []
    old_by_pos = {c["position"]: c for c in old}
    new_by_pos = {c["position"]: c for c in new}
    new_names = {c["name"] for c in new}
    old_names = {c["name"] for c in old}
    for pos, o in old_by_pos.items():
        n = new_by_pos.get(pos)
        col = display_ident(o["name"])
        if n is None:
            if o["name"] in new_names:
                out.append(Change(side, "column_recreated", f"column {col} of {t} was dropped and added again"
                                                           f" (its values were lost)", False, o["name"]))
            else:
                out.append(Change(side, "column_dropped", f"column {col} was dropped from {t}", False, o["name"]))
            continue
        if n["name"] != o["name"]:
            out.append(Change(side, "column_renamed", f"column {col} of {t} was renamed to "
                                                     f"{display_ident(n['name'])}", False, o["name"]))
            col = display_ident(n["name"])
        checks = (("type", "column_type", "changed type from {o} to {n}"),
                  ("collation", "column_collation", "changed collation from {o} to {n}"),
                  ("default", "column_default", "changed default from {o} to {n}"),
                  ("identity", "column_identity", "changed identity from {o!r} to {n!r}"),
                  ("generated", "column_generated", "changed generation from {o!r} to {n!r}"))
        for key, kind, text in checks:
            if o.get(key) != n.get(key):
                msg = text.format(o=o.get(key) if o.get(key) is not None else "none",
                                  n=n.get(key) if n.get(key) is not None else "none")
                out.append(Change(side, kind, f"column {col} of {t} {msg}", False, n["name"]))
        if o["not_null"] != n["not_null"]:
            how = "was made NOT NULL" if n["not_null"] else "is no longer NOT NULL"
            out.append(Change(side, "column_not_null", f"column {col} of {t} {how}", False, n["name"]))
    for pos, n in new_by_pos.items():
        if pos in old_by_pos:
            continue
        if n["name"] in old_names and any(c["name"] == n["name"] for c in old_by_pos.values()
                                          if c["position"] not in new_by_pos):
            continue  # reported above as dropped and added again
        plain = not n.get("identity") and not n.get("generated")
        out.append(Change(side, "column_added", f"column {display_ident(n['name'])} was added to {t}"
                                                f" ({_column_text(n)})", plain, n["name"], {"column": n}))
    return out


def _diff_constraints(side: str, t: QualifiedName, old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    kinds = {"c": "CHECK", "f": "FOREIGN KEY", "p": "PRIMARY KEY", "u": "UNIQUE", "x": "EXCLUDE", "t": "TRIGGER",
             "n": "NOT NULL"}
    out: list[Change] = []
    for name, o in sorted(old.items()):
        c = display_ident(name)
        n = new.get(name)
        if n is None:
            out.append(Change(side, "constraint_dropped", f"constraint {c} ({o['definition']}) was dropped from {t}",
                              False, name))
        elif (n["type"], _unvalidated(n["definition"])) != (o["type"], _unvalidated(o["definition"])):
            out.append(Change(side, "constraint_changed", f"constraint {c} of {t} changed from {o['definition']}"
                                                          f" to {n['definition']}", False, name))
        elif n["validated"] != o["validated"]:
            # VALIDATE CONSTRAINT of a CHECK that was NOT VALID (the second half of a routine
            # deploy) can be repeated on the other table; nothing else changes validation state.
            # VALIDATE CONSTRAINT of a NOT NULL (PostgreSQL 18: pg_constraint rows, contype 'n')
            # likewise.
            out.append(Change(side, "constraint_validated", f"constraint {c} of {t} was "
                                                            f"{'validated' if n['validated'] else 'marked NOT VALID'}",
                              bool(n["validated"]) and n["type"] in ("c", "n"), name, {"constraint": n}))
        elif (n["deferrable"], n["deferred"]) != (o["deferrable"], o["deferred"]):
            out.append(Change(side, "constraint_changed", f"constraint {c} of {t} changed its deferral", False, name))
    for name, n in sorted(new.items()):
        if name in old:
            continue
        what = kinds.get(n["type"], n["type"])
        out.append(Change(side, "constraint_added", f"{what} constraint {display_ident(name)} was added to {t}:"
                                                    f" {n['definition']}", n["type"] == "c", name, {"constraint": n}))
    return out


# Column changes that bring, drop or rename their column's NOT NULL constraint with them (PostgreSQL 18).
_NOT_NULL_WITH = ("column_added", "column_not_null", "column_dropped", "column_recreated", "column_renamed")


def _implied_dropped(constraints: list[Change], columns: list[Change], old: dict[str, Any],
                     new: dict[str, Any]) -> list[Change]:
    """The constraint changes without those a column change already says: on PostgreSQL 18 a NOT
    NULL constraint is a pg_constraint row, added by ADD COLUMN ... NOT NULL or SET NOT NULL,
    dropped with its column or by DROP NOT NULL, its definition renamed with its column. The
    column's change names it (and decides whether it can be adopted) on every version alike; a
    NOT NULL constraint's own change (renamed, validated) still shows."""
    touched = {c.item for c in columns if c.kind in _NOT_NULL_WITH}

    def implied(c: Change) -> bool:
        if c.kind not in ("constraint_added", "constraint_dropped", "constraint_changed"):
            return False
        defs = [d[c.item]["definition"] for d in (old, new) if c.item in d and d[c.item]["type"] == "n"]
        return bool(defs) and any(not_null_column(d) in touched for d in defs)

    return [c for c in constraints if not implied(c)]


def _unvalidated(definition: str) -> str:
    return definition.removesuffix(" NOT VALID")


def _diff_indexes(side: str, t: QualifiedName, old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    out: list[Change] = []
    for name, o in sorted(old.items()):
        i = display_ident(name)
        n = new.get(name)
        if n is None:
            if o.get("constraint") and o["constraint"] not in {k for k, v in new.items() if v.get("constraint")}:
                continue  # the constraint's own index: reported with the constraint
            out.append(Change(side, "index_dropped", f"index {i} ({o['definition']}) was dropped from {t}", False,
                              name))
        elif (n["definition"], n["unique"]) != (o["definition"], o["unique"]):
            out.append(Change(side, "index_changed", f"index {i} of {t} changed from {o['definition']}"
                                                     f" to {n['definition']}", False, name))
        elif n["valid"] != o["valid"]:
            out.append(Change(side, "index_validity", f"index {i} of {t} became "
                                                      f"{'valid' if n['valid'] else 'invalid'}", False, name))
    for name, n in sorted(new.items()):
        if name in old:
            continue
        if n.get("constraint"):
            continue  # a constraint's own index: reported with the constraint
        state = "" if n["valid"] else " (not valid: a concurrent build that failed or was cancelled)"
        out.append(Change(side, "index_added", f"{'unique ' if n['unique'] else ''}index {display_ident(name)} was"
                                               f" added to {t}: {n['definition']}{state}", bool(n["valid"]), name,
                          {"index": n, "schema": t.schema}))
    return out


def mirrors(change: Change, live_changes: list[Change], mid: int) -> bool:
    """Is this change of the other table one that `mover adopt` makes for live_changes (seen
    after an adopt that stopped half-way)? Its indexes are named like the backfill's."""
    if change.kind in ("index_added", "index_validity"):
        return any(c.kind == "index_added" and names.derived(str(c.item), f"_m{mid}") == change.item
                   for c in live_changes)
    if change.kind in ("constraint_added", "column_not_null"):
        # A constraint the live table had NOT VALID when the target was created (which left it off)
        # and now validated: adopt adds it validated to the other table (engines/bulk/adopt.py); a NOT
        # NULL one (PostgreSQL 18) makes its column NOT NULL there too.
        validated = [c for c in live_changes if c.kind == "constraint_validated"]
        if change.kind == "constraint_added" and any(c.item == change.item for c in validated):
            return True
        if change.kind == "column_not_null" and any(
                not_null_column(c.detail.get("constraint", {}).get("definition", "")) == change.item
                for c in validated):
            return True
    return change.kind in ("column_added", "constraint_added", "constraint_validated") and any(
        c.kind == change.kind and c.item == change.item for c in live_changes)


def not_null_column(definition: str) -> str | None:
    """The column of a NOT NULL constraint's pg_get_constraintdef() text (PostgreSQL 18:
    'NOT NULL <quote_ident(column)>[ NO INHERIT][ NOT VALID]'); None for any other definition."""
    if not definition.startswith("NOT NULL "):
        return None
    rest = definition.removeprefix("NOT NULL ")
    if not rest.startswith('"'):
        return rest.split(" ", 1)[0] or None
    out, i = [], 1
    while i < len(rest):
        if rest[i] == '"':
            if rest[i + 1:i + 2] == '"':
                out.append('"')
                i += 2
                continue
            return "".join(out)
        out.append(rest[i])
        i += 1
    return None


def explain(name: str, changes: list[Change], swapped: bool, mid: int | None = None,
            step: str | None = None) -> ShapeChanged:
    """The error for `changes`: what changed, and the command that gets the migration going again
    (one that works at `step`, when the caller knows it: `mover adopt` not past the window)."""
    listed = "; ".join(c.message for c in changes)
    live = "target" if swapped else "source"
    live_changes = [c for c in changes if c.side == live]
    adoptable = all(c.adoptable for c in live_changes) and all(
        mid is not None and mirrors(c, live_changes, mid) for c in changes if c.side != live) and (
        step is None or step in control.COMMANDS["adopt"])
    leftovers = [c for c in changes if c.kind == "index_added" and transient(c, [_ANY_BUILD])]
    if leftovers and len(leftovers) == len(changes):
        # What a failed or cancelled CREATE INDEX / REINDEX CONCURRENTLY leaves behind (one still
        # running is no change at all: changes()). The table is as it was: drop it and go on.
        drops = "; ".join(f"DROP INDEX CONCURRENTLY {QualifiedName(c.detail.get('schema'), str(c.item))}"
                          for c in leftovers)
        return ShapeChanged(f"the shape of a table of migration {name!r} changed since mover recorded it: {listed};"
                            f" nothing was copied, compared or swapped across the change",
                            hint=f"a CREATE INDEX or REINDEX CONCURRENTLY that failed or was cancelled left"
                                 f" {'it' if len(leftovers) == 1 else 'them'} behind (nothing to abort): {drops};"
                                 f" then `mover run {name}` resumes", changes=changes)
    if adoptable:
        # After the swap abort does not work (a rollback first, which the changed shape refuses).
        hint = (f"`mover adopt {name}` applies the same change to the other table and re-checks what it touched;"
                + (" or undo the change on that table" if swapped else f" or `mover abort {name}` and plan again"))
    elif swapped:
        hint = (f"this cannot be adopted: undo the change on that table, then `mover run {name}`"
                f" (rollback and retire stay refused until the shapes match)")
    else:
        hint = f"this cannot be adopted: `mover abort {name}`, then plan the migration again for the new shape"
    return ShapeChanged(f"the shape of a table of migration {name!r} changed since mover recorded it: {listed};"
                        f" nothing was copied, compared or swapped across the change", hint=hint, changes=changes)


# ---------------------------------------------------------------------------------------------
# The catalog and the control row


def vanished(row: reading.Row) -> str | None:
    """The object a DESCRIBE row found but could not print (dropped since the scan: race 10)."""
    d, defaults = row[1], set(row[2])
    t = table_name(d)
    return reading.first([
        *(f"constraint {display_ident(k)} of {t}" for k, v in d["constraints"].items() if v["definition"] is None),
        *(f"index {display_ident(k)} of {t}" for k, v in d["indexes"].items() if v["definition"] is None),
        *(f"column {display_ident(c['name'])} of {t}" for c in d["columns"]
          if reading.gone(c["type"]) or (c["position"] in defaults and c["default"] is None)),
        f"the type of {t}" if reading.gone(d.get("of_type", "")) else None])


def describe(cur: psycopg.Cursor, oids: list[int]) -> dict[int, dict[str, Any]]:
    """Descriptions of the tables with these oids (a missing one is absent from the result)."""
    return {oid: d for oid, d, _ in reading.read(cur, DESCRIBE, (list(oids),), missing=vanished)}


def describe_table(cur: psycopg.Cursor, table: QualifiedName) -> dict[str, Any]:
    cur.execute("SELECT to_regclass(%s)::oid", (str(table),))
    oid = one(cur)[0]
    if oid is None:
        raise BadInput(f"table {table} does not exist", hint="`mover status` shows which tables the migration has")
    return describe(cur, [oid])[oid]


def current(cur: psycopg.Cursor, shapes: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, Any] | None]:
    oids = [s["oid"] for s in shapes.values() if s is not None]
    now = describe(cur, oids) if oids else {}
    return {side: (None if s is None else now.get(s["oid"])) for side, s in shapes.items()}


# The event in which a swap records the foreign keys it added NOT VALID (carry.py writes it;
# defined here because carry imports this module).
VALIDATE_EVENT = "constraints_to_validate"


def validated_by_another(cur: psycopg.Cursor, mid: int, table: dict[str, Any] | None, change: Change) -> str | None:
    """The name of another migration whose last swap re-created this foreign key NOT VALID and
    validates it after its lock (the cutover of a parent re-points the child's keys), when `change`
    is only that: a validation-state flip of a foreign key otherwise unchanged. Not a change of
    this table's shape (race 8 is about the application's DDL): the key is the same, and the
    other migration puts its validation back."""
    if change.kind != "constraint_validated" or table is None:
        return None
    con = table["constraints"].get(change.item)
    if con is None or con["type"] != "f":
        return None
    cur.execute("SELECT m.name FROM mover.events e JOIN mover.migrations m ON m.id = e.migration_id"
                " WHERE e.migration_id <> %(mid)s AND e.kind = %(kind)s"
                " AND e.id = (SELECT max(x.id) FROM mover.events x WHERE x.migration_id = e.migration_id"
                "             AND x.kind = %(kind)s)"
                " AND e.detail->'constraints'"
                "     @> jsonb_build_array(jsonb_build_array(%(schema)s::text, %(table)s::text, %(con)s::text))"
                " ORDER BY e.id DESC LIMIT 1",
                {"mid": mid, "kind": VALIDATE_EVENT, "schema": table["schema"], "table": table["name"],
                 "con": change.item})
    row = cur.fetchone()
    return row[0] if row else None


# A concurrent index build's transient indexes: REINDEX CONCURRENTLY builds <index>_ccnew (then
# _ccnew1, ...) beside the index, swaps the two and drops <index>_ccold.
_TRANSIENT = re.compile(r"_cc(new|old)[0-9]*$")

# The tables with a concurrent index build running (CREATE INDEX CONCURRENTLY, REINDEX
# CONCURRENTLY): a session of pg_stat_progress_create_index holding the table's SHARE UPDATE
# EXCLUSIVE lock (which those builds hold from start to end). The view hides the table of another
# role's session (relid NULL) from a role without pg_read_all_stats; its lock is seen by all.
BUILDS = """
SELECT DISTINCT l.relation, p.pid, coalesce(p.command, 'a concurrent index build'), coalesce(p.phase, '')
FROM pg_stat_progress_create_index p
JOIN pg_locks l ON l.pid = p.pid AND l.locktype = 'relation' AND l.granted AND l.mode = 'ShareUpdateExclusiveLock'
WHERE l.relation = ANY(%s) AND (p.relid IS NULL OR p.relid = l.relation) AND p.pid <> pg_backend_pid()
ORDER BY 1, 2
"""


@dataclass(frozen=True)
class Build:
    """A concurrent index build running on a table mover moves."""
    table_oid: int
    pid: int
    command: str
    phase: str


def builds(cur: psycopg.Cursor, oids: list[int]) -> dict[int, list[Build]]:
    """The concurrent index builds running on the tables with these oids, by table."""
    if not oids:
        return {}
    cur.execute(BUILDS, (list(oids),))
    out: dict[int, list[Build]] = {}
    for oid, pid, command, phase in cur.fetchall():
        out.setdefault(oid, []).append(Build(oid, pid, command, phase))
    return out


def transient(change: Change, running: list[Build]) -> bool:
    """Is `change` only a concurrent index build in progress on its table (`running` its builds)?
    Its new index, still invalid (CREATE INDEX CONCURRENTLY, a REINDEX's <index>_ccnew), or a
    REINDEX CONCURRENTLY's _ccnew/_ccold by name (valid a moment before the swap of the two). Not
    a change of the table's shape: the build changes no column, constraint or row, so nothing is
    copied, compared or replayed across it; it ends with the index as it was (REINDEX: the same
    definition under the same name, so the recorded shape holds again) or with a new index
    (`mover adopt`, as for any index added). The swap cannot meet one: a build holds the table's
    SHARE UPDATE EXCLUSIVE lock until it ends, which the swap's lock waits for (it names the
    build's session when its attempts run out)."""
    if change.kind != "index_added":
        return False
    return transient_index(str(change.item), bool(change.detail.get("index", {}).get("valid", True)), running)


def transient_index(name: str, valid: bool, running: list[Build]) -> bool:
    """An index of a table on which these builds run that is theirs: not valid yet, or a REINDEX
    CONCURRENTLY's by name."""
    return bool(running) and (not valid or bool(_TRANSIENT.search(name)))


# transient()'s `running` when only the index itself decides (explain(): a leftover of a build).
_ANY_BUILD = Build(0, 0, "", "")


def changes(cur: psycopg.Cursor, mid: int) -> tuple[dict[str, Any], dict[str, Any], list[Change]]:
    """(stored, current, changes) of both tables; a side mover has not recorded yet is skipped, and
    so is a foreign key's validation state while another migration re-validates it, and the
    transient index of a concurrent index build running on the table (transient())."""
    before = control.shapes(cur, mid)
    now = current(cur, before)
    found: list[Change] = []
    for side in SIDES:
        old = before[side]
        if old is not None and fingerprint(now[side]) != fingerprint(old):
            differs = diff(old, now[side], side)
            running = builds(cur, [old["oid"]]).get(old["oid"], []) \
                if any(c.kind == "index_added" for c in differs) else []
            found += [c for c in differs
                      if validated_by_another(cur, mid, now[side], c) is None and not transient(c, running)]
    return before, now, found


def verify(cur: psycopg.Cursor, mid: int, name: str, swapped: bool, step: str | None = None) -> str:
    """Raise ShapeChanged unless both recorded tables have the recorded shape; returns the pair of
    stored fingerprints, which names the shape a Mapping was built under."""
    before, _, found = changes(cur, mid)
    if found:
        raise explain(name, found, swapped, mid, step)
    return f"{fingerprint(before['source'])}/{fingerprint(before['target'])}"


# What DESCRIBE's result is read from, as a digest (Context.check_shape caches a full verify()
# by it): of the recorded tables (by the oids their recorded descriptions hold), the rows of
# pg_class (by content: VACUUM and ANALYZE update it in place), pg_namespace, pg_attribute
# with each column's type and collation, pg_attrdef, pg_constraint and pg_index (its flags by
# content: a concurrent index build sets them in place) with the index's pg_class row, and the
# rows the deparsed defaults, constraints and indexes name (pg_depend: tables, columns,
# sequences, functions, types, collations). A row's xmin changes with every transactional
# update of it. One query, a few milliseconds for 1600 columns where DESCRIBE and the
# comparison of two descriptions cost tens (issue 34). Not covered, as by the swap's digest
# (mover/engines/swap/carry.py): the schema of a referenced function, type or sequence renamed; the
# full check at the next step's start, and the swap's, still see it.
SHAPE_INPUTS = """
WITH m AS (
    SELECT source_fingerprint AS sf, target_fingerprint AS tf,
           ARRAY[(source_shape ->> 'oid')::oid, (target_shape ->> 'oid')::oid] AS oids
    FROM mover.migrations WHERE id = %(mid)s
), tab AS MATERIALIZED (
    SELECT DISTINCT unnest(oids) AS oid FROM m
), obj AS MATERIALIZED (
    SELECT 'pg_attrdef'::regclass AS classid, e.oid, concat_ws(':', 'e', e.oid, e.xmin) AS x
        FROM tab, LATERAL (SELECT oid, xmin FROM pg_attrdef WHERE adrelid = tab.oid) e
    UNION ALL SELECT 'pg_constraint'::regclass, k.oid, concat_ws(':', 'k', k.oid, k.xmin)
        FROM tab, LATERAL (SELECT oid, xmin FROM pg_constraint WHERE conrelid = tab.oid) k
    UNION ALL SELECT 'pg_class'::regclass, i.indexrelid,
                     concat_ws(':', 'i', i.indexrelid, i.xmin, i.indisvalid, i.indisready, i.indislive, ic.relname)
        FROM tab, LATERAL (SELECT indexrelid, xmin, indisvalid, indisready, indislive FROM pg_index
                               WHERE indrelid = tab.oid) i JOIN pg_class ic ON ic.oid = i.indexrelid
)
SELECT (SELECT sf FROM m), (SELECT tf FROM m), md5(coalesce(string_agg(x, ',' ORDER BY x), '')) FROM (
    SELECT concat_ws(':', 'c', c.oid, c.relname, c.relnamespace, c.relkind, c.relpersistence, c.reloftype, n.xmin) AS x
        FROM tab JOIN pg_class c ON c.oid = tab.oid JOIN pg_namespace n ON n.oid = c.relnamespace
    UNION ALL SELECT concat_ws(':', 'a', a.attrelid, a.attnum, a.xmin, t.xmin, co.xmin)
        FROM tab, LATERAL (SELECT attrelid, attnum, xmin, atttypid, attcollation FROM pg_attribute
                           WHERE attrelid = tab.oid AND attnum > 0) a
        JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_collation co ON co.oid = a.attcollation
    UNION ALL SELECT x FROM obj
    UNION ALL SELECT concat_ws(':', 'd', d.classid, d.objid, d.refclassid, d.refobjid, d.refobjsubid,
                               CASE d.refclassid  -- each an index probe
                                   WHEN 'pg_class'::regclass THEN (SELECT xmin FROM pg_class WHERE oid = d.refobjid)
                                   WHEN 'pg_proc'::regclass THEN (SELECT xmin FROM pg_proc WHERE oid = d.refobjid)
                                   WHEN 'pg_type'::regclass THEN (SELECT xmin FROM pg_type WHERE oid = d.refobjid)
                                   WHEN 'pg_collation'::regclass THEN
                                       (SELECT xmin FROM pg_collation WHERE oid = d.refobjid) END,
                               CASE WHEN d.refclassid = 'pg_class'::regclass AND d.refobjsubid > 0 THEN
                                   (SELECT xmin FROM pg_attribute WHERE attrelid = d.refobjid
                                                                    AND attnum = d.refobjsubid) END)
        FROM obj, LATERAL (SELECT classid, objid, refclassid, refobjid, refobjsubid FROM pg_depend
                           WHERE classid = obj.classid AND objid = obj.oid) d
) inputs
"""


def inputs_digest(cur: psycopg.Cursor, mid: int) -> str:
    """One query: the migration's stored fingerprints and the digest of the catalog rows its
    recorded tables' descriptions are read from (SHAPE_INPUTS). Equal to the value read before
    a verify() that passed: both tables still have the recorded shape."""
    cur.execute(SHAPE_INPUTS, {"mid": mid})
    row = cur.fetchone()
    return "/".join(str(v) for v in row) if row else ""


def record(cur: psycopg.Cursor, mid: int, *, source: QualifiedName | int | None = None,
           target: QualifiedName | int | None = None) -> None:
    """Store the current description of the given tables (by name or oid) as their recorded shape."""
    for side, table in (("source", source), ("target", target)):
        if table is None:
            continue
        desc = describe(cur, [table])[table] if isinstance(table, int) else describe_table(cur, table)
        control.store_shape(cur, mid, side, desc, hashlib.sha256(_canonical(desc)).hexdigest())


def rerecord(cur: psycopg.Cursor, mid: int) -> None:
    """Record both tables again as they are now (by oid): after mover itself renamed them."""
    before = control.shapes(cur, mid)
    record(cur, mid, source=before["source"]["oid"] if before["source"] else None,
           target=before["target"]["oid"] if before["target"] else None)


def store(cur: psycopg.Cursor, mid: int, side: str, description: dict[str, Any]) -> None:
    """Record a description describe() just read (the swap describes both tables in one query)."""
    control.store_shape(cur, mid, side, description, hashlib.sha256(_canonical(description)).hexdigest())


def verify_at_step(cur: psycopg.Cursor, m: control.Migration, swapped: bool) -> str:
    """verify() at a step's start; first records a table a migration registered before shapes
    were recorded (control schema revision 0004) does not have yet, with an event."""
    before = control.shapes(cur, m.id)
    tables = {"source": m.old if swapped else m.source, "target": m.source if swapped else m.target}
    built = swapped or m.step not in control.BUILDING
    for side in SIDES:
        if before[side] is None and (side == "source" or built):
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (str(tables[side]),))
            if one(cur)[0]:
                record(cur, m.id, **{side: tables[side]})
                control.event(cur, m.id, "mover", m.step, "shape_recorded",
                              f"recorded the shape of {tables[side]} (registered before shapes were recorded)")
    recorded = verify(cur, m.id, m.name, swapped, m.step)
    if not swapped:
        # Invariant 15, from registration on: an object bound to the source's oid or row type made
        # since (a child table, a row-type column...) is named at the next step's start, not first
        # at the gate. In the window the rollback and retire check it themselves: a refusal here
        # would stop the old table's sync.
        source = control.shapes(cur, m.id)["source"]
        if source is not None:
            identity.refuse_bound(cur, source["oid"], "cutover", f"`mover run {m.name}`")
    return recorded


def current_name(cur: psycopg.Cursor, mid: int, side: str) -> QualifiedName | None:
    """Where the recorded table is now (found by oid), whatever it was renamed to; None if not recorded or gone."""
    recorded = control.shapes(cur, mid)[side]
    if recorded is None:
        return None
    cur.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.oid = %s", (recorded["oid"],))
    row = cur.fetchone()
    return QualifiedName(row[0], row[1]) if row else None
