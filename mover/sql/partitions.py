"""SQL of partitioned targets: the parent's PARTITION BY, partitions, per-partition indexes,
detaching and dropping. Pure builders, no I/O.

Partition bounds are DDL: PostgreSQL takes no bind parameters there, so bound values go in as
sql.Literal, cast to the partition column's catalog type.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from mover.names import QualifiedName
from mover.sql import trusted


def partition_by(by: str, columns: tuple[str, ...]) -> sql.Composed:
    if by not in ("range", "list", "hash"):
        raise ValueError(f"unexpected partitioning {by!r}")
    return sql.SQL("PARTITION BY {} ({})").format(trusted(by.upper(), "keyword"),
                                                   sql.SQL(", ").join(sql.Identifier(c) for c in columns))


def _typed(value: Any, type_text: str) -> sql.Composed:
    # type_text is format_type() output from the catalog: trusted.
    return sql.SQL("CAST({} AS {})").format(sql.Literal(value), trusted(type_text, "format_type"))


def range_bound(lo: Any, hi: Any, type_text: str) -> sql.Composed:
    return sql.SQL("FOR VALUES FROM ({}) TO ({})").format(_typed(lo, type_text), _typed(hi, type_text))


def list_bound(values: tuple[Any, ...], type_texts: tuple[str, ...]) -> sql.Composed:
    if len(type_texts) == 1:
        return sql.SQL("FOR VALUES IN ({})").format(sql.SQL(", ").join(_typed(v, type_texts[0]) for v in values))
    raise ValueError("list partitioning by several columns is not supported by PostgreSQL")


def hash_bound(modulus: int, remainder: int) -> sql.Composed:
    return sql.SQL("FOR VALUES WITH (MODULUS {}, REMAINDER {})").format(sql.Literal(modulus), sql.Literal(remainder))


def default_bound() -> sql.SQL:
    return sql.SQL("DEFAULT")


def create_partition(partition: QualifiedName, parent: QualifiedName, bound: sql.Composable) -> sql.Composed:
    return sql.SQL("CREATE TABLE {} PARTITION OF {} {}").format(partition.ident, parent.ident, bound)


def create_partition_as(partition: QualifiedName, parent: QualifiedName, bound: str, partition_by: str | None,
                        tablespace: str | None) -> sql.Composed:
    """A partition of `parent` with a bound (and a sub-partitioned one's key) as the catalog printed
    them for the source's partition it stands for."""
    return sql.SQL("CREATE TABLE {} PARTITION OF {} {}{}{}").format(
        partition.ident, parent.ident, trusted(bound, "pg_get_expr"),
        sql.SQL(" PARTITION BY {}").format(trusted(partition_by, "pg_get_partkeydef")) if partition_by else sql.SQL(""),
        sql.SQL(" TABLESPACE {}").format(sql.Identifier(tablespace)) if tablespace else sql.SQL(""))


def add_primary_key(table: QualifiedName, constraint: str, columns: tuple[str, ...]) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
        table.ident, sql.Identifier(constraint), sql.SQL(", ").join(sql.Identifier(c) for c in columns))


def create_unique_index(name: str, table: QualifiedName, columns: tuple[str, ...]) -> sql.Composed:
    return sql.SQL("CREATE UNIQUE INDEX {} ON {} ({})").format(
        sql.Identifier(name), table.ident, sql.SQL(", ").join(sql.Identifier(c) for c in columns))


def create_index_on_only(name: str, parent: QualifiedName, unique: bool, tail: str) -> sql.Composed:
    """The parent's index, without building anything: invalid until every partition's is attached."""
    # tail is pg_get_indexdef() text of the source's index (`USING btree (a)`): from the catalog.
    return sql.SQL("CREATE {}INDEX IF NOT EXISTS {} ON ONLY {} {}").format(
        sql.SQL("UNIQUE ") if unique else sql.SQL(""), sql.Identifier(name), parent.ident,
        trusted(tail, "pg_get_indexdef"))


def attach_index(parent_index: QualifiedName, child_index: QualifiedName) -> sql.Composed:
    return sql.SQL("ALTER INDEX {} ATTACH PARTITION {}").format(parent_index.ident, child_index.ident)


def detach_concurrently(parent: QualifiedName, partition: QualifiedName) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} DETACH PARTITION {} CONCURRENTLY").format(parent.ident, partition.ident)


def detach_finalize(parent: QualifiedName, partition: QualifiedName) -> sql.Composed:
    """Completes a DETACH ... CONCURRENTLY that was interrupted (the partition stays pending)."""
    return sql.SQL("ALTER TABLE {} DETACH PARTITION {} FINALIZE").format(parent.ident, partition.ident)


def partitions_of() -> sql.SQL:
    """Partitions of %(parent)s (oid): schema, name, bound text, whether it is the default, and
    whether a detach is pending."""
    return sql.SQL(
        "SELECT n.nspname, c.relname, pg_get_expr(c.relpartbound, c.oid),"
        " pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT',"
        " i.inhdetachpending FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE i.inhparent = %(parent)s ORDER BY c.relname")


