"""SQL of the DDL mover runs on user tables: create the target, build its indexes, swap names."""

from __future__ import annotations

from typing import Protocol

from psycopg import sql

from mover.names import QualifiedName
from mover.sql import trusted

# What the target takes from the source at creation. Indexes wait until after the backfill
# (copying into an indexed table was 3x slower here); user triggers are never copied
# (they must not fire for copied rows); foreign keys are not copied either (see docs/operating.md).
LIKE_OPTIONS = ("DEFAULTS", "CONSTRAINTS", "GENERATED", "IDENTITY", "STORAGE", "COMMENTS", "COMPRESSION")


def create_target(target: QualifiedName, source: QualifiedName, *, unlogged: bool = False,
                  partition_by: sql.Composable | None = None) -> sql.Composed:
    # UNLOGGED as the source is: after the swap the live table keeps its persistence.
    return sql.SQL("CREATE {u}TABLE {t} (LIKE {s} {opts}){p}").format(
        u=sql.SQL("UNLOGGED ") if unlogged else sql.SQL(""), t=target.ident, s=source.ident,
        opts=sql.SQL(" ").join(trusted("INCLUDING " + o, "keyword") for o in LIKE_OPTIONS),
        p=sql.SQL(" {}").format(partition_by) if partition_by is not None else sql.SQL(""))


def alter_column_type(table: QualifiedName, column: str, type_text: str,
                      collation: tuple[str, str] | None = None) -> sql.Composed:
    # type_text is the plan's [target] columns value: trusted operator input, checked with
    # to_regtype() during validation, and a type position takes no bind parameter.
    return sql.SQL("ALTER TABLE {t} ALTER COLUMN {c} TYPE {ty}{coll}").format(
        t=table.ident, c=sql.Identifier(column), ty=trusted(type_text, "plan type"),
        coll=sql.SQL(" COLLATE {}").format(sql.Identifier(*collation)) if collation else sql.SQL(""))


class IndexDefinition(Protocol):
    """What create_index needs of an index the catalog described (mover/catalog/introspect.py
    Index): the builders sit below the catalog and read no catalog type of their own."""

    @property
    def is_unique(self) -> bool: ...

    @property
    def definition_tail(self) -> str: ...


def create_index(name: str, table: QualifiedName, index: IndexDefinition, *, concurrently: bool) -> sql.Composed:
    """Recreate `index` on another table. The tail (`USING btree (a, b) WHERE ...`) is text the
    catalog printed for the source's index; the same column names exist in the target."""
    return sql.SQL("CREATE {unique}INDEX {conc}{name} ON {table} {tail}").format(
        unique=sql.SQL("UNIQUE ") if index.is_unique else sql.SQL(""),
        conc=sql.SQL("CONCURRENTLY ") if concurrently else sql.SQL(""),
        name=sql.Identifier(name), table=table.ident, tail=trusted(index.definition_tail, "pg_get_indexdef"))


def add_primary_key_using(table: QualifiedName, constraint: str, index_name: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {t} ADD CONSTRAINT {c} PRIMARY KEY USING INDEX {i}").format(
        t=table.ident, c=sql.Identifier(constraint), i=sql.Identifier(index_name))


def drop_constraint(table: QualifiedName, name: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table.ident, sql.Identifier(name))


def add_constraint(table: QualifiedName, name: str, definition: str) -> sql.Composed:
    # definition is pg_get_constraintdef() text: trusted, produced by the catalog.
    return sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(table.ident, sql.Identifier(name),
                                                                 trusted(definition, "pg_get_constraintdef"))


def drop_index(schema: str, name: str) -> sql.Composed:
    return sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(schema, name))


