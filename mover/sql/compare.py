"""SQL of reconcile: compare one key range of both tables in one statement (one snapshot).

Definition of equal: a source row, transformed as the plan says (each value cast to the new
table's column type), equals its target row when every compared column IS NOT DISTINCT FROM
its counterpart. So numbers compare by value (1.0 = 1.00, -0 = 0, NaN = NaN), timestamps
by instant whatever the session's time zone, NULLs match, and an int key widened to bigint
compares by value. Types without a hash function (json, xml, the geometric types, or a
composite or array holding one) compare by their text form: json keeps its input text
verbatim, so two json values are equal when their text is.

How the statement compares, and why (measured by bench/reconcile.py in one run, figures in
bench/README.md): hashing is the cost, not reading. A join comparing the typed values
themselves takes about half the time of one hashing them, and it is exact, with no
probability of a missed difference at all. So rows are compared by value in a merge join of
the two key-ordered ranges, and the only hash computed is the one each range's stored
fingerprint needs: the source side's, once per row. The target side's fingerprint follows from
it without hashing the target: every row the join found equal hashes the same on both sides
(hash functions agree with their type's equality), so the target's sum is the source's minus
the source hashes of the rows that differ plus the target hashes of those rows, which the
statement returns anyway. Exactness costs nothing against the hash join, and the per-range
fingerprints come with it; without them ([reconcile] fingerprints off, the default) the
statement hashes nothing at all, and takes about 0.7 of one hash pass over both tables.

The statement runs with JIT off (mover/engines/bulk/reconcile.py): at the default range size its cost is
under jit_above_cost anyway, and on bigger ranges the compilation did not pay for itself.
Comparing each row by its binary image first (record_image_eq) before the typed comparisons
was measured too, and was slower on a narrow row (bench/README.md, the reconcile profile).

Per-range bisection loses twice: it hashes both sides of every range, and a range that
differs is then read again. It would only win when the two tables are in different
databases, where a join is impossible; then the stored fingerprints are what to compare.

The fingerprint of a range is (row count, sum mod 2^64 of hash_record_extended(ROW(the
row's columns as the target types them), SEED)). PostgreSQL's 64-bit hash of bigint,
timestamp, timestamptz, time and money folds the value to 32 bits before hashing; those
columns are hashed through their binary send form instead (8 bytes, equal exactly when the
values are), so a change in one of them moves the fingerprint with probability 1 - 2^-64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from mover.names import QualifiedName
from mover.sql import trusted
from mover.sql.mapping import Mapping, bound_row, collated, key_column_defs, key_equal, key_row, range_predicate

VALUE_CHARS = 200  # long values are truncated in divergence reports
SEED = 0x6D6F766572  # "mover": the seed of every row hash; changing it invalidates stored fingerprints
JSONB_PAIRS = 40  # jsonb_build_object takes at most 100 arguments

# Base types whose extended hash folds 64 bits into 32 (hashint8extended and its users), and
# the send function that gives their exact 8 bytes instead.
SEND_FUNCTIONS = {
    20: "int8send",  # bigint
    1114: "timestamp_send",
    1184: "timestamptz_send",
    1083: "time_send",
    790: "cash_send",  # money: no hash at all, and its text depends on lc_monetary
}

RECONCILE_KINDS = ("missing_in_target", "extra_in_target", "different")
# A row the backfill or the forward applier could not write (a value that does not convert):
# reconcile re-checks it with its range, and resolves it once the row is equal.
FORWARD_APPLY_ERROR = sql.SQL("(d.kind = 'apply_error' AND coalesce(d.columns ->> 'direction', 'forward') = 'forward')")


@dataclass(frozen=True)
class Compared:
    """One column as reconcile compares it."""

    name: str
    cast_to: str | None  # the source value is cast to this (the target's type) first
    mode: str  # "value": typed; "send": typed, hashed through send_fn; "text": by text form
    send_fn: str | None
    is_key: bool
    # The source's type, for a conversion that can lose information: compared (and hashed) in
    # it, the target's value cast back (exact: these narrowings widen back without loss), so a
    # value the conversion changed differs. cast_to is then unused. One cast per row either way.
    back_to: str | None = None


@dataclass(frozen=True)
class Spec:
    mapping: Mapping
    columns: tuple[Compared, ...]
    dst_key_types: tuple[str, ...]
    # Hash every source row for the range's stored fingerprint ([reconcile] fingerprints): the
    # hash is most of what a pass costs over the typed join, and no reconcile decision reads it.
    fingerprints: bool = True

    @property
    def non_key(self) -> tuple[Compared, ...]:
        return tuple(c for c in self.columns if not c.is_key)

    def column(self, name: str) -> Compared:
        return next(c for c in self.columns if c.name == name)


def hash_probe(type_text: str) -> sql.Composed:
    """Fails when PostgreSQL cannot hash the type (no extended hash function for it, or for a
    field or element of it). The lookup happens before the NULL check, so NULL is enough."""
    return sql.SQL("SELECT hash_record_extended(ROW(CAST(NULL AS {})), 0)").format(trusted(type_text, "format_type"))


# ---------------------------------------------------------------------------------------------
# Expressions


def _source(c: Compared, alias: str) -> sql.Composable:
    col = sql.Identifier(alias, c.name)
    if c.cast_to and not c.back_to:
        return sql.SQL("CAST({} AS {})").format(col, trusted(c.cast_to, "format_type"))
    return col


def _target(c: Compared, alias: str) -> sql.Composable:
    col = sql.Identifier(alias, c.name)
    return sql.SQL("CAST({} AS {})").format(col, trusted(c.back_to, "format_type")) if c.back_to else col


def value(c: Compared, alias: str, side: str) -> sql.Composable:
    return _source(c, alias) if side == "src" else _target(c, alias)


def compared(c: Compared, alias: str, side: str) -> sql.Composable:
    """What IS DISTINCT FROM compares: the typed value, or its text form."""
    v = value(c, alias, side)
    return sql.SQL("({})::text").format(v) if c.mode == "text" else v


def _hash_input(c: Compared, alias: str, side: str) -> sql.Composable:
    v = value(c, alias, side)
    if c.mode == "text":
        return sql.SQL("({})::text").format(v)
    if c.mode == "send":
        assert c.send_fn is not None  # set whenever the mode is "send"
        return sql.SQL("{}({})").format(sql.Identifier("pg_catalog", c.send_fn), v)
    return v


def row_hash(spec: Spec, alias: str, side: str) -> sql.Composed:
    """64-bit hash of one row's columns as the target types them."""
    return sql.SQL("hash_record_extended(ROW({}), {})").format(
        sql.SQL(", ").join(_hash_input(c, alias, side) for c in spec.columns), sql.Literal(SEED))


