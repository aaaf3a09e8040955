"""The arithmetic that cuts a one-column integer key's range bounds (mover/state/ranges.py)."""

from __future__ import annotations

import pytest

from mover.names import QualifiedName
from mover.sql.mapping import Mapping
from mover.state import ranges


@pytest.mark.parametrize(("last", "want"), [
    ((100, 300, 200), 1200),       # one key in each value: span = rows
    ((100, 400, 100), 1600),       # one in three: three times the span
    ((100, 500, 100), 1800),       # one in four: still arithmetic, the range holds at most 4x
    ((100, 501, 100), None),       # sparser than one in four: the probe cuts
    ((100, 300, 0), None),         # an empty range (a gap): the probe cuts
    ((100, 2100, 2000), None),     # held far more than the 200 asked now: irregular, probe
    ((100, 500, 400), 1200),       # twice what is asked now is still regular
    ((100, 100, 5), None),         # no span: cannot happen for done ranges, never divides by it
])
def test_arithmetic_bound(last, want):
    assert ranges.arithmetic_bound(1000, 200, *last) == want


def test_the_span_is_never_zero():
    assert ranges.arithmetic_bound(10, 1, 0, 1, 2) == 11  # rows * width // last_rows is 0 here
    assert ranges.arithmetic_bound(-50, 5, -100, -90, 10) == -45  # negative keys too


def _mapping(key, types):
    t = QualifiedName("public", "t")
    return Mapping(src=t, dst=t, key=key, src_key_types=types, columns=(), overriding=False)


def test_only_one_column_integer_keys_are_cut_by_arithmetic():
    assert ranges.integer_key(_mapping(("id",), ("bigint",))) == 2**63 - 1
    assert ranges.integer_key(_mapping(("id",), ("integer",))) == 2**31 - 1
    assert ranges.integer_key(_mapping(("id",), ("smallint",))) == 2**15 - 1
    for key, types in [(("id",), ("numeric",)), (("id",), ("text",)), (("id",), ("uuid",)),
                       (("a", "b"), ("bigint", "bigint"))]:
        assert ranges.integer_key(_mapping(key, types)) is None