def partition_key() -> sql.SQL:
    """Strategy and column names of the partitioned table %(table)s (oid); no row if it is not one."""
    return sql.SQL(
        "SELECT p.partstrat, array(SELECT a.attname FROM unnest(p.partattrs::int2[]) WITH ORDINALITY k(attnum, ord)"
        " JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = k.attnum ORDER BY k.ord)"
        " FROM pg_partitioned_table p WHERE p.partrelid = %(table)s")


def first_value(table: QualifiedName, column: str, descending: bool) -> sql.Composed:
    """The smallest (largest) non-null value of `column`: through an index on it where there is one
    (ORDER BY ... LIMIT 1 walks the index from one end), a scan only where there is none."""
    return sql.SQL("SELECT {c} FROM {t} WHERE {c} IS NOT NULL ORDER BY {c} {d} LIMIT 1").format(
        c=sql.Identifier(column), t=table.ident, d=sql.SQL("DESC") if descending else sql.SQL("ASC"))


def has_null(table: QualifiedName, column: str) -> sql.Composed:
    return sql.SQL("SELECT EXISTS (SELECT 1 FROM {t} WHERE {c} IS NULL)").format(
        t=table.ident, c=sql.Identifier(column))


def unlisted_value(table: QualifiedName, column: str, type_text: str, values: list[Any]) -> sql.Composed:
    """One value of `column` that no list partition takes (NULL included), as text, or no row."""
    listed = sql.SQL(", ").join(_typed(v, type_text) for v in values)
    return sql.SQL("SELECT {c}::text FROM {t} WHERE {c} IS NULL OR {c} NOT IN ({listed}) LIMIT 1").format(
        c=sql.Identifier(column), t=table.ident, listed=listed)


def count_rows(table: QualifiedName) -> sql.Composed:
    return sql.SQL("SELECT count(*) FROM {}").format(table.ident)


def detach(parent: QualifiedName, partition: QualifiedName) -> sql.Composed:
    """Plain DETACH (under the caller's lock_timeout): CONCURRENTLY is refused while the parent
    has a default partition."""
    return sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(parent.ident, partition.ident)


def lock_parent(parent: QualifiedName) -> sql.Composed:
    return sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(parent.ident)


def create_like(table: QualifiedName, parent: QualifiedName) -> sql.Composed:
    # No identity: a partition does not need one (the parent's hands out the values).
    return sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE"
                   " INCLUDING GENERATED)").format(table.ident, parent.ident)


def move_range(default: QualifiedName, table: QualifiedName, column: str, lo: Any, hi: Any, type_text: str,
               columns: tuple[str, ...]) -> sql.Composed:
    """Move the default partition's rows of [lo, hi) into `table`, in one statement."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    return sql.SQL("WITH moved AS (DELETE FROM ONLY {d} WHERE {c} >= {lo} AND {c} < {hi} RETURNING {cols})"
                   " INSERT INTO {t} ({cols}) SELECT {cols} FROM moved").format(
        d=default.ident, c=sql.Identifier(column), lo=_typed(lo, type_text), hi=_typed(hi, type_text),
        cols=cols, t=table.ident)


def has_rows_between(table: QualifiedName, column: str, lo: Any, hi: Any, type_text: str) -> sql.Composed:
    return sql.SQL("SELECT EXISTS (SELECT 1 FROM {t} WHERE {c} >= {lo} AND {c} < {hi})").format(
        t=table.ident, c=sql.Identifier(column), lo=_typed(lo, type_text), hi=_typed(hi, type_text))


def attach(parent: QualifiedName, table: QualifiedName, bound: sql.Composable) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} ATTACH PARTITION {} {}").format(parent.ident, table.ident, bound)


def rename_table(table: QualifiedName, new_name: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} RENAME TO {}").format(table.ident, sql.Identifier(new_name))


def move_all(source: QualifiedName, parent: QualifiedName, columns: tuple[str, ...]) -> sql.Composed:
    """Every row of `source` into `parent` (routed to its partitions), keeping identity values."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    return sql.SQL("INSERT INTO {p} ({cols}) OVERRIDING SYSTEM VALUE SELECT {cols} FROM {s}").format(
        p=parent.ident, cols=cols, s=source.ident)


def partman_create_parent(schema: str) -> sql.Composed:
    """pg_partman 4.x create_parent for a native range set, without pg_jobmon."""
    return sql.SQL("SELECT {}.create_parent(p_parent_table := %(parent)s, p_control := %(control)s,"
                   " p_type := 'native', p_interval := %(interval)s, p_premake := %(premake)s,"
                   " p_start_partition := %(start)s, p_jobmon := false)").format(sql.Identifier(schema))


def partman_run_maintenance(schema: str) -> sql.Composed:
    return sql.SQL("SELECT {}.run_maintenance(p_parent_table := %(parent)s, p_jobmon := false)").format(
        sql.Identifier(schema))
