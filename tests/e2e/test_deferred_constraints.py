"""Deferred constraints in the application (issue 21, item 2): a UNIQUE ... DEFERRABLE INITIALLY
DEFERRED column whose values the application swaps with two plain UPDATEs in one transaction, and
a foreign key DEFERRABLE INITIALLY DEFERRED whose child row is inserted before its parent. mover's
own writes are checked at once (the applier sets its constraints IMMEDIATE), so the cutover, the
rollback and a second cutover run their DDL with no pending trigger event, and a row a deferred
constraint rejects is a divergence, not PostgreSQL's error at COMMIT. A deferrable key is refused
at plan check, before anything is created."""

from __future__ import annotations

import json

import psycopg
from psycopg import sql

from tests import workload
from tests.workload import finish, mover, plan_file, spawn

SEAT_COLUMNS = ("id", "pos", "zone_id", "note")
MIRROR = "seat_mirror"

def seat_plan(tmp_path, target: dict | None = None) -> str:
    return plan_file(tmp_path, "seat", "seat", columns={"id": "bigint"}, target=target or {},
                     backfill={"range_rows": 500}, cutover={"lock_timeout": "500ms"})


def create_seat(dsn: str, rows: int = 2000) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE zone (id int PRIMARY KEY)")
        conn.execute("INSERT INTO zone SELECT generate_series(1, 10)")
        conn.execute("CREATE TABLE seat (id int PRIMARY KEY, pos int UNIQUE DEFERRABLE INITIALLY DEFERRED,"
                     " zone_id int REFERENCES zone DEFERRABLE INITIALLY DEFERRED, note text)")
        conn.execute("CREATE TABLE ticket (id serial PRIMARY KEY,"
                     " seat_id int NOT NULL REFERENCES seat DEFERRABLE INITIALLY DEFERRED)")
        conn.execute("INSERT INTO seat SELECT g, g, 1 + g %% 10, 'n' FROM generate_series(1, %s) g", (rows,))
        workload.create_mirror(conn, "seat", MIRROR)


def mirror_rows(conn: psycopg.Connection, ids: list[int]) -> None:
    cols = sql.SQL(", ").join(map(sql.Identifier, SEAT_COLUMNS))
    conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(sql.Identifier(MIRROR)), (ids,))
    conn.execute(sql.SQL("INSERT INTO {m} ({c}) SELECT {c} FROM seat WHERE id = ANY(%s)").format(
        m=sql.Identifier(MIRROR), c=cols), (ids,))


def swap_pos(conn: psycopg.Connection, a: int, b: int) -> None:
    """The application's swap: two plain UPDATEs, the unique check deferred to the commit."""
    with conn.transaction():
        pa = conn.execute("SELECT pos FROM seat WHERE id = %s", (a,)).fetchone()[0]
        pb = conn.execute("SELECT pos FROM seat WHERE id = %s", (b,)).fetchone()[0]
        conn.execute("UPDATE seat SET pos = %s WHERE id = %s", (pb, a))
        conn.execute("UPDATE seat SET pos = %s WHERE id = %s", (pa, b))
        mirror_rows(conn, [a, b])


def ticket_before_seat(conn: psycopg.Connection, seat: int) -> None:
    """The child row first, its parent after, in one transaction (the foreign key is deferred)."""
    with conn.transaction():
        conn.execute("INSERT INTO ticket (seat_id) VALUES (%s)", (seat,))
        conn.execute("INSERT INTO seat VALUES (%s, %s, 1, 't')", (seat, seat))
        mirror_rows(conn, [seat])


def app_writes(conn: psycopg.Connection, round_: int) -> None:
    for i in range(1, 40, 2):
        swap_pos(conn, i, i + 1)
    swap_pos(conn, 3, 1990)  # far apart: other ranges, other batches
    ticket_before_seat(conn, 10_000 + round_)


def while_hanging(dsn, tmp_path, command: str, point: str, action) -> tuple[int, str]:
    """`mover COMMAND seat`, held at fault point POINT while `action(conn)` writes."""
    release = tmp_path / f"release-{command}-{point}"
    proc = spawn(dsn, command, "seat", env={"MOVER_FAULT": f"hang@{point}", "MOVER_FAULT_RELEASE": str(release)})
    try:
        line = proc.stderr.readline()
        while line and f"hanging at {point}" not in line:
            line = proc.stderr.readline()
        assert line, f"mover {command} ended before {point}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            action(conn)
    finally:
        release.touch()
    return finish(proc, 120)


