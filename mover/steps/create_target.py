from __future__ import annotations

import psycopg
from psycopg import sql

from mover import names
from mover.catalog import introspect, partition_tree, reading, server
from mover.engines.context import Context
from mover.engines.partitioning import partitions, source_tree
from mover.engines.swap import metadata
from mover.errors import Failed, PlanError
from mover.plan import Plan
from mover.sql import ddl, trusted
from mover.sql import partitions as sql_partitions
from mover.state import control
from mover.steps.base import EachTable


def target_ddl(cur: psycopg.Cursor, plan: Plan, source: names.QualifiedName,
               target: names.QualifiedName, mid: int = 0) -> list[sql.Composed]:
    info = introspect.describe(cur, source)
    meta = introspect.metadata(cur, info.oid)
    spec = plan.new_layout
    tree = None if spec is not None or plan.one_table else partition_tree.read(cur, info.oid)
    partition_by: sql.Composable | None = None
    if spec is not None:
        partition_by = sql_partitions.partition_by(spec.by, spec.columns)
    elif tree is not None:
        partition_by = sql.SQL("PARTITION BY {}").format(trusted(tree.partition_by, "pg_get_partkeydef"))
    # PostgreSQL changes no type of a partition column: a kept layout whose partition columns
    # change type is made on an ordinary table first, and the new table created LIKE it.
    shaped = tree is not None and bool(set(plan.columns) & set(partitions.partition_columns(cur, source)))
    made = names.QualifiedName(target.schema, names.derived(target.name, "_shape")) if shaped else target
    unlogged = introspect.persistence(cur, source) == "u"
    stmts = [ddl.create_target(made, source, unlogged=unlogged, partition_by=None if shaped else partition_by)]
    target, final = made, target
    # LIKE copies every CHECK (and on 18 every NOT NULL constraint) as validated; one the source
    # has NOT VALID may be broken by rows that the backfill copies. It is added back NOT VALID at
    # the swap (mover/engines/swap/cutover.py), as it was.
    stmts += [ddl.drop_constraint(target, name) for name, _, _ in introspect.unvalidated_constraints(cur, info.oid)]
    have = {c.name: c for c in info.columns}
    drop, add = _regenerated(cur, info, plan.columns, target)
    stmts += drop
    stmts += [ddl.alter_column_type(target, col, typ, _kept_collation(cur, have[col], typ) if col in have else None)
              for col, typ in sorted(plan.columns.items())]
    stmts += add
    # A widened identity column keeps the old type's maximum (LIKE copies it as an explicit value).
    for seq in introspect.owned_sequences(cur, info.oid):
        if seq.identity and seq.column in plan.columns:
            seq_type, seq_max = introspect.sequence_limits(cur, seq.sequence)
            if seq_max == introspect.INTEGER_MAX.get(seq_type):
                stmts.append(ddl.identity_no_maxvalue(target, seq.column))
    if shaped:
        stmts += [ddl.create_target(final, made, unlogged=unlogged, partition_by=partition_by), ddl.drop_table(made)]
    target = final
    key_ix = next(ix for ix in info.indexes if ix.name == info.key_index)
    key_name = names.derived(target.name, "_pkey" if key_ix.is_primary else "_key")
    if spec is not None:
        # A partitioned table takes no ADD ... USING INDEX, and its key must hold the partition
        # columns; its partitions follow the key, and get it as they are created.
        stmts += partitions.key_sql(target, key_name, key_ix.is_primary, partitions.key_columns(info.key, spec))
        assert target.schema is not None
        stmts += partitions.create_sql(spec, target,
                                       partitions.layout(cur, spec, source, source.name, target.schema).partitions)
    elif tree is not None:
        # The source's key holds its partition columns already (PostgreSQL enforces no other).
        stmts += partitions.key_sql(target, key_name, key_ix.is_primary, info.key)
        stmts += source_tree.kept_sql(tree, info.oid, target, set())
    else:
        stmts.append(ddl.create_index(key_name, target, key_ix, concurrently=False))
    if key_ix.is_primary and spec is None and tree is None:
        stmts.append(ddl.add_primary_key_using(target, key_name, key_name))
    index_comment, constraint_comment = introspect.index_comments(cur, key_ix.oid)
    if index_comment is not None:
        stmts.append(ddl.comment_on_index(names.QualifiedName(target.schema, key_name), index_comment))
    if constraint_comment is not None and key_ix.is_primary:
        stmts.append(ddl.comment_on_constraint(target, key_name, constraint_comment))
    # What the application sees besides rows: owner, privileges, storage options, comment.
    stmts.append(ddl.owner_to(target, meta.owner))
    stmts += [ddl.grant(target, priv, role, grantable) for role, priv, grantable in meta.grants]
    stmts += [ddl.grant(target, priv, role, grantable, column=col) for col, role, priv, grantable in meta.column_grants]
    if meta.reloptions and partition_by is None:  # a partitioned parent stores no rows, and takes no storage options
        stmts.append(ddl.set_reloptions(target, meta.reloptions))
    if meta.comment is not None:
        stmts.append(ddl.comment_on(target, meta.comment))
    # Statistics targets, storage, compression, extended statistics, security labels.
    stmts += metadata.create_sql(cur, info.oid, target, plan.columns, mid)
    return stmts


