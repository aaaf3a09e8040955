"""SQL of change capture: the change log, the trigger that appends keys to it, and the
state-based replay that applies logged keys to the destination.

The trigger records *keys only* (the new key on INSERT/UPDATE, the old one on DELETE and on
an UPDATE that changes the key): it cannot fail on the application's data, and it writes one
small row. The applier later replays each logged key by state: the current source row is
upserted into the destination, or the destination row is deleted when the source has none.
Replay is idempotent and order-free, so a crash between two batches redoes at most a batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import sql

from mover.names import QualifiedName, parse_qualified
from mover.sql import trusted
from mover.sql.mapping import (
    Mapping,
    collated,
    destination_value,
    ident_list,
    key_column_defs,
    key_equal,
    overriding,
    source_values,
)


def create_log(log: QualifiedName, key: tuple[str, ...], key_types: tuple[str, ...],
               collations: tuple[tuple[str, str] | None, ...] = ()) -> list[sql.Composed]:
    """The log and its index on seq. No unique key: the trigger's insert must not be able to fail
    on a row someone else put there (invariant 3). seq orders and names the rows for the applier's
    claim; two rows sharing one (possible only if the log's owner, or a superuser, inserted with
    OVERRIDING SYSTEM VALUE) are claimed and replayed together, which replay by state allows."""
    # The key's own collation: the watermark test (covered_by) compares log keys with a bound.
    cols = key_column_defs(key, key_types, collations)
    return [sql.SQL("CREATE TABLE {log} (seq bigint GENERATED ALWAYS AS IDENTITY, {cols},"
                    " logged_at timestamptz NOT NULL DEFAULT now())").format(log=log.ident, cols=cols),
            sql.SQL("CREATE INDEX {ix} ON {log} (seq)").format(ix=sql.Identifier(log.name + "_seq"), log=log.ident)]


def key_equality() -> sql.SQL:
    """Per key column (%(columns)s, in order) of the table's key index (%(table)s oid, %(index)s
    name): the schema of its operator class's equality operator, and that operator's name. The
    trigger compares old and new keys with exactly the operator that decides key identity."""
    return sql.SQL(
        """
SELECT a.attname, n.nspname, o.oprname
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indclass::oid[]) AS k(attnum, opclass)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
JOIN pg_opclass c ON c.oid = k.opclass
JOIN pg_amop p ON p.amopfamily = c.opcfamily AND p.amopmethod = c.opcmethod AND p.amopstrategy = 3
                AND p.amoplefttype = c.opcintype AND p.amoprighttype = c.opcintype
JOIN pg_operator o ON o.oid = p.amopopr
JOIN pg_namespace n ON n.oid = o.oprnamespace
WHERE i.indrelid = %(table)s AND ic.relname = %(index)s AND a.attname = ANY(%(columns)s)
""")


def create_trigger_function(function: QualifiedName, log: QualifiedName, key: tuple[str, ...],
                            migration: str, equality: tuple[str, ...] | None = None,
                            reverse: bool = False) -> list[sql.Composed]:
    """The function body is a string literal (PostgreSQL takes no parameters there); the names
    inside it are composed with Identifier first, so they are quoted exactly once. `equality` is
    the schema of each key column's equality operator (key_equality; pg_catalog by default).

    SECURITY DEFINER, owned by mover's role: the writing roles need no right on the log, and no
    other role has any (nothing another role writes can make the trigger's insert fail,
    invariant 3). Without a SET clause (a GUC save and restore on every row, bench/README.md):
    instead nothing in the body resolves through the caller's search_path, which a writing role
    or a CREATE on public could fill with its own operators or functions and run them with
    mover's rights. The log is schema-qualified; every operator is OPERATOR(schema.=), the key
    type's own; the one function is pg_catalog.format; TG_OP is compared with
    OPERATOR(pg_catalog.=) (text = text). Plain comparison, not IS DISTINCT FROM (which resolves
    `=` by search path): key columns are NOT NULL."""
    schemas = equality or tuple("pg_catalog" for _ in key)
    eq = sql.SQL("OPERATOR(pg_catalog.=)")
    new_key = sql.SQL(", ").join(sql.SQL("NEW.{}").format(sql.Identifier(k)) for k in key)
    old_key = sql.SQL(", ").join(sql.SQL("OLD.{}").format(sql.Identifier(k)) for k in key)
    same_key = sql.SQL(" AND ").join(
        sql.SQL("OLD.{k} OPERATOR({s}.=) NEW.{k}").format(k=sql.Identifier(k), s=sql.Identifier(s))
        for k, s in zip(key, schemas, strict=True))
    body = sql.SQL(
        """
