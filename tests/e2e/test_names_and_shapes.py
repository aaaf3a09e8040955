"""Awkward names and table shapes through a whole migration."""

from __future__ import annotations

import json
import signal
import zipfile

import psycopg
from psycopg import sql

from tests.workload import ROOT, finish, hung_at, mover, plan_file, spawn


def test_names_needing_quotes_composite_key_identity_and_odd_types(db_dsn, tmp_path):
    schema, table = "Sales Dept", 'Order "Items"; DROP'
    t = sql.Identifier(schema, table)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("""
            CREATE TABLE {} (
                "Tenant Id" integer NOT NULL,
                line integer GENERATED ALWAYS AS IDENTITY,
                "Qty" smallint NOT NULL,
                doc json,
                tags text[],
                at timestamptz,
                total numeric GENERATED ALWAYS AS ("Tenant Id" * 2) STORED,
                PRIMARY KEY ("Tenant Id", line))""").format(t))
        conn.execute(sql.SQL("""INSERT INTO {} ("Tenant Id", "Qty", doc, tags, at)
            SELECT g % 7, g % 300, json_build_object('g', g), ARRAY['a', g::text], now() - g * interval '1 min'
            FROM generate_series(1, 3000) g""").format(t))
        # The oracle: a plain copy that the test's own writes below also go to.
        conn.execute(sql.SQL('CREATE TABLE expected AS SELECT * FROM {}').format(t))
    plan = plan_file(tmp_path, "odd", '"Sales Dept"."Order ""Items""; DROP"',
                     columns={"Qty": "integer", "line": "bigint"}, target={"name": '"Sales Dept"."Order Items new"'},
                     backfill={"range_rows": 700},
                     rollback={"window": "0s", "old_name": '"Sales Dept"."Order Items (old)"'})
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 0, r.stderr
    assert '"Sales Dept"."Order Items new"' in r.stdout
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn, conn.transaction():
        row = conn.execute(sql.SQL('INSERT INTO {} ("Tenant Id", "Qty") VALUES (1, 5) RETURNING *').format(t)
                           ).fetchone()
        conn.execute('INSERT INTO expected VALUES (%s, %s, %s, %s, %s, %s, %s)', row)
        conn.execute(sql.SQL('UPDATE {} SET doc = \'{{"x": 1}}\' WHERE line = 7').format(t))
        conn.execute('UPDATE expected SET doc = \'{"x": 1}\' WHERE line = 7')
    r = mover(db_dsn, "cutover", "odd")
    assert r.returncode == 0, r.stderr
    st = json.loads(mover(db_dsn, "status", "odd", "--json").stdout)
    assert st["state"] == "done"  # a zero-length window retires at once
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        types = dict(conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                                  " WHERE attrelid = %s::regclass AND attnum > 0",
                                  (str(t.as_string(conn)),)).fetchall())
        assert types["Qty"] == "integer" and types["line"] == "bigint"
        n, tot = conn.execute(sql.SQL('SELECT count(*), sum(total) FROM {}').format(t)).fetchone()
        assert n == 3001
        assert tot == 2 * sum(g % 7 for g in range(1, 3001)) + 2  # the generated column, recomputed
        # Every column of every row as the application left it (json compared by its text).
        cols = '"Tenant Id", line, "Qty", doc::text, tags, at, total'
        for a, b in ((t, sql.Identifier("expected")), (sql.Identifier("expected"), t)):
            assert conn.execute(sql.SQL(f"SELECT count(*) FROM (SELECT {cols} FROM {{}} EXCEPT ALL"
                                        f" SELECT {cols} FROM {{}}) d").format(a, b)).fetchone()[0] == 0
        assert conn.execute(sql.SQL("SELECT doc::text FROM {} WHERE line = 7").format(t)).fetchone()[0] == '{"x": 1}'
        # The identity continues after the copied values.
        line = conn.execute(
            sql.SQL('INSERT INTO {} ("Tenant Id", "Qty") VALUES (2, 1) RETURNING line').format(t)).fetchone()[0]
        assert line > 3001
        # Widened to bigint, the identity goes past the old integer maximum.
        seq_max, = conn.execute("SELECT seqmax FROM pg_sequence"
                                " WHERE seqrelid = pg_get_serial_sequence(%s, 'line')::regclass",
                                (t.as_string(conn),)).fetchone()
        assert seq_max == 2**63 - 1


def test_ctrl_c_stops_at_a_safe_point_and_resumes(db_dsn, tmp_path):
    from tests.workload import assert_oracle, create_orders
    create_orders(db_dsn, 5_000)
    plan = plan_file(tmp_path, "ctrlc", backfill={"range_rows": 500})
    release = tmp_path / "release"
    proc = spawn(db_dsn, "run", plan, env={"MOVER_FAULT": "hang@backfill_range:2", "MOVER_FAULT_RELEASE": str(release)})
    assert hung_at(proc, "backfill_range:2")
    proc.send_signal(signal.SIGINT)
    release.touch()
    code, err = finish(proc, 60)
    assert code == 130 and "mover run ctrlc" in err, err
    st = json.loads(mover(db_dsn, "status", "ctrlc", "--json").stdout)
    assert (st["step"], st["state"], st["lease"]) == ("backfill", "interrupted", None)
    assert st["backfill"]["ranges_done"] == 2
    r = mover(db_dsn, "run", "ctrlc")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_wheel_carries_the_control_schema_revisions(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("mover-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mover/_alembic/env.py" in names
    assert "mover/_alembic/versions/0001_control_schema.py" in names