# The generated columns of %(rel)s (stored, or virtual on 18) at or after the first one that reads
# a column in %(changed)s (attnums): its expression, NOT NULL (validated: on 18 a NOT VALID one
# comes back at the swap) and the NOT NULL constraint's name (18), storage (and the type's),
# compression, comment.
_GENERATED_AFTER = sql.SQL("""
WITH reads AS (
    SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = %(rel)s AND a.attgenerated <> '' AND NOT a.attisdropped
    AND EXISTS (SELECT 1 FROM pg_depend d LEFT JOIN pg_attrdef ad ON ad.oid = d.objid
                WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = %(rel)s AND d.refobjsubid = ANY(%(changed)s)
                AND ((d.classid = 'pg_class'::regclass AND d.objid = %(rel)s AND d.objsubid = a.attnum)
                     OR (d.classid = 'pg_attrdef'::regclass AND ad.adrelid = %(rel)s AND ad.adnum = a.attnum)))
)
SELECT a.attname, a.attgenerated, pg_get_expr(ad.adbin, ad.adrelid), {not_null}, a.attstorage, t.typstorage,
       nullif(a.attcompression::text, ''), col_description(a.attrelid, a.attnum),
       (SELECT nn.conname FROM pg_constraint nn WHERE nn.conrelid = a.attrelid AND nn.contype = 'n'
          AND nn.conkey[1] = a.attnum)
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
WHERE a.attrelid = %(rel)s AND a.attnum > 0 AND NOT a.attisdropped AND a.attnum >= (SELECT min(attnum) FROM reads)
ORDER BY a.attnum
""")


def _regenerated(cur: psycopg.Cursor, info: introspect.TableInfo, columns: dict[str, str],
                 target: names.QualifiedName) -> tuple[list[sql.Composed], list[sql.Composed]]:
    """A generated column (stored, or virtual on 18) that reads a column whose type changes blocks
    ALTER ... TYPE ("cannot alter type of a column used by a generated column"). The target is mover's own, and
    empty: drop such columns before the type changes and add them back after, with the source's
    expression over the new types (computed, never copied: copy_columns leaves them out). Every
    column from the first such one on is re-added in order, so the column order stays the
    source's; that is possible only when all of them are generated columns (re-adding a plain
    column would lose what LIKE copied), else the plan is refused, naming the column."""
    if not columns:
        return [], []
    attnums = _attnums(cur, info.oid, [c.name for c in info.columns if c.name in columns])
    rows = reading.read(cur, _GENERATED_AFTER.format(not_null=server.of(cur).not_null_validated("a")),
                        {"rel": info.oid, "changed": attnums},
                        missing=lambda r: f"the expression of column {names.display_ident(r[0])} of {info.name}"
                        if r[1] and r[2] is None else None)
    if not rows:
        return [], []
    plain = [r[0] for r in rows if not r[1]]
    if plain:
        first = rows[0][0]
        raise PlanError(
            f"[target] columns: the generated column {names.display_ident(first)} of {info.name} reads a column "
            f"whose type changes, so mover creates it again over the new type; the column "
            f"{names.display_ident(plain[0])} after it is not generated, and would have to move",
            hint="change the type of the columns it reads in another migration without it, or move the "
                 "generated column to the end of the table first")
    drop = [ddl.drop_column(target, r[0]) for r in rows]
    add: list[sql.Composed] = []
    for name, generated, expression, not_null, storage, type_storage, compression, comment, nn_name in rows:
        col = info.column(name)
        add.append(ddl.add_generated_column(target, name, col.type, col.collation, expression, not_null,
                                            virtual=generated == "v", not_null_name=nn_name))
        if storage != type_storage:
            add.append(ddl.set_storage(target, name, storage))
        if compression:
            add.append(ddl.set_compression(target, name, compression))
        if comment is not None:
            add.append(ddl.comment_on_column(target, name, comment))
    # The validated CHECK constraints the drop took with it (LIKE had copied them); the NOT VALID
    # ones come back at the swap anyway.
    add += [ddl.add_constraint(target, conname, definition) for conname, definition in reading.read(
        cur, "SELECT k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k WHERE k.conrelid = %s"
             " AND k.contype = 'c' AND k.convalidated AND k.conkey && %s::int2[] ORDER BY k.conname",
        (info.oid, _attnums(cur, info.oid, [r[0] for r in rows])),
        missing=reading.printed(1, name=lambda r: f"constraint {names.display_ident(r[0])} of {info.name}"))]
    return drop, add


def _attnums(cur: psycopg.Cursor, oid: int, columns: list[str]) -> list[int]:
    cur.execute("SELECT attnum FROM pg_attribute WHERE attrelid = %s AND attname = ANY(%s) AND NOT attisdropped",
                (oid, columns))
    return [r[0] for r in cur.fetchall()]


def _kept_collation(cur: psycopg.Cursor, column: introspect.Column, type_text: str) -> tuple[str, str] | None:
    """A column's own collation, kept through its type change when the new type is collatable
    (ALTER TABLE alone would reset it to the type's default: text keys would change order)."""
    if column.collation is None:
        return None
    cur.execute("SELECT typcollation <> 0 FROM pg_type WHERE oid = to_regtype(%s)", (type_text,))
    row = cur.fetchone()
    return column.collation if row and row[0] else None


class CreateTarget(EachTable):
    name = "create_target"

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        return list(target_ddl(cur, ctx.plan, ctx.migration.source, ctx.migration.target, ctx.mid))

    def run_table(self, ctx: Context) -> None:
        m = ctx.migration

        def create(cur: psycopg.Cursor) -> None:
            control.guard(cur, m.id, self.name, ctx.owner)
            if introspect.exists(cur, m.target):
                raise Failed(f"table {m.target} exists, but mover has no record of creating it",
                             hint=f"drop or rename it, then `mover run {m.name}`; or `mover abort {m.name}`")
            for stmt in target_ddl(cur, ctx.plan, m.source, m.target, m.id):
                cur.execute(stmt)
            control.finish_step(cur, m, self.name, ctx.owner, message=f"created {m.target}")

        ctx.db.transaction(create, lock_timeout="2s", label="create_target")
