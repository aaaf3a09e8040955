"""Partitioned targets: which partitions a conversion creates, and their upkeep after it.

Invariants:
- Every value the source holds has a partition before anything is created: range partitions
  run without gaps from the smallest value to `premake` intervals past the newest one (or now,
  whichever is later); a value no partition takes (a NULL, an unlisted list value) is refused
  by plan check unless the plan asks for a DEFAULT partition.
- The bounds are read through an index on the column where there is one (ORDER BY ... LIMIT 1
  from each end), never by a full scan then.
- Upkeep (`maintain`) only adds partitions ahead and detaches expired ones CONCURRENTLY; it never
  deletes rows, and drops a detached partition only when the plan says drop_detached = true.
"""

from __future__ import annotations

import calendar
import datetime as dt
import logging
import re
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import sql

from mover import names
from mover.catalog import introspect, partition_tree, reading, server
from mover.db import one
from mover.engines.partitioning import source_tree
from mover.errors import PlanError
from mover.plan import PartitionSpec
from mover.sql import partitions as q
from mover.sql import trusted

log = logging.getLogger("mover.partitions")

TIME_TYPES = {"timestamp with time zone", "timestamp without time zone", "date"}
INTEGER_TYPES = {"smallint", "integer", "bigint"}


@dataclass(frozen=True)
class Partition:
    name: str
    bound: sql.Composable
    lo: Any = None  # range partitions: [lo, hi)
    hi: Any = None
    label: str = ""  # the bound in words, for plan check and status

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "bound": self.label}


