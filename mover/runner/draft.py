"""`mover plan new TABLE`: a plan for a table and a change, read from the catalog.

The table must exist and have a key; each column `--columns` names must exist (and not be
generated) and its new type be one the database knows; `--partition` is checked as the plan's
[target.partition] is (mover/plan/tables.py) and its columns must exist. The columns that must
widen with a key the change widens are what `plan check` finds (mover/catalog/family.py
widenings): those of the table itself join its columns, those of other tables become [[also]]
tables, each of which must have a key too. Every refusal is BadInput (exit 2) naming the object
and the way on. The text is mover/plan/writer.py's; nothing is written to the database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg

from mover.catalog import family, introspect
from mover.checks.source import KINDS
from mover.db import Database, one
from mover.errors import BadInput, NotFound, PlanError
from mover.names import QualifiedName, display_ident, parse_qualified
from mover.plan import SETTINGS
from mover.plan.tables import partition_spec
from mover.plan.writer import AlsoDraft, Draft
from mover.state import control

# The same rule as [migration] name's declaration.
_NAME = re.compile(SETTINGS[("migration", "name")].kind.regex)  # type: ignore[attr-defined]
_INT = re.compile(r"^-?\d+$")


@dataclass(frozen=True, kw_only=True)
class Request:
    """What the operator asked for, as the command line gives it."""
    table: str  # as SQL writes it: orders, public.orders, '"Sales"."Order Items"'
    columns: tuple[str, ...] = ()  # "column=type" each
    partition: str | None = None  # "by=range,column=created_at,interval=1 month"
    name: str | None = None


def columns_option(items: tuple[str, ...]) -> dict[str, str]:
    """`--columns id=bigint` (repeated) -> {column: type}. The column is taken exactly (as the plan's
    [target] columns takes it: case-sensitive, no SQL quotes); the type is everything after the
    first `=` (it may hold commas: numeric(12,2))."""
    out: dict[str, str] = {}
    for item in items:
        column, sep, type_text = item.partition("=")
        column, type_text = column.strip(), type_text.strip()
        if not sep or not column or not type_text:
            raise BadInput(f"--columns {item!r} is not column=type", hint="e.g. --columns id=bigint")
        if column in out and out[column] != type_text:
            raise BadInput(f"--columns names column {display_ident(column)} twice, as {out[column]} and {type_text}",
                           hint="give each column once")
        out[column] = type_text
    return out


def partition_option(text: str) -> dict[str, Any]:
    """`--partition "by=range,column=created_at,interval=1 month"` -> [target.partition]'s keys as
    the file holds them, checked as the plan's reader checks them. `columns=a|b` lists several
    columns; `values.eu=de|fr` a list partition's values; numbers and true/false are typed."""
    doc: dict[str, Any] = {}
    for item in (i.strip() for i in text.split(",")):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise BadInput(f"--partition: {item!r} is not key=value",
                           hint='e.g. --partition "by=range,column=created_at,interval=1 month"')
        if key.startswith("values."):
            doc.setdefault("values", {})[key.removeprefix("values.")] = [_typed(v) for v in value.split("|")]
        elif key == "columns":
            doc[key] = [c.strip() for c in value.split("|")]
        elif key in ("premake", "modulus") or (key == "interval" and _INT.match(value)):
            if not _INT.match(value):
                raise BadInput(f"--partition: {key} must be a number, got {value!r}", hint=f"e.g. {key}=3")
            doc[key] = int(value)
        elif key in ("default", "accept_key_change"):
            if value.lower() not in ("true", "false"):
                raise BadInput(f"--partition: {key} must be true or false, got {value!r}", hint=f"e.g. {key}=true")
            doc[key] = value.lower() == "true"
        else:
            doc[key] = value

    def fail(message: str, hint: str | None = None) -> PlanError:
        return PlanError(f"--partition: {message}", hint=hint or "see docs/partitioning.md for the keys")

    partition_spec(doc, fail)
    return doc


def _typed(value: str) -> Any:
    value = value.strip()
    return int(value) if _INT.match(value) else value


