"""How the rows of one table map onto another: key, columns, casts. Pure data, no I/O.

The same Mapping drives the forward direction (original -> new table, before cutover) and the
reverse one (new -> original, during the rollback window); it is derived from the two tables'
catalog descriptions (mover/catalog/conversion.py `mapping`), so after create_target no plan is
needed to rebuild it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from mover.names import QualifiedName, display_ident
from mover.sql import trusted

# How a value reaches the destination column's type (MappedColumn.convert).
ASSIGN = "assign"  # the INSERT converts it with assignment semantics, as ALTER TABLE ... TYPE without USING
CAST = "cast"  # an explicit CAST: only where no assignment conversion exists (the rollback window's direction)
NONE = "none"  # no conversion at all: every value but NULL is refused, a data error on its row

# How mover's own refusal of a value begins (source_values). SQL has no expression that raises an
# error of its choosing, so the refusal is the input of a cast to integer that cannot succeed, and
# arrives inside PostgreSQL's error text: invalid input syntax for type integer: "mover: ...".
REFUSAL = "mover: "
SHOWN_CHARS = 100  # of a refused value, in the refusal


@dataclass(frozen=True)
class MappedColumn:
    name: str
    cast_to: str | None  # the destination type when it differs from the source's (catalog text)
    # The source's type when the conversion can lose information: reconcile compares in it
    # (the destination value cast back), so a value the conversion changed differs.
    back_to: str | None = None
    convert: str = ASSIGN
    # How the value is checked to arrive unchanged (converted to cast_to and back to back_to, and
    # compared with the value written; a difference refuses the row): "value" (typed `=`),
    # "collated" (typed, under the "C" collation: byte for byte), "text" (the text forms, for a
    # type without `=`); None: not checked (mover/catalog/conversion.py `mapping` says where).
    checked: str | None = None


@dataclass(frozen=True)
class Mapping:
    src: QualifiedName
    dst: QualifiedName
    key: tuple[str, ...]
    src_key_types: tuple[str, ...]
    columns: tuple[MappedColumn, ...]
    overriding: bool  # the destination has GENERATED ALWAYS identity columns
    # Per key column, (schema, name) of its collation when not the type's default: every
    # comparison of key values (range bounds, the watermark, logs) uses it, so that "below the
    # bound" means the same as in the key's index.
    key_collations: tuple[tuple[str, str] | None, ...] = ()
    # The destination's partition columns not in the key, when it is partitioned: its unique key
    # is the source's plus these, so replay upserts on that and deletes a row that changed
    # partition (mover/sql/capture.py).
    dst_partition: tuple[str, ...] = ()
    # Each side is an ordinary table: read with ONLY, so that an inheritance child's rows (plan check
    # and the swap refuse children, invariant 15: defence in depth) are never copied or compared as
    # the table's. A partitioned side is read whole (ONLY would read none of its rows).
    src_only: bool = False
    dst_only: bool = False
    # Either side is partitioned: a statement joining a set of keys to it must probe each
    # partition's key index by key, never hash a whole side (mover/engines/capture/changelog.py).
    partitioned: bool = False

    def reads(self, side: str) -> sql.Composable:
        """The relation a statement reads `side` ("src" or "dst") from: `ONLY table` where it may."""
        table, only = (self.src, self.src_only) if side == "src" else (self.dst, self.dst_only)
        return sql.SQL("ONLY {}").format(table.ident) if only else table.ident

    @property
    def non_key(self) -> tuple[MappedColumn, ...]:
        return tuple(c for c in self.columns if c.name not in self.key)


def ident_list(names: Iterable[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def key_row(alias: str, key: tuple[str, ...]) -> sql.Composed:
    """`(alias.k1, alias.k2)`: a row value, so one-column and composite keys read the same."""
    return sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(alias, k) for k in key))


def key_equal(a: str, b: str, key: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(sql.Identifier(a, k), sql.Identifier(b, k)) for k in key)


def collated(expr: sql.Composable, collation: tuple[str, str] | None) -> sql.Composable:
    """`expr COLLATE "schema"."name"`, or expr alone for the type's default collation."""
    return expr if collation is None else sql.SQL("{} COLLATE {}").format(expr, sql.Identifier(*collation))


def key_column_defs(key: tuple[str, ...], key_types: tuple[str, ...],
                    collations: tuple[tuple[str, str] | None, ...] = ()) -> sql.Composed:
    """`k1 type [COLLATE c], ...`: key columns of a log or notes table, ordered like the key."""
    return sql.SQL(", ").join(
        collated(sql.SQL("{} {}").format(sql.Identifier(k), trusted(t, "format_type")),
                 collations[i] if collations else None)
        for i, (k, t) in enumerate(zip(key, key_types, strict=True)))


def bound_row(key_types: tuple[str, ...], name: str | None = None,
              collations: tuple[tuple[str, str] | None, ...] = ()) -> sql.Composed:
    """A key bound as bind parameters cast back from their text form (positional, or named
    `name_0`, `name_1`...), in the key's collation (a cast takes the type's default, and a
    comparison of two default-collated values, e.g. a log column with the bound, would
    otherwise order text keys unlike their index). Type names come from format_type() in the
    catalog: PostgreSQL takes no parameters in a type position."""
    return sql.SQL("({})").format(sql.SQL(", ").join(
        collated(sql.SQL("CAST({} AS {})").format(sql.Placeholder(f"{name}_{i}") if name else sql.Placeholder(),
                                                   trusted(t, "format_type")), collations[i] if collations else None)
        for i, t in enumerate(key_types)))


def named_bound(name: str, values: list[str]) -> dict[str, str]:
    return {f"{name}_{i}": v for i, v in enumerate(values)}


