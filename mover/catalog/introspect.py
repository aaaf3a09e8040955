"""Catalog reads: a table's columns, key, indexes, dependents, sequences, constraints and metadata
(owner, grants, storage options, comments). The plan's checks against the live catalog are built
on these but live with plan validation, not here.

Nothing here writes. Every function takes a cursor so it can run inside the caller's
transaction (and therefore its snapshot and timeouts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from mover.catalog import reading, server
from mover.db import one
from mover.errors import NotFound, PlanError
from mover.names import QualifiedName, display_ident


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # format_type(), e.g. "numeric(12,2)"
    type_oid: int
    # The column holds no NULL: NOT NULL and validated (on 18 a NOT NULL constraint added NOT
    # VALID marks the column NOT NULL while old rows may still hold NULL: mover/catalog/server.py)
    not_null: bool
    identity: str  # '' | 'a' (ALWAYS) | 'd' (BY DEFAULT)
    generated: str  # '' | 's' (STORED) | 'v' (VIRTUAL, PostgreSQL 18)
    # (schema, name) of the column's collation when it is not its type's default: every
    # comparison of key values must use it (a log column or a cast bound would take the default)
    collation: tuple[str, str] | None = None
    typmod: int = -1
    # For a domain: its base type and typmod (0 otherwise), so that a conversion from a domain
    # over varchar(20) is judged as one from varchar(20)
    base_type_oid: int = 0
    base_typmod: int = -1


@dataclass(frozen=True)
class Index:
    oid: int
    name: str
    is_primary: bool
    is_unique: bool
    is_valid: bool
    is_exclusion: bool
    definition_tail: str  # pg_get_indexdef() from " USING ..." on: trusted text produced by the catalog
    # pg_get_constraintdef() of the constraint this index backs, when only adding that constraint
    # makes the index (BUILT_BY_CONSTRAINT: an exclusion constraint or a temporal key, whose index
    # carries its name); None for an index CREATE INDEX builds (a plain or unique one, a PRIMARY
    # KEY's, a UNIQUE's).
    constraint_def: str | None = None
    constraint_type: str | None = None  # its pg_constraint.contype: 'x', or 'p' / 'u' for a temporal key

    @property
    def by_constraint(self) -> bool:
        """Built (on the target) by ALTER TABLE ... ADD CONSTRAINT, not CREATE INDEX."""
        return self.constraint_def is not None

    @property
    def constraint_kind(self) -> str:
        """What the constraint is called in messages."""
        return "temporal key" if self.constraint_type in ("p", "u") else "exclusion constraint"


@dataclass(frozen=True)
class TableInfo:
    oid: int
    name: QualifiedName
    relkind: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    key_index: str
    indexes: tuple[Index, ...] = field(default=())

    def column(self, name: str) -> Column:
        return self._by_name[name]  # KeyError for a column the table lacks

    @functools.cached_property
    def _by_name(self) -> dict[str, Column]:
        # By name, not a scan: mappings look every column up, a scan made them quadratic (issue 34).
        return {c.name: c for c in self.columns}

    @property
    def copy_columns(self) -> tuple[Column, ...]:
        """Columns whose values are copied (generated columns compute themselves: stored ones on
        write, virtual ones on read)."""
        return tuple(c for c in self.columns if not c.generated)


def setting_ms(cur: psycopg.Cursor, name: str) -> int:
    """A time setting of this session (SET LOCAL included), in milliseconds: lock_timeout,
    deadlock_timeout (their unit in pg_settings is ms)."""
    cur.execute("SELECT setting::int FROM pg_catalog.pg_settings WHERE name OPERATOR(pg_catalog.=) %s"
                " AND unit OPERATOR(pg_catalog.=) 'ms'", (name,))
    return int(one(cur)[0])


def resolve(cur: psycopg.Cursor, name: QualifiedName) -> QualifiedName | None:
    """The schema-qualified name of an existing relation. An unqualified name (a plan's) follows
    the search_path the session started with, the operator's and the application's, not the one
    mover's sessions pin (mover/db.py PINNED): it names a table, it runs nothing."""
    if name.schema is None:
        cur.execute("SELECT current_setting('search_path'), reset_val FROM pg_settings WHERE name = 'search_path'")
        pinned, startup = one(cur)
        cur.execute("SELECT set_config('search_path', %s, true)", (startup,))
    try:
        cur.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.oid = to_regclass(%s)",
            (_regclass_text(name),),
        )
        row = cur.fetchone()
    finally:
        if name.schema is None:
            cur.execute("SELECT set_config('search_path', %s, true)", (pinned,))
    return QualifiedName(row[0], row[1]) if row else None