def new(db: Database, request: Request) -> Draft:
    """The plan `mover plan new` writes for `request`, from the catalog as it is now."""
    try:
        table = parse_qualified(request.table)
    except ValueError as exc:
        raise BadInput(f"mover plan new: {exc}", hint="name the table as SQL does: orders, public.orders, "
                                                      "'\"Sales\".\"Order Items\"'") from None
    columns = columns_option(request.columns)
    partition = partition_option(request.partition) if request.partition is not None else None
    if request.name is not None and not _NAME.match(request.name):
        raise BadInput(f"--name {request.name!r} must be 1-63 characters of letters, digits, '_', '.', '-'",
                       hint="e.g. --name orders_bigint")

    def read(cur: psycopg.Cursor) -> Draft:
        source = introspect.resolve(cur, table)
        if source is None:
            raise NotFound(f"table {table} does not exist",
                           hint="check the name and its schema; unquoted names fold to lower case, quote "
                                "mixed-case ones (mover plan new '\"Sales\".\"Order Items\"')")
        info = _movable(cur, source, "")
        _columns_exist(cur, info, columns)
        if partition is not None:
            for column in partition.get("columns") or [partition["column"]]:
                if column not in {c.name for c in info.columns}:
                    raise BadInput(f"--partition: {source} has no column {display_ident(column)}",
                                   hint=f"its columns: {_listed(info)}")
        planned = dict(columns)
        also: list[AlsoDraft] = []
        for oid, found in family.per_table(family.widenings(cur, {info.oid: columns})).items():
            widened = {w.column: w.type for w in found}
            if oid == info.oid:  # a column of the table referencing its own key
                planned.update(widened)
                continue
            _movable(cur, found[0].table, f"{found[0].table} must widen {', '.join(map(display_ident, widened))} "
                                          f"with the key it references ({family.reasons(found)}), but ")
            also.append(AlsoDraft(source=found[0].table, columns=widened, why=family.reasons(found)))
        name = request.name or default_name(source, columns, partition)
        _name_free(cur, name, given=request.name is not None)
        return Draft(name=name, source=source, columns=planned, partition=partition, also=tuple(also),
                     header=_header(source, planned, partition, also))

    return db.transaction(read)


def _movable(cur: psycopg.Cursor, table: QualifiedName, why: str) -> introspect.TableInfo:
    """The table's description, if mover can move it: an ordinary table with a key."""
    cur.execute("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s", (table.schema, table.name))
    relkind = one(cur)[0]
    if relkind != "r":
        raise BadInput(f"{why}{table} is {KINDS.get(relkind, 'not an ordinary table')}",
                       hint="mover moves ordinary tables")
    try:
        return introspect.describe(cur, table)
    except PlanError as exc:  # no key mover can use (introspect names why, and the fix)
        raise BadInput(f"{why}{exc.message}", hint=exc.hint) from None


def _columns_exist(cur: psycopg.Cursor, info: introspect.TableInfo, columns: dict[str, str]) -> None:
    for column, type_text in columns.items():
        try:
            found = info.column(column)
        except KeyError:
            raise BadInput(f"--columns: {info.name} has no column {display_ident(column)}",
                           hint=f"name its columns exactly as the catalog spells them (case-sensitive): "
                                f"{_listed(info)}") from None
        if found.generated:
            raise BadInput(f"--columns: {display_ident(column)} of {info.name} is a generated column",
                           hint="change its expression's type instead, and leave it out of --columns")
        if not introspect.type_exists(cur, type_text):
            raise BadInput(f"--columns: {type_text!r} (for column {display_ident(column)}) is not a type this "
                           f"database knows", hint="fix its spelling (e.g. bigint, numeric(12,2)); `\\dT` in psql "
                                                   "lists the types")


def _listed(info: introspect.TableInfo) -> str:
    return ", ".join(c.name for c in info.columns)


def default_name(source: QualifiedName, columns: dict[str, str], partition: dict[str, Any] | None) -> str:
    """The table's name and the change: orders_bigint, events_partitioned, orders_rebuild."""
    types = set(columns.values())
    change = [next(iter(types)) if len(types) == 1 else "columns"] if columns else []
    change += ["partitioned"] if partition is not None else []
    text = "_".join([source.name, *(change or ["rebuild"])])
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", text).strip("_.-").lower()[:63] or "plan"


def _name_free(cur: psycopg.Cursor, name: str, *, given: bool) -> None:
    """A migration of that name, under way or done, would take the plan for its own (plan check
    compares the plan with it). Only where mover's schema is installed and current."""
    if not control.schema_ready(cur) or control.schema_revision(cur) != control.newest_revision():
        return
    existing = control.find(cur, name)
    if existing is not None and existing.state != "aborted":
        raise BadInput(f"a migration named {name!r} exists already ({existing.state})",
                       hint="choose another name with --name" if given else
                       "name this one with --name (e.g. --name " + f"{name}_2)")


def _header(source: QualifiedName, columns: dict[str, str], partition: dict[str, Any] | None,
            also: list[AlsoDraft]) -> tuple[str, ...]:
    change = [", ".join(f"{display_ident(c)} as {t}" for c, t in columns.items())] if columns else []
    if partition is not None:
        by = ", ".join(partition.get("columns") or [partition["column"]])
        change.append(f"partitioned by {partition['by']} ({by})")
    lines = [f"Moves {source}: {'; '.join(change) or 'the same shape, rebuilt'}."]
    if also:
        lines += [f"With it, in the same migration (one cutover), the {len(also)} "
                  f"table{'s' if len(also) > 1 else ''} whose columns reference the key it widens ([[also]] "
                  f"below): {', '.join(str(a.source) for a in also)}."]
    return (*lines, "",
            "Written by `mover plan new`. [migration], [target] and [[also]] define the migration; every",
            "other setting is at its default, as a comment: uncomment a line to change it (docs/plan.md).",
            "Next: `mover plan check PLAN` says what it will do, `mover run PLAN` starts it.")
