"""Which type changes can lose information, and why; how the server converts each changed column
(probed); and the column mapping between two tables that follows from both.

A plan converts each value as ALTER TABLE ... TYPE would: with the assignment cast, which
either errors (a value that does not fit: a longer string, an out-of-range number) or silently
rounds or drops part of the value (numeric scale, float8 -> float4, timestamptz -> date). Both
kinds are named at `plan check` and must be acknowledged in the plan ([target] accept_lossy);
reconcile compares such a column in the source's type (the target's value cast back, which
is exact for these narrowings), so a value the conversion changed is reported as different.
A type change with no assignment conversion is refused at plan check (as ALTER TABLE refuses it
without USING): `probe` asks the server, with the copy's own form of statement.

The rollback window converts the other way (new table -> old table), where the plan acknowledged
nothing, and a value the application wrote after the cutover may not go back: an integer column
turned text holds 'abc'. There every value must arrive unchanged or not at all (invariant 9: a row
the old table cannot hold exactly stays only in the new table, a reverse divergence that rollback
refuses to leave behind). So the reverse mapping (`mapping(..., reverse=probe(...))`) converts with
the assignment cast where one exists and with an explicit CAST only where none does (an explicit
cast may truncate where the assignment one raises), and, wherever the conversion can change a value
(lossy_reason) or goes through CAST, compares the value converted there and back with the one
written: a difference is a data error on that row (mover/sql/mapping.py source_values).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import psycopg
from psycopg import sql

from mover import names
from mover.catalog.introspect import Column, TableInfo
from mover.db import is_retryable
from mover.sql import casts as q
from mover.sql.mapping import ASSIGN, CAST, NONE, MappedColumn, Mapping

INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC = 21, 23, 20, 700, 701, 1700
TEXT, VARCHAR, BPCHAR, NAME, CHAR = 25, 1043, 1042, 19, 18
DATE, TIMESTAMP, TIMESTAMPTZ, TIME, TIMETZ, INTERVAL = 1082, 1114, 1184, 1083, 1266, 1186
BIT, VARBIT = 1560, 1562

STRINGS = {TEXT, VARCHAR, BPCHAR, NAME, CHAR}
INTEGER_BYTES = {INT2: 2, INT4: 4, INT8: 8}
INTEGER_DIGITS = {INT2: 5, INT4: 10, INT8: 19}
# Integers a float holds exactly: float4 has a 24-bit mantissa, float8 53 bits.
FLOAT_EXACT_INTEGERS = {FLOAT4: {INT2}, FLOAT8: {INT2, INT4}}
DATETIMES = {TIMESTAMP, TIMESTAMPTZ, TIME, TIMETZ}
DATE_PARTS = {  # (from, to) -> what is lost
    (TIMESTAMPTZ, DATE): "drops the time of day (and the session's TimeZone decides the day)",
    (TIMESTAMPTZ, TIMESTAMP): "drops the time zone (the session's TimeZone decides the local time)",
    (TIMESTAMPTZ, TIME): "drops the date",
    (TIMESTAMPTZ, TIMETZ): "drops the date",
    (TIMESTAMP, DATE): "drops the time of day",
    (TIMESTAMP, TIME): "drops the date",
    (TIMESTAMP, TIMESTAMPTZ): "reads the local time in the session's TimeZone (ambiguous at DST changes)",
    (TIMETZ, TIME): "drops the time zone",
}


def _length(c: Column) -> int | None:
    """The most characters a string column holds; None: unbounded."""
    if c.type_oid in (VARCHAR, BPCHAR):
        return c.typmod - 4 if c.typmod >= 0 else (None if c.type_oid == VARCHAR else 1)
    if c.type_oid == CHAR:
        return 1
    if c.type_oid == NAME:
        return 63
    return None


def _numeric(c: Column) -> tuple[int, int] | None:
    """(precision, scale) of a constrained numeric; None: unconstrained."""
    if c.typmod < 4:
        return None
    mod = c.typmod - 4
    return (mod >> 16) & 0xFFFF, ((mod & 0x7FF) ^ 1024) - 1024


def _precision(c: Column) -> int:
    """Fractional-second digits of a date/time type (-1 means the default, 6)."""
    return 6 if c.typmod < 0 else c.typmod


def _base(c: Column) -> Column:
    return replace(c, type_oid=c.base_type_oid, typmod=c.base_typmod) if c.base_type_oid else c


def lossy_reason(src: Column, dst: Column) -> str | None:
    """Why converting `src` to `dst` can change or refuse a value; None when every value converts
    exactly (or the types are not ones this function knows to narrow). A domain is judged by its
    base type (one level: a domain over a domain counts as its own type)."""
    src, dst = _base(src), _base(dst)
    s, d = src.type_oid, dst.type_oid
    if s == d and src.typmod == dst.typmod:
        return None
    if d in STRINGS:
        limit = _length(dst)
        if limit is None:
            return None
        have = _length(src) if s in STRINGS else None
        if have is not None and have <= limit:
            return None
        return f"length narrowing: values longer than {limit} characters do not fit"
    if s in STRINGS:
        return "converts text to another type: the value is parsed, and its text form may change"
    if s in INTEGER_BYTES:
        if d in INTEGER_BYTES and INTEGER_BYTES[d] < INTEGER_BYTES[s]:
            return "integer narrowing: values out of the new type's range do not fit"
        if d == NUMERIC and (n := _numeric(dst)) and n[0] - n[1] < INTEGER_DIGITS[s]:
            return f"precision narrowing: values of more than {n[0] - n[1]} digits do not fit"
        if d in FLOAT_EXACT_INTEGERS and s not in FLOAT_EXACT_INTEGERS[d]:
            return "large integers are rounded to the float's precision"
        return None
    if s in (FLOAT4, FLOAT8):
        if d == FLOAT8 and s == FLOAT4:
            return None
        if d == FLOAT4:
            return "rounded to single precision (float4)"
        if d in INTEGER_BYTES:
            return "rounded to an integer"
        if d == NUMERIC:
            return "rounded to the float's decimal digits (and to the numeric's scale)"
        return None
    if s == NUMERIC:
        if d in INTEGER_BYTES:
            return "rounded to an integer"
        if d in (FLOAT4, FLOAT8):
            return "rounded to the float's precision"
        if d == NUMERIC:
            src_ps, dst_ps = _numeric(src), _numeric(dst)
            if dst_ps is None:
                return None
            if src_ps is None:
                return f"numeric to numeric({dst_ps[0]},{dst_ps[1]}): rounded to {dst_ps[1]} decimal places, and " \
                       f"values of more than {dst_ps[0] - dst_ps[1]} integer digits do not fit"
            if dst_ps[1] < src_ps[1]:
                return f"scale narrowing from {src_ps[1]} to {dst_ps[1]}: values are rounded"
            if dst_ps[0] - dst_ps[1] < src_ps[0] - src_ps[1]:
                return f"precision narrowing: values of more than {dst_ps[0] - dst_ps[1]} integer digits do not fit"
        return None
    if (s, d) in DATE_PARTS:
        return DATE_PARTS[(s, d)]
    if s in DATETIMES and d in DATETIMES and _precision(dst) < _precision(src):
        return f"fractional seconds rounded to {_precision(dst)} digits"
    if s == INTERVAL and d == INTERVAL and dst.typmod >= 0:
        return "interval fields or precision restricted: values are truncated or rounded"
    if s in (BIT, VARBIT) and d in (BIT, VARBIT) and dst.typmod >= 0:
        # bit(n) takes exactly n bits, varbit(n) at most n
        if d == BIT and (s == VARBIT or dst.typmod != src.typmod):
            return f"bit string length changes: values of other than {dst.typmod} bits do not fit"
        if d == VARBIT and (src.typmod < 0 or dst.typmod < src.typmod):
            return f"length narrowing: bit strings longer than {dst.typmod} bits do not fit"
    return None


@dataclass(frozen=True)
class Converts:
    """How the server converts a value of one type (a) to another (b), as probe found it."""

    assignment: bool  # an INSERT converts it: ALTER TABLE ... TYPE's conversion without USING
    explicit: bool  # a CAST converts it (wherever an INSERT does, and maybe where it does not)
    back: bool  # a CAST converts b back to a: a value's round trip can be compared
    equality: bool  # a has the `=` IS DISTINCT FROM finds (json, xml, point have none)
    collatable: bool  # a has a collation


@dataclass(frozen=True)
class Probed:
    columns: dict[str, Converts] = field(default_factory=dict)
    keys: str | None = None  # the server's words where the key columns' two types do not compare


def probe(cur: psycopg.Cursor, pairs: dict[str, tuple[str, str]], key: Sequence[str] = ()) -> Probed:
    """How each column's values convert from its first type to its second (catalog or plan type
    text), and whether the types of the columns in `key` compare with each other: asked of the
    server, in a savepoint rolled back (mover/sql/casts.py), in the caller's transaction."""
    if not pairs:
        return Probed()
    table = names.cast_probe(secrets.token_hex(6))
    cur.execute("SAVEPOINT mover_cast_probe")
    try:
        cur.execute(q.probe_table(table, [t for pair in pairs.values() for t in pair]))
        cur.execute(q.collatable(), (str(table),))
        collated = {r[0] for r in cur.fetchall()}
        found = {}
        for n, (name, (a, b)) in enumerate(pairs.items()):
            i, j = 2 * n, 2 * n + 1
            assignment = _plans(cur, q.assignment(table, i, j)) is None
            found[name] = Converts(
                assignment=assignment, explicit=assignment or _plans(cur, q.explicit(table, i, b)) is None,
                back=_plans(cur, q.explicit(table, j, a)) is None, equality=_plans(cur, q.equality(table, i)) is None,
                collatable=f"c_{i}" in collated)
        index = {name: 2 * n for n, name in enumerate(pairs)}
        compared = [(index[k], index[k] + 1) for k in key if k in index]
        return Probed(found, _plans(cur, q.comparable(table, compared)) if compared else None)
    finally:
        if not cur.connection.broken:
            cur.execute("ROLLBACK TO SAVEPOINT mover_cast_probe")
            cur.execute("RELEASE SAVEPOINT mover_cast_probe")