def _utc(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    return value


def period_start(value: Any, interval: str) -> dt.date:
    """The first day of the interval that holds `value` (UTC for timestamptz; weeks start Monday)."""
    d = _utc(value)
    d = d.date() if isinstance(d, dt.datetime) else d
    if interval == "day":
        return d
    if interval == "week":
        return d - dt.timedelta(days=d.weekday())
    if interval == "month":
        return d.replace(day=1)
    return d.replace(month=1, day=1)


def next_period(start: dt.date, interval: str) -> dt.date:
    if interval == "day":
        return start + dt.timedelta(days=1)
    if interval == "week":
        return start + dt.timedelta(days=7)
    if interval == "month":
        y, m = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
        return dt.date(y, m, min(start.day, calendar.monthrange(y, m)[1]))
    return start.replace(year=start.year + 1)


def _bound_value(day: dt.date, type_text: str) -> Any:
    if type_text == "date":
        return day
    if type_text == "timestamp with time zone":
        return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
    return dt.datetime(day.year, day.month, day.day)


def partition_name(spec: PartitionSpec, table: str, *, day: dt.date | None = None, n: Any = None) -> str:
    fields = {"table": table, "N": "" if n is None else str(n)}
    if day is not None:
        fields |= {"YYYY": f"{day.year:04d}", "MM": f"{day.month:02d}", "DD": f"{day.day:02d}"}
    name = re.sub(r"{(\w+)}", lambda m: fields.get(m.group(1), ""), spec.name)
    if len(name.encode()) > names.NAMEDATALEN:
        raise PlanError(f"[target.partition] name: partition name {name!r} is longer than 63 bytes",
                        hint="choose a shorter pattern in [target.partition] name")
    return name


def default_name(table: str) -> str:
    return names.derived(table, "_default")


def column_type(info: introspect.TableInfo, column: str) -> str:
    return info.column(column).type


def range_partitions(spec: PartitionSpec, table: str, type_text: str, lo: Any, hi: Any, now: dt.datetime,
                     premake: int | None = None) -> list[Partition]:
    """Partitions from the one holding `lo` through `premake` past the one holding max(hi, now)
    (integer columns: past `hi`). With no value at all, from now (integers: from 0)."""
    ahead = spec.premake if premake is None else premake
    out = []
    if spec.interval is not None:
        # Up to `premake` past now: a row dated further ahead is an outlier (layout() sends it to the
        # default partition, or refuses), not a reason for hundreds of empty partitions.
        newest = now.date() if type_text == "date" else now
        start = period_start(lo if lo is not None and _comparable(lo) < _comparable(newest) else newest,
                             spec.interval)
        last = period_start(newest, spec.interval)
        for _ in range(ahead):
            last = next_period(last, spec.interval)
        day = start
        while day <= last:
            nxt = next_period(day, spec.interval)
            a, b = _bound_value(day, type_text), _bound_value(nxt, type_text)
            out.append(Partition(partition_name(spec, table, day=day), q.range_bound(a, b, type_text), a, b,
                                 f"FROM {day.isoformat()} TO {nxt.isoformat()}"))
            day = nxt
        return out
    step = spec.step
    assert step is not None  # parse_plan: a range has an interval or a step
    first = ((lo if lo is not None else 0) // step) * step
    top = ((hi if hi is not None else 0) // step + ahead) * step
    at = first
    while at <= top:
        out.append(Partition(partition_name(spec, table, n=at), q.range_bound(at, at + step, type_text), at,
                             at + step, f"FROM {at} TO {at + step}"))
        at += step
    return out


def _comparable(value: Any) -> Any:
    # Naive timestamps compare with an aware now() as if they were UTC.
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


@dataclass
class Layout:
    partitions: list[Partition]
    missing: list[str]  # values of the source that no partition would take (refused unless default)


def layout(cur: psycopg.Cursor, spec: PartitionSpec, source: names.QualifiedName, table: str,
           target_schema: str) -> Layout:
    """The partitions a conversion of `source` creates, read from its data (see the invariants)."""
    info = introspect.describe(cur, source)
    types = tuple(column_type(info, c) for c in spec.columns)
    missing: list[str] = []
    parts: list[Partition] = []
    if spec.by == "range":
        col, typ = spec.columns[0], types[0]
        if spec.interval is not None and typ not in TIME_TYPES:
            raise PlanError(f"[target.partition] interval {spec.interval!r}: column {names.display_ident(col)} is "
                            f"{typ}, not a date or timestamp", hint="use a number as the interval for integer columns")
        if spec.step is not None and typ not in INTEGER_TYPES:
            raise PlanError(f"[target.partition] interval: a number needs an integer column; "
                            f"{names.display_ident(col)} is {typ}", hint='use e.g. interval = "1 month"')
        cur.execute(q.first_value(source, col, False))
        row = cur.fetchone()
        lo = row[0] if row else None
        cur.execute(q.first_value(source, col, True))
        row = cur.fetchone()
        hi = row[0] if row else None
        cur.execute("SELECT now()")
        now = one(cur)[0]
        parts = range_partitions(spec, table, typ, lo, hi, now)
        if len(parts) > spec.max_partitions:
            raise PlanError(f"[target.partition]: {len(parts)} partitions would be created for {source}, from the "
                            f"one {parts[0].label} (the smallest value of {names.display_ident(col)}, {lo}) on",
                            hint=f"at most {spec.max_partitions} ([target.partition] max_partitions): choose a "
                                 f"wider interval, move or delete the outliers, or raise max_partitions")
        if hi is not None and parts and _comparable(hi) >= _comparable(parts[-1].hi):
            missing.append(f"value {hi} of column {names.display_ident(col)} is after the last partition "
                           f"({parts[-1].label}); raise premake or set default = true")
        if not info.column(col).not_null:
            cur.execute(q.has_null(source, col))
            if one(cur)[0]:
                missing.append(f"NULL in column {names.display_ident(col)} (a range partition takes no NULL)")
    elif spec.by == "list":
        if len(spec.columns) != 1:
            raise PlanError("[target.partition] columns: PostgreSQL partitions a list by one column only",
                            hint="name one column, or partition by hash")
        col, typ = spec.columns[0], types[0]
        for suffix, values in spec.values:
            parts.append(Partition(partition_name(spec, table, n=suffix), q.list_bound(values, types),
                                   label=f"IN ({', '.join(map(str, values))})"))
        cur.execute(q.unlisted_value(source, col, typ, [v for _, vs in spec.values for v in vs]))
        row = cur.fetchone()
        if row is not None:
            missing.append(f"value {'NULL' if row[0] is None else repr(row[0])} of column "
                           f"{names.display_ident(col)} is in no list of [target.partition] values")
    else:
        for r in range(spec.modulus):
            parts.append(Partition(partition_name(spec, table, n=r), q.hash_bound(spec.modulus, r),
                                   label=f"WITH (MODULUS {spec.modulus}, REMAINDER {r})"))
    if spec.default:
        parts.append(Partition(default_name(table), q.default_bound(), label="DEFAULT"))
        missing = []
    # A name a partition of a partitioned source holds is taken until the swap hands it over.
    held = {r.name for r in partition_tree.relations(cur, info.oid) if r.schema == target_schema}
    parts = [replace(p, name=source_tree.new_name(p.name)) if p.name in held else p for p in parts]
    seen: set[str] = set()
    for p in parts:
        if p.name in seen:
            raise PlanError(f"[target.partition] name: two partitions would both be named {p.name!r}",
                            hint="include {N} or the date fields in the pattern")
        seen.add(p.name)
    return Layout(parts, missing)


def key_columns(key: tuple[str, ...], spec: PartitionSpec) -> tuple[str, ...]:
    """The target's unique key: the source's, plus the partition columns it lacks (PostgreSQL
    enforces uniqueness on a partitioned table only over keys that include them)."""
    return key + tuple(c for c in spec.columns if c not in key)


def create_sql(spec: PartitionSpec, target: names.QualifiedName, parts: list[Partition]) -> list[sql.Composed]:
    assert target.schema is not None
    return [q.create_partition(names.QualifiedName(target.schema, p.name), target, p.bound) for p in parts]


def partition_columns(cur: psycopg.Cursor, table: names.QualifiedName) -> tuple[str, ...]:
    """The partition columns of `table`, or () when it is not partitioned."""
    oid = introspect.table_oid(cur, table)
    cur.execute(q.partition_key(), {"table": oid})
    row = cur.fetchone()
    return tuple(row[1]) if row else ()


def children(cur: psycopg.Cursor, parent: names.QualifiedName) -> list[tuple[names.QualifiedName, str, bool, bool]]:
    """(partition, bound text, is default, detach pending) for each partition of `parent`."""
    return [(names.QualifiedName(s, n), b, d, p) for s, n, b, d, p in reading.read(
        cur, q.partitions_of(), {"parent": introspect.table_oid(cur, parent)},
        missing=reading.printed(2, name=lambda r: f"partition {names.QualifiedName(r[0], r[1])}"))]


def key_sql(target: names.QualifiedName, key_name: str, primary: bool, columns: tuple[str, ...]) -> list[sql.Composed]:
    if primary:
        return [q.add_primary_key(target, key_name, columns)]
    return [q.create_unique_index(key_name, target, columns)]


def check_plan(cur: psycopg.Cursor, spec: PartitionSpec, source: names.QualifiedName,
               info: introspect.TableInfo, target: names.QualifiedName,
               columns: dict[str, str]) -> dict[str, Any]:
    """[target.partition] against the source's catalog and data (resolve_plan calls it before it
    refuses inbound foreign keys in general, to name the ones partitioning breaks). Returns what
    plan check reports: the key change and every partition to create."""
    have = {c.name: c for c in info.columns}
    for col in spec.columns:
        if col not in have:
            raise PlanError(f"[target.partition] columns: {source} has no column {names.display_ident(col)}",
                            hint=f"columns are: {', '.join(c.name for c in info.columns)}")
        if have[col].generated:
            raise PlanError(f"[target.partition] columns: {names.display_ident(col)} is a generated column; "
                            f"PostgreSQL cannot partition by one", hint="partition by a stored column")
        if col in columns:
            # Replay matches a row's partition by comparing the source's value with the target's.
            raise PlanError(f"[target] columns: {names.display_ident(col)} is a partition column; mover does "
                            f"not change a partition column's type during the conversion",
                            hint="change its type in a migration of its own, before or after this one")
    if introspect.persistence(cur, source) == "u":
        raise PlanError(f"[target.partition]: {source} is UNLOGGED, and PostgreSQL has no unlogged "
                        f"partitioned tables", hint="ALTER TABLE ... SET LOGGED first")
    pcols = set(spec.columns)
    new_key = key_columns(info.key, spec)
    # A temporal key's index is unique too; plan check judges it with the exclusion constraints
    # (checks/refused_objects.py), by its operators rather than its columns.
    lacking = [ix for ix in info.indexes if ix.is_unique and ix.name != info.key_index and not ix.by_constraint]
    cur.execute("SELECT i.indexrelid, array(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = i.indrelid"
                " AND a.attnum = ANY (i.indkey::int2[])) FROM pg_index i WHERE i.indrelid = %s", (info.oid,))
    index_columns = {r[0]: set(r[1]) for r in cur.fetchall()}
    lacking = [ix for ix in lacking if not pcols <= index_columns.get(ix.oid, set())]
    if lacking:
        raise PlanError(f"[target.partition]: the unique indexes "
                        f"{', '.join(names.display_ident(ix.name) for ix in lacking)} of {source} do not contain the "
                        f"partition columns ({', '.join(spec.columns)}); PostgreSQL cannot enforce them on a "
                        f"partitioned table, and mover does not widen them",
                        hint="drop them, or replace them with unique indexes that include the partition columns")
    # Inbound foreign keys whose referenced index loses its uniqueness: they would have nothing to
    # reference after the swap.
    cur.execute("SELECT format('%%I on %%s', c.conname, c.conrelid::regclass), c.conindid FROM pg_constraint c"
                " WHERE c.contype = 'f' AND c.confrelid = %s AND c.conrelid <> %s ORDER BY 1", (info.oid, info.oid))
    broken = [name for name, ix in cur.fetchall() if not pcols <= index_columns.get(ix, set())]
    if broken:
        raise PlanError(f"[target.partition]: foreign keys reference a key of {source} that will no longer be "
                        f"unique once it is partitioned by {', '.join(spec.columns)}: {'; '.join(broken)}",
                        hint="drop those foreign keys (or reference a key that includes the partition columns); "
                             "PostgreSQL needs a unique key on the referenced columns")
    changed = new_key != info.key
    change = None
    if changed:
        kind = "primary key" if next(ix for ix in info.indexes if ix.name == info.key_index).is_primary \
            else "unique key"
        change = (f"the {kind} ({', '.join(info.key)}) becomes ({', '.join(new_key)}): "
                  f"({', '.join(info.key)}) alone is no longer enforced unique by the new table "
                  f"(PostgreSQL enforces uniqueness on a partitioned table only over the partition columns too)")
        nullable = [c for c in new_key if c not in info.key and not have[c].not_null] if kind == "primary key" else []
        if nullable:
            change += (f"; a primary key's columns are NOT NULL, so {', '.join(map(names.display_ident, nullable))} "
                       f"becomes NOT NULL")
        for col in nullable:
            cur.execute(q.has_null(source, col))
            if one(cur)[0]:
                raise PlanError(f"[target.partition]: rows of {source} have NULL in column {names.display_ident(col)}, "
                                f"which the new primary key ({', '.join(new_key)}) cannot hold",
                                hint=f"give those rows a value in {names.display_ident(col)} first, or partition by "
                                     f"another column")
        if not spec.accept_key_change:
            raise PlanError(f"[target.partition]: {change}",
                            hint="if the application keeps that key unique itself, say so with "
                                 "accept_key_change = true in [target.partition]")
    assert target.schema is not None
    lay = layout(cur, spec, source, source.name, target.schema)
    if lay.missing:
        raise PlanError(f"[target.partition]: rows of {source} would have no partition: {'; '.join(lay.missing)}",
                        hint=("add the values to [target.partition] values, or set default = true for a "
                              "DEFAULT partition") if spec.by == "list" else
                             ("set default = true for a DEFAULT partition, or give those rows a value in "
                              f"{', '.join(names.display_ident(c) for c in spec.columns)} first"))
    for p in lay.partitions:
        if introspect.exists(cur, names.QualifiedName(target.schema, p.name)):
            raise PlanError(f"[target.partition] name: partition {p.name!r} would be created, but a table of "
                            f"that name exists in {names.display_ident(target.schema)}",
                            hint="choose another [target.partition] name pattern, or drop that table")
    return {"by": spec.by, "columns": list(spec.columns), "key": list(new_key), "key_change": change,
            "row_movement": row_movement(cur, info.oid, spec),
            "partitions": [p.describe() for p in lay.partitions]}


def row_movement(cur: psycopg.Cursor, source_oid: int, spec: PartitionSpec) -> str | None:
    """What the application's row triggers see change after the conversion: PostgreSQL runs an
    UPDATE that moves a row to another partition as a DELETE there and an INSERT here, and fires
    the row triggers as such (an audit trigger logs D + I where it logged U). None without any."""
    # tgtype bit 0: FOR EACH ROW; mover's own capture triggers are not the application's.
    cur.execute("SELECT coalesce(string_agg(quote_ident(tgname), ', ' ORDER BY tgname), '') FROM pg_trigger"
                " WHERE tgrelid = %s AND NOT tgisinternal AND tgtype::int & 1 = 1"
                " AND tgname !~ '^mover_m[0-9]+_'", (source_oid,))
    triggers = one(cur)[0]
    if not triggers:
        return None
    return (f"an UPDATE that changes {', '.join(map(names.display_ident, spec.columns))} so that the row moves to "
            f"another partition fires the row triggers ({triggers}) as a DELETE and an INSERT, not an UPDATE "
            f"(PostgreSQL's row movement; docs/partitioning.md)")


def child_index_name(partition: str, index: str) -> str:
    return names.derived(f"{partition}_{index}", "")


def live_partitions(cur: psycopg.Cursor, table: names.QualifiedName) -> list[names.QualifiedName] | None:
    """The partitions of `table` (none pending detach), or None when it is not partitioned."""
    if not partition_columns(cur, table):
        return None
    return [child for child, _, _, pending in children(cur, table) if not pending]


def child_indexes(cur: psycopg.Cursor, parent: names.QualifiedName,
                  index: str) -> list[tuple[names.QualifiedName, str]]:
    """(partition, the name its part of the parent's index `index` gets) for every partition."""
    return [(child, child_index_name(child.name, index)) for child, _, _, pending in children(cur, parent)
            if not pending]


def attach_indexes(cur: psycopg.Cursor, parent: names.QualifiedName, index: str, ix: introspect.Index) -> None:
    """The parent's index ON ONLY (no build), then each partition's attached: the parent's turns
    valid with the last. Re-entrant: what exists or is attached already is left as it is."""
    assert parent.schema is not None
    cur.execute(q.create_index_on_only(index, parent, ix.is_unique, ix.definition_tail))
    parent_index = names.QualifiedName(parent.schema, index)
    for child, child_index in child_indexes(cur, parent, index):
        cur.execute("SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s)"
                    " AND inhparent = to_regclass(%s))",
                    (str(names.QualifiedName(child.schema, child_index)), str(parent_index)))
        if not one(cur)[0]:
            cur.execute(q.attach_index(parent_index, names.QualifiedName(child.schema, child_index)))


# ---------------------------------------------------------------------------------------------
# Upkeep: `mover partitions maintain`


def live_table(cur: psycopg.Cursor, source: names.QualifiedName,
               target: names.QualifiedName) -> names.QualifiedName | None:
    """The partitioned table of a conversion: the source's name after the cutover, the target's
    before it (partitions can be kept ahead while the migration runs too)."""
    for table in (source, target):
        if introspect.exists(cur, table) and partition_columns(cur, table):
            return table
    return None


def _upper_bound(bound: str) -> str | None:
    # pg_get_expr text: FOR VALUES FROM ('2024-01-01 00:00:00+00') TO ('2024-02-01 00:00:00+00')
    m = re.search(r"\) TO \((.*)\)$", bound)
    if m is None:
        return None
    text = m.group(1)
    return text[1:-1].replace("''", "'") if text.startswith("'") else text


def maintain_plan(cur: psycopg.Cursor, spec: PartitionSpec, premake: int, retention: str | None,
                  table: names.QualifiedName, base: str) -> dict[str, Any]:
    """What `maintain` would do to `table` now: partitions to create, partitions to detach, and
    the rows in the default partition. Reads only."""
    assert table.schema is not None
    info = introspect.describe(cur, table)
    existing = children(cur, table)
    have = {c.name for c, _, _, _ in existing}
    create: list[Partition] = []
    if spec.by == "range":
        col = spec.columns[0]
        typ = column_type(info, col)
        cur.execute("SELECT now()")
        now = one(cur)[0]
        cur.execute(q.first_value(table, col, True))
        row = cur.fetchone()
        newest = row[0] if row else None
        if spec.interval is not None:
            wanted = range_partitions(spec, base, typ, now if typ != "date" else now.date(), newest, now, premake)
        else:
            wanted = range_partitions(spec, base, typ, newest, newest, now, premake)
        create = [p for p in wanted if p.name not in have]
    detach: list[str] = []
    if retention is not None and spec.by == "range" and spec.interval is not None:
        typ = column_type(info, spec.columns[0])
        for child, bound, is_default, pending in existing:
            upper = _upper_bound(bound)
            if is_default or upper is None:
                continue
            cur.execute(sql.SQL("SELECT CAST(%s AS {}) <= now() - CAST(%s AS interval)").format(
                trusted(typ, "format_type")), (upper, retention))
            if one(cur)[0] or pending:
                detach.append(child.name)
    # A DETACH ... CONCURRENTLY that was interrupted leaves its partition pending: only FINALIZE
    # completes it (a new DETACH is refused).
    pending_detach = [c.name for c, _, _, pending in existing if pending]
    detach += [n for n in pending_detach if n not in detach]
    default_rows = None
    for child, _, is_default, _ in existing:
        if is_default:
            cur.execute(q.count_rows(child))
            default_rows = one(cur)[0]
    return {"table": str(table), "create": create, "detach": detach, "pending": pending_detach,
            "default_rows": default_rows,
            "partitions": len(existing), "has_default": any(d for _, _, d, _ in existing)}


def status(cur: psycopg.Cursor, source: names.QualifiedName, target: names.QualifiedName) -> dict[str, Any] | None:
    """For `mover status`: partitions, rows per partition (the planner's estimate), rows in the
    default partition (estimate), and the newest partition's upper bound."""
    table = live_table(cur, source, target)
    if table is None:
        return None
    rows = {}
    newest = None
    default_rows = None
    for child, bound, is_default, _ in children(cur, table):
        cur.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass(%s)", (str(child),))
        estimate = one(cur)[0]
        rows[child.name] = estimate
        if is_default:
            default_rows = estimate
        upper = _upper_bound(bound)
        if upper is not None:
            newest = upper if newest is None else max(newest, upper, key=_bound_order)
    out = {"table": str(table), "count": len(rows), "rows_estimate": rows, "default_rows_estimate": default_rows,
           "newest_bound": newest, "next_boundary": None, "ahead": None}
    cols = partition_columns(cur, table)
    uppers = [u for _, b, _, _ in children(cur, table) if (u := _upper_bound(b)) is not None]
    if len(cols) == 1 and uppers:
        typ = column_type(introspect.describe(cur, table), cols[0])
        if typ in TIME_TYPES:
            # The boundary the table crosses next, and how far past now the newest partition reaches.
            # As text from the server, like the bounds themselves (pg_get_expr), not Python's form.
            cur.execute(sql.SQL("SELECT (min(b) FILTER (WHERE b > now()))::text, max(b) - now() FROM"
                                " (SELECT CAST(u AS {}) AS b FROM unnest(%s::text[]) u) x").format(
                                trusted(typ, "format_type")),
                        (uppers,))
            nxt, ahead = one(cur)
            out["next_boundary"] = nxt
            out["ahead"] = None if ahead is None else _words(ahead)
        elif typ in INTEGER_TYPES:
            cur.execute(q.first_value(table, cols[0], True))
            row = cur.fetchone()
            top = row[0] if row else None
            bounds = sorted(int(u) for u in uppers)
            out["next_boundary"] = next((b for b in bounds if top is None or b > top), None)
            out["ahead"] = None if top is None else f"{bounds[-1] - top} values"
    return out


def _words(delta: Any) -> str:
    if isinstance(delta, int):  # date - date: days
        return f"{delta} days"
    days = delta.total_seconds() / 86400
    return f"{days:.1f} days" if days >= 0 else f"{days:.1f} days (behind now)"


def _bound_order(text: str) -> Any:
    # Integer bounds compare as numbers; timestamps and dates in ISO text compare as text.
    return (0, int(text)) if text.lstrip("-").isdigit() else (1, text)


def carve_from_default(cur: psycopg.Cursor, parent: names.QualifiedName, part: Partition, column: str) -> int:
    """Create range partition `part` although the default partition holds rows of its range
    (PostgreSQL refuses CREATE ... PARTITION OF then): in one transaction under the parent's
    lock, a plain table, the default's rows of the range moved into it, then attached. Writers
    wait on the lock, so none is lost; the caller's statement_timeout bounds the hold. Returns
    the rows moved."""
    assert parent.schema is not None
    cur.execute(q.lock_parent(parent))
    default = next((c for c, _, d, _ in children(cur, parent) if d), None)
    if default is None:
        raise ValueError(f"{parent} has no default partition")
    info = introspect.describe(cur, parent)
    typ = column_type(info, column)
    table = names.QualifiedName(parent.schema, part.name)
    cur.execute(q.create_like(table, parent))
    cur.execute(q.move_range(default, table, column, part.lo, part.hi, typ,
                             tuple(c.name for c in info.copy_columns)))
    moved = cur.rowcount
    cur.execute(q.attach(parent, table, part.bound))
    return moved


# ---------------------------------------------------------------------------------------------
# pg_partman: `[partitions] manager = "pg_partman"` hands the parent over once the migration is
# retired (during the rollback window mover keeps the partitions itself: a rollback renames the
# tables, and pg_partman's part_config names the parent by text).

PARTMAN_INTERVALS = {"day": "1 day", "month": "1 month", "year": "1 year"}


def partman_package(cur: psycopg.Cursor) -> str:
    return server.package_name(cur, "partman")


def partman_schema(cur: psycopg.Cursor) -> str | None:
    """The schema pg_partman is installed in, or None when it is not installed in this database."""
    cur.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
                " WHERE e.extname = 'pg_partman'")
    row = cur.fetchone()
    return row[0] if row else None


def check_partman(cur: psycopg.Cursor, table: names.QualifiedName) -> str:
    """Plan check of manager = "pg_partman": the extension is installed (its schema), and the
    table's name is one pg_partman can hold (it splits the parent's name at the dot)."""
    schema = partman_schema(cur)
    if schema is None:
        cur.execute("SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman')")
        if not one(cur)[0]:
            package = partman_package(cur)
            raise PlanError(f'[partitions] manager = "pg_partman": the server has no pg_partman extension '
                            f"(Debian/Ubuntu package {package})",
                            hint=f'apt-get install {package}, then CREATE EXTENSION pg_partman SCHEMA partman; '
                                 f'or use manager = "mover"')
        raise PlanError('[partitions] manager = "pg_partman": pg_partman is available on the server but not '
                        'installed in this database',
                        hint='CREATE EXTENSION pg_partman SCHEMA partman (CREATE SCHEMA partman first); '
                             'or use manager = "mover"')
    assert table.schema is not None
    if "." in table.schema or "." in table.name:
        raise PlanError(f'[partitions] manager = "pg_partman": pg_partman cannot manage {table}: it does not '
                        f"support names with a period", hint='use manager = "mover"')
    return schema


def partman_parent(table: names.QualifiedName) -> str:
    # pg_partman's own spelling of a parent: schema.table, unquoted (it quotes the parts itself).
    return f"{table.schema}.{table.name}"


def partman_config(cur: psycopg.Cursor, schema: str, table: names.QualifiedName) -> dict[str, Any] | None:
    cur.execute(sql.SQL("SELECT partition_interval, premake, retention, retention_keep_table,"
                        " infinite_time_partitions FROM {}.part_config WHERE parent_table = %s").format(
        sql.Identifier(schema)), (partman_parent(table),))
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip(("interval", "premake", "retention", "retention_keep_table", "infinite_time_partitions"), row,
                    strict=True))


def hand_over(cur: psycopg.Cursor, spec: PartitionSpec, premake: int, retention: str | None, drop_detached: bool,
              table: names.QualifiedName) -> bool:
    """Register `table` with pg_partman (create_parent with the plan's interval and premake, the
    retention policy into part_config). False when it is registered already (idempotent).

    The table ends with a DEFAULT partition, as pg_partman makes its sets: a default partition
    mover made is detached first and its rows put back through the parent (they land in their
    partition, or in pg_partman's default), all under the parent's lock, so no write is lost.
    Bounds are UTC (mover's): the session's time zone is UTC here, as pg_partman's must be."""
    schema = check_partman(cur, table)
    if partman_config(cur, schema, table) is not None:
        return False
    assert table.schema is not None and spec.by == "range"
    cur.execute("SET LOCAL TimeZone = 'UTC'")
    cur.execute(q.lock_parent(table))
    old_default = next((c for c, _, d, _ in children(cur, table) if d), None)
    if old_default is not None:
        cur.execute(q.detach(table, old_default))
        aside = names.QualifiedName(table.schema, names.derived(old_default.name, "_mover"))
        cur.execute(q.rename_table(old_default, aside.name))
        old_default = aside
    col = spec.columns[0]
    cur.execute(q.first_value(table, col, True))
    row = cur.fetchone()
    if spec.interval is not None:
        interval = PARTMAN_INTERVALS[spec.interval]
        cur.execute("SELECT now()")
        start: Any = period_start(one(cur)[0], spec.interval).isoformat()
    else:
        assert spec.step is not None
        interval = str(spec.step)
        start = str(((row[0] if row and row[0] is not None else 0) // spec.step) * spec.step)
    cur.execute(q.partman_create_parent(schema), {"parent": partman_parent(table), "control": col,
                                                  "interval": interval, "premake": premake, "start": start})
    # ignore_default_data: rows no partition takes (dated 2100, say) must not make pg_partman
    # create partitions up to them, nor fail its maintenance.
    cur.execute(sql.SQL("UPDATE {}.part_config SET retention = %s, retention_keep_table = %s,"
                        " infinite_time_partitions = %s, ignore_default_data = true"
                        " WHERE parent_table = %s").format(sql.Identifier(schema)),
                (retention, not drop_detached, spec.interval is not None, partman_parent(table)))
    if not any(d for _, _, d, _ in children(cur, table)):
        # create_parent returns before making its default when every partition it wanted existed.
        cur.execute(q.create_partition(names.QualifiedName(table.schema, default_name(table.name)), table,
                                       q.default_bound()))
    if old_default is not None:
        info = introspect.describe(cur, table)
        cur.execute(q.move_all(old_default, table, tuple(c.name for c in info.copy_columns)))
        cur.execute(sql.SQL("DROP TABLE {}").format(old_default.ident))
    return True


def partman_maintain(cur: psycopg.Cursor, spec: PartitionSpec, premake: int, table: names.QualifiedName) -> int:
    """pg_partman's run_maintenance for `table` (UTC, as its bounds are). pg_partman fails to
    create a partition whose range has rows in the default partition ("updated partition
    constraint for default partition would be violated"): mover carves those out first, under
    the same names, so pg_partman finds them made. Returns the rows moved out of the default."""
    schema = check_partman(cur, table)
    cur.execute("SET LOCAL TimeZone = 'UTC'")
    moved = 0
    default = next((c for c, _, d, _ in children(cur, table) if d), None)
    if default is not None:
        col = spec.columns[0]
        typ = column_type(introspect.describe(cur, table), col)
        # One past premake: pg_partman counts ahead from the newest row, mover from now.
        for p in maintain_plan(cur, spec, premake + 1, None, table, table.name)["create"]:
            cur.execute(q.has_rows_between(default, col, p.lo, p.hi, typ))
            if one(cur)[0]:
                moved += carve_from_default(cur, table, p, col)
    cur.execute(q.partman_run_maintenance(schema), {"parent": partman_parent(table)})
    return moved