def differs(spec: Spec, s: str = "s", t: str = "t") -> sql.Composed:
    k0 = spec.mapping.key[0]
    parts = [sql.SQL("{} IS NULL").format(sql.Identifier(s, k0)), sql.SQL("{} IS NULL").format(sql.Identifier(t, k0))]
    parts += [sql.SQL("{} IS DISTINCT FROM {}").format(compared(c, s, "src"), compared(c, t, "dst"))
              for c in spec.non_key]
    return sql.SQL("({})").format(sql.SQL(" OR ").join(parts))


def _key_text(spec: Spec, s: str = "s", t: str = "t") -> sql.Composed:
    """The key as text, in the target's type: the form divergences and re-checks use."""
    return sql.SQL("jsonb_build_array({})").format(sql.SQL(", ").join(
        sql.SQL("(coalesce({}, {}))::text").format(_source(spec.column(k), s), sql.Identifier(t, k))
        for k in spec.mapping.key))


def _shown(expr: sql.Composable) -> sql.Composed:
    text = sql.SQL("({})::text").format(expr)
    return sql.SQL("CASE WHEN length({t}) > {n} THEN left({t}, {n}) || '...' ELSE {t} END").format(
        t=text, n=sql.Literal(VALUE_CHARS))


def _column_detail(spec: Spec, s: str, t: str, columns: Sequence[Compared] | None = None) -> sql.Composable:
    """{"column": [source value, target value]} for each column that differs."""
    pairs = [
        sql.SQL("{name}, CASE WHEN {a} IS DISTINCT FROM {b} THEN jsonb_build_array({sv}, {tv}) END").format(
            name=sql.Literal(c.name), a=compared(c, s, "src"), b=compared(c, t, "dst"),
            sv=_shown(value(c, s, "src")), tv=_shown(sql.Identifier(t, c.name)))
        for c in (spec.non_key if columns is None else columns)]
    if not pairs:
        return sql.SQL("'{}'::jsonb")
    objects = [sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(pairs[i:i + JSONB_PAIRS]))
               for i in range(0, len(pairs), JSONB_PAIRS)]
    return sql.SQL("jsonb_strip_nulls({})").format(sql.SQL(" || ").join(objects))