def status(dsn: str) -> dict:
    r = mover(dsn, "status", "seat", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_oracle(dsn: str, *tables: str) -> None:
    workload.assert_oracle(dsn, *tables, mirror=MIRROR, columns=SEAT_COLUMNS)


def test_swaps_under_deferred_unique_cut_over_roll_back_and_cut_over_again(db_dsn, tmp_path):
    create_seat(db_dsn)
    plan = seat_plan(tmp_path)
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        app_writes(conn, 1)
    # Each swap of the tables with the application's deferred swaps committed just before its lock,
    # so that the lock's own drain replays them into a table whose constraint is deferrable.
    for round_, (command, point) in enumerate([("cutover", "swap:before_lock"),
                                               ("rollback", "swap_back:before_lock"),
                                               ("cutover", "swap:before_lock")], start=2):
        if command == "cutover":
            r = mover(db_dsn, "run", "seat")
            assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        code, err = while_hanging(db_dsn, tmp_path, command, point, lambda conn, n=round_: app_writes(conn, n))
        assert code == 0, f"{command}: {err}"
        assert "pending trigger events" not in err
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            app_writes(conn, 10 + round_)
        r = mover(db_dsn, "run", "seat")
        assert r.returncode == 3, r.stderr
        st = status(db_dsn)
        assert st["divergences"] == 0, st
        other = "seat_old" if command == "cutover" else "seat_new"
        assert_oracle(db_dsn, "seat", other)
    # The application's deferred constraints are still deferred on the table that has the name.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        swap_pos(conn, 1, 2)
        ticket_before_seat(conn, 20_000)
        rows = conn.execute("SELECT conname, condeferrable, condeferred FROM pg_constraint"
                            " WHERE conrelid IN ('seat'::regclass, 'ticket'::regclass) AND contype IN ('u', 'f')"
                            " ORDER BY 1").fetchall()
    assert rows == [("seat_pos_key", True, True), ("seat_zone_id_fkey", True, True),
                    ("ticket_seat_id_fkey", True, True)], rows


def test_a_row_a_deferred_constraint_rejects_is_a_divergence(db_dsn, tmp_path):
    """The old table keeps the deferred foreign key [target] drop_foreign_keys leaves on it; a row
    of the live table that breaks it cannot be replayed into the old table: a reverse apply_error
    divergence, and rollback refuses naming it (never PostgreSQL's error at COMMIT, exit 1)."""
    create_seat(db_dsn)
    plan = seat_plan(tmp_path, {"drop_foreign_keys": ["seat_zone_id_fkey"]})
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    r = mover(db_dsn, "cutover", "seat")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE seat SET zone_id = 99 WHERE id = 5")  # no such zone: the live table has no key now
        swap_pos(conn, 7, 8)
    r = mover(db_dsn, "run", "seat")
    assert r.returncode == 3, r.stderr
    assert "ForeignKeyViolation" not in r.stderr, r.stderr
    st = status(db_dsn)
    assert st["divergences"] == 1, st
    r = mover(db_dsn, "rollback", "seat")
    assert r.returncode == 3, r.stderr
    assert "rows exist only in the new table" in r.stderr and "key ['5']" in r.stderr, r.stderr
    assert "--give-up-rows" in r.stderr and "pending trigger events" not in r.stderr, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE seat SET zone_id = 1 WHERE id = 5")
    r = mover(db_dsn, "rollback", "seat")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        mirror_rows(conn, [5])
    assert_oracle(db_dsn, "seat")


def test_a_deferrable_key_is_refused_at_plan_check(db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE seat (id int PRIMARY KEY DEFERRABLE, pos int, zone_id int, note text)")
        conn.execute("INSERT INTO seat SELECT g, g FROM generate_series(1, 100) g")
        conn.execute("ANALYZE seat")  # the snapshot compares reltuples: not autovacuum's to change meanwhile
    before = workload.catalog_snapshot(db_dsn)
    plan = seat_plan(tmp_path)
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "seat_pkey" in r.stderr and "DEFERRABLE" in r.stderr, r.stderr
    assert "undo the change on the new table" not in r.stderr
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 2, r.stderr
    assert workload.catalog_snapshot(db_dsn) == before