def _plans(cur: psycopg.Cursor, statement: sql.Composed) -> str | None:
    """None when the server plans `statement`; else its error, first line. A lock timeout or a lost
    connection says nothing about the types: raised."""
    cur.execute("SAVEPOINT mover_cast_try")
    try:
        cur.execute(statement)
    except psycopg.Error as exc:
        if is_retryable(exc) or isinstance(exc, psycopg.OperationalError):
            raise
        cur.execute("ROLLBACK TO SAVEPOINT mover_cast_try")
        return (exc.diag.message_primary or str(exc)).splitlines()[0]
    cur.execute("RELEASE SAVEPOINT mover_cast_try")
    return None


def changed(src: TableInfo, dst: TableInfo) -> dict[str, tuple[str, str]]:
    """The copied columns whose type differs between `src` and `dst`: name -> (src type, dst type)."""
    return {d.name: (src.column(d.name).type, d.type) for d in dst.copy_columns if src.column(d.name).type != d.type}


def mapping(src: TableInfo, dst: TableInfo, key: tuple[str, ...], *, reverse: Probed | None = None) -> Mapping:
    """How `src`'s rows map onto `dst` (mover/sql/mapping.py): the copied columns, each cast to the
    destination's type where it differs, and compared back in the source's type where that
    conversion can lose information (lossy_reason).

    `reverse`: the rollback window's direction (new -> old), with how the server converts each
    changed column (probe(changed(src, dst))): converted with the assignment cast, else with CAST,
    else not at all (every value but NULL refused); and checked to arrive unchanged wherever the
    conversion can change a value (lossy, or through CAST) and the value can be converted back to
    be compared. Without it (forward), the copy converts as ALTER TABLE does and nothing is checked
    on the way: a lossy change there is the plan's, acknowledged, and reconcile reports what it
    changed."""
    cols = []
    for d in dst.copy_columns:
        s = src.column(d.name)
        if s.type == d.type:
            cols.append(MappedColumn(d.name, None))
            continue
        lossy = lossy_reason(s, d) is not None
        if reverse is None:
            cols.append(MappedColumn(d.name, d.type, s.type if lossy else None))
            continue
        how = reverse.columns[d.name]
        convert = ASSIGN if how.assignment else CAST if how.explicit else NONE
        if convert != NONE and (lossy or convert == CAST) and not how.back:
            convert = NONE  # no way to compare the value that would arrive: none goes back unchecked
        checked = None
        if convert != NONE and (lossy or convert == CAST):
            checked = "text" if not how.equality else "collated" if how.collatable else "value"
        cols.append(MappedColumn(d.name, d.type, s.type if lossy or checked else None, convert, checked))
    return Mapping(
        src=src.name, dst=dst.name, key=key,
        src_key_types=tuple(src.column(k).type for k in key),
        columns=tuple(cols),
        overriding=any(c.identity == "a" for c in dst.columns),
        key_collations=tuple(src.column(k).collation for k in key),
        src_only=src.relkind == "r", dst_only=dst.relkind == "r",
    )


def way_back(m: Mapping, new: TableInfo, old: TableInfo) -> dict[str, str]:
    """In words, for plan check: each changed column of the rollback window's mapping `m` (built by
    `mapping(new, old, key, reverse=...)`, as the replay builds it) whose values may not all go back
    to the old table as written, and why. The same mapping the replay writes with: plan check says
    what the window will do, not a guess at it."""
    out = {}
    for c in m.columns:
        if c.cast_to is None or (c.convert == ASSIGN and c.checked is None):
            continue
        a, b = new.column(c.name).type, old.column(c.name).type
        if c.convert == NONE:
            out[c.name] = f"{a} -> {b}: no conversion whose result can be checked; only NULL goes back"
        elif c.convert == CAST:
            out[c.name] = f"{a} -> {b}: no assignment cast; converted with CAST, only the values that convert to {b} " \
                          f"go back"
        else:
            out[c.name] = f"{a} -> {b}: {lossy_reason(new.column(c.name), old.column(c.name))}"
    return out