# ---------------------------------------------------------------------------------------------
# Wide tables
#
# A join whose output needs every column of both sides forms tuples of 2 x the table's width,
# and PostgreSQL forms no tuple of more than 1664 columns (MaxTupleAttributeNumber): a table
# wider than about 830 columns could not be compared by the statements above, while the server
# accepts tables of up to 1600. Such a table is compared with each side narrowed first, in a
# subquery the planner keeps (OFFSET 0), to its key, one composite of its compared values and
# its row hash; the join then carries a handful of columns. Two composites are equal when each
# field is by its type's own equality (record_eq), NULL equal to NULL: the same definition of
# equal as the column-by-column IS DISTINCT FROM (each pair has one type: the source's side is
# cast to the target's type, or the target's back, or both are text). The differing columns of
# a row that differs are found in groups of WIDE_GROUP columns, each its own subquery joining
# the two rows again. Narrow tables keep the plain join (bench/README.md: it is the faster).

WIDE_COLUMNS = 700  # 2 x this, plus keys and aggregates, stays well under 1664
WIDE_GROUP = 400


def is_wide(spec: Spec) -> bool:
    return len(spec.columns) > WIDE_COLUMNS


def _narrowed(spec: Spec, side: str, where: sql.Composable) -> sql.Composed:
    """One side as (key..., v: composite of the compared non-key values, h: row hash), aliased
    s or t like the table it reads."""
    m = spec.mapping
    alias = "s" if side == "src" else "t"
    return sql.SQL("(SELECT {keys}, ROW({vals}) AS v, {h} AS h FROM {tbl} {a} WHERE {where} OFFSET 0) {a}").format(
        keys=sql.SQL(", ").join(sql.Identifier(alias, k) for k in m.key),
        vals=sql.SQL(", ").join(compared(c, alias, side) for c in spec.non_key),
        h=row_hash(spec, alias, side), tbl=m.reads(side), a=sql.Identifier(alias),
        where=where)


def _differs_wide(spec: Spec) -> sql.Composed:
    k0 = spec.mapping.key[0]
    return sql.SQL("({s} IS NULL OR {t} IS NULL OR s.v IS DISTINCT FROM t.v)").format(
        s=sql.Identifier("s", k0), t=sql.Identifier("t", k0))


def _column_detail_wide(spec: Spec) -> sql.Composed:
    """_column_detail in groups: each a scalar subquery reading the row of each side again by
    the key of the narrowed rows s and t (the same snapshot: one statement)."""
    m = spec.mapping
    on = sql.SQL(" AND ").join(
        sql.SQL("{} = {} AND {} = {}").format(sql.Identifier("s2", k), sql.Identifier("s", k),
                                              sql.Identifier("t2", k), sql.Identifier("t", k)) for k in m.key)
    cols = spec.non_key
    groups = [sql.SQL("(SELECT {d} FROM {src} s2, {dst} t2 WHERE {on})").format(
        d=_column_detail(spec, "s2", "t2", cols[i:i + WIDE_GROUP]), src=m.reads("src"), dst=m.reads("dst"), on=on)
        for i in range(0, len(cols), WIDE_GROUP)]
    return sql.SQL("({})").format(sql.SQL(" || ").join(groups))


