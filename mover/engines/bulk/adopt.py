"""`mover adopt NAME`: carry an additive change of the live table's shape over to the other table.

The live table is the one the application writes: the original before the cutover, the new
table during the rollback window. Adoptable are the changes that add without taking anything
away: a plain column (with or without a default, NOT NULL or not), a CHECK constraint (with
its validation state), an index. Anything else (a dropped or renamed column, a type change, a
dropped constraint or index, a renamed table...) is refused with exit 2; so is a change made
to the other table, which the application does not use.

A new column needs its values, not only its definition. Adding it to the other table gives
every row already there the column's default as evaluated now, which may differ from the live
row's value: the application may have updated it, the default may be volatile or changed
since. So every row of the other table gets the column's value from the live row with the same
key, range by range, each range in one transaction that holds the replay lock of that
direction (mover/engines/capture/changelog.py). Why this is correct: no replay runs while a range is re-synced; a
write to the live table that committed before the range's statement is seen by it, and one
that commits after it is in the change log, which the applier replays by state afterwards with
a mapping that includes the column. Rows not in the other table yet are copied later by the
backfill, which reads the live table's current columns. Then every reconcile range is verified
again (a full pass): the re-sync is checked, not presumed.

A crash anywhere leaves the recorded shapes as they were, so the next `mover adopt` starts
again: what is already on the other table (a column, a constraint, an index of the expected
name) is kept, the re-sync is redone, and only then are the new shapes recorded.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from psycopg import sql

from mover import faults, names
from mover.catalog import introspect, reading, shape
from mover.db import bind
from mover.engines.bulk import builds
from mover.engines.capture import changelog
from mover.engines.context import Context
from mover.errors import Failed, ShapeChanged
from mover.names import QualifiedName
from mover.sql import ddl, trusted
from mover.state import control, ranges

log = logging.getLogger("mover.adopt")

RESYNC_ROWS = 5000


def adopt(ctx: Context) -> list[dict[str, Any]]:
    m = ctx.migration
    live_side, other_side = ("target", "source") if ctx.swapped else ("source", "target")
    live, other = (ctx.new, ctx.original) if ctx.swapped else (ctx.original, ctx.new)
    before, now, found = ctx.db.transaction(lambda cur: shape.changes(cur, ctx.mid))
    if not found:
        ctx.db.transaction(lambda cur: control.event(cur, ctx.mid, ctx.owner, m.step, "adopted",
                                                     "nothing to adopt: both tables have their recorded shape"))
        return []
    live_changes = [c for c in found if c.side == live_side]
    refused = [c for c in live_changes if not c.adoptable]
    refused += [c for c in found if c.side == other_side and not shape.mirrors(c, live_changes, ctx.mid)]
    if refused:
        exc = shape.explain(m.name, refused, ctx.swapped, ctx.mid)
        raise ShapeChanged(f"cannot adopt the change to the shape of migration {m.name!r}: "
                           f"{'; '.join(c.message for c in refused)}", hint=exc.hint, changes=refused)
    built = ctx.swapped or before[other_side] is not None
    exists = ctx.db.transaction(lambda cur: introspect.exists(cur, other))
    columns = [c.detail["column"] for c in live_changes if c.kind == "column_added"]
    checks = [(str(c.item), c.detail["constraint"]) for c in live_changes if c.kind == "constraint_added"]
    indexes = [str(c.item) for c in live_changes if c.kind == "index_added"]
    validations = [str(c.item) for c in live_changes if c.kind == "constraint_validated"]
    if exists:
        _add_columns(ctx, other, columns)
        _resync(ctx, live, other, [c["name"] for c in columns], reverse=ctx.swapped)
        _finish_columns_and_checks(ctx, live, other, columns, checks, validations)
        if built:
            # Before then, the backfill builds every index the original has when it gets there.
            _build_indexes(ctx, live, other, indexes)
    faults.point("adopt:before_record")

    def record(cur: psycopg.Cursor) -> None:
        control.guard(cur, ctx.mid, m.step, ctx.owner)
        again, now2, left = shape.changes(cur, ctx.mid)
        if shape.fingerprint(now2[live_side]) != shape.fingerprint(now[live_side]):
            raise Failed(f"the shape of {live} changed again while `mover adopt` ran; nothing was recorded",
                         hint=f"run `mover adopt {m.name}` again")
        stray = [c for c in left if c.side == other_side and not shape.mirrors(c, live_changes, ctx.mid)]
        if stray:
            raise Failed(f"after adopting, {other} differs otherwise: {'; '.join(c.message for c in stray)}",
                         hint=_undo(m))
        shape.record(cur, ctx.mid, **{live_side: again[live_side]["oid"]})
        if again[other_side] is not None:
            shape.record(cur, ctx.mid, **{other_side: again[other_side]["oid"]})
        if columns and not ctx.swapped:
            # Every range is compared again, new column included: a full pass.
            ranges.reset(cur, ctx.mid, "reconcile")
        control.mark_adopted(cur, m, ctx.owner, recheck=bool(columns) and not ctx.swapped,
                             message=f"adopted on {other}: {'; '.join(c.message for c in live_changes)}",
                             detail={"changes": [c.as_dict() for c in live_changes]})

    ctx.db.transaction(record, label="adopt")
    ctx.refresh()
    return [c.as_dict() for c in live_changes]


def _undo(m: control.Migration) -> str:
    """What undoes the migration from where adopt found it (up to the rollback window: abort only
    before the swap)."""
    return control.way_to_undo(m) or f"`mover status {m.name}` shows where it stands"


def _lock_timeout(ctx: Context) -> dict[str, Any]:
    # DDL on a table the application or a replay uses: wait as briefly as the cutover does.
    return {"lock_timeout": f"{ctx.plan.cutover.lock_timeout_ms}ms", "attempts": ctx.plan.cutover.attempts}


def _add_columns(ctx: Context, other: QualifiedName, columns: list[dict[str, Any]]) -> None:
    if not columns:
        return

    def add(cur: psycopg.Cursor) -> None:
        have = {c.name: c for c in introspect.describe(cur, other).columns}
        for c in columns:
            if c["name"] in have:
                if have[c["name"]].type != c["type"]:
                    raise Failed(f"column {names.display_ident(c['name'])} of {other} exists with type "
                                 f"{have[c['name']].type}, not {c['type']}", hint=_undo(ctx.migration))
                continue  # added by an adopt that did not finish
            # Type, collation and default are text the catalog printed for the live table's column
            # (format_type, pg_get_expr): trusted, and positions that take no bind parameter.
            cur.execute(sql.SQL("ALTER TABLE {t} ADD COLUMN {c} {ty}{coll}{default}").format(
                t=other.ident, c=sql.Identifier(c["name"]), ty=trusted(c["type"], "format_type"),
                coll=sql.SQL(" COLLATE {}").format(trusted(c["collation"], "pg_collation")) if c.get("collation")
                else sql.SQL(""),
                default=sql.SQL(" DEFAULT {}").format(trusted(c["default"], "pg_get_expr"))
                if c.get("default") is not None else sql.SQL("")))
    ctx.db.transaction(add, label="adopt columns", **_lock_timeout(ctx))


def _resync(ctx: Context, live: QualifiedName, other: QualifiedName, columns: list[str], *, reverse: bool) -> None:
    """Copy `columns` from the live rows into the other table's rows with the same key, a range
    at a time, under the replay lock (see the module's docstring for why that is correct)."""
    if not columns:
        return
    key = tuple(ctx.migration.key_columns)
    key_types = ctx.db.transaction(lambda cur: {c.name: c.type for c in introspect.describe(cur, other).columns})
    # Key types are catalog text (format_type) of the other table's key columns.
    bound = sql.SQL("({})").format(sql.SQL(", ").join(
        sql.SQL("CAST(%s AS {})").format(trusted(key_types[k], "format_type")) for k in key))
    t_key = sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier("t", k) for k in key))
    s_key = sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier("s", k) for k in key))
    lo: tuple[Any, ...] | None = None
    total = 0
    started = time.monotonic()
    while True:
        ctx.checkpoint()

        def resync_range(cur: psycopg.Cursor, lo: tuple[Any, ...] | None) -> tuple[tuple[Any, ...] | None, int]:
            changelog.lock_applier(cur, ctx.mid, reverse)
            above = sql.SQL("{} > {}").format(t_key, bound) if lo is not None else sql.SQL("true")
            cur.execute(sql.SQL("SELECT {o} FROM {t} t WHERE {above} ORDER BY {o} OFFSET %s LIMIT 1").format(
                o=sql.SQL(", ").join(sql.Identifier("t", k) for k in key), t=other.ident, above=above),
                [*(lo or ()), RESYNC_ROWS - 1])
            row = cur.fetchone()
            hi = tuple(row) if row else None
            upto = sql.SQL("{} <= {}").format(t_key, bound) if hi is not None else sql.SQL("true")
            # Every row of the range, not only those that look different: some types have no
            # equality operator, and a row version more in the other table costs less than a test.
            cur.execute(sql.SQL("UPDATE {t} t SET {sets} FROM {s} s WHERE {tk} = {sk} AND {above} AND {upto}").format(
                t=other.ident, s=live.ident, tk=t_key, sk=s_key, above=above, upto=upto,
                sets=sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(c), sql.Identifier("s", c))
                                        for c in columns)),
                [*(lo or ()), *(hi or ())])
            return hi, cur.rowcount

        hi, n = ctx.db.transaction(bind(resync_range, lo), statement_timeout="300s", label="adopt re-sync")
        total += n
        if hi is None:
            break
        lo = hi
    ctx.db.transaction(lambda cur: control.event(
        cur, ctx.mid, ctx.owner, ctx.migration.step, "adopt_resync",
        f"re-synced {', '.join(names.display_ident(c) for c in columns)} of {total} rows of {other} from {live}",
        {"rows": total, "columns": columns}, (time.monotonic() - started) * 1000))
    ctx.report("adopt_resync", rows=total, table=str(other))


