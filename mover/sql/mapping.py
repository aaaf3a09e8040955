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

from mover.names import QualifiedName
from mover.sql import trusted


@dataclass(frozen=True)
class MappedColumn:
    name: str
    cast_to: str | None  # the destination type when it differs from the source's (catalog text)
    # The source's type when the conversion can lose information: reconcile compares in it
    # (the destination value cast back), so a value the conversion changed differs.
    back_to: str | None = None


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
    """The source columns for an INSERT into the destination. Not cast here: the INSERT converts
    each value with assignment semantics, as ALTER TABLE ... TYPE would, so a value that does
    not fit fails (an explicit CAST would truncate a string or a bit string silently)."""
    return sql.SQL(", ").join(sql.Identifier(alias, c.name) for c in m.columns)


def overriding(m: Mapping) -> sql.SQL:
    return sql.SQL(" OVERRIDING SYSTEM VALUE") if m.overriding else sql.SQL("")
