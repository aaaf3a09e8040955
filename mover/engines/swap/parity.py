"""Metadata parity: does the live table look to the application after the swap as it did before?

The shape (mover/catalog/shape.py) is what mover's copy depends on; parity is everything else the
application, replication and the planner see: owner, grants, comments, replica identity,
publications, statistics, storage and compression, security labels, triggers, policies, rules,
dependent views, referencing foreign keys. Two descriptions are compared by a pure function;
a difference is "planned" when the plan asked for it (a type change, a partitioned target) or
when mover makes it on purpose (the names the new table's indexes take), "accepted" when the
operator listed it in `[cutover] accept_parity`, and otherwise unplanned.

Where it runs:
- the swap (mover/engines/swap/cutover.py): the live table described before the lock, with the swap's
  statements (under the lock only a digest of what that read is checked, mover/engines/swap/carry.py), and
  the table that carries its name after the DDL, inside the locked transaction; an unplanned difference rolls the swap
  back (exit 3) - nothing is swapped across a lost grant or publication;
- `mover parity NAME`: before the swap, the two tables modulo the planned changes and what the
  swap itself will make; after it, the description stored at the swap (event `parity_baseline`)
  against the live table; after a rollback, that baseline against the original again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import psycopg

from mover import names
from mover.catalog import introspect, reading, shape
from mover.db import one
from mover.engines.bulk.builds import deferred_index_name
from mover.errors import BadInput, Waiting
from mover.plan import Plan
from mover.state import control

BASELINE_EVENT = "parity_baseline"

# What shape.DESCRIBE leaves out. "<table>" stands for the table in definitions that print its
# name (triggers, rules: the non-pretty forms always qualify it), so the two tables' compare equal. mover's own capture
# triggers (mover_m<id>_...) are not the application's.
DESCRIBE_METADATA = """
SELECT jsonb_build_object(
    'owner', pg_get_userbyid(c.relowner),
    'comment', obj_description(c.oid, 'pg_class'),
    -- autovacuum_enabled is left out: mover turns it off around each lock attempt and restores
    -- it after (mover/engines/swap/lockwatch.py), so a description taken under the lock reads mover's own value.
    'reloptions', to_jsonb(coalesce(ARRAY(SELECT o FROM unnest(c.reloptions) o
                                          WHERE split_part(o, '=', 1) <> 'autovacuum_enabled'), '{}')),
    'row_security', c.relrowsecurity,
    'force_row_security', c.relforcerowsecurity,
    'replica_identity', c.relreplident,
    'replica_identity_index', (SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
                                WHERE i.indrelid = c.oid AND i.indisreplident),
    'grants', (SELECT coalesce(jsonb_agg(x ORDER BY x), '[]') FROM (
        SELECT concat_ws(' ', a.privilege_type, 'TO', CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                         ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                         CASE WHEN a.is_grantable THEN 'WITH GRANT OPTION' END) AS x
        FROM aclexplode(c.relacl) a WHERE a.grantee <> c.relowner) g),
    'columns', (SELECT coalesce(jsonb_object_agg(a.attname, jsonb_build_object(
            'storage', a.attstorage,
            'compression', nullif(a.attcompression::text, ''),
            'statistics', nullif(a.attstattarget::int, -1),
            'comment', cd.description,
            'grants', CASE WHEN a.attacl IS NULL THEN '[]'::jsonb ELSE (SELECT coalesce(jsonb_agg(x ORDER BY x), '[]')
                FROM (SELECT concat_ws(' ', p.privilege_type, 'TO', CASE WHEN p.grantee = 0 THEN 'PUBLIC'
                                 ELSE quote_ident(pg_get_userbyid(p.grantee)) END,
                                 CASE WHEN p.is_grantable THEN 'WITH GRANT OPTION' END) AS x
                FROM aclexplode(a.attacl) p) g) END,
            'security_labels', coalesce(cl.labels, '{}'),
            -- PostgreSQL 18: the column's NOT NULL constraint is validated (NULL: none, or before 18)
            'not_null_valid', nn.convalidated)), '{}')
        -- Joins, not a subquery per column (col_description is one): on a table of 800 columns
        -- the per-column form took most of the parity check's time under the swap's lock.
        FROM pg_attribute a
        LEFT JOIN pg_description cd ON cd.objoid = c.oid AND cd.classoid = 'pg_class'::regclass
                                   AND cd.objsubid = a.attnum
        LEFT JOIN (SELECT l.objsubid, jsonb_object_agg(l.provider, l.label) AS labels FROM pg_seclabel l
                   WHERE l.classoid = 'pg_class'::regclass AND l.objoid = c.oid GROUP BY l.objsubid) cl
               ON cl.objsubid = a.attnum
        LEFT JOIN pg_constraint nn ON nn.conrelid = c.oid AND nn.contype = 'n' AND nn.conkey[1] = a.attnum
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
    'index_comments', (SELECT coalesce(jsonb_object_agg(ic.relname, obj_description(ic.oid, 'pg_class'))
                                       FILTER (WHERE obj_description(ic.oid, 'pg_class') IS NOT NULL), '{}')
                       FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid),
    'constraint_comments', (SELECT coalesce(jsonb_object_agg(k.conname, obj_description(k.oid, 'pg_constraint'))
                                            FILTER (WHERE obj_description(k.oid, 'pg_constraint') IS NOT NULL), '{}')
                            FROM pg_constraint k WHERE k.conrelid = c.oid),
    'security_labels', (SELECT coalesce(jsonb_object_agg(l.provider, l.label), '{}') FROM pg_seclabel l
                         WHERE l.classoid = 'pg_class'::regclass AND l.objoid = c.oid AND l.objsubid = 0),
    'publications', (SELECT coalesce(jsonb_object_agg(p.pubname, jsonb_build_object(
            'columns', (SELECT jsonb_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
                         WHERE a.attrelid = c.oid AND a.attnum = ANY(pr.prattrs::int2[])),
            'row_filter', pg_get_expr(pr.prqual, pr.prrelid))), '{}')
        FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid WHERE pr.prrelid = c.oid
        AND p.pubname !~ '^mover_m[0-9]+_'),
    'statistics', (SELECT coalesce(jsonb_object_agg(s.stxname, jsonb_build_object(
            -- || rather than format(): NULL (race 10) when the statistics vanished since the scan
            'definition', '(' || array_to_string(array(
                SELECT CASE k WHEN 'd' THEN 'ndistinct' WHEN 'f' THEN 'dependencies' WHEN 'm' THEN 'mcv' END
                FROM unnest(s.stxkind) k WHERE k <> 'e' ORDER BY 1), ', ') || ') ON '
                || pg_get_statisticsobjdef_columns(s.oid),
            'statistics', nullif(s.stxstattarget::int, -1),
            'comment', obj_description(s.oid, 'pg_statistic_ext'))), '{}')
        FROM pg_statistic_ext s WHERE s.stxrelid = c.oid),
    'triggers', (SELECT coalesce(jsonb_object_agg(t.tgname, jsonb_build_object(
            'definition', replace(pg_get_triggerdef(t.oid), format(' ON %%I.%%I ', n.nspname, c.relname),
                                  ' ON <table> '),
            'enabled', t.tgenabled)), '{}')
        FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal AND t.tgname !~ '^mover_m[0-9]+_'),
    'rules', (SELECT coalesce(jsonb_object_agg(r.rulename, jsonb_build_object(
            'definition', replace(pg_get_ruledef(r.oid), format(' TO %%I.%%I ', n.nspname, c.relname),
                                  ' TO <table> '),
            'enabled', r.ev_enabled)), '{}')
        FROM pg_rewrite r WHERE r.ev_class = c.oid AND r.rulename <> '_RETURN'),
    'policies', (SELECT coalesce(jsonb_object_agg(p.polname, jsonb_build_object(
            'command', p.polcmd, 'permissive', p.polpermissive,
            'roles', (SELECT jsonb_agg(x ORDER BY x) FROM (
                SELECT CASE WHEN r = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(r) END AS x FROM unnest(p.polroles) r) q),
            'using', pg_get_expr(p.polqual, p.polrelid), 'with_check', pg_get_expr(p.polwithcheck, p.polrelid))),
            '{}')
        FROM pg_policy p WHERE p.polrelid = c.oid),
    'views', (SELECT coalesce(jsonb_agg(DISTINCT format('%%I.%%I', vn.nspname, v.relname)), '[]')
        FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class v ON v.oid = r.ev_class
        JOIN pg_namespace vn ON vn.oid = v.relnamespace
        WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
          AND d.refobjid = c.oid AND v.oid <> c.oid),
    'referenced_by', (SELECT coalesce(jsonb_object_agg(format('%%I.%%I', fn.nspname, f.relname) || '.' ||
                                                       quote_ident(k.conname), pg_get_constraintdef(k.oid)), '{}')
        FROM pg_constraint k JOIN pg_class f ON f.oid = k.conrelid JOIN pg_namespace fn ON fn.oid = f.relnamespace
        WHERE k.contype = 'f' AND k.confrelid = c.oid AND k.conrelid <> c.oid AND NOT f.relispartition))
    -- A partitioned table's partitions, by bound (their names change sides at the swap): what each
    -- carries of its own. Only then, so that other tables' descriptions read as they always did.
    || CASE WHEN c.relkind = 'p' THEN jsonb_build_object('partitions', (
        SELECT coalesce(jsonb_object_agg(concat_ws(' under ', pg_get_expr(pc.relpartbound, pc.oid),
                                                   pg_get_expr(pp.relpartbound, pp.oid)), jsonb_build_object(
                'kind', pc.relkind,
                'owner', pg_get_userbyid(pc.relowner),
                'comment', obj_description(pc.oid, 'pg_class'),
                'tablespace', (SELECT s.spcname FROM pg_tablespace s WHERE s.oid = pc.reltablespace),
                'reloptions', to_jsonb(coalesce(ARRAY(SELECT o FROM unnest(pc.reloptions) o
                                                      WHERE split_part(o, '=', 1) <> 'autovacuum_enabled'), '{}')),
                'grants', (SELECT coalesce(jsonb_agg(x ORDER BY x), '[]') FROM (
                    SELECT concat_ws(' ', a.privilege_type, 'TO', CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                     ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                                     CASE WHEN a.is_grantable THEN 'WITH GRANT OPTION' END) AS x
                    FROM aclexplode(pc.relacl) a WHERE a.grantee <> pc.relowner) g))), '{}')
        FROM pg_partition_tree(c.oid) t JOIN pg_class pc ON pc.oid = t.relid
        LEFT JOIN pg_class pp ON pp.oid = t.parentrelid AND t.level > 1
        WHERE t.level > 0)) ELSE '{}'::jsonb END
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = %s
"""


# PostgreSQL prints an integer bound bare (10) and a bigint or smallint one quoted ('10'): a
# partition column the plan widens ([target] columns, the layout kept) leaves every bound the
# same value in another print. Partitions are matched by value, their integers unquoted.
_QUOTED_INTEGER = re.compile(r"'(-?[0-9]+)'")


def _by_bound_value(partitions: dict[str, Any]) -> dict[str, Any]:
    return {_QUOTED_INTEGER.sub(r"\1", bound): p for bound, p in partitions.items()}


def describe(cur: psycopg.Cursor, oid: int, base: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The shape (`base`, when the caller has just read it with shape.describe) and the rest of the
    metadata of the table with this oid; None if it is gone."""
    base = base or shape.describe(cur, [oid]).get(oid)
    if base is None:
        return None
    row = reading.read_one(cur, DESCRIBE_METADATA, (oid,), missing=_vanished)
    if row is None:  # dropped since shape.describe read it
        return None
    return {**base, "metadata": row[0]}


def _vanished(row: reading.Row) -> str | None:
    """The object DESCRIBE_METADATA found but could not print (dropped since the scan: race 10)."""
    m = row[0]
    return reading.first([
        *(f"{what[:-1]} {names.display_ident(k)}" for what in ("triggers", "rules", "statistics")
          for k, v in m[what].items() if v["definition"] is None),
        *(f"foreign key {k}" for k, v in m["referenced_by"].items() if v is None)])


# ---------------------------------------------------------------------------------------------
# Pure part


@dataclass(frozen=True)
class Difference:
    kind: str  # the aspect: column_type, grant, publication, statistics, index_name, trigger, ...
    item: str  # what it is about: a column, a grant, a publication name, an index...
    before: Any
    after: Any
    status: str = "unplanned"  # planned | accepted | unplanned
    reason: str = ""  # why it is planned or accepted

    @property
    def key(self) -> str:
        """How `[cutover] accept_parity` names it."""
        return f"{self.kind}:{self.item}"

    @property
    def message(self) -> str:
        return f"{self.kind} {self.item}: {_show(self.before)} -> {_show(self.after)}"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "item": self.item, "before": self.before, "after": self.after,
                "status": self.status, "reason": self.reason}