def _key_of(spec: Spec, i: int, element: str = "e") -> sql.Composable:
    return collated(sql.SQL("CAST({}.value ->> {} AS {})").format(sql.Identifier(element), sql.Literal(i),
                                                                 trusted(spec.dst_key_types[i], "format_type")),
                    _collation(spec.mapping, i))


def _collation(m: Mapping, i: int) -> tuple[str, str] | None:
    return m.key_collations[i] if m.key_collations else None


def _pending(spec: Spec, log: QualifiedName | None) -> sql.Composable:
    """Whether the change log holds a change to the key e.value (jsonb array of text)."""
    m = spec.mapping
    if log is None:
        return sql.SQL("false")
    # A hashed subplan: one pass over the log however many keys differ.
    # (The log may hold NULL keys: the capture trigger logs OLD's key on INSERT too. Without
    # the filter, IN would answer NULL rather than false for a key that is not pending.)
    template = (sql.SQL("(ROW({keys}) IN (SELECT {lkeys} FROM {log} l WHERE {notnull}))") if len(m.key) > 1
                else sql.SQL("({keys} IN (SELECT {lkeys} FROM {log} l WHERE {notnull}))"))
    return template.format(
        keys=sql.SQL(", ").join(_key_of(spec, i) for i in range(len(m.key))),
        lkeys=sql.SQL(", ").join(sql.Identifier("l", k) for k in m.key), log=log.ident,
        notnull=sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(sql.Identifier("l", k)) for k in m.key))


def detail(spec: Spec, keys: sql.Composable, log: QualifiedName | None, *, columns: bool = True) -> sql.Composed:
    """For each key in the jsonb array `keys` ([[k1, k2...], ...], text in the target's types)
    that differs now: key, kind, differing columns (NULL without `columns`: the statement then
    names no column twice, see "Wide tables"), whether the change log still holds a change to it,
    and the row hash of each side present."""
    m = spec.mapping
    k0 = m.key[0]
    lookup_s = sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(sql.Identifier("s", k), _key_of(spec, i)) for i, k in enumerate(m.key))
    lookup_t = sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(sql.Identifier("t", k), _key_of(spec, i)) for i, k in enumerate(m.key))
    pending = _pending(spec, log)
    q = sql.SQL(
        """
SELECT e.value AS key,
       CASE WHEN t.{k0} IS NULL THEN 'missing_in_target'
            WHEN s.{k0} IS NULL THEN 'extra_in_target'
            ELSE 'different' END AS kind,
       CASE WHEN s.{k0} IS NOT NULL AND t.{k0} IS NOT NULL THEN {columns} END AS columns,
       {pending} AS pending,
       CASE WHEN s.{k0} IS NOT NULL THEN {hash_s} END AS src_hash,
       CASE WHEN t.{k0} IS NOT NULL THEN {hash_t} END AS dst_hash
FROM jsonb_array_elements({keys}) AS e
LEFT JOIN {src} ON {on_s}
LEFT JOIN {dst} ON {on_t}
WHERE (s.{k0} IS NOT NULL OR t.{k0} IS NOT NULL) AND {differs}
""")
    if is_wide(spec):
        return q.format(k0=sql.Identifier(k0), columns=_column_detail_wide(spec) if columns else sql.SQL("NULL::jsonb"),
                        pending=pending,
                        hash_s=sql.SQL("s.h"), hash_t=sql.SQL("t.h"), keys=keys,
                        src=sql.SQL("LATERAL {}").format(_narrowed(spec, "src", lookup_s)),
                        dst=sql.SQL("LATERAL {}").format(_narrowed(spec, "dst", lookup_t)),
                        on_s=sql.SQL("true"), on_t=sql.SQL("true"), differs=_differs_wide(spec))
    return q.format(k0=sql.Identifier(k0), pending=pending,
                    columns=_column_detail(spec, "s", "t") if columns else sql.SQL("NULL::jsonb"),
                    hash_s=row_hash(spec, "s", "src"), hash_t=row_hash(spec, "t", "dst"), keys=keys,
                    src=sql.SQL("{} s").format(m.reads("src")), dst=sql.SQL("{} t").format(m.reads("dst")),
                    on_s=lookup_s, on_t=lookup_t, differs=differs(spec))