BEGIN
    IF TG_OP {eq} 'TRUNCATE' THEN
        -- The rows are gone before anyone could log their keys: refuse rather than diverge.
        RAISE EXCEPTION USING ERRCODE = 'object_in_use',
            MESSAGE = pg_catalog.format('%s is being moved by mover migration %s; TRUNCATE would not reach the copy',
                                        TG_TABLE_NAME, {migration}),
            HINT = pg_catalog.format({hint}, {migration});
    END IF;
    IF TG_OP {eq} 'DELETE' THEN
        INSERT INTO {log} ({cols}) VALUES ({old_key});
        RETURN NULL;
    END IF;
    INSERT INTO {log} ({cols}) VALUES ({new_key});
    IF TG_OP {eq} 'UPDATE' AND NOT ({same_key}) THEN
        INSERT INTO {log} ({cols}) VALUES ({old_key});
    END IF;
    RETURN NULL;
END
"""
    ).format(log=log.ident, cols=ident_list(key), new_key=new_key, old_key=old_key, same_key=same_key, eq=eq,
             migration=sql.Literal(migration),
             # What works where the trigger is: the forward capture's before the swap (abort), the
             # reverse capture's in the rollback window (retire ends it; abort does not work there).
             hint=sql.Literal("delete the rows instead, or `mover retire %s` first (it ends the rollback window)"
                              if reverse else "delete the rows instead, or `mover abort %s` first"))
    # CREATE OR REPLACE: a capture installed by an older mover (SECURITY INVOKER, the log granted
    # to PUBLIC) is brought to this one in place on resume (capture.upgrade). EXECUTE revoked:
    # another role could otherwise attach the function to a table of its own and log keys
    # through it with mover's rights (a trigger's function is checked for EXECUTE only when the
    # trigger is created, not when it fires).
    return [sql.SQL("CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS {body}")
            .format(fn=function.ident, body=sql.Literal(body.as_string())),
            sql.SQL("REVOKE ALL ON FUNCTION {fn}() FROM PUBLIC").format(fn=function.ident)]


def revoke_log(log: QualifiedName) -> sql.Composed:
    """What an older mover granted on the log (INSERT to PUBLIC), taken back: no grant is needed."""
    return sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(log.ident)


def truncate_trigger(trigger: str) -> str:
    return trigger + "_truncate"


def create_trigger(trigger: str, table: QualifiedName, function: QualifiedName, *,
                   rows: bool = True) -> list[sql.Composed]:
    """The row trigger that logs keys and the statement trigger that refuses TRUNCATE; without
    `rows` only the latter (logical capture reads the rows' changes from the WAL)."""
    # ENABLE ALWAYS: the triggers fire even in sessions with session_replication_role = replica
    # (logical replication appliers, some bulk loaders), which would otherwise skip them.
    t, tt = sql.Identifier(trigger), sql.Identifier(truncate_trigger(trigger))
    row = [sql.SQL("CREATE TRIGGER {t} AFTER INSERT OR UPDATE OR DELETE ON {tbl} FOR EACH ROW EXECUTE FUNCTION {fn}()")
           .format(t=t, tbl=table.ident, fn=function.ident)]
    return [
        *(row if rows else []),
        sql.SQL("CREATE TRIGGER {t} BEFORE TRUNCATE ON {tbl} FOR EACH STATEMENT EXECUTE FUNCTION {fn}()")
        .format(t=tt, tbl=table.ident, fn=function.ident),
        *([sql.SQL("ALTER TABLE {tbl} ENABLE ALWAYS TRIGGER {t}").format(t=t, tbl=table.ident)] if rows else []),
        sql.SQL("ALTER TABLE {tbl} ENABLE ALWAYS TRIGGER {t}").format(t=tt, tbl=table.ident),
    ]


def drop_trigger(trigger: str, table: QualifiedName) -> sql.Composed:
    return sql.SQL("DROP TRIGGER IF EXISTS {t} ON {tbl}").format(t=sql.Identifier(trigger), tbl=table.ident)


def drop_function(function: QualifiedName) -> sql.Composed:
    return sql.SQL("DROP FUNCTION IF EXISTS {fn}()").format(fn=function.ident)


def drop_table(table: QualifiedName) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {t}").format(t=table.ident)


def _sync_keys(m: Mapping, suffix: str = "") -> sql.Composed:
    """CTEs that bring the destination rows of the keys in CTE `keys` to their source state:
    delete those whose source row is gone, upsert the others. `suffix` names the CTEs apart when
    one statement replays several tables (replay_family)."""
    k = m.key
    conflict = k + m.dst_partition
    action = (sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
        sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c.name)) for c in m.columns if c.name not in conflict))
        if any(c.name not in conflict for c in m.columns) else sql.SQL("DO NOTHING"))
    # A partitioned destination's unique key is the source's key plus its partition columns (the
    # columns keep their type: resolve_plan refuses a type change on them). A row whose partition
    # value changed is a different row there: delete the old one, in the same statement, and the
    # upsert inserts the new one into its partition. Plain `=`: a NULL partition value (only in a
    # default partition) is deleted and inserted again, since no unique index would match it.
    moved = (sql.SQL(" AND ({d}) = ({s})").format(
        d=sql.SQL(", ").join(sql.Identifier("d", c) for c in m.dst_partition),
        s=sql.SQL(", ").join(sql.Identifier("s", c) for c in m.dst_partition)) if m.dst_partition else sql.SQL(""))
    return sql.SQL(
        """{gone} AS (
    DELETE FROM {dst} d USING {keys} l
    WHERE {d_eq_l} AND NOT EXISTS (SELECT 1 FROM {src} s WHERE {s_eq_l}{moved})
    RETURNING 1
), {upserted} AS (
    INSERT INTO {dst} AS d ({cols}){overriding}
    SELECT {values} FROM {src} s JOIN {keys} l ON {s_eq_l}
    ON CONFLICT ({key_cols}) {action}
    RETURNING 1
)"""
    ).format(dst=m.dst.ident, src=m.reads("src"), d_eq_l=key_equal("d", "l", k), s_eq_l=key_equal("s", "l", k),
             cols=ident_list(c.name for c in m.columns), overriding=overriding(m), values=source_values("s", m),
             key_cols=ident_list(conflict), action=action, moved=moved, gone=sql.Identifier("gone" + suffix),
             upserted=sql.Identifier("upserted" + suffix), keys=sql.Identifier("keys" + suffix))


