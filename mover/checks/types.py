"""[target] columns: each names a real, non-generated column and a type this database knows with a
cast from the column's type; a type change that can lose information is acknowledged."""

from __future__ import annotations

import psycopg
from psycopg import sql

from mover import names
from mover.catalog import conversion, introspect
from mover.checks import Subject
from mover.errors import PlanError
from mover.names import QualifiedName
from mover.plan import Plan
from mover.sql import trusted


def columns(s: Subject) -> None:
    info = s.table
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
        try:
            _check_cast(s.cur, s.src, col, typ)
        except PlanError as exc:
            s.report(exc)


def _check_cast(cur: psycopg.Cursor, source: QualifiedName, col: str, typ: str) -> None:
    cur.execute("SAVEPOINT mover_cast_check")
    try:
        # EXPLAIN plans the cast without reading a row: a missing cast fails here, not mid-backfill.
        # The type is the plan's text: trusted input, as docs/plan.md says ([target] columns).
        cur.execute(sql.SQL("EXPLAIN SELECT CAST({c} AS {t}) FROM {s}").format(
            c=sql.Identifier(col), t=trusted(typ, "plan type"), s=source.ident))
        cur.execute("RELEASE SAVEPOINT mover_cast_check")
    except psycopg.errors.Error as exc:
        cur.execute("ROLLBACK TO SAVEPOINT mover_cast_check")
        raise PlanError(f"[target] columns: column {names.display_ident(col)} cannot become {typ!r}: "
                        f"{str(exc).splitlines()[0]}",
                        hint="choose a type the column's values cast to, or change the column in the application "
                             "first") from None


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