def range_predicate(alias: str, m: Mapping, lo: list[str] | None,
                    hi: list[str] | None) -> tuple[sql.Composable, list[Any]]:
    """`lo < key <= hi` on `alias`; a None bound is open."""
    parts: list[sql.Composable] = []
    params: list[Any] = []
    if lo is not None:
        parts.append(sql.SQL("{} > {}").format(key_row(alias, m.key), bound_row(m.src_key_types, None,
                                                                                m.key_collations)))
        params += lo
    if hi is not None:
        parts.append(sql.SQL("{} <= {}").format(key_row(alias, m.key), bound_row(m.src_key_types, None,
                                                                                 m.key_collations)))
        params += hi
    if not parts:
        return sql.SQL("true"), []
    return sql.SQL(" AND ").join(parts), params


def source_values(alias: str, m: Mapping) -> sql.Composed:
    """The source columns for an INSERT into the destination. Not cast here where an assignment
    conversion exists: the INSERT converts each value with assignment semantics, as ALTER TABLE
    ... TYPE would, so a value that does not fit fails (an explicit CAST would truncate a string or
    a bit string silently). A column without one (convert CAST, the rollback window's direction
    only) goes through CAST, and one without any conversion is refused unless NULL; a checked
    column's value is refused where converting it there and back changes it (`checked`)."""
    return sql.SQL(", ").join(source_value(alias, c) for c in m.columns)


def source_value(alias: str, c: MappedColumn) -> sql.Composable:
    """One column of source_values: what the INSERT is given for `c` (plan check prints it)."""
    return _value(sql.Identifier(alias, c.name), c)


def destination_value(alias: str, c: MappedColumn) -> sql.Composable:
    """The source column `alias.c` as the destination would hold it, in the destination's type (what
    a unique index or an exclusion constraint of the destination reads)."""
    v = _value(sql.Identifier(alias, c.name), c)
    if c.cast_to is None or c.convert != ASSIGN:
        return v
    return sql.SQL("CAST({} AS {})").format(v, trusted(c.cast_to, "format_type"))


def _value(v: sql.Composable, c: MappedColumn) -> sql.Composable:
    if c.cast_to is None:
        return v
    to = trusted(c.cast_to, "format_type")
    if c.convert == NONE:
        message = _text(f"{REFUSAL}column {display_ident(c.name)} has no conversion to {c.cast_to}: value ")
        return sql.SQL("CASE WHEN {v} IS NULL THEN CAST(NULL AS {to}) ELSE {refused} END").format(
            v=v, to=to, refused=_refused(sql.SQL("{} || {}").format(message, _shown(v)), to))
    value = sql.SQL("CAST({} AS {})").format(v, to) if c.convert == CAST else v
    if c.checked is None:
        return value
    assert c.back_to is not None  # set wherever a value is checked
    back = sql.SQL("CAST(CAST({} AS {}) AS {})").format(v, to, trusted(c.back_to, "format_type"))
    if c.checked == "text":
        same = sql.SQL("CAST({} AS pg_catalog.text) COLLATE pg_catalog.\"C\" IS NOT DISTINCT FROM CAST({} AS"
                       " pg_catalog.text)").format(v, back)
    elif c.checked == "collated":
        same = sql.SQL("{} COLLATE pg_catalog.\"C\" IS NOT DISTINCT FROM {}").format(v, back)
    else:
        same = sql.SQL("{} IS NOT DISTINCT FROM {}").format(v, back)
    message = sql.SQL("{} || {} || {} || {}").format(
        _text(f"{REFUSAL}value of column {display_ident(c.name)} does not convert to {c.cast_to} and back "
              f"unchanged: "), _shown(v), _text(" comes back as "), _shown(back))
    return sql.SQL("CASE WHEN {same} THEN {value} ELSE {refused} END").format(
        same=same, value=value, refused=_refused(message, to if c.convert == CAST else trusted(c.back_to,
                                                                                                 "format_type")))


def _shown(v: sql.Composable) -> sql.Composed:
    """A value in a refusal: its text form, quoted, cut to SHOWN_CHARS characters."""
    return sql.SQL("pg_catalog.quote_literal(pg_catalog.left(CAST({} AS pg_catalog.text), {}))").format(
        v, sql.Literal(SHOWN_CHARS))


def _refused(message: sql.Composable, typ: sql.Composable) -> sql.Composed:
    """An expression of type `typ` that raises a data error (22P02) carrying `message` (REFUSAL).
    Every message reads the column's value: never a constant, which the planner would fold (and
    raise) before the CASE around it chose its branch."""
    return sql.SQL("CAST(CAST(CAST({} AS pg_catalog.int4) AS pg_catalog.text) AS {})").format(message, typ)


def _text(text: str) -> sql.Composable:
    """A text literal, its % spelled chr(37): the statements it goes into are run with parameters,
    and psycopg reads every % of a statement's text, string literals included, as a placeholder."""
    parts = text.split("%")
    if len(parts) == 1:
        return sql.Literal(text)
    return sql.SQL("({})").format(sql.SQL(" || pg_catalog.chr(37) || ").join(sql.Literal(p) for p in parts))


def refusal(exc_message: str) -> str | None:
    """mover's own refusal of a value (source_values), read back out of PostgreSQL's error text."""
    start = exc_message.find('"' + REFUSAL)
    if start < 0 or not exc_message.endswith('"'):
        return None
    return exc_message[start + 1 + len(REFUSAL):-1]


def overriding(m: Mapping) -> sql.SQL:
    return sql.SQL(" OVERRIDING SYSTEM VALUE") if m.overriding else sql.SQL("")