def replay(m: Mapping, log: QualifiedName, *, covered: sql.Composable, skip_locked: bool) -> sql.Composed:
    """One statement: claim up to %(limit)s log rows whose keys the backfill has covered, delete
    the destination rows whose source row is gone, upsert the others. One snapshot serves the
    claim and the reads, so every claimed change is visible in the source rows read."""
    lkey = sql.SQL(", ").join(sql.Identifier("l", c) for c in m.key)
    return sql.SQL(
        """
WITH claimed AS (
    DELETE FROM {log} l WHERE l.seq IN (
        SELECT c.seq FROM {log} c WHERE {covered} ORDER BY c.seq LIMIT %(limit)s FOR UPDATE{skip})
    RETURNING {lkey}
), keys AS (
    SELECT DISTINCT {lkey} FROM claimed l
), {sync}
SELECT (SELECT count(*) FROM claimed), (SELECT count(*) FROM gone), (SELECT count(*) FROM upserted)
"""
    ).format(log=log.ident, covered=covered, skip=sql.SQL(" SKIP LOCKED") if skip_locked else sql.SQL(""),
             lkey=lkey, sync=_sync_keys(m))


def replay_family(parts: list[tuple[Mapping, QualifiedName, sql.Composable]], *, skip_locked: bool) -> sql.Composed:
    """replay() of several tables' logs in ONE statement: for each (mapping, log, covered), claim up
    to %(limit)s log rows (NULL: all of them), delete the destination rows whose source row is
    gone, upsert the others. One statement, one snapshot of every source and log; and the
    destinations' foreign keys between these tables are checked once, at the end of the
    statement, against the state it reached: a child replayed with its new parent, a parent
    deleted with its children, never one before the other (docs/design.md "Families"). Returns
    one row: claimed, deleted, upserted for each part in turn."""
    ctes: list[sql.Composable] = []
    counts: list[sql.Composable] = []
    for i, (m, log, covered) in enumerate(parts):
        lkey = sql.SQL(", ").join(sql.Identifier("l", c) for c in m.key)
        claimed, keys = sql.Identifier(f"claimed_{i}"), sql.Identifier(f"keys_{i}")
        ctes.append(sql.SQL(
            """{claimed} AS (
    DELETE FROM {log} l WHERE l.seq IN (
        SELECT c.seq FROM {log} c WHERE {covered} ORDER BY c.seq LIMIT %(limit)s FOR UPDATE{skip})
    RETURNING {lkey}
), {keys} AS (
    SELECT DISTINCT {lkey} FROM {claimed} l
), {sync}""").format(claimed=claimed, keys=keys, log=log.ident, covered=covered, lkey=lkey,
                     skip=sql.SQL(" SKIP LOCKED") if skip_locked else sql.SQL(""), sync=_sync_keys(m, f"_{i}")))
        counts += [sql.SQL("(SELECT count(*) FROM {})").format(sql.Identifier(f"{name}_{i}"))
                   for name in ("claimed", "gone", "upserted")]
    return sql.SQL("WITH {}\nSELECT {}").format(sql.SQL(",\n").join(ctes), sql.SQL(", ").join(counts))


