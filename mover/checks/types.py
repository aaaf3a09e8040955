"""[target] columns: each names a real, non-generated column and a type this database knows, that the
column's values convert to on assignment and back (the rollback window's way) at least with CAST; a
key's new type compares with its old; a type change that can lose information is acknowledged, and
what a rollback cannot carry back is said."""

from __future__ import annotations

import psycopg

from mover import names
from mover.catalog import conversion, introspect
from mover.checks.subject import Subject
from mover.errors import PlanError
from mover.plan import Plan


def columns(s: Subject) -> None:
    info = s.table
    wanted: dict[str, str] = {}
    for col, typ in sorted(s.plan.columns.items()):
        try:
            column = info.column(col)
        except KeyError:
            s.report(PlanError(f"[target] columns: {s.src} has no column {names.display_ident(col)}",
                               hint=f"columns are: {', '.join(c.name for c in info.columns)}"))
            continue
        if column.generated:
            s.report(PlanError(f"[target] columns: {names.display_ident(col)} is a generated column; change its "
                               f"expression's type instead",
                               hint=f"remove {col} from [target] columns"))
            continue
        if not introspect.type_exists(s.cur, typ):
            s.report(PlanError(f"[target] columns: {typ!r} (for column {names.display_ident(col)}) is not a type "
                               f"this database knows",
                               hint="fix the type's spelling (e.g. \"bigint\", \"numeric(12,2)\"); `\\dT` in psql "
                                    "lists the types, then `mover plan check PLAN` again"))
            continue
        wanted[col] = typ
    if wanted:
        conversions(s, wanted)


def conversions(s: Subject, wanted: dict[str, str]) -> None:
    """Each type change converts both ways as mover will convert it, asked of the server with the
    copy's own statement (mover/catalog/conversion.py probe): forward with an assignment cast, as
    ALTER TABLE ... TYPE without USING (invariant 8); back (the rollback window's replay of the
    application's writes into the old table) with one, or else with an explicit CAST, which then
    carries back only the values it converts unchanged (carried_back says so, once the target is
    rehearsed); a key's old and new types compare with each other, as the two tables' keys are
    matched and ranged. Not a clean-stage check: said beside every other problem of the plan."""
    info = s.table
    try:
        forward = conversion.probe(s.cur, {c: (info.column(c).type, t) for c, t in wanted.items()},
                                   key=[c for c in wanted if c in info.key])
        back = conversion.probe(s.cur, {c: (t, info.column(c).type) for c, t in wanted.items()})
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.InvalidSchemaName):
        return  # no table can be made in schema mover to probe with: the privileges check says what is missing
    for col, typ in wanted.items():
        old, col_name = info.column(col).type, names.display_ident(col)
        there = forward.columns[col]
        if not there.assignment:
            how = "only an explicit one" if there.explicit else "nor any other"
            s.report(PlanError(
                f"[target] columns: column {col_name} cannot become {typ!r}: PostgreSQL has no assignment cast "
                f"from {old} to {typ} ({how}), and mover converts every value as ALTER TABLE ... TYPE without "
                f"USING does",
                hint=f"choose a type {old} converts to on assignment, or convert the column in the source table "
                     f"first (ALTER TABLE ... ALTER COLUMN {col_name} TYPE {typ} USING ...); then `mover plan check "
                     f"PLAN` again"))
            continue
        if not back.columns[col].explicit:
            s.report(PlanError(
                f"[target] columns: column {col_name} cannot become {typ!r}: in the rollback window mover carries the "
                f"application's writes back to the old table's {old}, and PostgreSQL has no cast from {typ} to {old}",
                hint=f"choose a type that converts back to {old} (at least with CAST), or convert the column in the "
                     f"source table first; then `mover plan check PLAN` again"))
    if forward.keys is not None:
        keys = ", ".join(names.display_ident(k) for k in wanted if k in info.key)
        s.report(PlanError(
            f"[target] columns: the key of {s.src} ({keys}) cannot change type so: mover matches and ranges the rows "
            f"of the two tables by key, and the old and new key types do not compare ({forward.keys})",
            hint="keep the key column's type, or choose one that compares with the old (integer -> bigint, "
                 "varchar -> text); then `mover plan check PLAN` again"))


def lossy_columns(plan: Plan, source: introspect.TableInfo, target: introspect.TableInfo) -> dict[str, str]:
    """Column -> why its type change can lose information (as the target's catalog types it)."""
    out = {}
    for col in sorted(plan.columns):
        a, b = source.column(col), target.column(col)
        reason = conversion.lossy_reason(a, b)
        if reason:
            out[col] = f"{a.type} -> {b.type}: {reason}"
    return out


def lossy(s: Subject) -> None:
    """A conversion that can refuse or change values must be acknowledged in the plan; never on
    a key column, whose values ranges, logs and the swap compare exactly."""
    if not s.plan.columns or s.rehearsed is None:
        return
    source, plan = s.table, s.plan
    found = lossy_columns(plan, source, s.rehearsed)
    keys = [c for c in found if c in source.key]
    if keys:
        raise PlanError(
            f"[target] columns: key column {names.display_ident(keys[0])} of {source.name} cannot change type "
            f"{found[keys[0]]}", hint="mover narrows no key column: keep its type, or one that holds every value")
    missing = [c for c in found if c not in plan.accept_lossy]
    if missing:
        listed = "; ".join(f"{names.display_ident(c)} {found[c]}" for c in missing)
        accept = ", ".join(f'"{c}"' for c in missing)
        raise PlanError(
            f"[target] columns: {len(missing)} type change{'s' if len(missing) > 1 else ''} can lose information: "
            f"{listed}",
            hint=f"if that is intended, add accept_lossy = [{accept}] under [target]: a row that does not fit "
                 f"becomes a divergence, and reconcile reports every value the conversion changed as different")
    s.lossy = found
    carried_back(s)


def carried_back(s: Subject) -> None:
    """What a rollback may not carry back: the application may write values after the cutover that
    the old type does not hold, or holds only changed (the reverse of a widening narrows). Such a
    row stays in the new table only, a divergence (invariant 9): `mover rollback` refuses while one
    exists, `--give-up-rows` gives it up, `mover retire` keeps it. Said at plan check, from the
    mapping the window's replay builds (mover/engines/context.py), over the rehearsed target."""
    assert s.rehearsed is not None  # the lossy check's caller made sure
    back = conversion.probe(s.cur, conversion.changed(s.rehearsed, s.table))
    way = conversion.mapping(s.rehearsed, s.table, s.table.key, reverse=back)
    s.carried_back = conversion.way_back(way, s.rehearsed, s.table)
