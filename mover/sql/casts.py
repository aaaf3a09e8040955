"""SQL of the conversion probes: how the server converts a value of one type to another, asked of the
server itself rather than re-derived from pg_cast (which has no row for the I/O conversion to a
string type, nor for a domain or an array of convertible elements).

The probes read a table of mover's own with one column of each type (c_0, c_1, ...), created in a
savepoint that is rolled back (mover/catalog/conversion.py `probe`), and are only EXPLAINed: the
parser decides whether a conversion exists before anything runs, and an empty table has no row a
conversion could fail on.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from mover.names import QualifiedName
from mover.sql import trusted


def column(i: int) -> sql.Identifier:
    return sql.Identifier(f"c_{i}")


def probe_table(table: QualifiedName, types: Sequence[str]) -> sql.Composed:
    """The probe table: a column c_i of each type (catalog text, or a plan's type the caller checked)."""
    return sql.SQL("CREATE TABLE {t} ({cols})").format(t=table.ident, cols=sql.SQL(", ").join(
        sql.SQL("{} {}").format(column(i), trusted(t, "format_type")) for i, t in enumerate(types)))


def collatable() -> sql.SQL:
    """The probe table's (%s, as regclass text) columns whose type has a collation: attcollation is
    set from the type's."""
    return sql.SQL("SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = %s::pg_catalog.regclass"
                   " AND attnum > 0 AND attcollation <> 0")


def assignment(table: QualifiedName, src: int, dst: int) -> sql.Composed:
    """c_src into c_dst as the backfill's copy and the replay write it (mover/sql/mapping.py
    source_values): the INSERT converts with assignment semantics, as ALTER TABLE ... TYPE without
    USING does. Fails (42804) where PostgreSQL has no assignment conversion."""
    return sql.SQL("EXPLAIN INSERT INTO {t} ({d}) SELECT {s} FROM {t}").format(t=table.ident, d=column(dst),
                                                                               s=column(src))


def explicit(table: QualifiedName, src: int, dst_type: str) -> sql.Composed:
    """c_src through an explicit CAST. Fails (42846) where PostgreSQL has no conversion at all."""
    return sql.SQL("EXPLAIN SELECT CAST({s} AS {ty}) FROM {t}").format(t=table.ident, s=column(src),
                                                                       ty=trusted(dst_type, "format_type"))


def equality(table: QualifiedName, i: int) -> sql.Composed:
    """Whether the type of c_i has the `=` IS DISTINCT FROM finds (json, xml, point have none)."""
    return sql.SQL("EXPLAIN SELECT {c} IS DISTINCT FROM {c} FROM {t}").format(t=table.ident, c=column(i))


def comparable(table: QualifiedName, pairs: Sequence[tuple[int, int]]) -> sql.Composed:
    """Key values of two types compared as mover compares the keys of the two tables: equal (the
    replay's and reconcile's joins, both ways round) and ordered (a range's bounds, read in one
    table's types, against the other table's keys), as row values like mover/sql/mapping.py's."""
    a = sql.SQL("({})").format(sql.SQL(", ").join(column(i) for i, _ in pairs))
    b = sql.SQL("({})").format(sql.SQL(", ").join(column(j) for _, j in pairs))
    return sql.SQL("EXPLAIN SELECT 1 FROM {t} WHERE {a} = {b} AND {b} = {a} AND {a} > {b} AND {b} > {a}").format(
        t=table.ident, a=a, b=b)
