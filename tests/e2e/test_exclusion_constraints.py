"""Exclusion constraints (issue 21, item 7): a booking table whose `EXCLUDE USING gist (room WITH =,
during WITH &&)` keeps two bookings of one room from overlapping. mover builds the constraint on
the new table after the copy, under mover's name, gives it the original's name at the swap and
back at the rollback; replays that meet it go through as a closure (a booking moved into the slot
another one just left) or become divergences (a row the other table cannot hold), never an error
of the application; a build that the rows break stops the step, resumable."""

from __future__ import annotations

import datetime as dt
import json
import random
import signal
import threading

import psycopg
import pytest
from psycopg import sql

from tests import workload
from tests.workload import WriterThread, mover, write_plan

MIRROR = "booking_mirror"
COLUMNS = ("id", "room", "during", "note")
DEFINITION = "EXCLUDE USING gist (room WITH =, during WITH &&)"
ROOMS, SLOTS = 6, 40
BASE = dt.datetime(2030, 1, 1)


def slot(k: int) -> tuple[dt.datetime, dt.datetime]:
    return BASE + dt.timedelta(hours=k), BASE + dt.timedelta(hours=k + 1)


def btree_gist(dsn: str) -> None:
    """`room WITH =` on an integer needs btree_gist's operator classes: Debian's postgresql-contrib
    has it; a server built without contrib (the pgserver wheel may be) cannot run these tests."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gist'").fetchone() is None:
            pytest.skip("this server has no btree_gist extension (PostgreSQL's contrib), which `room WITH =` needs")
        conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")


def server_version(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SHOW server_version_num").fetchone()[0])


def create_bookings(dsn: str, room_type: str = "int", rows: list[tuple] | None = None) -> None:
    btree_gist(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE booking (id int PRIMARY KEY, room {room_type} NOT NULL, during tsrange NOT NULL,"
                     f" note text, CONSTRAINT booking_no_overlap {DEFINITION})")
        if rows is None:  # every other slot of every room booked
            rows = [(r * 1000 + k, r, slot(k), "n") for r in range(1, ROOMS + 1) for k in range(0, SLOTS, 2)]
        for id_, room, (lo, hi), note in rows:
            conn.execute("INSERT INTO booking VALUES (%s, %s, tsrange(%s, %s), %s)", (id_, room, lo, hi, note))
        workload.create_mirror(conn, "booking", MIRROR)
        if room_type.startswith("numeric"):  # what the application writes after a type change, unrounded
            conn.execute(sql.SQL("ALTER TABLE {} ALTER room TYPE numeric").format(sql.Identifier(MIRROR)))


def exclusions(dsn: str) -> dict[str, dict[str, str]]:
    """Per table of the migration that exists: its exclusion constraints' names and definitions,
    and the name of each one's index (the same: the swap renames both)."""
    out = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("booking", "booking_new", "booking_old"):
            if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
                continue
            rows = conn.execute("SELECT k.conname, pg_get_constraintdef(k.oid), i.relname FROM pg_constraint k"
                                " JOIN pg_class i ON i.oid = k.conindid WHERE k.conrelid = %s::regclass"
                                " AND k.contype = 'x' ORDER BY 1", (table,)).fetchall()
            assert all(name == index for name, _, index in rows), rows
            out[table] = {name: definition for name, definition, _ in rows}
    return out


def migration_id(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT id FROM mover.migrations WHERE name = 'booking'").fetchone()[0]


def assert_oracle(dsn: str, *tables: str) -> None:
    workload.assert_oracle(dsn, *tables, mirror=MIRROR, columns=COLUMNS)


def app_execute(dsn: str, statement: str, params: tuple = ()) -> None:
    """The application's own write to booking (no key change), mirrored in its transaction."""
    m, cols = sql.Identifier(MIRROR), sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        keys = [r[0] for r in conn.execute(sql.SQL(statement + " RETURNING id"), params).fetchall()]  # type: ignore[arg-type]
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(m), (keys,))
        conn.execute(sql.SQL("INSERT INTO {m} ({c}) SELECT {c} FROM booking WHERE id = ANY(%s)").format(m=m, c=cols),
                     (keys,))