def _regclass_text(name: QualifiedName) -> str:
    # to_regclass() parses its argument like SQL does, so hand it properly quoted parts.
    return str(name)


def persistence(cur: psycopg.Cursor, name: QualifiedName) -> str | None:
    """pg_class.relpersistence: 'p' permanent, 'u' unlogged, 't' temporary; None if there is no such relation."""
    cur.execute("SELECT relpersistence FROM pg_class WHERE oid = to_regclass(%s)", (_regclass_text(name),))
    row = cur.fetchone()
    return row[0] if row else None


def exists(cur: psycopg.Cursor, name: QualifiedName) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (_regclass_text(name),))
    return bool(one(cur)[0])


def describe(cur: psycopg.Cursor, name: QualifiedName) -> TableInfo:
    cur.execute(
        "SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s",
        (name.schema, name.name),
    )
    row = cur.fetchone()
    if row is None:
        raise NotFound(f"table {name} does not exist", hint="check the table's name and schema in the plan")
    oid, relkind = row
    srv = server.of(cur)
    rows = reading.read(cur, sql.SQL(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid, {not_null},
               a.attidentity, a.attgenerated,
               (SELECT ARRAY[cn.nspname, co.collname] FROM pg_collation co
                  JOIN pg_namespace cn ON cn.oid = co.collnamespace
                  JOIN pg_type ct ON ct.oid = a.atttypid
                 WHERE co.oid = a.attcollation AND a.attcollation <> ct.typcollation),
               a.atttypmod,
               (SELECT CASE WHEN d.typtype = 'd' THEN d.typbasetype ELSE 0 END FROM pg_type d WHERE d.oid = a.atttypid),
               (SELECT CASE WHEN d.typtype = 'd' THEN d.typtypmod ELSE -1 END FROM pg_type d WHERE d.oid = a.atttypid)
        FROM pg_attribute a
        WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
        """).format(not_null=srv.not_null_validated("a")),
        (oid,), missing=reading.printed(1, name=lambda r: f"the type of column {display_ident(r[0])} of {name}"))
    columns = tuple(Column(r[0], r[1], r[2], r[3], r[4], r[5], tuple(r[6]) if r[6] else None, r[7], r[8], r[9])
                    for r in rows)
    key, key_index = _key(cur, oid, name, srv)
    return TableInfo(oid, name, relkind, columns, key, key_index, _indexes(cur, oid))


def key_index(cur: psycopg.Cursor, oid: int, name: QualifiedName) -> str:
    """The name of the index describe() takes as the table's key."""
    return _key(cur, oid, name, server.of(cur))[1]


def _key(cur: psycopg.Cursor, oid: int, name: QualifiedName, srv: server.Server) -> tuple[tuple[str, ...], str]:
    """The primary key, else the narrowest unique index on plain NOT NULL columns (validated: a
    NOT VALID one lets old rows hold NULL), non-partial."""
    cur.execute(sql.SQL(
        """
        SELECT ic.relname, array_agg(a.attname ORDER BY k.ord)
        FROM pg_index i
        JOIN pg_class ic ON ic.oid = i.indexrelid
        CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
        WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL
          AND i.indexprs IS NULL AND NOT i.indisexclusion
          AND k.ord <= i.indnkeyatts
        GROUP BY ic.relname, i.indisprimary, i.indnkeyatts
        HAVING bool_and({not_null})
        ORDER BY i.indisprimary DESC, i.indnkeyatts, ic.relname
        LIMIT 1
        """).format(not_null=srv.not_null_validated("a")),
        (oid,),
    )
    row = cur.fetchone()
    if row is None:
        raise _no_key(cur, oid, name, srv)
    return tuple(row[1]), row[0]


def _no_key(cur: psycopg.Cursor, oid: int, name: QualifiedName, srv: server.Server) -> PlanError:
    """Why the table has no key mover can use, and the way out. A temporal key (PostgreSQL 18,
    PRIMARY KEY / UNIQUE (..., col WITHOUT OVERLAPS)) is not one: its plain columns repeat in other
    periods, and its index is a GiST exclusion index, which neither orders the backfill's and
    reconcile's ranges nor serves the replay's ON CONFLICT. Its columns together do identify a row
    where they are NOT NULL (two equal non-empty periods overlap, and it refuses empty ones): a
    unique btree index on them is a key, built without a rewrite and without a conflict."""
    hint = "add one (ALTER TABLE ... ADD PRIMARY KEY) and check the plan again"
    if not srv.temporal_constraints:
        return PlanError(f"table {name} has no primary key or unique index on NOT NULL columns", hint=hint)
    temporal = reading.read(cur, sql.SQL(
        "SELECT pg_get_constraintdef(k.oid), array(SELECT a.attname FROM unnest(k.conkey) WITH ORDINALITY"
        "   AS u(attnum, ord) JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.attnum ORDER BY u.ord),"
        " (SELECT bool_and({not_null}) FROM pg_attribute a WHERE a.attrelid = k.conrelid AND a.attnum = ANY(k.conkey))"
        " FROM pg_constraint k WHERE k.conrelid = %s AND k.contype IN ('p', 'u') AND {period}"
        " ORDER BY k.contype, k.conname").format(not_null=srv.not_null_validated("a"), period=srv.conperiod("k")),
        (oid,), missing=reading.printed(0, name=lambda r: f"a key constraint of {name}"))
    if not temporal:
        return PlanError(f"table {name} has no primary key or unique index on NOT NULL columns", hint=hint)
    keys = ", ".join(definition for definition, _, _ in temporal)
    usable = next((columns for _, columns, not_null in temporal if not_null), None)
    if usable is not None:
        hint = (f"give it a btree key over the same columns: CREATE UNIQUE INDEX CONCURRENTLY ON {name}"
                f" ({', '.join(map(display_ident, usable))}) (the temporal key makes them unique together:"
                f" no build conflict, no rewrite), or add a surrogate key (an identity column with a PRIMARY"
                f" KEY); then check the plan again")
    return PlanError(
        f"table {name} has no primary key or unique index on NOT NULL columns ({keys}"
        f" {'is a temporal key' if len(temporal) == 1 else 'are temporal keys'}: its plain columns repeat in"
        f" other periods, and its GiST index can neither order mover's key ranges nor serve the replay's"
        f" ON CONFLICT)", hint=hint)


# The constraints whose index only the constraint itself can make: those that exclude pairs of rows
# by operators (conexclop). CREATE INDEX builds the index of an exclusion constraint without its
# operators, and ADD CONSTRAINT ... USING INDEX takes only a btree PRIMARY KEY or UNIQUE one.
# PostgreSQL 18's temporal keys (PRIMARY KEY / UNIQUE (..., col WITHOUT OVERLAPS), conperiod set)
# are such constraints underneath, with conexclop as an exclusion constraint's: `=` on the plain
# columns, `&&` on the period. The same test on every version (no temporal key before 18), and the
# one the replay's closures read (mover/sql/capture.py exclusion_constraints).
BUILT_BY_CONSTRAINT = "k.conexclop IS NOT NULL"


def _indexes(cur: psycopg.Cursor, oid: int) -> tuple[Index, ...]:
    # pg_get_indexdef() reads "CREATE [UNIQUE] INDEX name ON schema.table USING ...". Names may
    # contain " USING ", so the tail is cut after the exact prefix the catalog would print.
    rows = reading.read(
        cur,
        """
        SELECT i.indexrelid, ic.relname, i.indisprimary, i.indisunique, i.indisvalid, i.indisexclusion,
               pg_get_indexdef(i.indexrelid),
               format('CREATE %%sINDEX %%I ON %%s%%I.%%I ', CASE WHEN i.indisunique THEN 'UNIQUE ' ELSE '' END,
                      ic.relname, CASE WHEN c.relkind = 'p' THEN 'ONLY ' ELSE '' END, n.nspname, c.relname),
               k.definition, k.contype
        FROM pg_index i
        JOIN pg_class ic ON ic.oid = i.indexrelid
        JOIN pg_class c ON c.oid = i.indrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN LATERAL (SELECT pg_get_constraintdef(k.oid) AS definition, k.contype FROM pg_constraint k
                            WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid
                              AND """ + BUILT_BY_CONSTRAINT + """) k ON true
        WHERE i.indrelid = %s
        ORDER BY ic.relname
        """,
        (oid,),
        # k.contype: the scan found the constraint, whose definition must then print
        missing=lambda r: f"index {display_ident(r[1])}" if r[6] is None or (r[9] is not None and r[8] is None)
        else None,
    )
    out = []
    for ioid, iname, primary, unique, valid, exclusion, definition, prefix, constraint, contype in rows:
        if not definition.startswith(prefix) or not definition[len(prefix):].startswith("USING "):
            raise PlanError(f"cannot read the definition of index {iname!r}: {definition!r}",
                            hint="report this definition; mover does not handle this index form yet")
        out.append(Index(ioid, iname, primary, unique, valid, exclusion, definition[len(prefix):], constraint,
                         contype))
    return tuple(out)


def outbound_foreign_keys(cur: psycopg.Cursor, oid: int) -> list[tuple[str, str]]:
    """(name, definition) of the table's own foreign keys, self-references included."""
    return [(r[0], r[1]) for r in reading.read(
        cur, "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
             " WHERE contype = 'f' AND conrelid = %s ORDER BY conname", (oid,),
        missing=reading.printed(1, name=lambda r: f"constraint {display_ident(r[0])}"))]


def index_comments(cur: psycopg.Cursor, index_oid: int) -> tuple[str | None, str | None]:
    """The comment on an index, and on the constraint it backs (a primary key's, a unique one's,
    an exclusion constraint's)."""
    cur.execute("SELECT obj_description(%s, 'pg_class'),"
                " (SELECT obj_description(oid, 'pg_constraint') FROM pg_constraint WHERE conindid = %s"
                "   AND contype IN ('p', 'u', 'x') LIMIT 1)", (index_oid, index_oid))
    row = one(cur)
    return row[0], row[1]


def unvalidated_constraints(cur: psycopg.Cursor, oid: int) -> list[tuple[str, str, str | None]]:
    """(name, definition, comment) of the CHECK and NOT NULL constraints existing rows may break:
    NOT VALID ones (the definition ends in NOT VALID), and CHECKs NOT ENFORCED (18). NOT NULL
    constraints are rows of pg_constraint from PostgreSQL 18 on (contype 'n'), with a name and,
    added by ALTER TABLE, possibly NOT VALID; before 18 there are none, and the query is the same."""
    return [(r[0], r[1], r[2]) for r in reading.read(
        cur, "SELECT conname, pg_get_constraintdef(oid), obj_description(oid, 'pg_constraint') FROM pg_constraint"
             " WHERE contype IN ('c', 'n') AND conrelid = %s AND NOT convalidated ORDER BY conname", (oid,),
        missing=reading.printed(1, name=lambda r: f"constraint {display_ident(r[0])}"))]


def type_exists(cur: psycopg.Cursor, type_text: str) -> bool:
    try:
        cur.execute("SAVEPOINT mover_type_check")
        cur.execute("SELECT to_regtype(%s) IS NOT NULL", (type_text,))
        ok: bool = one(cur)[0]
        cur.execute("RELEASE SAVEPOINT mover_type_check")
        return ok
    except psycopg.errors.Error:
        cur.execute("ROLLBACK TO SAVEPOINT mover_type_check")
        return False


@dataclass(frozen=True)
class OwnedSequence:
    column: str
    sequence: QualifiedName
    identity: bool  # an identity column's own sequence, else a serial's OWNED BY sequence


def owned_sequences(cur: psycopg.Cursor, oid: int) -> list[OwnedSequence]:
    cur.execute(
        """
        SELECT a.attname, n.nspname, c.relname, d.deptype = 'i'
        FROM pg_depend d
        JOIN pg_class c ON c.oid = d.objid AND c.relkind = 'S'
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
        WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
          AND d.refobjid = %s AND d.deptype IN ('a', 'i')
        ORDER BY a.attnum
        """,
        (oid,),
    )
    return [OwnedSequence(col, QualifiedName(s, n), ident) for col, s, n, ident in cur.fetchall()]


def table_oid(cur: psycopg.Cursor, name: QualifiedName) -> int | None:
    cur.execute("SELECT to_regclass(%s)::oid", (str(name),))
    oid: int | None = one(cur)[0]
    return oid


def index_state(cur: psycopg.Cursor, schema: str, name: str) -> bool | None:
    """None when the index does not exist, else whether it is valid (a crashed CREATE INDEX
    CONCURRENTLY leaves an invalid one behind)."""
    cur.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (schema, name))
    row = cur.fetchone()
    return None if row is None else row[0]


@dataclass(frozen=True)
class Metadata:
    """What the new table must carry over so the application sees the same table after the swap."""
    owner: str
    grants: tuple[tuple[str | None, str, bool], ...]  # (grantee or None for PUBLIC, privilege, grantable)
    column_grants: tuple[tuple[str, str | None, str, bool], ...]  # (column, grantee, privilege, grantable)
    reloptions: tuple[str, ...]
    comment: str | None
    row_security: bool
    policies: tuple[str, ...]
    user_triggers: tuple[str, ...]
    rules: tuple[str, ...]
    inheritance: str | None  # why the table takes part in inheritance or partitioning, or is typed, if it does


def metadata(cur: psycopg.Cursor, oid: int) -> Metadata:
    cur.execute("SELECT pg_get_userbyid(c.relowner), coalesce(c.reloptions, '{}'), obj_description(c.oid, 'pg_class'),"
                " c.relrowsecurity OR c.relforcerowsecurity, c.relispartition FROM pg_class c WHERE c.oid = %s", (oid,))
    owner, reloptions, comment, rls, is_partition = one(cur)
    cur.execute("SELECT CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END, a.privilege_type,"
                " a.is_grantable FROM pg_class c, aclexplode(c.relacl) a"
                " WHERE c.oid = %s AND a.grantee <> c.relowner ORDER BY 1, 2", (oid,))
    grants = tuple(cur.fetchall())
    cur.execute("SELECT att.attname, CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END,"
                " a.privilege_type, a.is_grantable FROM pg_attribute att, aclexplode(att.attacl) a"
                " WHERE att.attrelid = %s AND att.attnum > 0 AND NOT att.attisdropped AND att.attacl IS NOT NULL"
                " ORDER BY 1, 2, 3", (oid,))
    column_grants = tuple(cur.fetchall())
    cur.execute("SELECT polname FROM pg_policy WHERE polrelid = %s ORDER BY 1", (oid,))
    policies = tuple(r[0] for r in cur.fetchall())
    cur.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal"
                " AND tgname !~ '^mover_m[0-9]+_' ORDER BY 1", (oid,))
    triggers = tuple(r[0] for r in cur.fetchall())
    cur.execute("SELECT rulename FROM pg_rewrite WHERE ev_class = %s AND rulename <> '_RETURN' ORDER BY 1", (oid,))
    rules = tuple(r[0] for r in cur.fetchall())
    inheritance = None
    typed = reading.read_one(cur, "SELECT format_type(reloftype, NULL) FROM pg_class WHERE oid = %s AND reloftype <> 0",
                             (oid,), missing=reading.printed(0, name=lambda r: "the type of a typed table"))
    if typed:
        # CREATE TABLE ... OF type: the new table mover builds would be a plain one.
        inheritance = f"is a typed table (OF {typed[0]})"
    elif is_partition:
        inheritance = "is a partition of another table"
    else:
        cur.execute("SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = %s),"
                    " EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = %s)", (oid, oid))
        child, parent = one(cur)
        if child:
            inheritance = "inherits from another table"
        elif parent:
            inheritance = "has inheritance children"
    return Metadata(owner, grants, column_grants, tuple(reloptions), comment, bool(rls), policies, triggers, rules,
                    inheritance)


