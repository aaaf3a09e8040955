"""What the capture trigger logs for each kind of write: keys only, once each."""

from __future__ import annotations

import psycopg

from tests.workload import mover, write_plan


def test_each_write_logs_exactly_the_keys_it_touches(db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE "T" (a int NOT NULL, b text NOT NULL, v text, PRIMARY KEY (a, b))')
        conn.execute("""INSERT INTO "T" VALUES (1, 'x', 'before')""")
    plan = write_plan(tmp_path / "p.toml", '[migration]\nname = "cap"\nsource = \'"T"\'\n[rollback]\nwindow = "1h"\n')
    assert mover(db_dsn, "step", plan).returncode == 0
    assert mover(db_dsn, "step", "cap").returncode == 0  # install_capture

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        (mid,) = conn.execute("SELECT id FROM mover.migrations").fetchone()
        log = f"mover.m{mid}_changes"

        def logged(statement, role=None):
            conn.execute(f"DELETE FROM {log}")
            if role:
                conn.execute(f"SET ROLE {role}")
            try:
                conn.execute(statement)
            finally:
                conn.execute("RESET ROLE")
            return sorted(conn.execute(f"SELECT a, b FROM {log}").fetchall())

        assert logged("""INSERT INTO "T" VALUES (2, 'y', 'new')""") == [(2, "y")]
        assert logged("""UPDATE "T" SET v = 'changed' WHERE a = 2""") == [(2, "y")]
        assert logged("""UPDATE "T" SET b = 'z' WHERE a = 2""") == [(2, "y"), (2, "z")]  # the key changed
        assert logged("""DELETE FROM "T" WHERE a = 2""") == [(2, "z")]
        assert logged("""INSERT INTO "T" SELECT g, 'm', NULL FROM generate_series(10, 14) g""") == \
            [(g, "m") for g in range(10, 15)]
        # A role with no rights on mover's schema writes through the trigger all the same.
        conn.execute("DROP ROLE IF EXISTS cap_app")
        conn.execute("CREATE ROLE cap_app")
        conn.execute('GRANT INSERT ON "T" TO cap_app')
        try:
            assert logged("""INSERT INTO "T" VALUES (3, 'w', 'as app')""", role="cap_app") == [(3, "w")]
        finally:
            conn.execute("DROP OWNED BY cap_app")
            conn.execute("DROP ROLE cap_app")
