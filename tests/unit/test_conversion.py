"""Which type changes plan check names as lossy (mover/catalog/conversion.py), by catalog oid and typmod."""

from __future__ import annotations

import pytest

from mover.catalog import conversion as cv
from mover.catalog.introspect import Column, TableInfo
from mover.names import QualifiedName
from mover.sql.mapping import ASSIGN, CAST, NONE


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


# ---------------------------------------------------------------------------------------------
# The mapping: forward as ALTER TABLE converts; the rollback window's way back checked


def table(name: str, **types: tuple[str, int] | tuple[str, int, int]) -> TableInfo:
    cols = [Column("id", "integer", cv.INT4, True, "", ""),
            *(Column(n, t[0], t[1], False, "", "", None, t[2] if len(t) > 2 else -1) for n, t in types.items())]
    return TableInfo(oid=1, name=QualifiedName("public", name), relkind="r", columns=tuple(cols), key=("id",),
                     key_index="k")


def converts(assignment: bool, explicit: bool = True, back: bool = True, equality: bool = True,
             collatable: bool = False) -> cv.Converts:
    return cv.Converts(assignment, explicit, back, equality, collatable)


OLD = table("t_old", code=("integer", cv.INT4), price=("numeric", cv.NUMERIC), big=("bigint", cv.INT8),
            label=("character varying(10)", cv.VARCHAR, 14))
NEW = table("t", code=("text", cv.TEXT), price=("double precision", cv.FLOAT8), big=("bigint", cv.INT8),
            label=("text", cv.TEXT))


def test_the_forward_mapping_converts_on_assignment_and_checks_nothing_on_the_way():
    m = cv.mapping(OLD, NEW, ("id",))
    by = {c.name: c for c in m.columns}
    assert cv.changed(OLD, NEW) == {"code": ("integer", "text"), "price": ("numeric", "double precision"),
                                    "label": ("character varying(10)", "text")}
    assert all(c.convert == ASSIGN and c.checked is None for c in m.columns)
    assert by["price"].back_to == "numeric"  # lossy forward: reconcile compares in the source's type
    assert by["code"].back_to is None and by["big"].cast_to is None


def test_the_way_back_uses_cast_only_without_an_assignment_cast_and_checks_what_can_change():
    back = cv.Probed({"code": converts(False, collatable=True), "price": converts(True),
                      "label": converts(True, collatable=True)})
    by = {c.name: c for c in cv.mapping(NEW, OLD, ("id",), reverse=back).columns}
    # text -> integer: no assignment cast, so CAST, and the value checked to come back as written
    assert (by["code"].convert, by["code"].checked, by["code"].back_to) == (CAST, "collated", "text")
    # float8 -> numeric can round, text -> varchar(10) can refuse or cut trailing spaces: checked
    assert (by["price"].convert, by["price"].checked) == (ASSIGN, "value")
    assert (by["label"].convert, by["label"].checked) == (ASSIGN, "collated")
    assert by["big"].cast_to is None and by["big"].checked is None


def test_the_way_back_refuses_every_value_where_nothing_converts_or_nothing_compares():
    none = cv.Probed({"code": converts(False, explicit=False), "price": converts(True, back=False),
                      "label": converts(True, equality=False, collatable=True)})
    by = {c.name: c for c in cv.mapping(NEW, OLD, ("id",), reverse=none).columns}
    assert (by["code"].convert, by["code"].checked) == (NONE, None)
    # a lossy conversion whose result cannot be converted back to be compared: nothing goes back unchecked
    assert (by["price"].convert, by["price"].checked) == (NONE, None)
    assert by["label"].checked == "text"  # a type without `=`: compared by text form


def test_plan_check_says_what_the_windows_mapping_does_on_the_way_back():
    """conversion.way_back reads the mapping the replay writes with: a column through CAST, a checked
    narrowing, one that takes only NULL; a column converted on assignment unchecked is not named."""
    back = cv.Probed({"code": converts(False, collatable=True), "price": converts(True),
                      "label": converts(True, collatable=True)})
    said = cv.way_back(cv.mapping(NEW, OLD, ("id",), reverse=back), NEW, OLD)
    assert said == {
        "code": "text -> integer: no assignment cast; converted with CAST, only the values that convert to integer "
                "go back",
        "price": "double precision -> numeric: rounded to the float's decimal digits (and to the numeric's scale)",
        "label": "text -> character varying(10): length narrowing: values longer than 10 characters do not fit"}
    none = cv.Probed({"code": converts(False, explicit=False), "price": converts(True),
                      "label": converts(True, collatable=True)})
    said = cv.way_back(cv.mapping(NEW, OLD, ("id",), reverse=none), NEW, OLD)
    assert said["code"] == "text -> integer: no conversion whose result can be checked; only NULL goes back"
    widened = table("t", code=("bigint", cv.INT8), price=("numeric", cv.NUMERIC), big=("bigint", cv.INT8),
                    label=("character varying(10)", cv.VARCHAR, 14))
    exact = cv.Probed({"code": converts(True)})
    assert cv.way_back(cv.mapping(OLD, widened, ("id",), reverse=exact), OLD, widened) == {}  # int -> bigint