def replay_keys(m: Mapping) -> sql.Composed:
    """Replay a single key given as parameters (the fallback when a batch fails on data)."""
    keyrow = sql.SQL(", ").join(
        sql.SQL("{} AS {}").format(
            collated(sql.SQL("CAST({} AS {})").format(sql.Placeholder(), trusted(t, "format_type")),
                     m.key_collations[i] if m.key_collations else None), sql.Identifier(c))
        for i, (c, t) in enumerate(zip(m.key, m.src_key_types, strict=True)))
    return sql.SQL("WITH keys AS (SELECT {keyrow}), {sync}\n"
                   "SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM upserted)").format(
        keyrow=keyrow, sync=_sync_keys(m))


def claim_keys(log: QualifiedName, covered: sql.Composable, key: tuple[str, ...]) -> sql.Composed:
    """Claim a batch of log rows and return their keys as text (the per-key fallback path)."""
    return sql.SQL(
        "DELETE FROM {log} l WHERE l.seq IN (SELECT c.seq FROM {log} c WHERE {covered} ORDER BY c.seq"
        " LIMIT %(limit)s FOR UPDATE) RETURNING {keys}"
    ).format(log=log.ident, covered=covered,
             keys=sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier("l", c)) for c in key))


def pending_count(log: QualifiedName) -> sql.Composed:
    return sql.SQL("SELECT count(*), extract(epoch FROM clock_timestamp() - min(logged_at)) FROM {log}").format(
        log=log.ident)


# ---------------------------------------------------------------------------------------------
# Replaying a closure of keys (race 7): two rows that swap a unique value in one transaction
# cannot be replayed one key at a time, nor by an upsert of both (the unique check is per row).
# Nor can a booking moved into the slot another one left, under an exclusion constraint.


def generated_columns() -> sql.SQL:
    """Stored generated columns of both %(src)s and %(dst)s (oids), by name."""
    return sql.SQL("SELECT d.attname FROM pg_attribute d JOIN pg_attribute s ON s.attrelid = %(src)s"
                   " AND s.attname = d.attname AND s.attgenerated = 's' AND NOT s.attisdropped"
                   " WHERE d.attrelid = %(dst)s AND d.attgenerated = 's' AND NOT d.attisdropped ORDER BY d.attnum")


# Every column an index reads: its keys, and those its expressions and predicate depend on.
_INDEX_READS = sql.SQL("""array(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum > 0
             AND (a.attnum = ANY (i.indkey::int2[])
                  OR a.attnum IN (SELECT d.refobjsubid FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                                  AND d.objid = i.indexrelid AND d.refclassid = 'pg_class'::regclass
                                  AND d.refobjid = i.indrelid)))""")


