"""Catalog reads that print objects with the catalog's own functions (race 10, docs/design.md).

A query's scan of pg_constraint, pg_index, pg_trigger, pg_attrdef ... reads the statement's snapshot,
but pg_get_constraintdef(), pg_get_indexdef(), pg_get_triggerdef(), pg_get_ruledef(),
pg_get_viewdef(), pg_get_expr(), pg_get_statisticsobjdef_columns() look the object up in the
catalog as it is now. An object another session dropped after the snapshot (another migration's
swap re-creating this table's foreign key, a REINDEX CONCURRENTLY swapping an index, the
application's DDL) is found by the scan and printed as NULL (format_type() prints '???' for a type
gone). Taken for a definition, that NULL crashed mover (`'NoneType' object has no attribute
'removesuffix'`) or would read as a shape change.

read() is the one way such a query runs: it reads again, whole, while a row holds the print of an
object that is gone. The statement run again takes a new snapshot (READ COMMITTED), in which the
object is gone or its successor is there. Where it cannot (a REPEATABLE READ transaction keeps its
snapshot) or the catalog keeps moving, it raises CatalogMoved, which Database.transaction retries
whole like a serialization failure, and which names the object when those attempts run out. A
"cache lookup failed" (XX000) that such a function raises instead of returning NULL is the same
race, and raised the same way (the transaction is aborted: only a new one can read again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from mover.errors import CatalogMoved

# Statements a read runs before it gives the race to the transaction's own retry.
ATTEMPTS = 3

# format_type()'s print of a type that is gone (never a real type's: one named ??? prints quoted).
UNKNOWN_TYPE = "???"

Row = tuple[Any, ...]
# The object a row found but could not print, for the message; None when the row is whole.
Missing = Callable[[Row], "str | None"]
Query = str | sql.SQL | sql.Composed

HINT = ("another session's DDL (another migration's swap, a REINDEX CONCURRENTLY, the application's"
        " ALTER TABLE) kept changing it while mover read it; run the same command again")


def gone(value: Any) -> bool:
    """Is this print that of an object dropped since the scan found it?"""
    return value is None or value == UNKNOWN_TYPE


def printed(*columns: int, name: Callable[[Row], str] | str) -> Missing:
    """Rows whose `columns` hold the catalog's prints of the object the row found (never NULL
    while it exists); `name(row)` (or `name`) names it ("constraint "x" of "public"."t"")."""
    def missing(row: Row) -> str | None:
        if not any(gone(row[c]) for c in columns):
            return None
        return name if isinstance(name, str) else name(row)
    return missing


def read(cur: psycopg.Cursor, query: Query, params: Any = None, *, missing: Missing) -> list[Row]:
    """cur.execute(query, params).fetchall(), read again whole while `missing` finds a row whose
    object vanished between the scan and its print; CatalogMoved when it does not settle."""
    lost: list[str] = []
    for _ in range(ATTEMPTS):
        try:
            cur.execute(query, params)
        except psycopg.errors.InternalError_ as exc:
            if "cache lookup failed" not in (exc.diag.message_primary or ""):
                raise
            raise CatalogMoved(f"the catalog changed while mover read it ({exc.diag.message_primary})",
                               hint=HINT) from exc
        rows = cur.fetchall()
        lost = [m for m in map(missing, rows) if m is not None]
        if not lost:
            return rows
    raise CatalogMoved(f"{_listed(lost)} vanished while mover read the catalog (dropped or replaced since the"
                       f" read's snapshot found {'it' if len(lost) == 1 else 'them'})", hint=HINT)


def read_one(cur: psycopg.Cursor, query: Query, params: Any = None, *, missing: Missing) -> Row | None:
    """read() of a query that finds one row or none."""
    rows = read(cur, query, params, missing=missing)
    return rows[0] if rows else None


def _listed(items: Sequence[str]) -> str:
    unique = list(dict.fromkeys(items))
    return ", ".join(unique[:5]) + (f" and {len(unique) - 5} more" if len(unique) > 5 else "")


def first(found: Iterable[str | None]) -> str | None:
    """The first object named, for predicates that look at several parts of a row."""
    return next((f for f in found if f is not None), None)
