"""Logical capture ([capture] method = "logical"): the source's changes read from the WAL through
mover's replication slot into the change log (mover/engines/capture/logical.py). kill -9 at the feeder's
points and inside the swap, then resume; the slot's creation waiting for running transactions; a
difference that is only feeder lag never becomes a divergence; a lost slot stops the migration and
`mover recapture` recovers; nothing that keeps WAL is left behind a crash. Judged by the writer's
mirror (assert_oracle), never by mover's reconcile alone.

The suite's server runs with wal_level = logical (tests/conftest.py). Two tests need server settings
of their own (a slow WAL writer, a bound on the WAL a slot may keep) and get a server of their own."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator

import psycopg
import pytest

from mover import api
from mover.demo.embedded import EmbeddedPostgres
from tests.conftest import dsn_with_dbname
from tests.workload import (
    Spawned,
    Writer,
    app_execute,
    assert_oracle,
    create_orders,
    differences,
    mover,
    write_plan,
)

PLAN = """
[migration]
name = "wal"
source = 'public."Orders"'

[target]
columns = {{ id = "bigint" }}

[backfill]
range_rows = 1000
max_rows = 1000

[rollback]
window = "1h"

[capture]
method = "logical"
{capture}
"""


def plan_file(tmp_path, capture="", name="wal.toml"):
    return write_plan(tmp_path / name, PLAN.format(capture=capture))


@pytest.fixture
def orders(db_dsn, tmp_path):
    create_orders(db_dsn, 6_000)
    return plan_file(tmp_path)


def status(dsn, name="wal"):
    r = mover(dsn, "status", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def slots(dsn) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots"
                                           " WHERE database = current_database() ORDER BY 1")]


def publications(dsn) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT pubname FROM pg_publication ORDER BY 1")]


def events(dsn, kind) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT message FROM mover.events WHERE kind = %s ORDER BY id", (kind,))]


def settle_and_compare(dsn, writer, live="Orders", other="Orders_new"):
    writer.pause()
    r = mover(dsn, "run", "wal")
    assert r.returncode == 3, r.stderr
    assert differences(dsn, live, other) == (0, 0)
    assert_oracle(dsn, live, other)
    writer.resume()


@pytest.mark.parametrize("point,when", [
    ("feed:inserted", "backfill"), ("after:install_capture", "backfill"),
    ("feed:inserted", "gate"), ("feed:committed", "gate"), ("feed:advanced", "gate"),
])
def test_kill9_at_the_feeders_points_then_resume(db_dsn, orders, point, when):
    """Inside the feed's transaction (its keys and position lost together), after its commit and
    before the slot's advance (the next feed advances it first), after the advance: the resumed
    run reaches the gate with every committed write in the target. At the gate every range is
    copied: a change a crash dropped from the stream would be lost for good."""
    writer = Writer(db_dsn, seed=hash(point) % 1000).start()
    try:
        if when == "gate":
            assert mover(db_dsn, "run", orders).returncode == 3
            orders = "wal"
        r = mover(db_dsn, "run", orders, env={"MOVER_FAULT": f"kill@{point}"})
        assert r.returncode == -signal.SIGKILL, r.stderr
        assert len(slots(db_dsn)) == 1
        r = mover(db_dsn, "run", "wal")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        settle_and_compare(db_dsn, writer)
        slot = status(db_dsn)["capture"]["slot"]
        assert slot["exists"] and slot["keys"] > 0 and slot["fed_lsn"] is not None, slot
        r = mover(db_dsn, "cutover", "wal")
        assert r.returncode == 0, r.stderr
        writer.pause()
        assert_oracle(db_dsn, "Orders")
    finally:
        writer.halt()
    assert writer.errors == []
    assert slots(db_dsn) == [] and publications(db_dsn) == []


def test_kill9_inside_the_swap_after_its_feed_and_before_the_slots_drop(db_dsn, orders):
    """Killed under the swap's lock after the last feed: nothing swapped, the slot still read by the
    next cutover. Killed after the swap committed, before the slot's drop: the next run drops it."""
    writer = Writer(db_dsn, seed=5).start()
    try:
        assert mover(db_dsn, "run", orders).returncode == 3
        r = mover(db_dsn, "cutover", "wal", env={"MOVER_FAULT": "kill@swap:fed"})
        assert r.returncode == -signal.SIGKILL, r.stderr
        st = status(db_dsn)
        assert st["step"] == "cutover" and st["cutover"] is None and st["capture"]["slot"]["exists"]
        r = mover(db_dsn, "cutover", "wal", env={"MOVER_FAULT": "kill@swap:before_slot_drop"})
        assert r.returncode == -signal.SIGKILL, r.stderr
        writer.pause()
        assert_oracle(db_dsn, "Orders")  # swapped, nothing lost
        assert len(slots(db_dsn)) == 1 and publications(db_dsn) == []  # the slot outlived the swap
        r = mover(db_dsn, "run", "wal")  # the window: syncs the old table, and drops the slot first
        assert r.returncode == 3, r.stderr
        assert slots(db_dsn) == [], "the next run did not drop the slot the crash left"
        assert any("replication slot" in m for m in events(db_dsn, "capture_cleaned"))
        assert_oracle(db_dsn, "Orders", "Orders_old")
    finally:
        writer.halt()
    assert writer.errors == []


