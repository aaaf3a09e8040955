"""Promises the README and docs/ make, each exercised end to end through the CLI and judged by plain SQL."""

from __future__ import annotations

import json
import signal
import time

import psycopg
import pytest

from tests.workload import (
    ORDERS_DDL,
    Writer,
    assert_oracle,
    catalog_snapshot,
    create_mirror,
    create_orders,
    differences,
    finish,
    mover,
    plan_file,
    plan_text,
    spawn,
    write_plan,
)


def promise_plan(tmp_path, *, window="1h", target=None, backfill=None, reconcile=None, rollback=None) -> str:
    return plan_file(tmp_path, "promise", columns={"id": "bigint"}, target=target or {},
                     backfill={"range_rows": 1000, **(backfill or {})}, reconcile=reconcile or {},
                     rollback=rollback or {}, window=window)


def status(dsn):
    r = mover(dsn, "status", "promise", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def sql(dsn, statement, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def column_type(dsn, table, column):
    return sql(dsn, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass"
                    " AND attname = %s", (f'"{table}"', column))[0][0]


def wait_for(predicate, what: str, proc=None, timeout: float = 60):
    """Poll for an event (a row, a state), failing early if the process under test died."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"mover exited ({proc.returncode}) before {what}: {err}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ranges_done(dsn) -> int:
    return sql(dsn, "SELECT count(*) FROM mover.ranges WHERE kind = 'backfill' AND status = 'done'")[0][0]


# --- capture -----------------------------------------------------------------------------------


def test_writes_under_replica_role_are_captured_both_ways(db_dsn, tmp_path):
    """Logical replication appliers and pg_restore run with session_replication_role = replica;
    the capture triggers are ENABLE ALWAYS, so those writes reach the other table too."""
    create_orders(db_dsn, 2_000)
    plan = promise_plan(tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3

    def replica_writes(table, note):
        with psycopg.connect(db_dsn, autocommit=True) as conn, conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(f'INSERT INTO "{table}" ("Account", note) VALUES (77, %s)', (note,))
            conn.execute(f'UPDATE "{table}" SET note = %s WHERE id BETWEEN 10 AND 20', (note,))
            conn.execute(f'DELETE FROM "{table}" WHERE id BETWEEN 30 AND 40')

    replica_writes("Orders", "replica before cutover")
    assert mover(db_dsn, "run", "promise").returncode == 3  # applies the log at the gate
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
    assert sql(db_dsn, """SELECT count(*) FROM "Orders_new" WHERE note = 'replica before cutover'""")[0][0] == 12

    r = mover(db_dsn, "cutover", "promise")
    assert r.returncode == 0, r.stderr
    replica_writes("Orders", "replica in the window")
    assert mover(db_dsn, "run", "promise").returncode == 3  # applies the reverse log
    assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)
    assert sql(db_dsn, """SELECT count(*) FROM "Orders_old" WHERE note = 'replica in the window'""")[0][0] == 12


def test_truncate_of_the_new_table_is_refused_in_the_window(db_dsn, tmp_path):
    create_orders(db_dsn, 2_000)
    plan = promise_plan(tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    assert mover(db_dsn, "cutover", "promise").returncode == 0
    before = sql(db_dsn, 'SELECT count(*) FROM "Orders"')[0][0]
    with pytest.raises(psycopg.errors.ObjectInUse) as info:  # SQLSTATE 55006
        sql(db_dsn, 'TRUNCATE "Orders"')
    assert "promise" in str(info.value)
    assert sql(db_dsn, 'SELECT count(*) FROM "Orders"')[0][0] == before > 0
    assert mover(db_dsn, "run", "promise").returncode == 3
    assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)


# --- the window: run --wait, keep_old -----------------------------------------------------------


def test_run_wait_syncs_through_the_window_then_retires_keeping_the_old_table(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    plan = promise_plan(tmp_path, rollback={"keep_old": True})
    writer = Writer(db_dsn, seed=21).start()
    try:
        assert mover(db_dsn, "run", plan).returncode == 3
        assert mover(db_dsn, "cutover", "promise").returncode == 0
        applied_at_cutover = status(db_dsn)["capture"]["applied"]
        proc = spawn(db_dsn, "run", "promise", "--wait")
        # While the window is open, the waiting run keeps replaying the writer's changes into the
        # old table (the log is applied only while a mover command runs).
        wait_for(lambda: status(db_dsn)["capture"]["applied"] > applied_at_cutover + 50,
                 "the reverse log applied during the window", proc)
        assert proc.poll() is None and status(db_dsn)["step"] == "rollback_window"
        writer.pause()
        # Nothing is written now: the old table catches up while the window is still open.
        wait_for(lambda: status(db_dsn)["capture"]["pending"] == 0, "the reverse log drained", proc)
        assert_oracle(db_dsn, "Orders", "Orders_old")
        assert proc.poll() is None
        # The window ends (moved forward rather than waited for): the waiting run retires by itself.
        sql(db_dsn, "UPDATE mover.migrations SET window_ends_at = now() WHERE name = 'promise'")
        code, err = finish(proc, 60)
        assert code == 0, err
    finally:
        writer.halt()
    assert writer.errors == []
    st = status(db_dsn)
    assert (st["step"], st["state"]) == ("retire", "done")
    # keep_old: the original stays under the old name, its data intact, and nothing of mover's is
    # left (no triggers, no logs, no functions).
    assert column_type(db_dsn, "Orders_old", "id") == "integer"
    assert column_type(db_dsn, "Orders", "id") == "bigint"
    assert_oracle(db_dsn, "Orders", "Orders_old")
    snap = catalog_snapshot(db_dsn)
    assert snap["mover_objects"] == [] and snap["triggers"] == []
    assert not any(schema == "mover" for schema, _ in snap["functions"])
    # No longer synced: a write to the new table stays there.
    sql(db_dsn, """INSERT INTO "Orders" ("Account", note) VALUES (1, 'after retire')""")
    assert differences(db_dsn, "Orders", "Orders_old") == (1, 0)
    # An inert copy: its id no longer draws from the serial sequence, which went to the live table
    # (an insert into the copy would consume the live table's keys) ...
    assert sql(db_dsn, """SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef WHERE adrelid = '"Orders_old"'::regclass"""
               ) == [("now()",)]
    # ... so the live table (and its sequence) can be dropped without touching the copy.
    sql(db_dsn, 'DROP TABLE "Orders"')
    assert sql(db_dsn, 'SELECT count(*) > 0 FROM "Orders_old"')[0][0] is True


def test_a_kept_old_table_holds_no_foreign_key(db_dsn, tmp_path):
    """A foreign key [target] drop_foreign_keys left on the old table for the window is dropped
    with retire's keep_old: the kept copy must not block the application's deletes of parent rows."""
    create_orders(db_dsn, 500)
    sql(db_dsn, """CREATE TABLE accounts (id int PRIMARY KEY);
                   INSERT INTO accounts SELECT generate_series(0, 999);
                   ALTER TABLE "Orders" ADD CONSTRAINT orders_account_fkey
                       FOREIGN KEY ("Account") REFERENCES accounts""")
    plan = promise_plan(tmp_path, rollback={"keep_old": True}, target={"drop_foreign_keys": ["orders_account_fkey"]})
    assert mover(db_dsn, "run", plan).returncode == 3
    assert mover(db_dsn, "cutover", "promise").returncode == 0
    fkeys = """SELECT conrelid::regclass::text FROM pg_constraint WHERE confrelid = 'accounts'::regclass"""
    assert sql(db_dsn, fkeys) == [('"Orders_old"',)]  # left on the old table for the window
    r = mover(db_dsn, "retire", "promise", "--force")
    assert r.returncode == 0, r.stderr
    assert sql(db_dsn, fkeys) == []
    account = sql(db_dsn, 'SELECT "Account" FROM "Orders_old" LIMIT 1')[0][0]
    sql(db_dsn, 'DELETE FROM "Orders" WHERE "Account" = %s', (account,))
    sql(db_dsn, "DELETE FROM accounts WHERE id = %s", (account,))  # the copy still has rows for it
    assert sql(db_dsn, 'SELECT count(*) FROM "Orders_old" WHERE "Account" = %s', (account,))[0][0] > 0


# --- abort ---------------------------------------------------------------------------------------


def test_abort_refused_after_cutover_and_clean_after_rollback(db_dsn, tmp_path):
    create_orders(db_dsn, 2_000)
    plan = promise_plan(tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    assert mover(db_dsn, "cutover", "promise").returncode == 0
    before = catalog_snapshot(db_dsn)
    r = mover(db_dsn, "abort", "promise")
    assert r.returncode == 2, r.stderr
    assert "after its cutover" in r.stderr, r.stderr
    assert "next: `mover rollback promise` swaps the original back, then `mover abort promise`" in r.stderr
    assert catalog_snapshot(db_dsn) == before  # nothing dropped: the new table is live
    assert status(db_dsn)["step"] == "rollback_window"

    sql(db_dsn, """INSERT INTO "Orders" ("Account", note) VALUES (4242, 'written in the window')""")
    sql(db_dsn, """UPDATE "Orders" SET note = 'changed in the window' WHERE id = 10""")
    sql(db_dsn, """DELETE FROM "Orders" WHERE id = 11""")
    r = mover(db_dsn, "rollback", "promise")
    assert r.returncode == 0, r.stderr
    sql(db_dsn, 'CREATE TABLE expected AS SELECT * FROM "Orders"')
    r = mover(db_dsn, "abort", "promise")
    assert r.returncode == 0, r.stderr
    assert status(db_dsn)["state"] == "aborted"
    # The original is back, unchanged by the abort and holding the window's writes.
    assert column_type(db_dsn, "Orders", "id") == "integer"
    assert differences(db_dsn, "Orders", "expected") == (0, 0)
    assert sql(db_dsn, """SELECT count(*) FROM "Orders" WHERE "Account" = 4242 OR note = 'changed in the window'
                          OR id = 11""")[0][0] == 2
    snap = catalog_snapshot(db_dsn)
    assert snap["mover_objects"] == [] and snap["triggers"] == []
    assert sorted(name for schema, name, kind, _ in snap["relations"] if kind == "r") == ["Orders", "expected"]
    sql(db_dsn, 'TRUNCATE expected')  # and TRUNCATE is no longer refused on the source
    sql(db_dsn, 'TRUNCATE "Orders"')


# --- signals ---------------------------------------------------------------------------------------


def test_sigterm_stops_at_a_safe_point_and_resumes(db_dsn, tmp_path):
    create_orders(db_dsn, 4_000)
    plan = promise_plan(tmp_path, backfill={"max_rows_per_second": 1000})
    writer = Writer(db_dsn, seed=5).start()
    try:
        proc = spawn(db_dsn, "run", plan)
        wait_for(lambda: ranges_done(db_dsn) >= 1, "a backfill range", proc)
        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc, 60)
        assert code == 130, err
        assert "stopping at the next safe point" in err
        assert "stopped at a safe point" in err and "next: run `mover run promise` to continue" in err, err
        st = status(db_dsn)
        assert (st["step"], st["state"], st["lease"]) == ("backfill", "interrupted", None), st
        assert 0 < st["backfill"]["rows_copied"] < 4_000
        r = mover(db_dsn, "run", "promise")
        assert r.returncode == 3, r.stderr
        writer.pause()
        assert mover(db_dsn, "run", "promise").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_new")
    finally:
        writer.halt()
    assert writer.errors == []


def test_second_sigterm_stops_at_once_rolling_back_the_open_transaction(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    plan = promise_plan(tmp_path)
    proc = spawn(db_dsn, "run", plan, env={"MOVER_FAULT": "hang@range_copied"})
    try:
        # The first range is copied and its transaction is still open.
        line = ""
        while "mover-fault: hanging at range_copied" not in line:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "mover exited before the fault point"
        assert sql(db_dsn, "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                           " AND application_name LIKE 'mover-worker%%'")[0][0] == 1
        proc.send_signal(signal.SIGTERM)  # the first waits for a safe point, which this run cannot reach
        while "stopping at the next safe point" not in line:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "mover exited on the first signal"
        # Acknowledged, and the range's transaction is still open: nothing was cut short.
        assert sql(db_dsn, "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                           " AND application_name LIKE 'mover-worker%%'")[0][0] == 1
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, err
    assert "interrupted; the open transaction was rolled back" in err, err
    st = status(db_dsn)
    assert (st["step"], st["state"], st["backfill"]["rows_copied"]) == ("backfill", "interrupted", 0), st
    assert sql(db_dsn, 'SELECT count(*) FROM "Orders_new"')[0][0] == 0  # the range's copy rolled back
    r = mover(db_dsn, "run", "promise")
    assert r.returncode == 3, r.stderr
    assert_oracle(db_dsn, "Orders", "Orders_new")


# --- a unique index that is not the primary key as the migration key -----------------------------


def test_unique_non_primary_key_index_as_the_key_under_a_writer(db_dsn, tmp_path):
    ddl = ORDERS_DDL.replace("id serial PRIMARY KEY", "id serial NOT NULL")
    ddl += 'CREATE UNIQUE INDEX "Orders id" ON "Orders" (id);\n'
    # A wider candidate too: the narrowest one is the key.
    ddl += 'CREATE UNIQUE INDEX "Orders account id" ON "Orders" ("Account", id);\n'
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(ddl)
        conn.execute("""INSERT INTO "Orders" ("Account", amount, status, note)
                        SELECT g % 1000, g / 100.0, 'new', md5(g::text) FROM generate_series(1, 3000) g""")
        create_mirror(conn)
    plan = promise_plan(tmp_path)
    writer = Writer(db_dsn, seed=11).start()
    try:
        r = mover(db_dsn, "run", plan)
        assert r.returncode == 3, r.stderr
        st = status(db_dsn)
        assert st["key"] == ["id"] and st["divergences"] == 0
        writer.pause()
        assert mover(db_dsn, "run", "promise").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_new")
        writer.resume()
        r = mover(db_dsn, "cutover", "promise")
        assert r.returncode == 0, r.stderr
        assert mover(db_dsn, "run", "promise").returncode == 3
        writer.pause()
        assert mover(db_dsn, "run", "promise").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_old")
        writer.resume()
        r = mover(db_dsn, "retire", "promise", "--force")
        assert r.returncode == 0, r.stderr
    finally:
        writer.halt()
    assert writer.errors == []
    assert writer.ops > 50
    assert column_type(db_dsn, "Orders", "id") == "bigint"
    # Still no primary key; every index under the name it had before the swap (mover/engines/swap/carry.py).
    indexes = dict(sql(db_dsn, """SELECT indexrelid::regclass::text, indisunique::text || indisprimary::text
                                  FROM pg_index WHERE indrelid = '"Orders"'::regclass"""))
    assert indexes == {'"Orders id"': "truefalse", '"Orders account id"': "truefalse",
                       '"Orders by account"': "falsefalse"}, indexes


# --- reconcile settings ---------------------------------------------------------------------------


def migration_id(dsn) -> int:
    return sql(dsn, "SELECT id FROM mover.migrations WHERE name = 'promise'")[0][0]


def open_divergences(dsn) -> list[tuple[list[str], str]]:
    return sql(dsn, "SELECT key, kind FROM mover.divergences WHERE resolved_at IS NULL ORDER BY key")


def test_settle_rounds_exhausted_leaves_a_pending_key_to_the_next_pass(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    plan = promise_plan(tmp_path, reconcile={"settle_rounds": 2})
    assert mover(db_dsn, "run", plan).returncode == 3
    with psycopg.connect(db_dsn, autocommit=True) as holder:
        # The applier is busy (its advisory lock is held): key 5's change stays in the log through
        # every re-check round, while key 6 differs with nothing pending.
        holder.execute("SELECT pg_advisory_lock(hashtext('mover.apply'), %s::int)", (migration_id(db_dsn),))
        sql(db_dsn, """UPDATE "Orders" SET note = 'hot' WHERE id = 5""")
        sql(db_dsn, """UPDATE "Orders_new" SET note = 'corrupt' WHERE id = 6""")
        r = mover(db_dsn, "reconcile", "promise", "--full")
        assert r.returncode == 3, r.stderr
        assert open_divergences(db_dsn) == [(["6"], "different")]  # key 5 is no divergence yet
        (detail,) = sql(db_dsn, "SELECT detail FROM mover.events WHERE kind = 'pass_done' ORDER BY id DESC LIMIT 1")[0]
        assert detail["unsettled"] == 1, detail
        assert sql(db_dsn, """SELECT note FROM "Orders_new" WHERE id = 5""")[0][0] != "hot"
        holder.execute("SELECT pg_advisory_unlock_all()")
    # The next pass applies key 5, re-verifies its range (noted when the key was replayed) and
    # finds it equal; key 6 stays open until repaired.
    r = mover(db_dsn, "reconcile", "promise")
    assert r.returncode == 3, r.stderr
    assert open_divergences(db_dsn) == [(["6"], "different")]
    assert differences(db_dsn, "Orders", "Orders_new") == (1, 1)
    assert mover(db_dsn, "repair", "promise").returncode == 0
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)


@pytest.mark.parametrize("before_cutover", [True, False])
def test_before_cutover_decides_whether_the_last_pass_runs(db_dsn, tmp_path, before_cutover):
    create_orders(db_dsn, 3_000)
    plan = promise_plan(tmp_path, reconcile={"before_cutover": before_cutover})
    assert mover(db_dsn, "run", plan).returncode == 3
    # A captured change in the range (so the quick pass re-verifies it) and, in the same range, a
    # write to the new table behind mover's back.
    sql(db_dsn, """UPDATE "Orders" SET note = 'captured' WHERE id = 7""")
    sql(db_dsn, """UPDATE "Orders_new" SET note = 'behind mover' WHERE id = 8""")
    r = mover(db_dsn, "cutover", "promise")
    if before_cutover:
        assert r.returncode == 3, r.stderr
        assert "cutover refused" in r.stderr and "next: see them with `mover divergences promise`" in r.stderr
        assert open_divergences(db_dsn) == [(["8"], "different")]
        assert status(db_dsn)["step"] == "cutover" and column_type(db_dsn, "Orders", "id") == "integer"
    else:
        # The operator chose to skip the last check: the swap goes ahead, difference and all.
        assert r.returncode == 0, r.stderr
        assert status(db_dsn)["step"] == "rollback_window" and column_type(db_dsn, "Orders", "id") == "bigint"
        assert open_divergences(db_dsn) == []
        assert differences(db_dsn, "Orders", "Orders_old") == (1, 1)
        assert sql(db_dsn, """SELECT note FROM "Orders" WHERE id = 7""")[0][0] == "captured"


def test_reconcile_range_out_of_attempts_ends_failed_and_the_next_run_retries_it(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    plan = promise_plan(tmp_path, reconcile={"range_rows": 1000, "max_attempts": 2})
    r = mover(db_dsn, "run", plan, env={"MOVER_FAULT": "error@reconcile_compared:2"})
    assert r.returncode == 1, r.stderr
    assert "1 reconcile ranges failed; range 2" in r.stderr and "next:" in r.stderr, r.stderr
    got = sql(db_dsn, "SELECT range_no, status, attempts FROM mover.ranges WHERE kind = 'reconcile' ORDER BY 1")
    assert len(got) >= 3 and got[1] == (2, "failed", 2), got
    assert all(row[1:] == ("done", 1) for row in got if row[0] != 2), got  # the others went on
    st = status(db_dsn)
    assert (st["step"], st["state"], st["reconcile"]["ranges_failed"]) == ("reconcile", "failed", 1), st
    r = mover(db_dsn, "run", "promise")
    assert r.returncode == 3, r.stderr
    st = status(db_dsn)
    assert (st["step"], st["reconcile"]["ranges_failed"], st["divergences"]) == ("cutover", 0, 0), st


# --- replay failures ---------------------------------------------------------------------------------

NARROW = plan_text("promise", columns={"id": "bigint", "amount": "numeric(6,2)"}, target={"accept_lossy": ["amount"]},
                   cutover={"lock_timeout": "10s", "attempts": 1})


def test_forward_apply_error_is_a_divergence_not_an_application_error(db_dsn, tmp_path):
    create_orders(db_dsn, 2_000)  # amounts up to 20.00 fit numeric(6,2)
    plan = write_plan(tmp_path / "narrow.toml", NARROW)
    assert mover(db_dsn, "run", plan).returncode == 3
    sql(db_dsn, """UPDATE "Orders" SET amount = 123456.78 WHERE id = 5""")  # the application is not refused
    r = mover(db_dsn, "run", "promise")
    assert r.returncode == 3, r.stderr
    divs = json.loads(mover(db_dsn, "divergences", "promise", "--json").stdout)
    assert [(d["key"], d["kind"], d["columns"]["sqlstate"]) for d in divs] == [(["5"], "apply_error", "22003")], divs
    assert differences(db_dsn, "Orders", "Orders_new") == (1, 1)
    r = mover(db_dsn, "cutover", "promise")
    assert r.returncode == 3 and "unresolved divergences" in r.stderr, r.stderr
    assert column_type(db_dsn, "Orders", "id") == "integer"
    sql(db_dsn, """UPDATE "Orders" SET amount = 1234.56 WHERE id = 5""")
    assert mover(db_dsn, "repair", "promise").returncode == 0
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
    assert mover(db_dsn, "cutover", "promise").returncode == 0


def test_apply_failure_under_the_cutover_lock_swaps_nothing(db_dsn, tmp_path):
    create_orders(db_dsn, 2_000)
    plan = write_plan(tmp_path / "narrow.toml", NARROW)
    assert mover(db_dsn, "run", plan).returncode == 3
    before = catalog_snapshot(db_dsn)
    # The application's write commits after the cutover's last drain outside the lock and before
    # the lock is granted: only the drain under the lock meets it.
    app = psycopg.connect(db_dsn)
    try:
        app.execute("""UPDATE "Orders" SET amount = 123456.78 WHERE id = 5""")
        proc = spawn(db_dsn, "cutover", "promise")
        wait_for(lambda: sql(db_dsn, """SELECT count(*) FROM pg_locks WHERE relation = '"Orders"'::regclass
                                        AND NOT granted AND mode = 'AccessExclusiveLock'""")[0][0] == 1,
                 "the cutover to wait for the lock", proc)
        app.commit()
        code, err = finish(proc, 60)
    finally:
        app.close()
    assert code == 3, err
    assert "nothing was swapped" in err and "`mover divergences promise`" in err, err
    assert catalog_snapshot(db_dsn) == before
    divs = json.loads(mover(db_dsn, "divergences", "promise", "--json").stdout)
    assert [(d["key"], d["kind"]) for d in divs] == [(["5"], "apply_error")], divs
    st = status(db_dsn)
    assert (st["step"], st["divergences"]) == ("cutover", 1), st