def _differing_wide(spec: Spec, log: QualifiedName | None) -> sql.Composed:
    """detail()'s rows for a wide table's range statement, from what its join aggregated for each
    differing key (j.keys: [key, source hash, target hash, missing in source, missing in target]):
    the columns are left NULL, the tables are not read again (reading them again, and naming
    each column in a second and a third place, tripled the statement). Which columns differ is
    asked of the keys alone, by detail(), in the range's transaction (mover/engines/bulk/reconcile.py)."""
    return sql.SQL(
        """
SELECT e.value AS key,
       CASE WHEN (e.row ->> 4)::boolean THEN 'missing_in_target'
            WHEN (e.row ->> 3)::boolean THEN 'extra_in_target'
            ELSE 'different' END AS kind,
       NULL::jsonb AS columns,
       {pending} AS pending,
       (e.row ->> 1)::bigint AS src_hash,
       (e.row ->> 2)::bigint AS dst_hash
FROM (SELECT x.value -> 0 AS value, x.value AS row FROM jsonb_array_elements(coalesce(j.keys, '[]'::jsonb)) x) e
""").format(pending=_pending(spec, log))


def range_params(spec: Spec, lo: list[str] | None, hi: list[str] | None) -> list[Any]:
    """compare_range()'s parameters: its statement depends only on which bounds are open."""
    return range_predicate("s", spec.mapping, lo, hi)[1] + range_predicate("t", spec.mapping, lo, hi)[1]


def compare_range(spec: Spec, log: QualifiedName | None, notes: QualifiedName, lo: list[str] | None,
                  hi: list[str] | None) -> tuple[sql.Composed, list[Any]]:
    """One statement, one snapshot: both ranges joined on the key, the count and hash sum of
    the source rows (NULL without spec.fingerprints, but on a wide table, whose narrowing hashes
    anyway), the count of the target rows, the highest applied-change note (what this
    verification covers), and one row per key that differs (see detail(); on a wide table
    without its columns, see _differing_wide()); a range without differences gives one row
    whose detail columns are NULL.

    Columns: src_rows, dst_rows, src_sum (numeric), mark, key, kind, columns, pending,
    src_hash, dst_hash."""
    m = spec.mapping
    s_where, s_params = range_predicate("s", m, lo, hi)
    t_where, t_params = range_predicate("t", m, lo, hi)
    k0 = sql.Identifier(m.key[0])
    mark = sql.SQL("(SELECT coalesce(max(a.seq), 0) FROM {} a)").format(notes.ident) if notes is not None \
        else sql.SQL("0::bigint")
    wide = is_wide(spec)
    q = sql.SQL(
        """
WITH j AS (
    SELECT count(s.{k0}) AS src_rows, count(t.{k0}) AS dst_rows,
           sum({hash_s}) FILTER (WHERE s.{k0} IS NOT NULL) AS src_sum,
           jsonb_agg({key_text}) FILTER (WHERE {differs}) AS keys
    FROM {src}
    FULL JOIN {dst} ON {on}
)
SELECT j.src_rows, j.dst_rows, j.src_sum, {mark} AS mark, d.*
FROM j LEFT JOIN LATERAL ({detail}) d ON true
"""
    ).format(k0=k0, hash_s=sql.SQL("s.h") if wide else row_hash(spec, "s", "src") if spec.fingerprints
             else sql.SQL("NULL::numeric"),
             key_text=sql.SQL("jsonb_build_array({}, s.h, t.h, s.{k0} IS NULL, t.{k0} IS NULL)").format(
                 _key_text(spec), k0=k0) if wide else _key_text(spec),
             differs=_differs_wide(spec) if wide else differs(spec),
             src=_narrowed(spec, "src", s_where) if wide
             else sql.SQL("(SELECT * FROM {} s WHERE {}) s").format(m.reads("src"), s_where),
             dst=_narrowed(spec, "dst", t_where) if wide
             else sql.SQL("(SELECT * FROM {} t WHERE {}) t").format(m.reads("dst"), t_where),
             on=key_equal("s", "t", m.key), mark=mark,
             detail=_differing_wide(spec, log) if wide else detail(spec, sql.SQL("coalesce(j.keys, '[]'::jsonb)"), log))
    return q, s_params + t_params


