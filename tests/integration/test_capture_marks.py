"""Capture integrity's catalog reading (invariant 14, mover/engines/capture/integrity.py): the PostgreSQL
behaviour it rests on (every ALTER of a trigger's pg_trigger row writes a new xmin; no-op ENABLE
ALWAYS, freezing, VACUUM FULL, renames and column changes do not), checked on this server with
mover's own probe and the marks its install records; and what each state is called."""

from __future__ import annotations

import psycopg

from mover.engines.capture import integrity
from mover.sql import capture as q
from tests.workload import mover, plan_file


def probe(conn, table='"public"."T"', direction="forward"):
    (mid,) = conn.execute("SELECT id FROM mover.migrations").fetchone()
    objects = [f"mover_m{mid}_capture", f"mover_m{mid}_capture_truncate"]
    rows = conn.execute(q.capture_probe(), {"objects": objects, "table": table, "publication": f"mover_m{mid}_capture",
                                            "mid": mid, "direction": direction}).fetchall()
    return {r[0]: integrity.Seen(*r) for r in rows}


def test_the_marks_see_a_change_undone_before_the_next_check(db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE "T" (id int PRIMARY KEY, v text)')
    plan = plan_file(tmp_path, "marks", '"T"')
    assert mover(db_dsn, "step", plan).returncode == 0
    assert mover(db_dsn, "step", "marks").returncode == 0  # install_capture: the marks recorded with it

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        seen = probe(conn)
        assert len(seen) == 2 and all(s.continuous and s.state == "A" for s in seen.values()), seen
        trigger = next(t for t in seen if not t.endswith("_truncate"))
        # What leaves the row alone: still continuous.
        for statement in (f'ALTER TABLE "T" ENABLE ALWAYS TRIGGER {trigger}', "VACUUM FREEZE pg_trigger",
                          "VACUUM FULL pg_trigger", 'ALTER TABLE "T" ADD COLUMN w int',
                          'ALTER TABLE "T" ALTER COLUMN v TYPE varchar(20)', 'ALTER TABLE "T" RENAME TO "T2"'):
            conn.execute(statement)
            assert probe(conn, '"public"."T2"' if "RENAME" in statement else '"public"."T"')[trigger].continuous, \
                statement
        conn.execute('ALTER TABLE "T2" RENAME TO "T"')
        # Off and on again: the state is right, the row is not the one marked.
        conn.execute(f'ALTER TABLE "T" DISABLE TRIGGER {trigger}')
        assert probe(conn)[trigger].state == "D" and not probe(conn)[trigger].in_force
        conn.execute(f'ALTER TABLE "T" ENABLE ALWAYS TRIGGER {trigger}')
        s = probe(conn)[trigger]
        assert s.in_force and s.oid == s.mark_oid and s.xmin != s.mark_xmin and not s.continuous
        assert "row was rewritten" in integrity.describe(s, None)  # type: ignore[arg-type]
        # In one transaction too.
        conn.execute(f"UPDATE mover.capture_marks SET row_xmin = '{s.xmin}' WHERE object = '{trigger}'")
        assert probe(conn)[trigger].continuous
        with conn.transaction():
            conn.execute('ALTER TABLE "T" DISABLE TRIGGER USER')
            conn.execute(f'ALTER TABLE "T" ENABLE ALWAYS TRIGGER {trigger}')
        assert not probe(conn)[trigger].continuous
        # The reported routine: DISABLE / ENABLE TRIGGER USER leaves 'O'.
        conn.execute('ALTER TABLE "T" DISABLE TRIGGER USER')
        conn.execute('ALTER TABLE "T" ENABLE TRIGGER USER')
        s = probe(conn)[trigger]
        assert s.state == "O" and not s.in_force
        assert integrity.describe(s, None).startswith("tgenabled O (was A): ENABLE TRIGGER without ALWAYS")  # type: ignore[arg-type]
        # Dropped.
        conn.execute(f'DROP TRIGGER {trigger} ON "T"')
        s = probe(conn)[trigger]
        assert s.oid is None and not s.in_force and s.mark_oid is not None
        assert integrity.describe(s, None).startswith("dropped")  # type: ignore[arg-type]
