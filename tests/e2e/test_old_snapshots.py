"""Old snapshots across the swap (invariant 16, mover/engines/swap/snapshots.py): REPEATABLE READ and
SERIALIZABLE readers whose snapshot could not see the table that takes the name complete are
waited for before the cutover's and the rollback's lock, named, refused after [cutover]
snapshot_wait, or terminated with terminate_blockers; never left to read that table by name.
The oracle: the mirror the application writes in the same transaction (tests/workload.py)."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.workload import Spawned, Writer, create_orders, differences, mover, plan_file

ISOLATIONS = ("REPEATABLE READ", "SERIALIZABLE")


def plan(tmp_path, method: str = "trigger", **cutover) -> str:
    return plan_file(tmp_path, "snap", columns={"id": "bigint"}, capture={"method": method},
                     cutover={"lock_timeout": "200ms", "attempts": 3, "snapshot_wait": "1s", **cutover})


def sql(dsn, statement, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def status(dsn) -> dict:
    r = mover(dsn, "status", "snap", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def step(dsn) -> str:
    return status(dsn)["step"]


def reader(dsn, isolation) -> psycopg.Connection:
    """An application's reader whose snapshot is taken now, without touching "Orders" (it holds no
    lock on it: the swap's lock does not wait for it)."""
    conn = psycopg.connect(dsn, application_name="app-report")
    conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
    conn.execute("SELECT 1")
    return conn


def mirror_count(dsn) -> int:
    return sql(dsn, 'SELECT count(*) FROM "Orders_mirror"')[0][0]