def _show(value: Any) -> str:
    return "absent" if value is None else str(value)


@dataclass(frozen=True)
class Planned:
    """What the plan and mover change on purpose, for compare()."""

    columns: frozenset[str] = frozenset()  # columns whose type the plan changes
    # The target is partitioned by these: its key and storage differ, and a primary key makes them NOT NULL.
    partition_columns: frozenset[str] = frozenset()
    renames: dict[str, str] = field(default_factory=dict)  # name after -> name before (indexes, constraints)
    dropped_foreign_keys: frozenset[str] = frozenset()
    # Before the swap only: what the swap itself makes on the new table (publication membership,
    # replica identity, NOT VALID checks, statistics names, and whatever else swap_made lists).
    at_swap: bool = False
    accepted: frozenset[str] = frozenset()  # [cutover] accept_parity
    # A family's (issue 27), before its swap: each new table's name as definitions print it ->
    # the name the swap gives it (its source's). The keys between the family's tables are on the
    # new tables from the first reconcile on, referencing the other new tables (keys.link); the
    # swap renames the tables and the keys stay with them, so that a key that reads, names mapped,
    # as the source's is what the swap makes. After the swap there is nothing to map.
    family: dict[str, str] = field(default_factory=dict)
    one_table: bool = False  # [target.partition] by = "none": a partitioned table becomes one table

    @property
    def partitioned(self) -> bool:
        return bool(self.partition_columns)


