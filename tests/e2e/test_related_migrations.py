"""Two migrations of related tables at once (issue 21, item 6): the parent's cutover re-creates the
child's foreign key NOT VALID and validates it after its lock. The child's migration meets the
key NOT VALID in between: a validation-state flip of an otherwise unchanged constraint, made by
another migration, is not a change of the child's shape (invariant 7) and never a reason to abort."""

from __future__ import annotations

import threading
import time

import psycopg

from tests import workload
from tests.workload import Writer, finish, mover, plan_text, spawn, write_plan

ORDERS = plan_text("orders", '"Orders"', columns={"id": "bigint"}, backfill={"range_rows": 500})

ACCOUNTS = plan_text("accounts", "accounts", columns={"id": "bigint"})


def test_the_childs_migration_goes_on_while_the_parents_cutover_validates_its_key(db_dsn, tmp_path):
    workload.create_orders(db_dsn, 3000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO accounts SELECT g, 'a' || g FROM generate_series(0, 999) g")
        conn.execute('ALTER TABLE "Orders" ADD CONSTRAINT "Orders_Account_fkey" FOREIGN KEY ("Account")'
                     " REFERENCES accounts")
    writer = Writer(db_dsn, seed=21).start()
    try:
        r = mover(db_dsn, "run", write_plan(tmp_path / "orders.toml", ORDERS))
        assert r.returncode == 3, r.stderr
        r = mover(db_dsn, "run", write_plan(tmp_path / "accounts.toml", ACCOUNTS))
        assert r.returncode == 3, r.stderr
        # The parent's cutover, held after its swap committed and before it validates the key.
        release = tmp_path / "release"
        proc = spawn(db_dsn, "cutover", "accounts",
                     env={"MOVER_FAULT": "hang@validate", "MOVER_FAULT_RELEASE": str(release)})
        try:
            line = proc.stderr.readline()
            while line and "hanging at validate" not in line:
                line = proc.stderr.readline()
            assert line, "the parent's cutover ended before it validated the key"
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                assert conn.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'Orders_Account_fkey'"
                                    ).fetchone() == (False,)
            r = mover(db_dsn, "run", "orders")  # the child's reconcile at the gate checks its shape
            assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
            assert "mover abort" not in r.stderr, r.stderr
        finally:
            release.touch()
        code, err = finish(proc, 120)
        assert code == 0, err
        r = mover(db_dsn, "run", "orders")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        r = mover(db_dsn, "cutover", "orders")
        assert r.returncode == 0, r.stderr
        writer.pause()
        r = mover(db_dsn, "run", "orders")
        assert r.returncode == 3, r.stderr
    finally:
        writer.halt()
    assert writer.errors == [], writer.errors[:5]
    workload.assert_oracle(db_dsn, "Orders", "Orders_old")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT conrelid::regclass::text, confrelid::regclass::text, convalidated"
                            " FROM pg_constraint WHERE conname = 'Orders_Account_fkey'").fetchall() == \
            [('"Orders"', "accounts", True)]


def test_the_childs_migration_reads_its_catalog_while_the_parents_swaps_come_and_go(db_dsn, tmp_path):
    """Issue 34 item 6 (race 10): the child's backfill and reconcile read its shape while the
    parent's cutovers and rollbacks drop and re-create the child's foreign key. A read whose scan
    found the old key printed it as NULL and crashed the child's backfill (AttributeError). Now
    the read is made again: through rounds of swaps under a writer, every run of the child ends
    as a run does (exit 3 at the gate), no Python error escapes, and after its own cutover the
    application's mirror (an independent oracle) matches both tables."""
    workload.create_orders(db_dsn, 20_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO accounts SELECT g, 'a' || g FROM generate_series(0, 999) g")
        conn.execute('ALTER TABLE "Orders" ADD CONSTRAINT "Orders_Account_fkey" FOREIGN KEY ("Account")'
                     " REFERENCES accounts")
    r = mover(db_dsn, "run", write_plan(tmp_path / "accounts.toml", ACCOUNTS))
    assert r.returncode == 3, r.stderr
    child = write_plan(tmp_path / "orders.toml", plan_text("orders", '"Orders"', columns={"id": "bigint"},
                                                           backfill={"range_rows": 100, "min_rows": 100,
                                                                     "max_rows": 100}))
    writer = Writer(db_dsn, seed=34).start()
    runs: list[tuple[int, str]] = []
    swapping = threading.Event()
    swapping.set()

    def child_runs() -> None:
        # the child's backfill first, then reconcile passes at its gate, as long as the parent swaps
        plan = child
        while swapping.is_set() or not runs:
            r = mover(db_dsn, "run", plan)
            runs.append((r.returncode, r.stderr))
            plan = "orders"

    thread = threading.Thread(target=child_runs)
    try:
        thread.start()
        deadline = time.monotonic() + 120
        swaps, overlapped = 0, 0
        while swaps < 10 and time.monotonic() < deadline:
            overlapped += thread.is_alive()  # the child's run goes on meanwhile
            r = mover(db_dsn, "cutover", "accounts")
            assert r.returncode == 0, r.stderr
            r = mover(db_dsn, "rollback", "accounts")
            assert r.returncode == 0, r.stderr
            r = mover(db_dsn, "run", "accounts")
            assert r.returncode == 3, r.stderr
            swaps += 2
        swapping.clear()
        thread.join(300)
        assert not thread.is_alive()
        assert swaps >= 2 and overlapped and runs, (swaps, overlapped, len(runs))
        for code, err in runs:
            assert code == 3 and "ready for cutover" in err, err
            assert "Error" not in err and "mover abort" not in err, err
        r = mover(db_dsn, "run", "orders")
        assert r.returncode == 3, r.stderr
        r = mover(db_dsn, "cutover", "orders")
        assert r.returncode == 0, r.stderr
        writer.pause()
        r = mover(db_dsn, "run", "orders")
        assert r.returncode == 3, r.stderr
    finally:
        swapping.clear()
        writer.halt()
        thread.join(300)
    assert writer.errors == [], writer.errors[:5]
    workload.assert_oracle(db_dsn, "Orders", "Orders_old")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT conrelid::regclass::text, confrelid::regclass::text, convalidated"
                            " FROM pg_constraint WHERE conname = 'Orders_Account_fkey'").fetchall() == \
            [('"Orders"', "accounts", True)]