def sequence_limits(cur: psycopg.Cursor, seq: QualifiedName) -> tuple[str, int]:
    """(data type, max value) of a sequence."""
    row = reading.read_one(cur, "SELECT format_type(s.seqtypid, NULL), s.seqmax FROM pg_sequence s"
                                " JOIN pg_class c ON c.oid = s.seqrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
                                " WHERE n.nspname = %s AND c.relname = %s", (seq.schema, seq.name),
                           missing=reading.printed(0, name=lambda r: f"the type of sequence {seq}"))
    if row is None:
        raise NotFound(f"sequence {seq} does not exist", hint="check the sequence's name")
    return row[0], row[1]


INTEGER_MAX = {"smallint": 32767, "integer": 2147483647, "bigint": 9223372036854775807}


# The relations that hold the rows of %(t)s (regclass text): a partitioned table's (or index's)
# leaves, else the relation itself (pg_partition_tree() returns nothing for one that takes no part
# in partitioning).
LEAVES = sql.SQL("SELECT relid FROM pg_partition_tree(to_regclass(%(t)s)) WHERE isleaf"
                 " UNION ALL SELECT to_regclass(%(t)s) WHERE NOT EXISTS"
                 " (SELECT 1 FROM pg_partition_tree(to_regclass(%(t)s)))")


def estimate_rows(cur: psycopg.Cursor, table: QualifiedName) -> int:
    """The planner's row count (pg_class.reltuples; a partitioned table's, its partitions'): for
    progress and ETAs, never for decisions."""
    cur.execute(sql.SQL("SELECT sum(greatest(c.reltuples, 0))::bigint FROM ({leaves}) t JOIN pg_class c"
                        " ON c.oid = t.relid").format(leaves=LEAVES), {"t": str(table)})
    row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0