def _finish_columns_and_checks(ctx: Context, live: QualifiedName, other: QualifiedName, columns: list[dict[str, Any]],
                               checks: list[tuple[str, dict[str, Any]]], validations: list[str]) -> None:
    if not any(c.get("not_null") for c in columns) and not checks and not validations:
        return

    def finish(cur: psycopg.Cursor) -> None:
        info = introspect.describe(cur, other)
        cur.execute("SELECT conname, convalidated FROM pg_constraint WHERE conrelid = %s", (info.oid,))
        existing: dict[str, bool] = dict(cur.fetchall())
        for name in validations:
            if name not in existing:
                # A constraint the source had NOT VALID at registration: the target was created
                # without it (steps/create_target.py) and would get it NOT VALID at the swap. Now
                # validated on the live table, it is added validated here (a scan of mover's table).
                definition = _live_definition(cur, live, name)
                if definition is None:
                    raise Failed(f"constraint {names.display_ident(name)} was validated on the live table, but "
                                 f"{other} has no constraint of that name", hint=_undo(ctx.migration))
                cur.execute(sql.SQL("ALTER TABLE {t} ADD CONSTRAINT {c} {d}").format(
                    t=other.ident, c=sql.Identifier(name), d=trusted(definition, "pg_get_constraintdef")))
                continue
            if not existing[name]:
                cur.execute(sql.SQL("ALTER TABLE {t} VALIDATE CONSTRAINT {c}").format(
                    t=other.ident, c=sql.Identifier(name)))
        for name, con in checks:
            if name in existing:
                continue
            # The definition is pg_get_constraintdef() of the live table's constraint, NOT VALID
            # included when it is not validated there: the same validation state on both tables.
            cur.execute(sql.SQL("ALTER TABLE {t} ADD CONSTRAINT {c} {d}").format(
                t=other.ident, c=sql.Identifier(name), d=trusted(con["definition"], "pg_get_constraintdef")))
        have = {c.name: c for c in introspect.describe(cur, other).columns}
        for c in columns:
            if c.get("not_null") and not have[c["name"]].not_null:
                # PostgreSQL 18 names a NOT NULL constraint: the other table's takes the live table's
                # name (SET NOT NULL would make up another, which the swap's parity check refuses).
                named = _not_null_name(cur, live, c["name"])
                cur.execute(sql.SQL("ALTER TABLE {t} ALTER COLUMN {c} SET NOT NULL").format(
                    t=other.ident, c=sql.Identifier(c["name"])) if named is None else
                    sql.SQL("ALTER TABLE {t} ADD CONSTRAINT {n} NOT NULL {c}").format(
                    t=other.ident, n=sql.Identifier(named), c=sql.Identifier(c["name"])))
    ctx.db.transaction(finish, label="adopt constraints", statement_timeout="300s", **_lock_timeout(ctx))