def unique_indexes() -> sql.Composed:
    """The destination's unique indexes: each one's key column/expression texts, its predicate
    (a partial index's, else NULL), every column it reads (keys, expressions and predicate, from
    indkey and pg_depend), and the plain columns among its keys. Takes %(table)s, the table's oid.
    Not a temporal key's (PostgreSQL 18, WITHOUT OVERLAPS: unique, and an exclusion index): rows
    equal on it also overlap, so exclusion_constraints() finds them with the rest."""
    return sql.SQL(
        """
SELECT i.indexrelid::regclass::text,
       array(SELECT pg_get_indexdef(i.indexrelid, k, true) FROM generate_series(1, i.indnkeyatts) k ORDER BY k),
       pg_get_expr(i.indpred, i.indrelid),
       {reads},
       array(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum > 0
             AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1]))
FROM pg_index i WHERE i.indrelid = %(table)s AND i.indisunique AND NOT i.indisexclusion ORDER BY i.indexrelid
""").format(reads=_INDEX_READS)


def exclusion_constraints() -> sql.Composed:
    """The destination's constraints that exclude pairs of rows by operators (conexclop): EXCLUDE
    constraints (and PostgreSQL 18's WITHOUT OVERLAPS keys, built the same way). Each one's name,
    its index's key column/expression texts, the schema and name of each one's operator, its
    predicate (or NULL), and every column it reads. Takes %(table)s, the table's oid."""
    return sql.SQL(
        """
SELECT k.conname,
       array(SELECT pg_get_indexdef(i.indexrelid, n, true) FROM generate_series(1, i.indnkeyatts) n ORDER BY n),
       array(SELECT ns.nspname FROM unnest(k.conexclop) WITH ORDINALITY AS x(op, ord)
             JOIN pg_operator o ON o.oid = x.op JOIN pg_namespace ns ON ns.oid = o.oprnamespace ORDER BY x.ord),
       array(SELECT o.oprname FROM unnest(k.conexclop) WITH ORDINALITY AS x(op, ord)
             JOIN pg_operator o ON o.oid = x.op ORDER BY x.ord),
       pg_get_expr(i.indpred, i.indrelid),
       {reads}
FROM pg_constraint k JOIN pg_index i ON i.indexrelid = k.conindid
WHERE k.conrelid = %(table)s AND k.conexclop IS NOT NULL ORDER BY k.conname
""").format(reads=_INDEX_READS)


@dataclass(frozen=True)
class Unique:
    """A unique index of the destination: its key column/expression texts (pg_get_indexdef: SQL
    the catalog deparsed, so trusted) and its predicate, if partial."""
    exprs: tuple[str, ...]
    predicate: str | None = None


@dataclass(frozen=True)
class Exclusion:
    """An exclusion constraint of the destination: per key column of its index, the column or
    expression text and the (schema, name) of the operator two rows may not both satisfy on it
    (catalog text, trusted); its predicate, if partial."""
    exprs: tuple[str, ...]
    operators: tuple[tuple[str, str], ...]
    predicate: str | None = None


@dataclass(frozen=True)
class Conflicts:
    """What can make one row of the destination refuse another's values: its unique indexes and
    exclusion constraints, and the generated columns both tables compute (the source's value
    stands for the destination's)."""
    unique: tuple[Unique, ...] = ()
    exclusions: tuple[Exclusion, ...] = ()
    computed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.unique or self.exclusions)


_OPERATOR_CHARS = frozenset("+-*/<>=~!@#%^&|`?")


def _operator(schema: str, name: str) -> sql.Composed:
    """OPERATOR(schema.name): the catalog's operator, never one the session's search path finds."""
    if not name or not set(name) <= _OPERATOR_CHARS:
        raise ValueError(f"unexpected operator name {name!r}")
    return sql.SQL("OPERATOR({}.{})").format(sql.Identifier(schema), trusted(name, "pg_operator"))


def _key_set(m: Mapping) -> sql.Composed:
    """CTE `keys`: the keys given as one text array per key column (%(k_0)s, %(k_1)s...), cast to
    the source's key types."""
    arrays = sql.SQL(", ").join(sql.SQL("{}::text[]").format(sql.Placeholder(f"k_{i}")) for i in range(len(m.key)))
    cols = sql.SQL(", ").join(sql.SQL("CAST(u.{} AS {}) AS {}").format(sql.Identifier(f"k_{i}"),
                                                                      trusted(t, "format_type"), sql.Identifier(c))
                              for i, (c, t) in enumerate(zip(m.key, m.src_key_types, strict=True)))
    return sql.SQL("keys AS (SELECT {cols} FROM unnest({arrays}) AS u({names}))").format(
        cols=cols, arrays=arrays, names=ident_list(f"k_{i}" for i in range(len(m.key))))


