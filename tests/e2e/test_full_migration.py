"""Whole migrations under a concurrent writer, through the CLI, checked by independent queries."""

from __future__ import annotations

import json
import re

import psycopg
import pytest

from tests.workload import (
    Writer,
    app_execute,
    assert_oracle,
    catalog_snapshot,
    count,
    create_orders,
    differences,
    mover,
    plan_file,
)


def orders_plan(tmp_path, range_rows=2000, window="1h", method="trigger", **sections):
    if method != "trigger":
        sections["capture"] = {"method": method}
    return plan_file(tmp_path, "orders_bigint", columns={"id": "bigint"}, backfill={"range_rows": range_rows},
                     window=window, **sections)


# The same migrations with each capture method: the trigger, and logical capture (the changes read
# from the WAL through mover's replication slot: the suite's server runs with wal_level = logical).
METHODS = pytest.mark.parametrize("method", ["trigger", "logical"])


def capture_leftovers(dsn):
    """What logical capture could leave behind that keeps WAL or reaches subscribers: its slots (of
    this database) and publications."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return (conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
                             ).fetchall()
                + conn.execute("SELECT pubname FROM pg_publication").fetchall())


def slot_of(dsn):
    """The status's view of logical capture's slot (None with the trigger, or once dropped)."""
    return status(dsn)["capture"]["slot"]


def status(dsn):
    r = mover(dsn, "status", "orders_bigint", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def column_type(dsn, table, column):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass"
                            " AND attname = %s", (f'"{table}"', column)).fetchone()[0]


@METHODS
def test_full_migration_under_concurrent_writer(db_dsn, tmp_path, method):
    create_orders(db_dsn, 20_000)
    plan = orders_plan(tmp_path, method=method)
    writer = Writer(db_dsn).start()
    try:
        r = mover(db_dsn, "run", plan)
        assert r.returncode == 3, r.stderr  # stopped at the cutover gate
        assert "mover cutover orders_bigint" in r.stderr
        st = status(db_dsn)
        assert (st["step"], st["state"], st["divergences"]) == ("cutover", "waiting", 0)
        assert st["backfill"]["rows_copied"] >= 20_000 * 0.9
        writer.pause()  # at the gate: the target holds every committed write, once the log is applied
        assert mover(db_dsn, "run", "orders_bigint").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_new")
        if method == "logical":
            slot = slot_of(db_dsn)
            assert slot["exists"] and slot["wal_status"] in ("reserved", "extended"), slot
            assert slot["changes"] > 0 and slot["retained_bytes"] >= 0 and slot["lag_seconds"] is not None, slot
            text = mover(db_dsn, "status", "orders_bigint").stdout
            assert re.search(r"slot .*mover_m\d+_d\d+, reserved, lag .*retains", text), text
            with psycopg.connect(db_dsn, autocommit=True) as conn:  # no row trigger on the source
                assert conn.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = '\"Orders\"'::regclass"
                                    " AND NOT tgisinternal").fetchall() == [("mover_m1_capture_truncate",)]
        writer.resume()

        r = mover(db_dsn, "cutover", "orders_bigint")
        assert r.returncode == 0, r.stderr
        assert re.search(r"swapped in; lock held \d+\.\d ms", r.stderr), r.stderr
        assert capture_leftovers(db_dsn) == []  # the slot went with the swap
        writer.pause()  # just after the swap: nothing committed before it is missing from the new table
        assert_oracle(db_dsn, "Orders")
        writer.resume()
        st = status(db_dsn)
        assert st["step"] == "rollback_window" and st["cutover"]["lock_ms"] > 0
        assert column_type(db_dsn, "Orders", "id") == "bigint"
        assert column_type(db_dsn, "Orders_old", "id") == "integer"

        r = mover(db_dsn, "run", "orders_bigint")  # window open: syncs the old table, exit 3
        assert r.returncode == 3, r.stderr
        writer.pause()
        r = mover(db_dsn, "run", "orders_bigint")
        assert r.returncode == 3, r.stderr
        assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)
        assert_oracle(db_dsn, "Orders", "Orders_old")  # the window: the old table follows the new one
        assert count(db_dsn, "Orders") > 0
        writer.resume()

        r = mover(db_dsn, "retire", "orders_bigint")  # window still open
        assert r.returncode == 3, r.stderr
        assert re.search(r"still open until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", r.stderr), r.stderr
        r = mover(db_dsn, "retire", "orders_bigint", "--force")
        assert r.returncode == 0, r.stderr
    finally:
        writer.halt()
    assert writer.errors == []
    assert writer.ops > 100
    assert_oracle(db_dsn, "Orders")
    st = status(db_dsn)
    assert (st["step"], st["state"]) == ("retire", "done")
    # Nothing stale once retired early: no window end, no dropped table, no change log.
    assert st["rollback_window_ends_at"] is None and st["tables_present"] == ["source"], st
    text = mover(db_dsn, "status", "orders_bigint").stdout
    assert "Orders_old" not in text and "rollback window" not in text and "capture" not in text, text
    snap = catalog_snapshot(db_dsn)
    assert snap["mover_objects"] == []
    assert [t for t in snap["triggers"]] == []
    assert not any(name == "Orders_old" for _, name, _, _ in snap["relations"])
    assert not any(schema == "mover" for schema, _ in snap["functions"])
    assert capture_leftovers(db_dsn) == []
    # The sequence survived the old table and still serves the new one.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('INSERT INTO "Orders" ("Account") VALUES (1)')


@METHODS
def test_rollback_keeps_rows_written_after_cutover(db_dsn, tmp_path, method):
    create_orders(db_dsn, 5_000)
    plan = orders_plan(tmp_path, method=method)
    writer = Writer(db_dsn, seed=7).start()
    try:
        assert mover(db_dsn, "run", plan).returncode == 3
        r = mover(db_dsn, "cutover", "orders_bigint")
        assert r.returncode == 0, r.stderr
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            app_execute(conn, 'INSERT INTO {t} ("Account", note) VALUES (4242, %s)', ("after cutover",))
            app_execute(conn, 'UPDATE {t} SET note = %s WHERE id = 10', ("changed after cutover",))
            app_execute(conn, 'DELETE FROM {t} WHERE id = 11')
        writer.pause()  # the window: the old table follows the new one
        assert mover(db_dsn, "run", "orders_bigint").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_old")
        writer.resume()
        r = mover(db_dsn, "rollback", "orders_bigint")
        assert r.returncode == 0, r.stderr
        assert re.search(r"swapped back; lock held \d+\.\d ms", r.stderr), r.stderr
        r = mover(db_dsn, "cutover", "orders_bigint")  # back at reconcile: the way on is `mover run`
        assert r.returncode == 2 and "next: `mover run orders_bigint` takes it to step 'cutover'" in r.stderr, \
            r.stderr
        writer.pause()
        assert_oracle(db_dsn, "Orders")  # nothing committed in the window is missing from the original
        assert column_type(db_dsn, "Orders", "id") == "integer"  # the original is back
        # The new table took every write of the window; the restored original must hold all of
        # them (the writer may have changed the probe rows since: compare, don't presume).
        assert mover(db_dsn, "run", "orders_bigint").returncode == 3
        assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
        assert_oracle(db_dsn, "Orders", "Orders_new")
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            probes = """SELECT count(*) FROM {} WHERE "Account" = 4242 OR id IN (10, 11)"""
            assert (conn.execute(probes.format('"Orders"')).fetchone()
                    == conn.execute(probes.format('"Orders_new"')).fetchone())
        st = status(db_dsn)
        assert (st["step"], st["cutover"]) == ("cutover", None)
        if method == "logical":  # the swap back made a new slot before its lock, and reads it
            assert st["capture"]["slot"]["exists"], st["capture"]
        # Forward capture runs again: a second cutover is possible and loses nothing.
        writer.resume()
        assert mover(db_dsn, "run", "orders_bigint").returncode == 3
        assert mover(db_dsn, "cutover", "orders_bigint").returncode == 0
        writer.pause()
        assert mover(db_dsn, "run", "orders_bigint").returncode == 3
        assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)
        assert_oracle(db_dsn, "Orders", "Orders_old")
    finally:
        writer.halt()
    assert writer.errors == []
    # History: each cutover and the rollback its own row with its own time and lock, none spanning the others.
    (h,) = json.loads(mover(db_dsn, "history", "orders_bigint", "--json").stdout)
    rows = [a for a in h["attempts"] if a["step"] in ("cutover", "rollback") and a["outcome"] == "done"]
    assert [a["step"] for a in rows] == ["cutover", "rollback", "cutover"], h["attempts"]
    assert all(a["lock_ms"] and a["lock_ms"] < 10_000 for a in rows), rows
    assert all(a["seconds"] < 60 for a in rows if a["seconds"] is not None), rows
    cut = next(s for s in h["steps"] if s["name"] == "cutover")
    assert cut["attempts"] >= 2 and cut["seconds"] == rows[-1]["seconds"], (cut, rows)
    text = mover(db_dsn, "history", "orders_bigint").stdout
    assert re.search(r"rollback +done .*lock held \d+\.\d ms", text), text


@METHODS
def test_abort_before_cutover_leaves_database_as_it_was(db_dsn, tmp_path, method):
    create_orders(db_dsn, 3_000)
    before = catalog_snapshot(db_dsn)
    plan = orders_plan(tmp_path, method=method)
    assert mover(db_dsn, "run", plan).returncode == 3
    assert_oracle(db_dsn, "Orders", "Orders_new")
    assert catalog_snapshot(db_dsn) != before  # the migration did create things
    r = mover(db_dsn, "abort", "orders_bigint")
    assert r.returncode == 0, r.stderr
    assert catalog_snapshot(db_dsn) == before
    assert capture_leftovers(db_dsn) == []
    assert_oracle(db_dsn, "Orders")
    st = status(db_dsn)
    assert st["state"] == "aborted"
    # The same plan can start afresh after an abort.
    assert mover(db_dsn, "step", plan).returncode == 0
    assert status(db_dsn)["step"] == "install_capture"


@METHODS
def test_zero_window_retires_in_one_run_with_auto_cutover(db_dsn, tmp_path, method):
    create_orders(db_dsn, 3_000)
    plan = orders_plan(tmp_path, range_rows=1000, window="0s", cutover={"auto": True}, method=method)
    writer = Writer(db_dsn, seed=3).start()
    try:
        r = mover(db_dsn, "run", plan)
    finally:
        writer.halt()
    assert r.returncode == 0, r.stderr
    assert writer.errors == []
    st = status(db_dsn)
    assert st["state"] == "done" and st["cutover"]["lock_ms"] > 0
    assert column_type(db_dsn, "Orders", "id") == "bigint"
    assert writer.ops > 0
    assert_oracle(db_dsn, "Orders")  # the old table is gone: the new one must hold every write
    assert capture_leftovers(db_dsn) == []


def test_widened_sequences_privileges_and_options_follow_the_swap(db_dsn, tmp_path):
    create_orders(db_dsn, 2_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS mover_app")
        conn.execute("CREATE ROLE mover_app LOGIN")
        conn.execute('GRANT SELECT, INSERT, UPDATE ON "Orders" TO mover_app')
        conn.execute('GRANT USAGE ON SEQUENCE "Orders_id_seq" TO mover_app')
        conn.execute('GRANT SELECT ("Account") ON "Orders" TO PUBLIC')
        conn.execute('ALTER TABLE "Orders" SET (fillfactor = 70)')
        conn.execute("""COMMENT ON TABLE "Orders" IS 'the orders'""")
    plan = orders_plan(tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET ROLE mover_app")  # writes through the capture trigger as a plain role
        conn.execute('INSERT INTO "Orders" ("Account") VALUES (2)')
        conn.execute("RESET ROLE")
        conn.execute('INSERT INTO "Orders_mirror" SELECT * FROM "Orders" WHERE "Account" = 2 AND note IS NULL'
                     ' AND amount IS NULL')
    r = mover(db_dsn, "cutover", "orders_bigint")
    assert r.returncode == 0, r.stderr
    assert_oracle(db_dsn, "Orders")
    try:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            seq_type, = conn.execute("SELECT format_type(seqtypid, NULL) FROM pg_sequence"
                                     " WHERE seqrelid = '\"Orders_id_seq\"'::regclass").fetchone()
            assert seq_type == "bigint"
            conn.execute("""SELECT setval('"Orders_id_seq"', 2147483657)""")
            options, comment = conn.execute("""SELECT reloptions, obj_description('"Orders"'::regclass, 'pg_class')
                                                FROM pg_class WHERE oid = '"Orders"'::regclass""").fetchone()
            assert options == ["fillfactor=70"] and comment == "the orders"
            conn.execute("SET ROLE mover_app")
            # The application's role still works on the new table, past the old int limit.
            new_id = conn.execute('INSERT INTO "Orders" ("Account") VALUES (1) RETURNING id').fetchone()[0]
            assert new_id > 2147483647
            conn.execute("RESET ROLE")
            conn.execute('INSERT INTO "Orders_mirror" SELECT * FROM "Orders" WHERE id = %s', (new_id,))
            assert conn.execute(
                """SELECT has_column_privilege('public', '"Orders"', 'Account', 'SELECT')""").fetchone()[0]
        assert mover(db_dsn, "run", "orders_bigint").returncode == 3  # the reverse log reached the old table...
        # ...except the row beyond its integer range, which is recorded, not lost or raised in the app.
        assert status(db_dsn)["divergences"] == 1
        assert_oracle(db_dsn, "Orders")
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("DROP OWNED BY mover_app")
            conn.execute("DROP ROLE mover_app")


@METHODS
def test_truncate_of_a_table_being_moved_is_refused_with_a_clear_error(db_dsn, tmp_path, method):
    create_orders(db_dsn, 500)
    assert mover(db_dsn, "step", orders_plan(tmp_path, method=method)).returncode == 0  # create_target
    assert mover(db_dsn, "step", "orders_bigint").returncode == 0  # install_capture
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        try:
            conn.execute('TRUNCATE "Orders"')
            raise AssertionError("TRUNCATE went through")
        except psycopg.errors.ObjectInUse as exc:
            assert "orders_bigint" in str(exc) and "mover abort orders_bigint" in (exc.diag.message_hint or "")
        assert conn.execute('SELECT count(*) FROM "Orders"').fetchone()[0] == 500
    assert_oracle(db_dsn, "Orders")


def test_a_type_change_of_a_column_a_generated_column_reads_under_writer_cutover_rollback(db_dsn, tmp_path):
    """Issue 21 item 8: ALTER TABLE refuses the type change of a column a stored generated column
    reads; mover builds a new table, so it creates the generated column again over the new type:
    its values computed there (never copied), through the cutover and the rollback, under a writer.
    Judged by the mirror (the written columns) and by recomputing the generated one."""
    create_orders(db_dsn, 2000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('ALTER TABLE "Orders" ADD COLUMN amount_x2 numeric GENERATED ALWAYS AS (amount * 2) STORED,'
                     " ADD CONSTRAINT x2_positive CHECK (amount_x2 >= 0)")
        conn.execute('COMMENT ON COLUMN "Orders".amount_x2 IS \'twice\'')
    plan = plan_file(tmp_path, "orders_amount", columns={"amount": "numeric(16,2)"}, backfill={"range_rows": 500})
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 0, r.stdout + r.stderr

    def judge(*tables):
        writer.pause()
        try:
            assert mover(db_dsn, "run", "orders_amount").returncode == 3
            assert_oracle(db_dsn, *tables)
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                for t in tables:
                    wrong = conn.execute(f'SELECT count(*) FROM "{t}" WHERE amount_x2 IS DISTINCT FROM amount * 2'
                                         ).fetchone()[0]
                    assert wrong == 0, t
        finally:
            writer.resume()

    writer = Writer(db_dsn).start()
    try:
        r = mover(db_dsn, "run", plan)
        assert r.returncode == 3 and "mover cutover orders_amount" in r.stderr, r.stderr
        judge("Orders", "Orders_new")
        assert mover(db_dsn, "cutover", "orders_amount").returncode == 0
        assert column_type(db_dsn, "Orders", "amount") == "numeric(16,2)"
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            # Where it was (the last column), still generated, its CHECK and comment kept.
            assert conn.execute("SELECT attname, attgenerated, col_description(attrelid, attnum) FROM pg_attribute"
                                " WHERE attrelid = '\"Orders\"'::regclass AND attnum > 0 AND NOT attisdropped"
                                " ORDER BY attnum DESC LIMIT 1").fetchone() == ("amount_x2", "s", "twice")
            assert conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = '\"Orders\"'::regclass"
                                " AND conname = 'x2_positive'").fetchone()[0] == 1
        judge("Orders", "Orders_old")
        r = mover(db_dsn, "rollback", "orders_amount")
        assert r.returncode == 0, r.stderr
        assert column_type(db_dsn, "Orders", "amount") == "numeric(12,2)"
        judge("Orders", "Orders_new")
    finally:
        writer.halt()
    assert writer.errors == []
    assert writer.ops > 50