# Aspects the swap transaction makes or moves (mover/engines/swap/cutover.py, mover/engines/swap/carry.py,
# mover/engines/swap/metadata.py): before the swap the new table lacks them on purpose.
SWAP_MADE = frozenset({"publication", "constraint", "trigger", "rule", "policy", "view", "referenced_by"})
# ... and what it sets, whatever the new table has before.
SWAP_SET = frozenset({"replica_identity", "replica_identity_index", "statistics_name", "row_security"})


def compare(before: dict[str, Any], after: dict[str, Any], planned: Planned) -> list[Difference]:
    """Every difference between two parity descriptions (describe()), each marked planned,
    accepted or unplanned."""
    found = _raw(before, after, planned)
    return [_classify(d, planned, before, after) for d in found]


def unplanned(diffs: list[Difference]) -> list[Difference]:
    return [d for d in diffs if d.status == "unplanned"]


def _classify(d: Difference, p: Planned, before: dict[str, Any], after: dict[str, Any]) -> Difference:
    reason = _planned_reason(d, p, before, after)
    if reason:
        return Difference(d.kind, d.item, d.before, d.after, "planned", reason)
    if d.key in p.accepted or d.kind in p.accepted:
        return Difference(d.kind, d.item, d.before, d.after, "accepted", "[cutover] accept_parity")
    return d


