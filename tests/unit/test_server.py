"""What each server version has (mover/catalog/server.py), decided in one place: the flags and the
catalog fragments per version, rendered without a server. tests/integration/test_server_catalog.py
checks the same flags against the running server on each version CI covers."""

from __future__ import annotations

import pytest

from mover.catalog.server import Server
from mover.catalog.shape import not_null_column
from mover.names import QualifiedName
from mover.sql import ddl


def text(q) -> str:
    return q.as_string(None)


# (server_version_num, what it has)
VERSIONS = {
    150018: dict(exclusion_on_partitioned=False,
                 maintain_privilege=False, identity_on_partitioned=False, catalogued_not_null=False,
                 virtual_generated=False, temporal_constraints=False, enforced_flag=False, unlogged_partitioned=True,
                 not_valid_foreign_key_on_partitioned=False),
    160002: dict(exclusion_on_partitioned=False,
                 maintain_privilege=False, identity_on_partitioned=False, catalogued_not_null=False,
                 virtual_generated=False, temporal_constraints=False, enforced_flag=False, unlogged_partitioned=True,
                 not_valid_foreign_key_on_partitioned=False),
    170010: dict(exclusion_on_partitioned=True,
                 maintain_privilege=True, identity_on_partitioned=True, catalogued_not_null=False,
                 virtual_generated=False, temporal_constraints=False, enforced_flag=False, unlogged_partitioned=True,
                 not_valid_foreign_key_on_partitioned=False),
    180006: dict(exclusion_on_partitioned=True,
                 maintain_privilege=True, identity_on_partitioned=True, catalogued_not_null=True,
                 virtual_generated=True, temporal_constraints=True, enforced_flag=True, unlogged_partitioned=False,
                 not_valid_foreign_key_on_partitioned=True),
}


@pytest.mark.parametrize("num", sorted(VERSIONS))
def test_flags_per_version(num):
    srv = Server(num)
    assert srv.major == num // 10000
    assert srv.hash_record_extended
    assert not srv.split_merge_partition  # in no release up to 18
    assert {k: getattr(srv, k) for k in VERSIONS[num]} == VERSIONS[num]


@pytest.mark.parametrize("num", [150018, 160002, 170010])
def test_before_18_the_catalog_fragments_read_what_exists(num):
    srv = Server(num)
    assert text(srv.not_null_validated("a")) == '"a".attnotnull'
    assert text(srv.conperiod("k")) == "false"  # no pg_constraint.conperiod column before 18
    assert text(srv.conenforced("k")) == "true"  # no pg_constraint.conenforced column before 18


def test_on_18_not_null_means_validated_and_the_new_columns_are_read():
    srv = Server(180006)
    nn = text(srv.not_null_validated("a"))
    # attnotnull is set by a NOT VALID NOT NULL too: the column holds no NULL only once validated.
    assert nn.startswith('("a".attnotnull AND NOT EXISTS (') and "contype = 'n'" in nn and "NOT nn.convalidated" in nn
    assert text(srv.conperiod("k")) == '"k".conperiod'
    assert text(srv.conenforced("k")) == '"k".conenforced'


def test_reconcile_needs_14():
    assert not Server(130015).hash_record_extended


@pytest.mark.parametrize(("definition", "column"), [
    ("NOT NULL note", "note"),
    ("NOT NULL note NOT VALID", "note"),
    ("NOT NULL d NO INHERIT", "d"),
    ('NOT NULL "Odd ""col"" name" NOT VALID', 'Odd "col" name'),
    ('NOT NULL "select"', "select"),
    ("CHECK ((qty > 0))", None),
])
def test_the_column_of_a_not_null_constraint_definition(definition, column):
    assert not_null_column(definition) == column


def test_a_generated_column_comes_back_stored_or_virtual_with_its_not_null_name():
    t = QualifiedName("public", "T new")
    assert text(ddl.add_generated_column(t, "x2", "numeric", None, "(amount * 2)", True)) == (
        'ALTER TABLE "public"."T new" ADD COLUMN "x2" numeric GENERATED ALWAYS AS ((amount * 2)) STORED NOT NULL')
    assert text(ddl.add_generated_column(t, "x2", "numeric", None, "(amount * 2)", True, virtual=True,
                                         not_null_name="T_x2_not_null")) == (
        'ALTER TABLE "public"."T new" ADD COLUMN "x2" numeric GENERATED ALWAYS AS ((amount * 2)) VIRTUAL'
        ' CONSTRAINT "T_x2_not_null" NOT NULL')
