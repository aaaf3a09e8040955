"""Which type changes can lose information, and why; and the column mapping between two tables
that follows from it. Pure functions over catalog descriptions.

A plan converts each value as ALTER TABLE ... TYPE would: with the assignment cast, which
either errors (a value that does not fit: a longer string, an out-of-range number) or silently
rounds or drops part of the value (numeric scale, float8 -> float4, timestamptz -> date). Both
kinds are named at `plan check` and must be acknowledged in the plan ([target] accept_lossy);
reconcile compares such a column in the source's type (the target's value cast back, which
is exact for these narrowings), so a value the conversion changed is reported as different.
"""

from __future__ import annotations

from dataclasses import replace

from mover.catalog.introspect import Column, TableInfo
from mover.sql.mapping import MappedColumn, Mapping

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


def mapping(src: TableInfo, dst: TableInfo, key: tuple[str, ...]) -> Mapping:
    """How `src`'s rows map onto `dst` (mover/sql/mapping.py): the copied columns, each cast to the
    destination's type where it differs, and compared back in the source's type where that
    conversion can lose information (lossy_reason)."""
    cols = []
    for d in dst.copy_columns:
        s = src.column(d.name)
        cols.append(MappedColumn(d.name, None if s.type == d.type else d.type,
                                 s.type if s.type != d.type and lossy_reason(s, d) else None))
    return Mapping(
        src=src.name, dst=dst.name, key=key,
        src_key_types=tuple(src.column(k).type for k in key),
        columns=tuple(cols),
        overriding=any(c.identity == "a" for c in dst.columns),
        key_collations=tuple(src.column(k).collation for k in key),
    )