class BookingWriter(WriterThread):
    """The application: inserts, note updates, deletes, key changes, moves to a free slot, and
    moves into the slot another booking leaves in the same transaction (that one moving on, or
    cancelled), every transaction mirrored. It is the table's only writer, so it knows which slots
    are free and never breaks the constraint itself; any error it meets is mover's."""

    def __init__(self, dsn: str, seed: int = 3):
        self.dsn, self.seed = dsn, seed
        self.ops = self.vacated = 0
        self.errors: list[str] = []
        self.stop, self.paused, self.idle = threading.Event(), threading.Event(), threading.Event()

    def _state(self, conn: psycopg.Connection) -> None:
        self.at: dict[int, tuple[int, int]] = {}
        for id_, room, lo in conn.execute("SELECT id, room, lower(during) FROM booking").fetchall():
            self.at[id_] = (room, int((lo - BASE).total_seconds() // 3600))
        self.held = {v: k for k, v in self.at.items()}
        self.next_id = max(self.at) + 1

    def _free(self, rnd: random.Random) -> tuple[int, int] | None:
        for _ in range(50):
            place = (rnd.randint(1, ROOMS), rnd.randrange(SLOTS))
            if place not in self.held:
                return place
        return None

    def _move(self, conn: psycopg.Connection, id_: int, place: tuple[int, int]) -> None:
        lo, hi = slot(place[1])
        conn.execute("UPDATE booking SET room = %s, during = tsrange(%s, %s) WHERE id = %s", (place[0], lo, hi, id_))
        del self.held[self.at[id_]]
        self.at[id_] = place
        self.held[place] = id_

    def _step(self, conn: psycopg.Connection, rnd: random.Random) -> None:
        r = rnd.random()
        ids = list(self.at)
        touched: set[int] = set()
        with conn.transaction():
            if r < 0.2 and (place := self._free(rnd)):
                id_, self.next_id = self.next_id, self.next_id + 1
                lo, hi = slot(place[1])
                conn.execute("INSERT INTO booking VALUES (%s, %s, tsrange(%s, %s), 'new')", (id_, place[0], lo, hi))
                self.at[id_], self.held[place] = place, id_
                touched.add(id_)
            elif r < 0.35:
                id_ = rnd.choice(ids)
                conn.execute("UPDATE booking SET note = md5(random()::text) WHERE id = %s", (id_,))
                touched.add(id_)
            elif r < 0.5 and len(ids) > 50:
                id_ = rnd.choice(ids)
                conn.execute("DELETE FROM booking WHERE id = %s", (id_,))
                del self.held[self.at.pop(id_)]
                touched.add(id_)
            elif r < 0.6:  # a key change
                old, new = rnd.choice(ids), self.next_id
                self.next_id += 1
                conn.execute("UPDATE booking SET id = %s WHERE id = %s", (new, old))
                self.at[new] = self.at.pop(old)
                self.held[self.at[new]] = new
                touched |= {old, new}
            elif r < 0.75 and (place := self._free(rnd)):
                id_ = rnd.choice(ids)
                self._move(conn, id_, place)
                touched.add(id_)
            elif (place := self._free(rnd)):
                # A leaves its slot (to a free one, or cancelled), B takes it, C maybe takes B's.
                a, b, c = rnd.sample(ids, 3)
                left = self.at[a]
                if rnd.random() < 0.3:
                    conn.execute("DELETE FROM booking WHERE id = %s", (a,))
                    del self.held[self.at.pop(a)]
                else:
                    self._move(conn, a, place)
                left_b = self.at[b]
                self._move(conn, b, left)
                if rnd.random() < 0.5:
                    self._move(conn, c, left_b)
                    touched.add(c)
                touched |= {a, b}
                self.vacated += 1
            keys = sorted(touched)
            m, cols = sql.Identifier(MIRROR), sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
            conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(m), (keys,))
            conn.execute(sql.SQL("INSERT INTO {m} ({c}) SELECT {c} FROM booking WHERE id = ANY(%s)").format(
                m=m, c=cols), (keys,))

    def _loop(self) -> None:
        rnd = random.Random(self.seed)
        with psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None) as conn:
            self._state(conn)
            while not self.stop.is_set():
                if self.paused.is_set():
                    self.idle.set()
                    self.stop.wait(0.01)
                    continue
                self.idle.clear()
                try:
                    self._step(conn, rnd)
                    self.ops += 1
                except psycopg.Error as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    self._state(conn)  # rolled back: read the table again
                self.stop.wait(0.003)  # busy, not a tight loop: the machine is shared
            self.idle.set()