def key_params(keys: list[tuple[Any, ...]], width: int) -> dict[str, list[Any]]:
    return {f"k_{i}": [k[i] for k in keys] for i in range(width)}


def _conflict_probe(m: Mapping, c: Conflicts) -> tuple[sql.Composed, sql.Composed]:
    """Two LATERAL items for a source row `s`: `v`, the row as the destination would hold it (each
    column cast to its destination type) with the value of every unique index's and exclusion
    constraint's expressions and predicates over it; and `h`, the keys of the destination rows
    that would refuse it (same unique values, or values an exclusion constraint's operators
    match). Unqualified catalog expressions read the one row in scope: `v`'s inner subquery holds
    only the converted source row, and each branch of `h` reads only the destination, through a
    subquery the planner flattens, so that the index of the constraint serves each probe."""
    casts = [destination_value("s", col) for col in m.columns]
    row = sql.SQL("(SELECT {}) AS c ({})").format(
        sql.SQL(", ").join([*casts, *(sql.Identifier("s", g) for g in c.computed)]),
        ident_list([*(col.name for col in m.columns), *c.computed]))
    probes: list[sql.Composable] = []
    branches: list[sql.Composable] = []
    dkeys = sql.SQL(", ").join(sql.SQL("{} AS {}").format(sql.Identifier(k), sql.Identifier(f"k_{j}"))
                               for j, k in enumerate(m.key))
    out_keys = sql.SQL(", ").join(sql.Identifier("d", f"k_{j}") for j in range(len(m.key)))

    def values(prefix: str, exprs: tuple[str, ...]) -> list[sql.Composable]:
        return [sql.SQL("({}) AS {}").format(trusted(e, "pg_get_indexdef"), sql.Identifier(f"{prefix}_{j}"))
                for j, e in enumerate(exprs)]

    def predicate(name: str, text: str | None) -> tuple[sql.Composable, sql.Composable]:
        """The predicate as a value of `v` and as the filter of the destination's subquery."""
        if text is None:
            return sql.SQL(""), sql.SQL("")
        pred = trusted(text, "pg_get_expr")
        probes.append(sql.SQL("coalesce(({}), false) AS {}").format(pred, sql.Identifier(name)))
        return sql.SQL(" AND {}").format(sql.Identifier("v", name)), sql.SQL(" WHERE ({})").format(pred)

    for i, u in enumerate(c.unique):
        probes += values(f"u{i}", u.exprs)
        on_v, where = predicate(f"u{i}_p", u.predicate)
        names_ = [f"u{i}_{j}" for j in range(len(u.exprs))]
        branches.append(sql.SQL(
            "SELECT {out} FROM (SELECT {dkeys}, {vals} FROM {dst}{where}) d WHERE ({dv}) = ({vv}){on_v}").format(
            out=out_keys, dkeys=dkeys, vals=sql.SQL(", ").join(values(f"u{i}", u.exprs)), dst=m.dst.ident,
            where=where, dv=sql.SQL(", ").join(sql.Identifier("d", n) for n in names_),
            vv=sql.SQL(", ").join(sql.Identifier("v", n) for n in names_), on_v=on_v))
    for i, x in enumerate(c.exclusions):
        probes += values(f"x{i}", x.exprs)
        on_v, where = predicate(f"x{i}_p", x.predicate)
        match = sql.SQL(" AND ").join(
            sql.SQL("{} {} {}").format(sql.Identifier("d", f"x{i}_{j}"), _operator(*op),
                                       sql.Identifier("v", f"x{i}_{j}")) for j, op in enumerate(x.operators))
        branches.append(sql.SQL(
            "SELECT {out} FROM (SELECT {dkeys}, {vals} FROM {dst}{where}) d WHERE {match}{on_v}").format(
            out=out_keys, dkeys=dkeys, vals=sql.SQL(", ").join(values(f"x{i}", x.exprs)), dst=m.dst.ident,
            where=where, match=match, on_v=on_v))
    v = sql.SQL("CROSS JOIN LATERAL (SELECT {} FROM {}) v").format(sql.SQL(", ").join(probes), row)
    h = sql.SQL("CROSS JOIN LATERAL ({}) h").format(sql.SQL("\n    UNION ALL ").join(branches))
    return v, h