def app_changes(dsn) -> tuple[int, int]:
    """What the issue's reader missed: an insert and an update, committed (mirrored) by the application.
    Returns (the new row's id, row 7's amount after the update)."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        (new_id,) = conn.execute('INSERT INTO "Orders" ("Account", amount, status, note) VALUES (1, 1, \'new\', \'i\')'
                                 ' RETURNING id').fetchone()
        (amount,) = conn.execute('UPDATE "Orders" SET amount = amount + 1000 WHERE id = 7 RETURNING amount').fetchone()
        conn.execute('INSERT INTO "Orders_mirror" SELECT * FROM "Orders" WHERE id = %s', (new_id,))
        conn.execute('UPDATE "Orders_mirror" SET amount = %s WHERE id = 7', (amount,))
    return new_id, amount


def same_as_mirror(conn) -> bool:
    """In the reader's own snapshot: "Orders" by name holds exactly the mirror's rows (the
    application writes both in one transaction)."""
    q = 'SELECT count(*) FROM (SELECT * FROM "{}" EXCEPT ALL SELECT * FROM "{}") d'
    return [conn.execute(q.format(a, b)).fetchone()[0]
            for a, b in (("Orders", "Orders_mirror"), ("Orders_mirror", "Orders"))] == [0, 0]


def oid(dsn, table) -> int:
    return sql(dsn, "SELECT to_regclass(%s)::oid::int", (table,))[0][0]


@pytest.mark.parametrize("method", ["trigger", "logical"])
def test_readers_older_than_the_backfill_refuse_the_cutover(db_dsn, tmp_path, method):
    """(a) Snapshots taken before the backfill: the cutover waits, names them, and with its short bound
    refuses (exit 3) having changed nothing; they still read every row, and update row 7 (not 0 rows,
    not an UPDATE of nothing). Once they end, the cutover goes through. Either capture method."""
    create_orders(db_dsn, 2_000)
    readers = [reader(db_dsn, iso) for iso in ISOLATIONS]
    r = mover(db_dsn, "run", plan(tmp_path, method))
    assert r.returncode == 3, r.stderr
    before = oid(db_dsn, '"Orders"')
    r = mover(db_dsn, "cutover", "snap")
    err = " ".join(r.stderr.split())  # the console wraps long lines
    assert r.returncode == 3, err
    for conn in readers:
        assert f"pid {conn.info.backend_pid} (user " in err, err
    assert "snapshot_wait" in err and "'app-report'" in err and "idle in transaction holding a snapshot" in err, err
    assert "nothing was changed" in err and "terminate_blockers" in err, err
    st = status(db_dsn)
    assert st["step"] == "cutover" and oid(db_dsn, '"Orders"') == before  # nothing swapped
    assert all(f"pid {conn.info.backend_pid}" in st["error"] for conn in readers), st["error"]  # and in status
    for conn in readers:
        assert conn.execute('SELECT count(*) FROM "Orders"').fetchone() == (2_000,)
        assert conn.execute('UPDATE "Orders" SET note = note WHERE id = 7').rowcount == 1
        conn.rollback()
        conn.close()
    assert mover(db_dsn, "cutover", "snap").returncode == 0
    assert step(db_dsn) == "rollback_window"
    assert differences(db_dsn, "Orders", "Orders_mirror") == (0, 0)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_cutover_waits_for_a_reader_and_goes_on_when_it_ends(db_dsn, tmp_path, isolation):
    """(b, e) A snapshot taken after the application committed an insert and an update, before the
    cutover: the cutover says it waits for it (its pid), and once it ends the cutover goes through.
    A writer throughout; the reader, and a reader after the swap, each see in their own snapshot
    exactly the rows of the mirror."""
    create_orders(db_dsn, 2_000)
    assert mover(db_dsn, "run", plan(tmp_path, snapshot_wait="60s")).returncode == 3
    with Writer(db_dsn, delay=0.005) as writer:
        app_changes(db_dsn)
        conn = reader(db_dsn, isolation)
        cut = Spawned(db_dsn, "cutover", "snap", env={})
        assert cut.wait_for("snapshot_wait", 60), "".join(cut.err)
        assert f"pid {conn.info.backend_pid}" in "".join(cut.err)
        assert same_as_mirror(conn)
        conn.commit()
        assert cut.wait(60) == 0, "".join(cut.err)
        conn.close()
        writer.wait_for_ops(writer.ops + 20)
        after = reader(db_dsn, isolation)
        assert same_as_mirror(after)
        after.close()
    assert writer.errors == []
    assert step(db_dsn) == "rollback_window"
    assert differences(db_dsn, "Orders", "Orders_mirror") == (0, 0)


def test_terminate_blockers_ends_an_old_reader(db_dsn, tmp_path):
    """(c) With terminate_blockers: the reader is terminated after snapshot_wait and blocker_grace
    (it is idle in its transaction: a cancel does nothing), recorded, and the cutover completes."""
    create_orders(db_dsn, 2_000)
    conn = reader(db_dsn, "REPEATABLE READ")
    pid = conn.info.backend_pid
    assert mover(db_dsn, "run", plan(tmp_path, snapshot_wait="300ms", terminate_blockers=True,
                                     blocker_grace="200ms")).returncode == 3
    r = mover(db_dsn, "cutover", "snap")
    assert r.returncode == 0, r.stderr
    ((message, detail),) = sql(db_dsn, "SELECT message, detail FROM mover.events WHERE kind = 'blockers_cancelled'")
    assert f"terminated pid {pid}" in message, message
    assert [(s["pid"], s["application_name"]) for s in detail["sessions"]] == [(pid, "app-report")]
    with pytest.raises(psycopg.OperationalError):
        conn.execute('SELECT count(*) FROM "Orders"')  # it would have read 0 rows
    conn.close()
    assert step(db_dsn) == "rollback_window"
    assert differences(db_dsn, "Orders", "Orders_mirror") == (0, 0)


def test_the_rollback_waits_for_readers_older_than_its_last_drain(db_dsn, tmp_path):
    """(d) In the window: readers whose snapshots predate an insert and an update the application
    made to the new table. The rollback names them and refuses (exit 3, nothing swapped back); one
    ends, a second rollback waits for the other, which then ends: the rollback goes through. A
    writer throughout; the old table, back under the name, holds exactly the mirror's rows."""
    create_orders(db_dsn, 2_000)
    assert mover(db_dsn, "run", plan(tmp_path)).returncode == 3
    assert mover(db_dsn, "cutover", "snap").returncode == 0
    with Writer(db_dsn, delay=0.005) as writer:
        readers = [reader(db_dsn, iso) for iso in ISOLATIONS]
        app_changes(db_dsn)
        live = oid(db_dsn, '"Orders"')
        r = mover(db_dsn, "rollback", "snap")
        err = " ".join(r.stderr.split())
        assert r.returncode == 3, err
        assert all(f"pid {c.info.backend_pid} (user " in err for c in readers), err
        assert "could not swap back" in err and "mover rollback snap" in err, err
        assert step(db_dsn) == "rollback_window" and oid(db_dsn, '"Orders"') == live
        readers[0].commit()
        assert mover(db_dsn, "set", "snap", "cutover.snapshot_wait=60s").returncode == 0
        back = Spawned(db_dsn, "rollback", "snap", env={})
        assert back.wait_for("snapshot_wait", 60), "".join(back.err)
        assert f"pid {readers[1].info.backend_pid}" in "".join(back.err)
        assert f"pid {readers[0].info.backend_pid}" not in "".join(back.err)
        readers[1].commit()
        assert back.wait(60) == 0, "".join(back.err)
        for conn in readers:
            conn.close()
        writer.wait_for_ops(writer.ops + 20)
        after = reader(db_dsn, "SERIALIZABLE")
        assert same_as_mirror(after)
        after.close()
    assert writer.errors == []
    assert oid(db_dsn, '"Orders"') != live  # swapped back
    assert differences(db_dsn, "Orders", "Orders_mirror") == (0, 0)


