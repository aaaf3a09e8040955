"""Which type changes plan check names as lossy (mover/catalog/conversion.py), by catalog oid and typmod."""

from __future__ import annotations

import pytest

from mover.catalog import conversion as cv
from mover.catalog.introspect import Column


def col(oid: int, typmod: int = -1) -> Column:
    return Column("c", "t", oid, False, "", "", None, typmod)


def varchar(n: int) -> Column:
    return col(cv.VARCHAR, n + 4)


def numeric(p: int, s: int) -> Column:
    return col(cv.NUMERIC, ((p << 16) | (s & 0x7FF)) + 4)


LOSSY = [
    (varchar(20), varchar(5), "length narrowing"),
    (col(cv.TEXT), varchar(200), "length narrowing"),
    (col(cv.TEXT), col(cv.BPCHAR, 14), "length narrowing"),
    (col(cv.INT4), varchar(5), "length narrowing"),
    (numeric(12, 4), numeric(12, 2), "scale narrowing from 4 to 2"),
    (numeric(12, 2), numeric(10, 2), "precision narrowing"),
    (col(cv.NUMERIC), numeric(12, 2), "rounded to 2 decimal places"),
    (col(cv.FLOAT8), col(cv.FLOAT4), "single precision"),
    (col(cv.FLOAT8), col(cv.INT8), "rounded to an integer"),
    (col(cv.NUMERIC), col(cv.INT4), "rounded to an integer"),
    (col(cv.TIMESTAMPTZ), col(cv.DATE), "drops the time of day"),
    (col(cv.TIMESTAMPTZ), col(cv.TIMESTAMP), "drops the time zone"),
    (col(cv.TIMESTAMP, 6), col(cv.TIMESTAMP, 0), "rounded to 0 digits"),
    (col(cv.TEXT), col(cv.INT4), "converts text"),
    (col(cv.INT8), col(cv.INT4), "integer narrowing"),
    (col(cv.INT4), col(cv.INT2), "integer narrowing"),
    (col(cv.INT8), col(cv.FLOAT8), "rounded to the float's precision"),
    (col(cv.INT4), numeric(5, 0), "precision narrowing"),
]

EXACT = [
    (varchar(5), varchar(20)),
    (varchar(5), col(cv.TEXT)),
    (col(cv.TEXT), col(cv.VARCHAR)),
    (numeric(12, 2), numeric(14, 4)),
    (numeric(12, 2), col(cv.NUMERIC)),
    (col(cv.INT4), col(cv.INT8)),
    (col(cv.INT2), col(cv.INT4)),
    (col(cv.INT4), col(cv.FLOAT8)),
    (col(cv.INT4), col(cv.NUMERIC)),
    (col(cv.FLOAT4), col(cv.FLOAT8)),
    (col(cv.TIMESTAMP, 3), col(cv.TIMESTAMP)),
    (col(cv.DATE), col(cv.TIMESTAMPTZ)),
    (col(cv.INT4), col(cv.TEXT)),
    (col(114), col(3802)),  # json -> jsonb: normalized, compared as jsonb
]


@pytest.mark.parametrize("src, dst, words", LOSSY)
def test_lossy(src, dst, words):
    reason = cv.lossy_reason(src, dst)
    assert reason is not None and words in reason


@pytest.mark.parametrize("src, dst", EXACT)
def test_exact(src, dst):
    assert cv.lossy_reason(src, dst) is None


def test_a_domain_is_judged_by_its_base_type():
    over_varchar20 = Column("c", "code", 99999, False, "", "", None, -1, cv.VARCHAR, 24)
    assert "length narrowing" in cv.lossy_reason(over_varchar20, varchar(5))
    assert cv.lossy_reason(over_varchar20, varchar(30)) is None
    over_int = Column("c", "account_no", 99998, False, "", "", None, -1, cv.INT4, -1)
    assert cv.lossy_reason(col(cv.INT4), over_int) is None
    assert "integer narrowing" in cv.lossy_reason(col(cv.INT8), over_int)