def replace_closure(m: Mapping, c: Conflicts) -> sql.Composed:
    """Replace the destination rows of the given keys, and of every row that stands in the way of
    their source rows, by their source rows: in ONE statement, so in one snapshot of the source.

    The closure is recursive (CTE `closure`): from the keys' source rows, the destination rows
    they would collide with (_conflict_probe), then those rows' source rows' collisions, until no
    new key comes. Two rows that swapped a value close in one step; a permutation the writer made
    by thousands of swaps since the last replay (a cycle through thousands of rows) closes here
    too, one key per step of the recursion, each step an index probe: a closure computed by
    separate statements, a step per round trip, could neither follow such cycles far enough nor
    keep up with a writer changing them between its statements (issue 21, item 4). Then every
    closure key's destination row is deleted and its source row, if any, inserted: the insert
    waits for the delete (it reads the delete's count first), and a row deleted by this statement
    no longer holds its unique values nor counts for an exclusion constraint. Partial indexes
    and constraints take part only for rows their predicate covers, as PostgreSQL checks them."""
    v, h = _conflict_probe(m, c)
    key_cols = ident_list(m.key)
    pulled = sql.SQL(", ").join(sql.SQL("CAST({} AS {})").format(sql.Identifier("h", f"k_{j}"),
                                                                 trusted(t, "format_type"))
                                for j, t in enumerate(m.src_key_types))
    return sql.SQL(
        """WITH RECURSIVE {keys},
closure ({key_cols}) AS (
    SELECT {key_cols} FROM keys
    UNION
    SELECT {pulled} FROM closure w JOIN {src} s ON {s_eq_w}
    {v}
    {h}
), gone AS (DELETE FROM {dst} d USING closure l WHERE {d_eq_l} RETURNING 1)
INSERT INTO {dst} ({dcols}){overriding} SELECT {svalues} FROM {src} s JOIN closure l ON {s_eq_l}
WHERE (SELECT count(*) FROM gone) >= 0""").format(
        keys=_key_set(m), key_cols=key_cols, pulled=pulled, src=m.reads("src"), s_eq_w=key_equal("s", "w", m.key),
        v=v, h=h, dst=m.dst.ident, d_eq_l=key_equal("d", "l", m.key), dcols=ident_list(col.name for col in m.columns),
        overriding=overriding(m), svalues=source_values("s", m), s_eq_l=key_equal("s", "l", m.key))


def replace_keys(m: Mapping) -> sql.Composed:
    """Replace the destination rows of the given keys by their source rows (no conflicting row to
    pull in: a destination without unique indexes or exclusion constraints besides its key)."""
    return sql.SQL(
        """WITH {keys}, gone AS (DELETE FROM {dst} d USING keys l WHERE {d_eq_l} RETURNING 1)
INSERT INTO {dst} ({dcols}){overriding} SELECT {svalues} FROM {src} s JOIN keys l ON {s_eq_l}
WHERE (SELECT count(*) FROM gone) >= 0""").format(
        keys=_key_set(m), dst=m.dst.ident, d_eq_l=key_equal("d", "l", m.key),
        dcols=ident_list(col.name for col in m.columns), overriding=overriding(m), svalues=source_values("s", m),
        src=m.reads("src"), s_eq_l=key_equal("s", "l", m.key))


# ---------------------------------------------------------------------------------------------
# Capture integrity (invariant 14): the catalog rows that make capture fire, as they are now and as
# mover last verified them. A row's oid and raw xmin (the xmin system column: freezing leaves it)
# change with every ALTER that touches the row (DISABLE/ENABLE TRIGGER, DROP and CREATE, ALTER
# PUBLICATION), also when a second ALTER put the state back before mover looked: so "the same oid
# and xmin as verified" means "continuously as verified", and anything else is a gap.