def test_a_crash_before_aborts_slot_drop_is_cleaned_by_the_next_run(db_dsn, orders):
    assert mover(db_dsn, "step", orders).returncode == 0  # create_target
    assert mover(db_dsn, "step", "wal").returncode == 0  # install_capture: publication and slot
    assert len(slots(db_dsn)) == 1 and len(publications(db_dsn)) == 1
    r = mover(db_dsn, "abort", "wal", env={"MOVER_FAULT": "kill@abort:before_slot_drop"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert status(db_dsn)["state"] == "aborted"
    left = slots(db_dsn)
    assert len(left) == 1 and publications(db_dsn) == []  # the publication went with the abort
    # The same plan again: a new migration, whose run drops what the aborted one left.
    assert mover(db_dsn, "step", orders).returncode == 0
    now = slots(db_dsn)
    assert left[0] not in now, now
    assert mover(db_dsn, "abort", "wal").returncode == 0
    assert slots(db_dsn) == [] and publications(db_dsn) == []


def test_slot_creation_waits_for_running_transactions_and_names_them(db_dsn, tmp_path):
    """Creating the slot waits for every transaction holding a transaction id to end: bounded by
    [capture] slot_wait, then exit 3 naming the session, nothing created; once it ended, the run
    goes on."""
    create_orders(db_dsn, 2_000)
    plan = plan_file(tmp_path, 'slot_wait = "2s"')
    assert mover(db_dsn, "step", plan).returncode == 0  # create_target
    blocker = psycopg.connect(db_dsn)
    try:
        pid = blocker.info.backend_pid
        blocker.execute("SELECT pg_current_xact_id()")  # an open transaction with an id
        r = mover(db_dsn, "step", "wal")
        assert r.returncode == 3, r.stderr
        assert re.search(rf"could not create the replication slot mover_m\d+_d\d+ .* within 2000 ms.* pid {pid} ",
                         r.stderr), r.stderr
        assert "pg_terminate_backend" in r.stderr and "slot_wait" in r.stderr, r.stderr
        assert slots(db_dsn) == []
    finally:
        blocker.rollback()
        blocker.close()
    r = mover(db_dsn, "run", "wal")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_a_change_not_yet_fed_when_reconcile_reads_is_not_a_divergence(db_dsn, orders, tmp_path):
    """Rows changed after the last feed and before a range is compared differ there, with no
    change pending in the log: re-checked once the log is fed, not recorded."""
    assert mover(db_dsn, "run", orders).returncode == 3
    release = tmp_path / "release"
    p = Spawned(db_dsn, "reconcile", "wal", "--full", "--json",
                env={"MOVER_FAULT": "hang@reconcile_claimed:1", "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert p.wait_for("hanging at reconcile_claimed:1"), "".join(p.err)
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            app_execute(conn, "UPDATE {t} SET note = 'after the feed' WHERE id BETWEEN 1 AND 40")
        release.touch()
        assert p.proc.wait(120) == 0, "".join(p.err)
    finally:
        p.kill()
    assert status(db_dsn)["divergences"] == 0
    assert mover(db_dsn, "run", "wal").returncode == 3
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_a_range_whose_differences_settle_does_not_read_the_slot_again_before_its_last_look(db_dsn, orders,
                                                                                           monkeypatch):
    """A range that differs only by changes not yet fed: the settling rounds feed and replay them,
    and the range's last transaction finds every key equal, so it reads nothing more from the slot
    (each read decodes again from the slot's restart point); it feeds there only when a key still
    differs with nothing pending (test_a_change_not_yet_fed_when_reconcile_reads_is_not_a_divergence)."""
    from mover import faults
    from mover.engines.capture import logical
    assert mover(db_dsn, "run", orders).returncode == 3
    point = faults.point

    def change_when_claimed(name: str) -> None:
        if name == "reconcile_claimed:1":  # the pass's first range claimed, not yet compared
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                app_execute(conn, "UPDATE {t} SET note = 'not fed yet' WHERE id BETWEEN 1 AND 40")
        point(name)

    monkeypatch.setattr(faults, "point", change_when_claimed)
    calls = []
    feed_in = logical.feed_in
    monkeypatch.setattr(logical, "feed_in", lambda *a, **k: calls.append(1) or feed_in(*a, **k))
    r = mover(db_dsn, "reconcile", "wal", "--full", "--json", process=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pass"]["rechecked"] >= 40  # the range did differ when compared
    assert calls == []
    assert status(db_dsn)["divergences"] == 0
    assert mover(db_dsn, "run", "wal").returncode == 3
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_a_background_feed_reads_the_slot_at_most_every_few_seconds_a_whole_feed_always(db_dsn, orders, monkeypatch):
    """Every read of the slot decodes again from its restart point: a bounded feed soon after the
    last read reads nothing (the keys wait in the WAL), unless enough WAL waits; a whole feed (the
    gate's, the cutover's) reads to the end at once."""
    from mover.db import Database
    from mover.engines.capture import logical
    from mover.runner.lease import leased
    from mover.state import control
    assert mover(db_dsn, "run", orders).returncode == 3
    db = Database(db_dsn)
    m = db.transaction(lambda cur: control.get(cur, "wal"))
    log = f"mover.m{m.id}_changes"

    def write(first: int) -> None:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            app_execute(conn, "UPDATE {t} SET note = 'spaced' WHERE id BETWEEN %s AND %s", (first, first + 4))
        logical.flush(db)  # the suite's server commits asynchronously: decodable once flushed

    def logged() -> int:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            return conn.execute(f"SELECT count(*) FROM {log}").fetchone()[0]

    monkeypatch.setattr(logical, "FEED_SPACING_SECONDS", 60.0)  # (5 s: a slow machine could pass it meanwhile)
    with leased(db, m, control.new_owner_id()) as ctx:
        write(1)
        before = logged()
        logical._last_read.clear()  # (`mover run` above ran in this process and read the slot)
        assert logical.feed(ctx, catch_up=False).keys == 5  # the first read
        write(11)
        spaced = logical.feed(ctx, catch_up=False)
        assert (spaced.keys, logged()) == (0, before + 5)  # read a moment ago: not again yet
        monkeypatch.setattr(logical, "FEED_SPACING_BYTES", 1)  # as if 64 MB of WAL waited
        assert logical.feed(ctx, catch_up=False).keys == 5
        monkeypatch.setattr(logical, "FEED_SPACING_BYTES", 64 << 20)
        write(21)
        assert logical.feed(ctx, catch_up=False).keys == 0
        assert logical.feed(ctx, catch_up=True).keys == 5  # a whole feed: every change committed before it
    db.close()
    assert mover(db_dsn, "run", "wal").returncode == 3
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_hot_keys_under_logical_capture_never_become_divergences(db_dsn, orders):
    """Keys written many times a second while reconcile reads them: the differences the feeder's
    lag makes are re-checked in a snapshot whose log holds every change before it, never recorded."""
    writer = Writer(db_dsn, seed=8).start()
    hot = Writer(db_dsn, seed=9, hot=(1, 10), delay=0.005)
    try:
        assert mover(db_dsn, "run", orders).returncode == 3
        hot.start()
        rechecked = 0
        for _ in range(3):
            r = mover(db_dsn, "reconcile", "wal", "--full", "--json")
            assert r.returncode == 0, r.stderr
            rechecked += json.loads(r.stdout)["pass"]["rechecked"]
        r = mover(db_dsn, "divergences", "wal", "--json", "--all")
        assert json.loads(r.stdout) == []
        assert rechecked > 0  # the hot keys did differ when read
        hot.pause()
        writer.pause()
        assert mover(db_dsn, "run", "wal").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_new")
    finally:
        hot.halt() if hasattr(hot, "thread") else None
        writer.halt()
    assert writer.errors == [] and hot.errors == []


def test_a_dropped_slot_stops_the_migration_and_recapture_recovers(db_dsn, orders):
    writer = Writer(db_dsn, seed=21).start()
    try:
        assert mover(db_dsn, "run", orders).returncode == 3
        writer.pause()
        (slot,) = slots(db_dsn)
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            # Written while no slot reads the source: only a full comparison can find these.
            app_execute(conn, "UPDATE {t} SET note = 'unseen' WHERE id BETWEEN 100 AND 120")
            app_execute(conn, "DELETE FROM {t} WHERE id BETWEEN 200 AND 205")
        r = mover(db_dsn, "run", "wal")
        assert r.returncode == 1, r.stderr
        assert f"the replication slot {slot} of migration 'wal' is missing" in r.stderr, r.stderr
        assert "mover recapture wal" in r.stderr, r.stderr
        st = status(db_dsn)
        assert st["state"] == "failed" and "replication slot" in st["error"], st
        assert events(db_dsn, "capture_slot_lost")
        r = mover(db_dsn, "run", "wal")  # never silently past the gap
        assert r.returncode == 1, r.stderr
        r = mover(db_dsn, "recapture", "wal")
        assert r.returncode == 0, r.stderr
        assert slots(db_dsn) == [slot] and status(db_dsn)["step"] == "reconcile"
        writer.resume()
        r = mover(db_dsn, "run", "wal")  # a full pass finds what the lost slot did not deliver
        assert r.returncode == 3 and "reconcile (full)" in r.stderr, r.stderr
        assert status(db_dsn)["divergences"] >= 27, r.stderr
        writer.pause()
        r = mover(db_dsn, "repair", "wal")
        assert r.returncode == 0, r.stderr
        writer.resume()
        r = mover(db_dsn, "run", "wal")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        writer.pause()
        assert mover(db_dsn, "run", "wal").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_new")
    finally:
        writer.halt()
    assert writer.errors == []


# ---------------------------------------------------------------------------------------------
# A server of their own


@pytest.fixture(scope="module")
def slow_wal() -> Iterator[EmbeddedPostgres]:
    """A server whose WAL writer flushes an asynchronous commit only every 10 s (its longest
    delay): a commit the application made with synchronous_commit = off (the server's default
    here) stays out of the flushed WAL, which is all that decoding reads, until then."""
    with EmbeddedPostgres(fast=True, settings={"wal_level": "logical", "wal_writer_delay": "10s"}) as pg:
        yield pg


def fresh_database(pg: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = dsn_with_dbname(pg.dsn, name)
    api.init(dsn)
    return dsn


def test_the_cutover_flushes_the_wal_before_it_reads_the_stream(slow_wal, tmp_path):
    """A write committed with synchronous_commit = off just before the swap's lock is in the WAL
    buffers, not flushed: the lock's feed must flush the WAL before it reads the slot, or the write
    is lost (decoding stops at the flushed position)."""
    dsn = fresh_database(slow_wal, "flush")
    create_orders(dsn, 2_000)
    plan = plan_file(tmp_path)
    assert mover(dsn, "run", plan).returncode == 3
    release = tmp_path / "release"
    p = Spawned(dsn, "cutover", "wal",
                env={"MOVER_FAULT": "hang@swap:before_lock", "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert p.wait_for("hanging at swap:before_lock"), "".join(p.err)
        with psycopg.connect(dsn, autocommit=True) as conn:
            app_execute(conn, "UPDATE {t} SET note = 'just before the lock' WHERE id BETWEEN 1 AND 5")
            app_execute(conn, """INSERT INTO {t} (id, "Account") VALUES (-1, 1)""")
            flushed, inserted = conn.execute("SELECT pg_current_wal_flush_lsn(), pg_current_wal_insert_lsn()"
                                             ).fetchone()
        release.touch()
        assert p.proc.wait(120) == 0, "".join(p.err)
    finally:
        p.kill()
    assert_oracle(dsn, "Orders")
    (detail,) = [d for (d,) in psycopg.connect(dsn, autocommit=True).execute(
        "SELECT detail FROM mover.events WHERE kind = 'step_done' AND step = 'cutover'")]
    assert detail["fed_keys"] >= 6 and detail["feed_ms"] > 0, detail  # fed under the lock
    assert flushed != inserted  # the writes were not flushed when they committed: the test tested something


def test_a_slot_invalidated_for_its_wal_stops_the_migration(slow_wal, tmp_path):
    """max_slot_wal_keep_size: a slot that falls further behind is invalidated (wal_status lost) at
    a checkpoint. The next run stops with exit 1 saying so; recapture and a full pass recover."""
    dsn = fresh_database(slow_wal, "lost")
    create_orders(dsn, 2_000)
    plan = plan_file(tmp_path)
    assert mover(dsn, "run", plan).returncode == 3
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            app_execute(conn, "UPDATE {t} SET note = 'lost with the slot' WHERE id BETWEEN 10 AND 19")
            for _ in range(3):  # WAL past the bound, then a checkpoint removes it
                conn.execute("CREATE TABLE junk AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 60000) g")
                conn.execute("DROP TABLE junk")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
            (state,) = conn.execute("SELECT wal_status FROM pg_replication_slots WHERE database = current_database()"
                                    ).fetchone()
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
    assert state == "lost"
    r = mover(dsn, "run", "wal")
    assert r.returncode == 1, r.stderr
    assert re.search(r"the replication slot mover_m\d+_d\d+ of migration 'wal' (was invalidated|can no longer)",
                     r.stderr), r.stderr
    assert "mover recapture wal" in r.stderr, r.stderr
    assert status(dsn)["capture"]["slot"]["wal_status"] == "lost"
    assert mover(dsn, "recapture", "wal").returncode == 0
    r = mover(dsn, "run", "wal")
    assert r.returncode == 3 and "reconcile (full)" in r.stderr, r.stderr
    assert status(dsn)["divergences"] == 10
    assert mover(dsn, "repair", "wal").returncode == 0
    assert mover(dsn, "run", "wal").returncode == 3
    assert_oracle(dsn, "Orders", "Orders_new")