def rename_table(table: QualifiedName, new_name: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {t} RENAME TO {n}").format(t=table.ident, n=sql.Identifier(new_name))


def rename_index(index: QualifiedName, new_name: str) -> sql.Composed:
    return sql.SQL("ALTER INDEX {i} RENAME TO {n}").format(i=index.ident, n=sql.Identifier(new_name))


def drop_table(table: QualifiedName) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {}").format(table.ident)


# Privilege keywords aclexplode() reports; anything else would not be a catalog value.
PRIVILEGES = {"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "MAINTAIN"}


def _grantee(role: str | None) -> sql.Composable:
    return sql.SQL("PUBLIC") if role is None else sql.Identifier(role)


def grant(table: QualifiedName, privilege: str, role: str | None, grantable: bool,
          column: str | None = None) -> sql.Composed:
    if privilege not in PRIVILEGES:
        raise ValueError(f"unexpected privilege {privilege!r}")
    return sql.SQL("GRANT {priv}{col} ON {t} TO {role}{opt}").format(
        priv=trusted(privilege, "keyword"),
        col=sql.SQL(" ({})").format(sql.Identifier(column)) if column else sql.SQL(""),
        t=table.ident, role=_grantee(role), opt=sql.SQL(" WITH GRANT OPTION") if grantable else sql.SQL(""))


def grant_on_sequence(seq: QualifiedName, privilege: str, role: str | None, grantable: bool) -> sql.Composed:
    if privilege not in ("USAGE", "SELECT", "UPDATE"):
        raise ValueError(f"unexpected sequence privilege {privilege!r}")
    return sql.SQL("GRANT {priv} ON SEQUENCE {s} TO {role}{opt}").format(
        priv=trusted(privilege, "keyword"), s=seq.ident, role=_grantee(role),
        opt=sql.SQL(" WITH GRANT OPTION") if grantable else sql.SQL(""))


def owner_to(table: QualifiedName, role: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} OWNER TO {}").format(table.ident, sql.Identifier(role))


def set_reloptions(table: QualifiedName, options: tuple[str, ...]) -> sql.Composed:
    # "fillfactor=70"-style text from pg_class.reloptions: the catalog's own rendering.
    return sql.SQL("ALTER TABLE {} SET ({})").format(table.ident,
                                                     sql.SQL(", ").join(trusted(o, "reloptions") for o in options))


def comment_on(table: QualifiedName, comment: str) -> sql.Composed:
    return sql.SQL("COMMENT ON TABLE {} IS {}").format(table.ident, sql.Literal(comment))


def comment_on_index(index: QualifiedName, comment: str) -> sql.Composed:
    return sql.SQL("COMMENT ON INDEX {} IS {}").format(index.ident, sql.Literal(comment))


def comment_on_constraint(table: QualifiedName, name: str, comment: str) -> sql.Composed:
    return sql.SQL("COMMENT ON CONSTRAINT {} ON {} IS {}").format(sql.Identifier(name), table.ident,
                                                                   sql.Literal(comment))


def identity_no_maxvalue(table: QualifiedName, column: str) -> sql.Composed:
    """After widening an identity column: LIKE copied the old type's maximum explicitly."""
    return sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET NO MAXVALUE").format(table.ident, sql.Identifier(column))


def sequence_as(seq: QualifiedName, type_name: str) -> sql.Composed:
    # type_name is one of smallint / integer / bigint (checked by the caller)
    return sql.SQL("ALTER SEQUENCE {} AS {}").format(seq.ident, trusted(type_name, "keyword"))


# The rest of a table's metadata (mover/engines/swap/metadata.py). Values that are catalog-printed text
# (statistics column lists, publication row filters) are trusted like index definitions.

STORAGE = {"p": "PLAIN", "e": "EXTERNAL", "m": "MAIN", "x": "EXTENDED"}
STATISTICS_KINDS = {"ndistinct", "dependencies", "mcv"}
REPLICA_IDENTITY = {"d": "DEFAULT", "f": "FULL", "n": "NOTHING"}


def set_column_statistics(table: QualifiedName, column: str, target: int) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STATISTICS {}").format(
        table.ident, sql.Identifier(column), sql.Literal(int(target)))  # DDL takes no parameters


def set_storage(table: QualifiedName, column: str, storage: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STORAGE {}").format(
        table.ident, sql.Identifier(column), trusted(STORAGE[storage], "keyword"))


def set_compression(table: QualifiedName, column: str, method: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET COMPRESSION {}").format(
        table.ident, sql.Identifier(column), sql.Identifier(method))


def create_statistics(name: QualifiedName, kinds: list[str], columns_text: str,
                      table: QualifiedName) -> sql.Composed:
    # columns_text is pg_get_statisticsobjdef_columns() output: column names or expressions the
    # catalog printed, valid on the new table (same column names).
    if not set(kinds) <= STATISTICS_KINDS:
        raise ValueError(f"unexpected statistics kinds {kinds!r}")
    return sql.SQL("CREATE STATISTICS {n}{k} ON {c} FROM {t}").format(
        n=name.ident, k=sql.SQL(" ({})").format(sql.SQL(", ").join(trusted(k, "keyword") for k in kinds)) if kinds
        else sql.SQL(""), c=trusted(columns_text, "pg_get_statisticsobjdef"), t=table.ident)


def set_statistics_target(name: QualifiedName, target: int) -> sql.Composed:
    return sql.SQL("ALTER STATISTICS {} SET STATISTICS {}").format(name.ident, sql.Literal(int(target)))


def rename_statistics(name: QualifiedName, new_name: str) -> sql.Composed:
    return sql.SQL("ALTER STATISTICS {} RENAME TO {}").format(name.ident, sql.Identifier(new_name))


def comment_on_statistics(name: QualifiedName, comment: str) -> sql.Composed:
    return sql.SQL("COMMENT ON STATISTICS {} IS {}").format(name.ident, sql.Literal(comment))


def security_label(provider: str, table: QualifiedName, label: str, column: str | None = None) -> sql.Composed:
    # The label is a literal: SECURITY LABEL takes no bind parameters.
    if column is None:
        return sql.SQL("SECURITY LABEL FOR {} ON TABLE {} IS {}").format(
            sql.Identifier(provider), table.ident, sql.Literal(label))
    assert table.schema is not None
    return sql.SQL("SECURITY LABEL FOR {} ON COLUMN {} IS {}").format(
        sql.Identifier(provider), sql.Identifier(table.schema, table.name, column), sql.Literal(label))


def replica_identity(table: QualifiedName, mode: str, index: str | None = None) -> sql.Composed:
    if mode == "i":
        assert index is not None
        return sql.SQL("ALTER TABLE {} REPLICA IDENTITY USING INDEX {}").format(table.ident, sql.Identifier(index))
    return sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(table.ident, trusted(REPLICA_IDENTITY[mode], "keyword"))


def publication_add(publication: str, table: QualifiedName, columns: list[str] | None,
                    row_filter: str | None) -> sql.Composed:
    # row_filter is pg_get_expr() text of the publication's own WHERE clause: trusted catalog output.
    return sql.SQL("ALTER PUBLICATION {p} ADD TABLE {t}{c}{w}").format(
        p=sql.Identifier(publication), t=table.ident,
        c=sql.SQL(" ({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in columns)) if columns
        else sql.SQL(""),
        w=sql.SQL(" WHERE ({})").format(trusted(row_filter, "pg_get_expr")) if row_filter else sql.SQL(""))


def publication_drop(publication: str, table: QualifiedName) -> sql.Composed:
    return sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(sql.Identifier(publication), table.ident)


def drop_column(table: QualifiedName, column: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(table.ident, sql.Identifier(column))


def add_generated_column(table: QualifiedName, column: str, type_text: str, collation: tuple[str, str] | None,
                         expression: str, not_null: bool, *, virtual: bool = False,
                         not_null_name: str | None = None) -> sql.Composed:
    """A generated column: `expression` is the source column's, printed by pg_get_expr(). Stored,
    or virtual (PostgreSQL 18: computed when read, never written). `not_null_name`: the name of
    the source's NOT NULL constraint (PostgreSQL 18 names them; before, there is none)."""
    nn: sql.Composable = sql.SQL("")
    if not_null:
        nn = (sql.SQL(" CONSTRAINT {} NOT NULL").format(sql.Identifier(not_null_name)) if not_null_name
              else sql.SQL(" NOT NULL"))
    return sql.SQL("ALTER TABLE {t} ADD COLUMN {c} {ty}{coll} GENERATED ALWAYS AS ({e}) {kind}{nn}").format(
        t=table.ident, c=sql.Identifier(column), ty=trusted(type_text, "format_type"),
        coll=sql.SQL(" COLLATE {}").format(sql.Identifier(*collation)) if collation else sql.SQL(""),
        e=trusted(expression, "pg_get_expr"), kind=sql.SQL("VIRTUAL") if virtual else sql.SQL("STORED"), nn=nn)


def comment_on_column(table: QualifiedName, column: str, comment: str) -> sql.Composed:
    return sql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(table.ident, sql.Identifier(column), sql.Literal(comment))


FK_ACTIONS = {"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}
FK_MATCH = {"f": "MATCH FULL", "s": "MATCH SIMPLE", "p": "MATCH PARTIAL"}


def add_foreign_key(table: QualifiedName, name: str, columns: tuple[str, ...], parent: QualifiedName,
                    ref_columns: tuple[str, ...], *, match: str, on_update: str, on_delete: str,
                    delete_set: tuple[str, ...] = (), deferrable: bool = False, deferred: bool = False,
                    not_valid: bool = False, not_enforced: bool = False, period: bool = False) -> sql.Composed:
    """The foreign key pg_constraint describes (confmatchtype, confupdtype, confdeltype, confdelsetcols,
    condeferrable, condeferred as one-letter codes and names; conenforced and conperiod on 18),
    between two other tables: built from its parts, so pg_get_constraintdef prints it as it printed
    the original (the referenced table's name aside)."""
    def listed(names: tuple[str, ...]) -> sql.Composed:
        parts: list[sql.Composable] = [sql.Identifier(c) for c in names]
        if period:  # the last column of each list is the PERIOD one
            parts[-1] = sql.SQL("PERIOD {}").format(parts[-1])
        return sql.SQL(", ").join(parts)
    cols, refs = listed(columns), listed(ref_columns)
    on_delete_sql: sql.Composable = trusted(FK_ACTIONS[on_delete], "keyword")
    if delete_set:
        on_delete_sql = sql.SQL("{} ({})").format(on_delete_sql, sql.SQL(", ").join(sql.Identifier(c)
                                                                                     for c in delete_set))
    return sql.SQL("ALTER TABLE {t} ADD CONSTRAINT {n} FOREIGN KEY ({c}) REFERENCES {p} ({r}) {m}"
                   " ON UPDATE {u} ON DELETE {d}{defer}{nv}").format(
        t=table.ident, n=sql.Identifier(name), c=cols, p=parent.ident, r=refs, m=trusted(FK_MATCH[match], "keyword"),
        u=trusted(FK_ACTIONS[on_update], "keyword"), d=on_delete_sql,
        defer=sql.SQL(" DEFERRABLE INITIALLY DEFERRED") if deferred else sql.SQL(" DEFERRABLE") if deferrable
        else sql.SQL(""),
        nv=sql.SQL(" NOT ENFORCED") if not_enforced else sql.SQL(" NOT VALID") if not_valid else sql.SQL(""))