def capture_probe() -> sql.SQL:
    """One row per object in %(objects)s (in order): what the catalog holds now (oid, raw xmin,
    state, whether it is in force) and mover's mark of it (oid, xmin), each NULL when there is none.
    An object is a trigger name (on the table %(table)s, as text), or '<trigger> on <partition>' (one
    of a partitioned table's partitions, as regclass text), 'publication:' || %(publication)s
    (the publication's row: in force when it publishes every action) or that || ':table' (the
    table's membership of it: in force without a row filter or column list). Catalog reads
    only, by index: what every drain transaction runs."""
    return sql.SQL(
        """
SELECT o.object, s.oid, s.row_xmin, s.state, coalesce(s.in_force, false), k.object_oid, k.row_xmin, k.state
FROM unnest(%(objects)s::text[]) WITH ORDINALITY AS o(object, n)
LEFT JOIN LATERAL (
    SELECT t.oid::bigint AS oid, t.xmin::text AS row_xmin, t.tgenabled::text AS state,
           t.tgenabled OPERATOR(pg_catalog.=) 'A' AS in_force
    FROM pg_catalog.pg_trigger t
    WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(
              CASE WHEN pg_catalog.strpos(o.object, ' on ') OPERATOR(pg_catalog.>) 0
                   THEN pg_catalog.substr(o.object, pg_catalog.strpos(o.object, ' on ') OPERATOR(pg_catalog.+) 4)
                   ELSE %(table)s END)
      AND t.tgname OPERATOR(pg_catalog.=) pg_catalog.split_part(o.object, ' on ', 1)
    UNION ALL
    SELECT p.oid::bigint, p.xmin::text,
           pg_catalog.concat_ws(', ', CASE WHEN p.pubinsert THEN 'insert' END, CASE WHEN p.pubupdate THEN 'update' END,
                                CASE WHEN p.pubdelete THEN 'delete' END, CASE WHEN p.pubtruncate THEN 'truncate' END),
           p.pubinsert AND p.pubupdate AND p.pubdelete AND p.pubtruncate
    FROM pg_catalog.pg_publication p
    WHERE o.object OPERATOR(pg_catalog.=) ('publication:' || %(publication)s)
      AND p.pubname OPERATOR(pg_catalog.=) %(publication)s
    UNION ALL
    SELECT r.oid::bigint, r.xmin::text,
           CASE WHEN r.prqual IS NULL AND r.prattrs IS NULL THEN 'whole table' ELSE 'row filter or column list' END,
           r.prqual IS NULL AND r.prattrs IS NULL
    FROM pg_catalog.pg_publication_rel r JOIN pg_catalog.pg_publication p ON p.oid OPERATOR(pg_catalog.=) r.prpubid
    WHERE o.object OPERATOR(pg_catalog.=) ('publication:' || %(publication)s || ':table')
      AND p.pubname OPERATOR(pg_catalog.=) %(publication)s
      AND r.prrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(%(table)s)
) s ON true
LEFT JOIN mover.capture_marks k ON k.migration_id = %(mid)s AND k.direction = %(direction)s AND k.object = o.object
ORDER BY o.n
""")


def relation(text: str) -> QualifiedName:
    """A partition named in a capture object (mover/engines/capture/integrity.py), as regclass text."""
    return parse_qualified(text)


def enable_always(trigger: str, table: QualifiedName, partition: str | None = None) -> sql.Composed:
    """The statement that puts a capture trigger back in force (the fix a refusal names); on one
    of `table`'s partitions when `partition` names it."""
    on = table if partition is None else relation(partition)
    return sql.SQL("ALTER TABLE {tbl} ENABLE ALWAYS TRIGGER {t}").format(t=sql.Identifier(trigger), tbl=on.ident)


def resync_all_keys(log: QualifiedName, key: tuple[str, ...], key_types: tuple[str, ...],
                    live: QualifiedName, other: QualifiedName) -> sql.Composed:
    """Every key of either table into the change log (`key_types`: the log's, the live table's):
    the applier then replays each by state, which brings the other table's row to the live table's
    state, a row the live table no longer has deleted. The full re-sync after a gap in the reverse
    capture (the rows written while it was off are not in the log)."""
    cols = ident_list(key)
    cast = sql.SQL(", ").join(sql.SQL("CAST({} AS {})").format(sql.Identifier(k), trusted(t, "format_type"))
                              for k, t in zip(key, key_types, strict=True))
    return sql.SQL("INSERT INTO {log} ({cols}) SELECT {cols} FROM {live} UNION ALL SELECT {cast} FROM {other}").format(
        log=log.ident, cols=cols, live=live.ident, cast=cast, other=other.ident)