def _not_null_name(cur: psycopg.Cursor, live: QualifiedName, column: str) -> str | None:
    """The name of a column's NOT NULL constraint (PostgreSQL 18; None before, or if it has none)."""
    cur.execute("SELECT k.conname FROM pg_constraint k JOIN pg_attribute a ON a.attrelid = k.conrelid"
                " AND a.attnum = k.conkey[1] WHERE k.conrelid = %s::regclass AND k.contype = 'n' AND a.attname = %s",
                (str(live), column))
    row = cur.fetchone()
    return row[0] if row else None


def _live_definition(cur: psycopg.Cursor, live: QualifiedName, name: str) -> str | None:
    """pg_get_constraintdef() of a validated CHECK or NOT NULL constraint of the live table."""
    row = reading.read_one(
        cur, "SELECT pg_get_constraintdef(k.oid) FROM pg_constraint k WHERE k.conrelid = %s::regclass"
             " AND k.conname = %s AND k.contype IN ('c', 'n') AND k.convalidated", (str(live), name),
        missing=reading.printed(0, name=f"constraint {names.display_ident(name)} of {live}"))
    return row[0] if row else None


def _build_indexes(ctx: Context, live: QualifiedName, other: QualifiedName, indexes: list[str]) -> None:
    if not indexes:
        return
    by_name = {ix.name: ix for ix in ctx.db.transaction(lambda cur: introspect.describe(cur, live).indexes)}
    for name in indexes:
        ctx.checkpoint()
        target_name = builds.deferred_index_name(ctx.mid, name)
        assert other.schema is not None  # resolved at registration
        state = ctx.db.transaction(bind(introspect.index_state, other.schema, target_name))
        if state is True:
            continue
        if state is False:
            ctx.db.autocommit(ddl.drop_index(other.schema, target_name), lock_timeout="10s")
        # Not a transaction (CONCURRENTLY): a crash leaves an invalid index, rebuilt by the next adopt.
        ctx.db.autocommit(ddl.create_index(target_name, other, by_name[name], concurrently=True),
                          statement_timeout="0", lock_timeout="10min")
        ctx.db.transaction(bind(control.event, ctx.mid, ctx.owner, ctx.migration.step, "index_built",
                                f"index {target_name} built on {other} (adopted)", {"source_index": name}))