def _planned_reason(d: Difference, p: Planned, before: dict[str, Any], after: dict[str, Any]) -> str:
    if p.family and _family_key(d, p, before, after):
        return "a key between the family's tables: on the new tables since the first reconcile, it stays with them" \
               " when the swap renames them"
    column = d.item.split(".", 1)[0] if d.kind.startswith("column_") else None
    if column is not None and column in p.columns and d.kind in ("column_type", "column_storage",
                                                                  "column_compression", "column_default"):
        return "[target] columns changes this column's type"
    # A type change that makes the column collatable (integer -> text: the type's default collation)
    # or no longer so (text -> integer) changes its collation with it. Between two collatable types
    # create_target keeps the column's own (_kept_collation): a difference there is not the plan's.
    if column is not None and column in p.columns and d.kind == "column_collation" and None in (d.before, d.after):
        return "[target] columns changes this column's type, and whether the type has a collation"
    if p.partitioned and d.kind in ("kind", "reloptions", "constraint", "index", "index_name", "constraint_name",
                                    "replica_identity") and not _exclusion(d):
        return "[target.partition]: a partitioned table's key holds the partition columns and it stores no rows"
    if p.one_table and (d.kind == "kind" or d.kind.startswith("partition")):
        return "[target.partition] by = \"none\": the partitioned table becomes one ordinary table"
    if p.partitioned and d.kind.startswith("partition"):
        return "[target.partition]: the new table's partitions are the new layout's"
    if d.kind == "column_not_null" and column in p.partition_columns:
        return "[target.partition]: the primary key holds the partition columns, and a key's columns are NOT NULL"
    if d.kind in ("index_name", "constraint_name") and d.item in p.renames.values():
        return "the new table's objects carry mover's names"
    # Both ways: the swap back (rollback) compares the new table "before" with the original "after".
    if d.kind == "constraint_validated" and d.before and not d.after:
        return "added NOT VALID at the swap and validated after the lock is released"
    if d.kind == "constraint" and d.item in p.dropped_foreign_keys and None in (d.before, d.after):
        return "[target] drop_foreign_keys"
    if d.kind == "constraint" and None in (d.before, d.after) and (d.item in p.renames.values()
                                                                    or d.item in p.renames) and not _exclusion(d):
        return "carried as a unique index under mover's name"
    if (p.at_swap and d.kind == "column_not_null" and d.before and not d.after
            and before.get("metadata", {}).get("columns", {}).get(column, {}).get("not_null_valid") is False):
        return "NOT NULL ... NOT VALID (PostgreSQL 18): old rows may hold NULL; added as it was at the swap"
    if (p.at_swap and d.kind == "constraint_comment" and d.after is None and d.item in before["constraints"]
            and d.item not in after["constraints"]):
        return "made at the swap, with its constraint"
    if p.at_swap and (d.kind == "index" or _exclusion(d)) and d.after is None:
        return "built after the backfill"
    if p.at_swap and (d.kind in SWAP_SET or d.kind in SWAP_MADE and d.after is None):
        return "made at the swap"
    return ""


