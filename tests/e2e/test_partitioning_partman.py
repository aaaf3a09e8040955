"""`[partitions] manager = "pg_partman"`: a converted table handed over to pg_partman once the
migration is retired, and `mover partitions maintain` deferring to pg_partman's run_maintenance.
Needs the pg_partman extension on the server (Debian's postgresql-15-partman); skips, saying so,
where the server has none (the pgserver wheel's PostgreSQL 16)."""

from __future__ import annotations

import json

import psycopg

from tests.conftest import require_partman
from tests.e2e.test_partitioning import (
    MONTHLY,
    MONTHLY_DEFAULT,
    OUTSIDE,
    create_events,
    partitions_of,
    plan_file,
    query,
)
from tests.workload import mover

PARTMAN = {"manager": "pg_partman", "retention": "12 months", "drop_detached": True}


def install_partman(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA partman")
        conn.execute("CREATE EXTENSION pg_partman SCHEMA partman")


def test_plan_check_refuses_pg_partman_not_installed(db_dsn, tmp_path):
    create_events(db_dsn, 500)
    plan = plan_file(tmp_path, MONTHLY, partitions=PARTMAN)
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = " ".join(r.stderr.split())
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        available = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_available_extensions"
                                 " WHERE name = 'pg_partman')").fetchone()[0]
    if available:
        assert "available on the server but not installed" in err and "CREATE EXTENSION pg_partman" in err, err
    else:
        # The package is named for the server's major version.
        assert "no pg_partman extension" in err and "-partman" in err, err
    # A weekly layout is one pg_partman would name differently: refused without the database.
    plan = plan_file(tmp_path, {**MONTHLY, "interval": "1 week"}, partitions=PARTMAN)
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 2 and "ISO week" in r.stderr, r.stderr


def test_hand_over_to_pg_partman_after_retire(db_dsn, tmp_path):
    require_partman(db_dsn)
    create_events(db_dsn)
    install_partman(db_dsn)
    plan = plan_file(tmp_path, MONTHLY_DEFAULT, partitions=PARTMAN)
    r = mover(db_dsn, "plan", "check", plan, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["partitioning"]["manager"] == "pg_partman (schema partman)"
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    r = mover(db_dsn, "cutover", "events_part")
    assert r.returncode == 0, r.stderr

    # During the rollback window mover keeps the partitions itself (a rollback renames tables).
    r = mover(db_dsn, "partitions", "maintain", "events_part", "--json")
    assert r.returncode == 0, r.stderr
    (during,) = json.loads(r.stdout)
    assert during["manager"].startswith("mover") and "retired" in during["manager"]
    assert during["dropped"] and during["dropped"] == during["detached"]  # the plan's retention, by mover
    assert query(db_dsn, "SELECT count(*) FROM partman.part_config")[0][0] == 0

    r = mover(db_dsn, "retire", "events_part", "--force")
    assert r.returncode == 0, r.stderr
    # Rows in mover's default partition: one no partition takes, one in a month pg_partman creates.
    query(db_dsn, "INSERT INTO events (created_at, tenant_id, region, payload) VALUES (%s, 1, 'us', 'outside')"
                  " RETURNING 1", OUTSIDE)
    query(db_dsn, "INSERT INTO events (id, created_at, tenant_id, region, payload) VALUES (-1, date_trunc('month',"
                  " now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '3 months 1 day', 1, 'us', 'early')"
                  " RETURNING 1")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE snapshot AS SELECT * FROM events")
    before = partitions_of(db_dsn, "events")

    r = mover(db_dsn, "partitions", "maintain", "--all", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    (dry,) = json.loads(r.stdout)
    assert (dry["manager"], dry["registered"], dry["handed_over"]) == ("pg_partman", False, False), dry
    assert query(db_dsn, "SELECT count(*) FROM partman.part_config")[0][0] == 0  # a dry run changes nothing
    assert partitions_of(db_dsn, "events") == before
    r = mover(db_dsn, "partitions", "maintain", "--all", "--json")
    assert r.returncode == 0, r.stderr
    (done,) = json.loads(r.stdout)
    assert done["manager"] == "pg_partman" and done["handed_over"] is True, done
    config = query(db_dsn, "SELECT partition_interval, premake, retention, retention_keep_table,"
                           " infinite_time_partitions FROM partman.part_config WHERE parent_table = 'public.events'")
    assert config == [("1 mon", 2, "12 months", False, True)], config
    after = partitions_of(db_dsn, "events")
    assert set(after) == (set(before) | set(done["created"])) - set(done["detached"])
    # pg_partman made the months ahead under mover's names, and its own default partition.
    (ahead,) = query(db_dsn, "SELECT to_char(date_trunc('month', now() AT TIME ZONE 'UTC') + interval '3 months',"
                             " '\"events_p\"YYYY_MM')")[0]
    assert ahead in after and "events_default" in after
    assert query(db_dsn, "SELECT tableoid::regclass::text FROM events WHERE id = -1") == [(ahead,)]
    assert query(db_dsn, "SELECT tableoid::regclass::text FROM events WHERE payload = 'outside'") == [
        ("events_default",)]
    # Nothing lost or changed by the hand-over: every row of the last 11 months is there, and
    # nothing older than 13 months (the retention) is left.
    recent = ("SELECT count(*) FROM (SELECT * FROM {a} WHERE created_at >= now() - interval '11 months'"
              " EXCEPT ALL SELECT * FROM {b} WHERE created_at >= now() - interval '11 months') d")
    assert query(db_dsn, recent.format(a="events", b="snapshot")) == [(0,)]
    assert query(db_dsn, recent.format(a="snapshot", b="events")) == [(0,)]
    assert query(db_dsn, "SELECT count(*) FROM events WHERE created_at < now() - interval '13 months'") == [(0,)]
    assert done.get("moved_from_default") == 1, done  # the early row, carved out before pg_partman ran
    assert done["default_rows"] == 1, done  # the row dated 2100

    r = mover(db_dsn, "partitions", "maintain", "events", "--json")  # again: handed over already, nothing to do
    assert r.returncode == 0, r.stderr
    (again,) = json.loads(r.stdout)
    assert (again["handed_over"], again["created"], again["detached"]) == (False, [], []), again
    assert partitions_of(db_dsn, "events") == after
    r = mover(db_dsn, "partitions", "maintain", "events")
    assert r.returncode == 0 and "deferred to pg_partman run_maintenance" in r.stdout, r.stdout
    # pg_partman failing is mover's failure, naming the table and what to do; nothing half done.
    query(db_dsn, "UPDATE partman.part_config SET partition_interval = 'fortnightly' RETURNING 1")
    r = mover(db_dsn, "partitions", "maintain", "events")
    assert r.returncode == 1, (r.stdout, r.stderr)
    err = " ".join(r.stderr.split())
    assert 'pg_partman run_maintenance for "public"."events" failed' in err, err
    assert "mover partitions maintain events_part" in err, err
    assert partitions_of(db_dsn, "events") == after
