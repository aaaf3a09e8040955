"""What `plan check` refuses of PostgreSQL 17 and 18's catalog features (mover/checks/versions.py):
exit 2, the reason and the way out, nothing changed. Each test asks the server for the feature and
skips, saying why, where it is missing; CI runs this file on every version."""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import connect
from tests.integration.test_plan_check import assert_bad, mover, plan_toml, snapshot, write_plan


def require(dsn: str, what: str, *probe: str) -> None:
    with connect(dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        try:
            with conn.transaction(force_rollback=True):
                for statement in probe:
                    conn.execute(statement)
        except psycopg.Error as exc:
            pytest.skip(f"PostgreSQL {version} has no {what} ({type(exc).__name__}: {str(exc).splitlines()[0]})")


def execute(dsn: str, *statements: str) -> None:
    with connect(dsn) as conn:
        for s in statements:
            conn.execute(s)


def refused(dsn: str, tmp_path, text: str, fragments: list[str]) -> str:
    before = snapshot(dsn)
    r = mover(dsn, "plan", "check", str(write_plan(tmp_path, text)))
    assert_bad(r, fragments)
    assert snapshot(dsn) == before
    return " ".join(r.stderr.split())


TEMPORAL = """
CREATE EXTENSION btree_gist;
CREATE TABLE rooms (room int, during tstzrange, PRIMARY KEY (room, during WITHOUT OVERLAPS));
CREATE TABLE bookings (id int PRIMARY KEY, room int, during tstzrange, note text,
                       CONSTRAINT no_double_booking UNIQUE (room, during WITHOUT OVERLAPS),
                       CONSTRAINT booked_room FOREIGN KEY (room, PERIOD during) REFERENCES rooms (room, PERIOD during));
"""


def test_18_temporal_keys_are_built_after_the_copy_and_period_foreign_keys_carried(db_dsn, tmp_path):
    """A temporal key goes to the new table like an exclusion constraint (ADD CONSTRAINT under
    mover's name after the copy, tried on the rehearsed target), its PERIOD foreign key like every
    foreign key (NOT VALID in the swap, validated after): plan check says so and passes."""
    require(db_dsn, "temporal keys (PostgreSQL 18) or btree_gist", "CREATE EXTENSION btree_gist",
            "CREATE TABLE probe (r int, d tstzrange, PRIMARY KEY (r, d WITHOUT OVERLAPS))")
    execute(db_dsn, TEMPORAL)
    before = snapshot(db_dsn)
    r = mover(db_dsn, "plan", "check", str(write_plan(tmp_path, plan_toml(
        name="bookings", source="public.bookings", columns={"id": "bigint"}))), "--sql")
    assert r.returncode == 0, r.stdout + r.stderr
    checked = " ".join(r.stdout.split())
    assert ('ALTER TABLE "public"."bookings_new" ADD CONSTRAINT "no_double_booking_m1" UNIQUE (room, during WITHOUT'
            ' OVERLAPS)') in checked, checked
    assert ('ALTER TABLE "public"."bookings" ADD CONSTRAINT "booked_room" FOREIGN KEY (room, PERIOD during)'
            ' REFERENCES public.rooms(room, PERIOD during) NOT VALID') in checked, checked
    assert 'VALIDATE CONSTRAINT "booked_room"' in checked, checked
    assert snapshot(db_dsn) == before


def test_18_a_table_keyed_only_by_a_temporal_key_is_refused_naming_the_btree_key_to_add(db_dsn, tmp_path):
    """A temporal key does not serve as mover's key (its GiST index orders no ranges and serves no
    ON CONFLICT): the table is refused, with the unique btree index over its columns that does."""
    require(db_dsn, "temporal keys (PostgreSQL 18) or btree_gist", "CREATE EXTENSION btree_gist",
            "CREATE TABLE probe (r int, d tstzrange, PRIMARY KEY (r, d WITHOUT OVERLAPS))")
    execute(db_dsn, TEMPORAL)
    refused(db_dsn, tmp_path, plan_toml(name="rooms", source="public.rooms"),
            ['"public"."rooms" has no primary key or unique index on NOT NULL columns (PRIMARY KEY (room, during'
             ' WITHOUT OVERLAPS) is a temporal key', 'CREATE UNIQUE INDEX CONCURRENTLY ON "public"."rooms"'
             ' ("room", "during")'])


def test_18_a_temporal_key_is_refused_on_a_target_partitioned_by_a_column_outside_its_plain_ones(db_dsn,
                                                                                                  tmp_path):
    """PostgreSQL takes a temporal key on a partitioned table only when the partition columns are
    among the key's plain columns (compared with =): partitioning by the period, or by another
    column, is refused naming the key, once (not also as a unique index lacking the column)."""
    require(db_dsn, "temporal keys (PostgreSQL 18) or btree_gist", "CREATE EXTENSION btree_gist",
            "CREATE TABLE probe (r int, d tstzrange, PRIMARY KEY (r, d WITHOUT OVERLAPS))")
    execute(db_dsn, TEMPORAL)
    base = plan_toml(name="bookings", source="public.bookings")
    for column in ("id", "during"):
        partition = (f'[target.partition]\nby = "hash"\ncolumn = "{column}"\nmodulus = 2\n'
                     f'accept_key_change = true\n\n[rollback]\n')
        err = refused(db_dsn, tmp_path, base.replace("[rollback]\n", partition),
                      ['temporal key "no_double_booking" (UNIQUE (room, during WITHOUT OVERLAPS)), which does not hold'
                       f' the partition column "{column}" among its plain (non-period) columns'])
        assert "unique indexes" not in err, err
    text = base.replace("[rollback]\n", '[target.partition]\nby = "hash"\ncolumn = "room"\nmodulus = 2\n'
                                         'accept_key_change = true\n\n[rollback]\n')
    r = mover(db_dsn, "plan", "check", str(write_plan(tmp_path, text)))
    assert r.returncode == 0, r.stdout + r.stderr


def test_18_not_null_no_inherit_is_refused_for_a_partitioned_target(db_dsn, tmp_path):
    """On a partitioned table a NO INHERIT NOT NULL binds no partition: the new table would take NULL."""
    require(db_dsn, "NOT NULL ... NO INHERIT (PostgreSQL 18)", "CREATE TABLE probe (a int)",
            "ALTER TABLE probe ADD CONSTRAINT a_nn NOT NULL a NO INHERIT")
    execute(db_dsn, "CREATE TABLE ev (id int PRIMARY KEY, at date NOT NULL, d int)",
            "ALTER TABLE ev ADD CONSTRAINT d_nn NOT NULL d NO INHERIT",
            "INSERT INTO ev SELECT g, '2024-01-01'::date + g, g FROM generate_series(1, 100) g")
    text = plan_toml(name="ev", source="public.ev").replace(
        "[target]\n", '[target.partition]\nby = "range"\ncolumn = "at"\ninterval = "1 year"\n'
                      'accept_key_change = true\n')
    refused(db_dsn, tmp_path, text, ['NOT NULL constraint "d_nn" (NOT NULL d NO INHERIT)',
                                     'ALTER TABLE "public"."ev" ALTER CONSTRAINT "d_nn" INHERIT'])
    execute(db_dsn, "ALTER TABLE ev ALTER CONSTRAINT d_nn INHERIT")
    r = mover(db_dsn, "plan", "check", str(write_plan(tmp_path, text)))
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_source_stored_by_another_table_access_method_is_refused(db_dsn, tmp_path):
    """CREATE TABLE ... (LIKE) takes the default access method: a source stored by another one
    (which PostgreSQL 17 lets partitioned tables have too) is refused, not silently changed."""
    execute(db_dsn, "CREATE ACCESS METHOD heap_too TYPE TABLE HANDLER heap_tableam_handler",
            "CREATE TABLE stored (id int PRIMARY KEY, v text) USING heap_too")
    refused(db_dsn, tmp_path, plan_toml(name="stored", source="public.stored", columns={"id": "bigint"}),
            ["table access method 'heap_too'", "ALTER TABLE \"public\".\"stored\" SET ACCESS METHOD heap"])
