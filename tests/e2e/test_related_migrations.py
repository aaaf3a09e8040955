"""Two migrations of related tables at once (issue 21, item 6): the parent's cutover re-creates the
child's foreign key NOT VALID and validates it after its lock. The child's migration meets the
key NOT VALID in between: a validation-state flip of an otherwise unchanged constraint, made by
another migration, is not a change of the child's shape (invariant 7) and never a reason to abort."""

from __future__ import annotations

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