def _renamed(text: str, family: dict[str, str]) -> str:
    """A definition (or a referencing key's qualified name) with each new table of the family named
    as the swap will name it."""
    for new, source in family.items():
        text = text.replace(f"REFERENCES {new}(", f"REFERENCES {source}(")
        if text.startswith(f"{new}."):
            text = source + text[len(new):]
    return text


def _family_key(d: Difference, p: Planned, before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether `d` is only a key between the family's tables as it reads before the swap renames
    them: the same key (name, definition) on both sides once the new tables' names are mapped."""
    if d.kind == "constraint":  # this table's key referencing another table of the family
        return d.before is not None and d.after is not None and _renamed(d.after, p.family) == d.before
    if d.kind != "referenced_by":  # another table of the family referencing this one
        return False
    theirs = {k: _valid_text(v) for k, v in after.get("metadata", {}).get("referenced_by", {}).items()}
    ours = {k: _valid_text(v) for k, v in before.get("metadata", {}).get("referenced_by", {}).items()}
    if d.before is None:  # on the new table: the source's own, named as after the swap
        return _renamed(d.item, p.family) != d.item and ours.get(_renamed(d.item, p.family)) == _renamed(
            d.after, p.family)
    if d.after is None:  # on the source: the new table holds it under the new tables' names
        return any(_renamed(k, p.family) == d.item and _renamed(v or "", p.family) == d.before
                   for k, v in theirs.items() if k != d.item)
    return False


def _exclusion(d: Difference) -> bool:
    """An exclusion constraint's difference, or a temporal key's (PostgreSQL 18: PRIMARY KEY /
    UNIQUE (..., col WITHOUT OVERLAPS), an exclusion constraint underneath): a partitioned table
    takes the constraint as it is (where PostgreSQL allows one at all: plan check refuses the
    others), so partitioning plans none of it; and one that went missing must not pass as the new
    key's, nor as a unique index carried under mover's name (it is built as the constraint it is).
    Read from the catalog's definition text: a quoted column name that reads like WITHOUT OVERLAPS
    can only make a difference unplanned, which refuses the swap rather than pass it."""
    return d.kind == "constraint" and any(isinstance(v, str) and _builds_own_index(v) for v in (d.before, d.after))


def _builds_own_index(definition: str) -> bool:
    return definition.startswith("EXCLUDE ") or (
        definition.startswith(("PRIMARY KEY (", "UNIQUE (")) and " WITHOUT OVERLAPS)" in definition)


def _raw(before: dict[str, Any], after: dict[str, Any], p: Planned) -> list[Difference]:
    out: list[Difference] = []
    b_meta, a_meta = before.get("metadata", {}), after.get("metadata", {})

    def same(kind: str, item: str, x: Any, y: Any) -> None:
        if x != y:
            out.append(Difference(kind, item, x, y))

    same("kind", "table", before.get("kind"), after.get("kind"))
    same("persistence", "table", before.get("persistence"), after.get("persistence"))
    same("of_type", "table", before.get("of_type"), after.get("of_type"))  # CREATE TABLE ... OF type
    # Columns, by name (a type change is planned per column).
    b_cols = {c["name"]: c for c in before["columns"]}
    a_cols = {c["name"]: c for c in after["columns"]}
    for name in sorted(b_cols.keys() | a_cols.keys()):
        bc, ac = b_cols.get(name), a_cols.get(name)
        if bc is None or ac is None:
            same("column", name, bc and shape._column_text(bc), ac and shape._column_text(ac))
            continue
        for key in ("type", "collation", "not_null", "default", "identity", "generated"):
            same(f"column_{key}", name, bc.get(key), ac.get(key))
        bm, am = b_meta.get("columns", {}).get(name, {}), a_meta.get("columns", {}).get(name, {})
        for key in ("storage", "compression", "statistics", "comment", "grants", "security_labels"):
            same(f"column_{key}", name, bm.get(key), am.get(key))
    # Constraints and indexes, by name once the planned renames are undone: only where one side has
    # mover's name and the other the original (the swap gives the original names over, both ways).
    b_names = before["constraints"].keys() | before["indexes"].keys()
    a_names = after["constraints"].keys() | after["indexes"].keys()
    rn = {a: b for a, b in p.renames.items() if a in a_names and a not in b_names and b in b_names
          and b not in a_names}
    b_con, a_con = before["constraints"], {rn.get(k, k): v for k, v in after["constraints"].items()}
    for name in sorted(b_con.keys() | a_con.keys()):
        # Validation is compared on its own: the swap adds foreign keys NOT VALID and validates
        # them after the lock is released (mover/engines/swap/carry.py).
        bd, ad = (_valid_text((b_con.get(name) or {}).get("definition")),
                  _valid_text((a_con.get(name) or {}).get("definition")))
        same("constraint", name, bd, ad)
        if bd is not None and ad is not None:
            same("constraint_validated", name, b_con[name]["validated"], a_con[name]["validated"])
            same("constraint_deferral", name, (b_con[name]["deferrable"], b_con[name]["deferred"]),
                 (a_con[name]["deferrable"], a_con[name]["deferred"]))
    b_ix, a_ix = before["indexes"], {rn.get(k, k): v for k, v in after["indexes"].items()}
    for name in sorted(b_ix.keys() | a_ix.keys()):
        bi, ai = b_ix.get(name), a_ix.get(name)
        same("index", name, bi and _index_text(bi), ai and _index_text(ai))
    for after_name, before_name in sorted(rn.items()):
        if after_name in after["indexes"] and before_name in before["indexes"]:
            out.append(Difference("index_name", before_name, before_name, after_name))
        if after_name in after["constraints"] and before_name in before["constraints"]:
            out.append(Difference("constraint_name", before_name, before_name, after_name))
    for kind, key in (("index_comment", "index_comments"), ("constraint_comment", "constraint_comments")):
        bmap, amap = b_meta.get(key, {}), {rn.get(k, k): v for k, v in a_meta.get(key, {}).items()}
        for name in sorted(bmap.keys() | amap.keys()):
            same(kind, name, bmap.get(name), amap.get(name))
    # The table's own metadata.
    for key in ("owner", "comment", "reloptions", "security_labels"):
        same(key, "table", b_meta.get(key), a_meta.get(key))
    same("row_security", "table", (b_meta.get("row_security"), b_meta.get("force_row_security")),
         (a_meta.get("row_security"), a_meta.get("force_row_security")))
    same("replica_identity", "table", b_meta.get("replica_identity"), a_meta.get("replica_identity"))
    b_ri, a_ri = b_meta.get("replica_identity_index"), a_meta.get("replica_identity_index")
    same("replica_identity_index", "table", b_ri, rn.get(a_ri, a_ri) if a_ri else None)
    b_g, a_g = set(b_meta.get("grants", [])), set(a_meta.get("grants", []))
    out += [Difference("grant", g, g, None) for g in sorted(b_g - a_g)]
    out += [Difference("grant", g, None, g) for g in sorted(a_g - b_g)]
    for kind, key in (("publication", "publications"), ("trigger", "triggers"), ("rule", "rules"),
                      ("policy", "policies"), ("referenced_by", "referenced_by")):
        bmap, amap = b_meta.get(key, {}), a_meta.get(key, {})
        if kind == "referenced_by":  # re-created NOT VALID at the swap, validated after it
            bmap, amap = ({k: _valid_text(v) for k, v in m.items()} for m in (bmap, amap))
        for name in sorted(bmap.keys() | amap.keys()):
            same(kind, name, bmap.get(name), amap.get(name))
    out += _compare_statistics(b_meta.get("statistics", {}), a_meta.get("statistics", {}))
    b_p, a_p = (_by_bound_value(m.get("partitions", {})) for m in (b_meta, a_meta))
    for bound in sorted(b_p.keys() | a_p.keys()):
        bp, ap = b_p.get(bound), a_p.get(bound)
        if bp is None or ap is None:
            same("partition", bound, bp and bp["kind"], ap and ap["kind"])
            continue
        for key in ("kind", "owner", "comment", "tablespace", "reloptions", "grants"):
            same(f"partition_{key}", bound, bp.get(key), ap.get(key))
    b_v, a_v = set(b_meta.get("views", [])), set(a_meta.get("views", []))
    out += [Difference("view", v, v, None) for v in sorted(b_v - a_v)]
    out += [Difference("view", v, None, v) for v in sorted(a_v - b_v)]
    return out


def _valid_text(definition: str | None) -> str | None:
    return definition.removesuffix(" NOT VALID") if definition is not None else None


def _index_text(ix: dict[str, Any]) -> str:
    return ("UNIQUE " if ix.get("unique") else "") + str(ix["definition"]) + (
        "" if ix.get("valid", True) else " INVALID")


def _compare_statistics(before: dict[str, Any], after: dict[str, Any]) -> list[Difference]:
    """Extended statistics are matched by definition: their names are only compared as names."""
    out: list[Difference] = []
    by_def = {v["definition"]: k for k, v in after.items()}
    matched: set[str] = set()
    for name, b in sorted(before.items()):
        a_name = name if name in after and after[name]["definition"] == b["definition"] else by_def.get(
            b["definition"])
        if a_name is None or a_name in matched:
            out.append(Difference("statistics", name, b["definition"], None))
            continue
        matched.add(a_name)
        if a_name != name:
            out.append(Difference("statistics_name", name, name, a_name))
        for key in ("statistics", "comment"):
            if b.get(key) != after[a_name].get(key):
                out.append(Difference(f"statistics_{key}", name, b.get(key), after[a_name].get(key)))
    out += [Difference("statistics", k, None, v["definition"]) for k, v in sorted(after.items()) if k not in matched]
    return out


# ---------------------------------------------------------------------------------------------
# What a migration plans, and the checks


def renames(mid: int, source_desc: dict[str, Any], target_name: str, key_index: str) -> dict[str, str]:
    """The names the new table's indexes and key take (mover/steps/create_target.py,
    mover/engines/bulk/builds.py), mapped to the source's names they stand for."""
    out: dict[str, str] = {}
    for ix_name, ix in source_desc["indexes"].items():
        if ix_name == key_index:
            con = ix.get("constraint")
            primary = bool(con) and source_desc["constraints"].get(con, {}).get("type") == "p"
            out[names.derived(target_name, "_pkey" if primary else "_key")] = ix_name
        else:
            out[deferred_index_name(mid, ix_name)] = ix_name
    return out


def planned(plan: Plan, renamed: dict[str, str], *, at_swap: bool, family: dict[str, str] | None = None) -> Planned:
    """What the plan and mover change on purpose: the one judgement of the swap (check_swap) and
    of `mover parity` (report)."""
    return Planned(columns=frozenset(plan.columns),
                   partition_columns=frozenset(plan.new_layout.columns if plan.new_layout else ()), renames=renamed,
                   dropped_foreign_keys=frozenset(plan.drop_foreign_keys), at_swap=at_swap,
                   accepted=frozenset(plan.cutover.accept_parity), family=family or {}, one_table=plan.one_table)


def family_names(cur: psycopg.Cursor, members: Any) -> dict[str, str]:
    """A family's new tables' names as pg_get_constraintdef prints them -> their sources' (the
    names the swap gives them), for Planned.family; empty for a migration of one table."""
    if len(members) < 2:
        return {}
    out = {}
    for t in members:
        cur.execute("SELECT format('%%I.%%I', %s::text, %s::text), format('%%I.%%I', %s::text, %s::text)",
                    (t.migration.target.schema, t.migration.target.name, t.migration.source.schema,
                     t.migration.source.name))
        new, source = one(cur)
        out[new] = source
    return out


def refusal(name: str, diffs: list[Difference], when: str, command: str = "cutover") -> Waiting:
    listed = "; ".join(d.message for d in diffs)
    keys = ", ".join(f'"{d.key}"' for d in diffs)
    plural = "s" if len(diffs) != 1 else ""
    return Waiting(f"{len(diffs)} unplanned metadata difference{plural} {when} of migration {name!r}: {listed};"
                   f" nothing was swapped",
                   hint=f"undo the change on the new table (see `mover parity {name}`), or accept them in the plan:"
                        f" [cutover] accept_parity = [{keys}] (edit the plan, `mover run PLAN`), then"
                        f" `mover {command} {name}`")


def store_baseline(cur: psycopg.Cursor, mid: int, actor: str, step: str, description: dict[str, Any],
                   key_index: str) -> None:
    control.event(cur, mid, actor, step, BASELINE_EVENT,
                  "the live table's metadata before the swap, for `mover parity`",
                  {"description": description, "key_index": key_index})


def oids(cur: psycopg.Cursor, mid: int) -> tuple[int, int | None]:
    """(original, new) table oids, whatever they are named now."""
    recorded = control.shapes(cur, mid)
    assert recorded["source"] is not None  # recorded at registration
    return recorded["source"]["oid"], recorded["target"]["oid"] if recorded["target"] else None


def live_description(cur: psycopg.Cursor, mid: int, forward: bool) -> dict[str, Any]:
    """Before the swap's DDL: the table that carries the name now. Read before the lock with the
    swap's statements (the digest checked under the lock covers what it reads: carry.SWAP_INPUTS),
    and read again under the lock only when that digest changed."""
    original, new = oids(cur, mid)
    desc = describe(cur, original if forward else new)  # type: ignore[arg-type]
    assert desc is not None  # locked
    return desc


def check_swap(cur: psycopg.Cursor, ctx: Any, before: dict[str, Any], key_index: str, *, forward: bool,
               after_shape: dict[str, Any] | None = None) -> None:
    """Inside the swap, after its DDL: refuse (the transaction rolls back) on an unplanned difference.
    `after_shape`: the shape of the table taking the name, when the swap has just read it."""
    if after_shape is not None:
        after = describe(cur, int(after_shape["oid"]), after_shape)
    else:
        original, new = oids(cur, ctx.mid)
        after = describe(cur, new if forward else original)  # type: ignore[arg-type]
    assert after is not None
    source_side = before if forward else after
    renamed = renames(ctx.mid, source_side, ctx.migration.target.name, key_index)
    if not forward:
        renamed = {v: k for k, v in renamed.items()}
    # A family's keys between its tables need no mapping here: the swap has just renamed the
    # tables, and the keys read on both sides as the sources' (`mover parity` before the swap maps them).
    diffs = compare(before, after, planned(ctx.plan, renamed, at_swap=False))
    bad = unplanned(diffs)
    if bad:
        raise refusal(ctx.migration.name, bad, "the swap would make" if forward else "the swap back would make",
                      "cutover" if forward else "rollback")
    if forward:
        store_baseline(cur, ctx.mid, ctx.owner, "cutover", before, key_index)


def report(cur: psycopg.Cursor, ctx: Any, family: dict[str, str] | None = None) -> dict[str, Any]:
    """`mover parity NAME`: before the swap, the new table against the original modulo what is
    planned and what the swap makes; after it, the stored baseline against the live table; after a
    rollback, also the baseline against the original again. `family`: a family's new tables'
    names -> its sources' (family_names), which the swap gives them."""
    original, new = oids(cur, ctx.mid)
    source = describe(cur, original)
    target = describe(cur, new) if new is not None else None
    stored = _last_baseline(cur, ctx.mid)
    baseline = stored["description"] if stored else None
    comparisons: list[dict[str, Any]] = []
    if ctx.swapped:
        if baseline is None or target is None:
            raise BadInput(f"migration {ctx.migration.name!r} was swapped without a parity baseline (by a mover"
                           f" release before `mover parity`); there is nothing to compare the live table with",
                           hint=f"compare by hand with the old table, `{ctx.migration.old}`")
        # From the baseline: after retire the original table may be gone.
        renamed = renames(ctx.mid, baseline, ctx.migration.target.name, stored["key_index"] if stored else "")
        comparisons.append(_comparison("after_swap", "the original table before the swap",
                                       f"{ctx.migration.source} now", baseline, target,
                                       planned(ctx.plan, renamed, at_swap=False)))
    else:
        if target is None:
            raise Waiting(f"the new table of migration {ctx.migration.name!r} is not created yet; nothing to compare",
                          hint=f"`mover run {ctx.migration.name}`")
        assert source is not None
        key_index = introspect.describe(cur, ctx.original).key_index
        renamed = renames(ctx.mid, source, ctx.migration.target.name, key_index)
        comparisons.append(_comparison("before_swap", str(ctx.migration.source), str(ctx.migration.target),
                                       source, target, planned(ctx.plan, renamed, at_swap=True, family=family)))
        if baseline is not None:
            comparisons.append(_comparison("after_rollback", "the original table before the swap",
                                           f"{ctx.migration.source} now", baseline, source,
                                           planned(ctx.plan, {}, at_swap=False)))
    diffs = [d for c in comparisons for d in c["differences"]]
    return {"name": ctx.migration.name, "step": ctx.migration.step, "swapped": ctx.swapped,
            "equal": not any(d["status"] == "unplanned" for d in diffs), "comparisons": comparisons}


def _comparison(mode: str, before_label: str, after_label: str, before: dict[str, Any], after: dict[str, Any],
                p: Planned) -> dict[str, Any]:
    diffs = compare(before, after, p)
    return {"mode": mode, "before": before_label, "after": after_label,
            "equal": not unplanned(diffs), "differences": [d.as_dict() for d in diffs]}


def _last_baseline(cur: psycopg.Cursor, mid: int) -> dict[str, Any] | None:
    cur.execute("SELECT detail FROM mover.events WHERE migration_id = %s AND kind = %s"
                " ORDER BY id DESC LIMIT 1", (mid, BASELINE_EVENT))
    row = cur.fetchone()
    return row[0] if row else None