PLAN = """
[migration]
name = "booking"
source = "booking"

[target]
columns = {{ id = "bigint" }}
{partition}
[backfill]
range_rows = 50

[rollback]
window = "1h"
"""


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned-by-room"])
def test_bookings_keep_their_exclusion_constraint_through_every_step(db_dsn, tmp_path, partitioned):
    """Under the writer, through run, cutover, the window, rollback, a second cutover and retire:
    the live table always has `booking_no_overlap` with the source's definition, the other table
    its copy under mover's name; each table equals what the application committed (mirror) at
    every phase; no replay failed. Partitioned by room (the constraint compares it with =) where
    PostgreSQL takes an exclusion constraint on a partitioned table (17 and later)."""
    if partitioned and server_version(db_dsn) < 170000:
        pytest.skip("PostgreSQL before 17 takes no exclusion constraint on a partitioned table (plan check refuses"
                    " it: tests/integration/test_plan_check.py)")
    create_bookings(db_dsn)
    partition = ('[target.partition]\nby = "hash"\ncolumn = "room"\nmodulus = 3\naccept_key_change = true\n'
                 if partitioned else "")
    plan = write_plan(tmp_path / "booking.toml", PLAN.format(partition=partition))
    writer = BookingWriter(db_dsn).start()
    timer = threading.Timer(300, writer.stop.set)  # a stuck step cannot leave it running
    timer.start()

    def phase(expect: dict[str, dict[str, str]], *tables: str) -> None:
        writer.pause()
        try:
            assert exclusions(db_dsn) == expect
            assert_oracle(db_dsn, *tables)
        finally:
            writer.resume()

    try:
        r = mover(db_dsn, "run", plan)
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        mine = f"booking_no_overlap_m{migration_id(db_dsn)}"
        original = {"booking_no_overlap": DEFINITION}
        copy = {mine: DEFINITION}
        writer.pause()
        r = mover(db_dsn, "run", "booking")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        writer.resume()
        phase({"booking": original, "booking_new": copy}, "booking", "booking_new")

        r = mover(db_dsn, "cutover", "booking")
        assert r.returncode == 0, r.stderr
        phase({"booking": original, "booking_old": copy}, "booking")
        r = mover(db_dsn, "run", "booking")  # the window: the old table follows, meeting its constraint
        assert r.returncode == 3, r.stderr
        writer.pause()
        assert mover(db_dsn, "run", "booking").returncode == 3
        writer.resume()
        phase({"booking": original, "booking_old": copy}, "booking", "booking_old")

        r = mover(db_dsn, "rollback", "booking")
        assert r.returncode == 0, r.stderr
        phase({"booking": original, "booking_new": copy}, "booking")
        r = mover(db_dsn, "run", "booking")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        writer.pause()
        assert mover(db_dsn, "run", "booking").returncode == 3
        writer.resume()
        phase({"booking": original, "booking_new": copy}, "booking", "booking_new")

        r = mover(db_dsn, "cutover", "booking")
        assert r.returncode == 0, r.stderr
        assert mover(db_dsn, "run", "booking").returncode == 3
        writer.pause()
        assert mover(db_dsn, "run", "booking").returncode == 3
        writer.resume()
        phase({"booking": original, "booking_old": copy}, "booking", "booking_old")
        r = mover(db_dsn, "retire", "booking", "--force")
        assert r.returncode == 0, r.stderr
        phase({"booking": original}, "booking")
        r = mover(db_dsn, "parity", "booking", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["equal"], r.stdout
    finally:
        writer.halt()
        timer.cancel()
    assert writer.errors == []
    assert writer.ops > 100 and writer.vacated > 10, (writer.ops, writer.vacated)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM mover.divergences").fetchone()[0] == 0


def test_rows_the_old_table_cannot_hold_are_divergences_before_its_constraint_retire_goes_ahead(db_dsn, tmp_path):
    """In the rollback window the new table takes two bookings of rooms 1.04 and 1.01 at one
    time (room widened to numeric(5,2)); the old table's numeric(4,1) would hold both as room 1.0,
    where its exclusion constraint would reject the second. The way back refuses both first: a
    value that does not come back unchanged is never written (mover/sql/mapping.py `checked`), so
    no rounded row can meet the old table's constraint. Each is a divergence (the application's
    insert succeeded, nothing stuck): rollback refuses without --give-up-rows, naming the rows;
    retire goes ahead, the rows live on."""
    create_bookings(db_dsn, "numeric(4,1)", rows=[(1, 1.0, slot(0), "n"), (2, 2.0, slot(0), "n")])
    plan = write_plan(tmp_path / "booking.toml",
                      PLAN.replace('id = "bigint"', 'room = "numeric(5,2)"').format(partition=""))
    assert mover(db_dsn, "run", plan).returncode == 3
    r = mover(db_dsn, "cutover", "booking")
    assert r.returncode == 0, r.stderr
    for id_, room in ((10, 1.04), (11, 1.01)):
        app_execute(db_dsn, "INSERT INTO booking VALUES (%s, %s, tsrange(%s, %s), 'window')", (id_, room, *slot(5)))
    r = mover(db_dsn, "run", "booking")
    message = " ".join(r.stderr.split())
    assert r.returncode == 3 and "2 rows exist only in" in message, message
    assert "'1.04' comes back as '1.00'" in message and "'1.01' comes back as '1.00'" in message, message
    r = mover(db_dsn, "rollback", "booking")
    assert r.returncode == 3, r.stderr
    message = " ".join(r.stderr.split())
    assert "key ['10']" in message and "key ['11']" in message and "--give-up-rows" in message, message
    r = mover(db_dsn, "retire", "booking", "--force")
    assert r.returncode == 0, r.stderr
    assert exclusions(db_dsn) == {"booking": {"booking_no_overlap": DEFINITION}}
    assert_oracle(db_dsn, "booking")


def test_a_constraint_the_converted_rows_break_stops_the_backfill_until_they_fit(db_dsn, tmp_path):
    """A lossy type change (room numeric(4,1) -> integer, accepted) makes rooms 1.4 and 1.0 one
    room 1, booked at one time: the new table's exclusion constraint cannot be built over the
    copied rows. The backfill stops (exit 1) naming the constraint, the conflicting values and the
    way on; `mover run` stops the same way until the application's rows fit, then goes on to the
    gate with the constraint built."""
    create_bookings(db_dsn, "numeric(4,1)", rows=[(1, 1.4, slot(0), "a"), (2, 1.0, slot(0), "b"),
                                                  (3, 3.0, slot(1), "c")])
    plan = write_plan(tmp_path / "booking.toml", PLAN.replace('id = "bigint" }}', 'room = "integer" }}\n'
                                                             'accept_lossy = ["room"]').format(partition=""))
    for _ in range(2):
        r = mover(db_dsn, "run", plan)
        assert r.returncode == 1, r.stderr
        message = " ".join(r.stderr.split())
        assert 'constraint "booking_no_overlap" of "public"."booking" cannot be built' in message, message
        assert "Key (room, during)=(1, " in message and "mover run booking" in message, message
        plan = "booking"
    app_execute(db_dsn, "UPDATE booking SET room = 2 WHERE id = 1")
    r = mover(db_dsn, "run", "booking")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    assert exclusions(db_dsn)["booking_new"] == {f"booking_no_overlap_m{migration_id(db_dsn)}": DEFINITION}
    assert_oracle(db_dsn, "booking_new")


@pytest.mark.parametrize("point", ["index_building", "index_build_done"])
def test_a_crash_in_the_constraint_build_resumes_and_builds_it_once(db_dsn, tmp_path, point):
    """kill -9 of `mover run` before the constraint's transaction, and inside it after ADD CONSTRAINT
    (with its ACCESS EXCLUSIVE lock on the new table and the applier lock held by the orphaned
    backend until it notices or is cancelled): `mover run` carries on, builds the constraint once,
    and the tables hold what the application committed."""
    create_bookings(db_dsn)
    plan = write_plan(tmp_path / "booking.toml", PLAN.format(partition=""))
    r = mover(db_dsn, "run", plan, env={"MOVER_FAULT": f"kill@{point}"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    app_execute(db_dsn, "UPDATE booking SET note = 'after the crash' WHERE id < 2000")
    r = mover(db_dsn, "run", "booking")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    assert exclusions(db_dsn)["booking_new"] == {f"booking_no_overlap_m{migration_id(db_dsn)}": DEFINITION}
    assert_oracle(db_dsn, "booking", "booking_new")