def test_a_familys_swap_and_swap_back_wait_for_old_readers(db_dsn, tmp_path):
    """A family's swap and swap back (steps/cutover.py, for every table at once) wait as one table's do: a SERIALIZABLE
    reader from before the backfill refuses the cutover (its pid named, nothing swapped) and reads
    every row; a REPEATABLE READ reader in the window refuses the rollback; each ended, the swap
    goes through. The application's mirrors are the oracle."""
    from tests.e2e.test_family import PLAN, assert_mirrored, create

    create(db_dsn)
    old = reader(db_dsn, "SERIALIZABLE")
    plan_path = tmp_path / "family.toml"
    plan_path.write_text(PLAN + '\n[cutover]\nlock_timeout = "200ms"\nattempts = 3\nsnapshot_wait = "500ms"\n')
    assert mover(db_dsn, "run", str(plan_path)).returncode == 3
    customers = oid(db_dsn, "customers")
    r = mover(db_dsn, "cutover", "family")
    err = " ".join(r.stderr.split())
    assert r.returncode == 3 and f"pid {old.info.backend_pid} (user " in err, err
    assert oid(db_dsn, "customers") == customers  # no table swapped
    assert old.execute("SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM customers)").fetchone() \
        == (3_000, 1_500)
    old.rollback()
    old.close()
    assert mover(db_dsn, "cutover", "family").returncode == 0
    window = reader(db_dsn, "REPEATABLE READ")
    r = mover(db_dsn, "rollback", "family")
    err = " ".join(r.stderr.split())
    assert r.returncode == 3 and f"pid {window.info.backend_pid} (user " in err, err
    assert oid(db_dsn, "customers") != customers  # still swapped in
    window.rollback()
    window.close()
    assert mover(db_dsn, "rollback", "family").returncode == 0
    assert oid(db_dsn, "customers") == customers
    assert_mirrored(db_dsn)


def test_older_snapshots_are_found_across_wraparound_and_without_pg_read_all_stats(db_dsn):
    """The comparison with X is modulo 2^32 (age()), as xids wrap: an X 2^31 - 100 behind finds no
    snapshot older, one 2^31 - 100 ahead finds the reader (a plain comparison of the numbers says
    the opposite for one of them). A role without pg_read_all_stats sees the reader's snapshot but
    not its state: still found, named as such."""
    from mover.engines.swap import snapshots

    conn = reader(db_dsn, "REPEATABLE READ")
    sql(db_dsn, "SELECT txid_current()")  # a transaction after the reader's snapshot
    role = f"snap_{conn.info.dbname}"  # roles are the server's: one per test database
    sql(db_dsn, f'CREATE ROLE "{role}" LOGIN')
    try:
        with psycopg.connect(db_dsn, autocommit=True) as admin, admin.cursor() as cur:
            x = snapshots.next_xid(cur)
            assert [h.pid for h in snapshots.holders(cur, x)] == [conn.info.backend_pid]
            assert snapshots.holders(cur, (x - 2**31 + 100) % 2**32) == []
            assert [h.pid for h in snapshots.holders(cur, (x + 2**31 - 100) % 2**32)] == [conn.info.backend_pid]
        plain = psycopg.conninfo.make_conninfo(db_dsn, user=role)
        with psycopg.connect(plain, autocommit=True) as other, other.cursor() as cur:
            (found,) = snapshots.holders(cur, snapshots.next_xid(cur))
            assert found.pid == conn.info.backend_pid and "pg_read_all_stats" in found.describe(), found
    finally:
        conn.close()
        sql(db_dsn, f'DROP ROLE "{role}"')
