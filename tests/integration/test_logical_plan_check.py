"""`plan check` of a plan with [capture] method = "logical": every prerequisite that is missing is
named with the statement or setting that provides it (mover/checks/logical.py), and nothing is
created; once they are met the plan passes, and a plan with the trigger needs none of them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from mover import api, checks
from mover.demo.embedded import EmbeddedPostgres
from mover.errors import PlanError
from mover.plan import load_plan
from tests.conftest import dsn_with_dbname
from tests.workload import create_orders, mover, write_plan

PLAN = """
[migration]
name = "wal"
source = 'public."Orders"'

[rollback]
window = "1h"

[capture]
method = "{method}"
"""


def plan_file(tmp_path, method="logical"):
    return write_plan(tmp_path / f"{method}.toml", PLAN.format(method=method))


def check(dsn, plan):
    r = mover(dsn, "plan", "check", plan, "--json")
    return r, json.loads(r.stdout)


def nothing_created(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0] == 0


def test_a_replica_identity_without_the_key_is_refused_with_its_fix(db_dsn, tmp_path):
    create_orders(db_dsn, 100)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('ALTER TABLE "Orders" REPLICA IDENTITY NOTHING')
    plan = plan_file(tmp_path)
    r, out = check(db_dsn, plan)
    assert r.returncode == 2, r.stderr
    text = json.dumps(out)
    assert "the replica identity of \\\"public\\\".\\\"Orders\\\" is NOTHING" in text, text
    assert 'ALTER TABLE \\"public\\".\\"Orders\\" REPLICA IDENTITY USING INDEX \\"Orders_pkey\\"' in text, text
    nothing_created(db_dsn)
    assert check(db_dsn, plan_file(tmp_path, "trigger"))[0].returncode == 0  # the trigger needs none of it
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # the statement plan check printed
        conn.execute('ALTER TABLE "public"."Orders" REPLICA IDENTITY USING INDEX "Orders_pkey"')
    r, out = check(db_dsn, plan)
    assert r.returncode == 0, r.stdout + r.stderr
    # The unbounded WAL a slot may keep is said, not refused.
    assert any("max_slot_wal_keep_size is -1" in w for w in out["warnings"]), out["warnings"]
    install = next(s for s in out["steps"] if s["name"] == "install_capture")["sql"]
    assert any(s.startswith('CREATE PUBLICATION "mover_m1_capture" FOR TABLE "public"."Orders"') for s in install)
    assert any("pg_create_logical_replication_slot('mover_m1_d" in s for s in install), install
    assert not any("FOR EACH ROW" in s for s in install), install  # no row trigger: only TRUNCATE's
    nothing_created(db_dsn)


def test_a_unique_key_without_a_primary_key_needs_a_replica_identity(db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE "Orders" (id int NOT NULL, v text)')
        conn.execute('CREATE UNIQUE INDEX orders_id ON "Orders" (id)')
    r, out = check(db_dsn, plan_file(tmp_path))
    assert r.returncode == 2
    assert "is DEFAULT, and it has no primary key" in json.dumps(out)
    assert 'REPLICA IDENTITY USING INDEX \\"orders_id\\"' in json.dumps(out)


def test_all_slots_taken_is_refused_naming_them(db_dsn, tmp_path):
    create_orders(db_dsn, 100)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        (free,) = conn.execute("SELECT current_setting('max_replication_slots')::int"
                               " - (SELECT count(*) FROM pg_replication_slots)").fetchone()
        taken = [f"taken_{i}" for i in range(free)]
        for name in taken:  # physical slots count against the same limit, and are made at once
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (name,))
        try:
            r, out = check(db_dsn, plan_file(tmp_path))
        finally:
            for name in taken:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    assert r.returncode == 2
    text = json.dumps(out)
    assert "are taken: " in text and "taken_0 (inactive)" in text and "max_replication_slots" in text, text


def test_a_role_without_replication_create_or_ownership_is_told_each(db_dsn, tmp_path):
    create_orders(db_dsn, 100)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS plain_mover")
        conn.execute("CREATE ROLE plain_mover")
        conn.execute("GRANT USAGE ON SCHEMA mover TO plain_mover")  # the checks read mover's own tables
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA mover TO plain_mover")
        conn.execute(sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(sql.Identifier(conn.info.dbname)))
        try:
            cur = conn.cursor()
            conn.execute("SET ROLE plain_mover")
            with pytest.raises(PlanError) as info:
                with conn.transaction(force_rollback=True):
                    checks.run(cur, load_plan(plan_file(tmp_path)))
            conn.execute("RESET ROLE")
        finally:
            conn.execute("RESET ROLE")
            conn.execute("DROP OWNED BY plain_mover")
            conn.execute("DROP ROLE plain_mover")
    found = [(p.message, p.hint or "") for p in info.value.problems]
    said = "\n".join(m + " / " + h for m, h in found)
    assert "needs the REPLICATION attribute: role plain_mover lacks it" in said, said
    assert 'ALTER ROLE "plain_mover" WITH REPLICATION;' in said and "rds_replication" in said, said
    assert "needs CREATE on database" in said and 'TO "plain_mover";' in said, said
    assert "which only its owner (postgres) may do" in said, said


@pytest.fixture(scope="module")
def replica_level() -> Iterator[EmbeddedPostgres]:
    """A server with the default wal_level (replica): no logical decoding."""
    with EmbeddedPostgres(fast=True) as pg:
        yield pg


def test_wal_level_below_logical_is_refused_with_the_setting(replica_level, tmp_path):
    with psycopg.connect(replica_level.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE plan")
    dsn = dsn_with_dbname(replica_level.dsn, "plan")
    api.init(dsn)
    create_orders(dsn, 100)
    r, out = check(dsn, plan_file(tmp_path))
    assert r.returncode == 2
    text = json.dumps(out)
    assert "needs wal_level = logical; this server runs with wal_level = replica" in text, text
    assert "ALTER SYSTEM SET wal_level = logical;" in text and "rds.logical_replication" in text, text
    assert check(dsn, plan_file(tmp_path, "trigger"))[0].returncode == 0