def recheck_keys(spec: Spec, log: QualifiedName | None, *, columns: bool = True) -> sql.Composed:
    """The keys given as one jsonb parameter, compared again; rows as detail() returns them."""
    return detail(spec, sql.SQL("CAST(%s AS jsonb)"), log, columns=columns)


def range_fingerprint(spec: Spec, side: str, lo: list[str] | None,
                      hi: list[str] | None) -> tuple[sql.Composed, list[Any]]:
    """Count and hash sum of one side's range, alone: what a copy of the target elsewhere (or the
    lower bound of the benchmark) computes to compare with the stored fingerprints."""
    m = spec.mapping
    alias = "s" if side == "src" else "t"
    where, params = range_predicate(alias, m, lo, hi)
    q = sql.SQL("SELECT count(*), coalesce(sum({h}), 0) FROM {tbl} {a} WHERE {where}").format(
        h=row_hash(spec, alias, side), tbl=m.reads(side), a=sql.Identifier(alias),
        where=where)
    return q, params


def fingerprint(src_sum: Any, diffs: list[dict[str, Any]]) -> tuple[int, int]:
    """(source fingerprint, target fingerprint) as signed 64-bit integers, from the source's hash
    sum and the differing rows' hashes (see the module docstring)."""
    src = int(src_sum or 0)
    dst = src - sum(int(d["src_hash"]) for d in diffs if d["src_hash"] is not None) \
        + sum(int(d["dst_hash"]) for d in diffs if d["dst_hash"] is not None)
    return signed64(src), signed64(dst)


def signed64(x: int) -> int:
    x %= 1 << 64
    return x - (1 << 64) if x >= 1 << 63 else x


# ---------------------------------------------------------------------------------------------
# Applied-change notes: which keys the applier replayed since their range was verified


def create_notes(notes: QualifiedName, notes_fn: QualifiedName, notes_trigger: str, log: QualifiedName,
                 key: tuple[str, ...],
                 key_types: tuple[str, ...], collations: tuple[tuple[str, str] | None, ...] = ()) -> list[sql.Composed]:
    """A table of keys the applier has replayed, kept by a statement-level trigger on the change
    log: every applier (batch, key by key, the cutover's last drain) deletes the log rows it
    applies in the transaction that applies them, so the note commits exactly with the change,
    and no applier code has to know. One row per key (an upsert moves its seq forward); reconcile
    deletes a range's notes up to the seq its verification saw."""
    cols = key_column_defs(key, key_types, collations)  # ranges of notes are cut in the key's collation
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    body = sql.SQL(
        """
BEGIN
    INSERT INTO {notes} ({keys}) SELECT DISTINCT {keys} FROM gone WHERE {notnull} ORDER BY {keys}
    ON CONFLICT ({keys}) DO UPDATE SET seq = EXCLUDED.seq;
    RETURN NULL;
END
"""
    ).format(notes=notes.ident, keys=keys,
             notnull=sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(sql.Identifier(k)) for k in key))
    return [
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({cols}, seq bigint GENERATED BY DEFAULT AS IDENTITY NOT NULL,"
                " PRIMARY KEY ({keys}))").format(notes.ident, cols=cols, keys=keys),
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (seq)").format(
            sql.Identifier(notes.name + "_seq"), notes.ident),
        sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql"
                " SET search_path = pg_catalog, pg_temp AS {}").format(notes_fn.ident,
                                                                       sql.Literal(body.as_string())),
        sql.SQL("CREATE OR REPLACE TRIGGER {} AFTER DELETE ON {} REFERENCING OLD TABLE AS gone"
                " FOR EACH STATEMENT EXECUTE FUNCTION {}()").format(sql.Identifier(notes_trigger), log.ident,
                                                                   notes_fn.ident),
    ]


def forget_notes(m: Mapping, notes: QualifiedName, lo: list[str] | None,
                 hi: list[str] | None) -> tuple[sql.Composed, list[Any]]:
    """Notes of a range up to the mark its verification saw (%s after the range's bounds)."""
    where, params = range_predicate("a", m, lo, hi)
    return sql.SQL("DELETE FROM {} a WHERE {} AND a.seq <= %s").format(notes.ident, where), params


def _in_range(alias: str, keys: Sequence[sql.Composable], types: tuple[str, ...], m: Mapping) -> sql.Composed:
    """`alias`-row keys inside the bounds of range row c (text arrays cast back to `types`, in
    the key's collation)."""
    row = sql.SQL("ROW({})").format(sql.SQL(", ").join(keys))

    def bound(col: str) -> sql.Composed:
        return sql.SQL("ROW({})").format(sql.SQL(", ").join(
            collated(sql.SQL("CAST(c.{}[{}] AS {})").format(sql.Identifier(col), sql.Literal(i + 1),
                                                             trusted(t, "format_type")), _collation(m, i))
            for i, t in enumerate(types)))
    return sql.SQL("(c.lo IS NULL OR {row} > {lo}) AND (c.hi IS NULL OR {row} <= {hi})").format(
        row=row, lo=bound("lo"), hi=bound("hi"))


def divergence_key(spec: Spec, alias: str = "d") -> list[sql.Composed]:
    return [sql.SQL("CAST({}.key[{}] AS {})").format(sql.Identifier(alias), sql.Literal(i + 1),
                                                     trusted(t, "format_type"))
            for i, t in enumerate(spec.dst_key_types)]


def changed_since_verified(spec: Spec, notes: QualifiedName) -> sql.Composed:
    """The condition on a done reconcile range `c` that it must be verified again: a change applied
    in it since its verification (a note), or an open divergence found by reconcile in it. One
    parameter: the migration id. mover/state/ranges.py reopen() puts those ranges back in the queue."""
    m = spec.mapping
    notes_in = sql.SQL("EXISTS (SELECT 1 FROM {} a WHERE {})").format(
        notes.ident, _in_range("a", [sql.Identifier("a", k) for k in m.key], m.src_key_types, m))
    open_in = sql.SQL(
        "EXISTS (SELECT 1 FROM mover.divergences d WHERE d.migration_id = %s AND d.resolved_at IS NULL"
        " AND (d.kind IN ('missing_in_target', 'extra_in_target', 'different') OR {forward_error}) AND {in_range})"
    ).format(forward_error=FORWARD_APPLY_ERROR, in_range=_in_range("d", divergence_key(spec), spec.dst_key_types, m))
    return sql.SQL("{} OR {}").format(notes_in, open_in)


def divergences_in_range(spec: Spec, lo: list[str] | None, hi: list[str] | None) -> tuple[sql.Composed, list[Any]]:
    """Reconcile's divergences (open or accepted) whose key lies in the range. Parameter first:
    the migration id."""
    keys = sql.SQL("({})").format(sql.SQL(", ").join(divergence_key(spec)))  # like bound_row(): a row from 2 keys
    parts: list[sql.Composable] = []
    params: list[Any] = []
    if lo is not None:
        parts.append(sql.SQL("{} > {}").format(keys, bound_row(spec.dst_key_types, None, spec.mapping.key_collations)))
        params += lo
    if hi is not None:
        parts.append(sql.SQL("{} <= {}").format(keys, bound_row(spec.dst_key_types, None, spec.mapping.key_collations)))
        params += hi
    q = sql.SQL(
        "SELECT d.id, d.key, d.kind, d.columns, d.resolved_at IS NULL, d.resolved_how FROM mover.divergences d"
        " WHERE d.migration_id = %s AND (d.kind IN ('missing_in_target', 'extra_in_target', 'different')"
        " OR {forward_error})"
        " AND (d.resolved_at IS NULL OR d.resolved_how = 'accepted') AND {} ORDER BY d.id").format(
        sql.SQL(" AND ").join(parts) if parts else sql.SQL("true"), forward_error=FORWARD_APPLY_ERROR)
    return q, params


__all__ = ["Compared", "Spec", "compare_range", "recheck_keys", "detail", "row_hash", "differs", "key_row"]
