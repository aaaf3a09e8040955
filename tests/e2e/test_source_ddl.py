"""DDL on either table during a migration (issue 7, invariant 7 and race 8 of docs/design.md): detected at every step
start, between backfill ranges, in reconcile passes and inside the cutover's lock; stopped with
exit 2 naming the change; adoptable changes carried over by `mover adopt`, the rest refused."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

from tests.workload import AppWriter, differences, finish, mover, plan_file, spawn


def ord_plan(tmp_path, **sections) -> str:
    return plan_file(tmp_path, "ord", "orders", columns={"id": "bigint"},
                     backfill={"range_rows": 500, "min_rows": 500, "max_rows": 500}, **sections)


def sql_run(dsn, *statements, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        out = None
        for s in statements:
            cur = conn.execute(s, params)
            out = cur.fetchall() if cur.description else None
        return out


@pytest.fixture
def orders(db_dsn, tmp_path):
    sql_run(db_dsn, "CREATE TABLE orders (id int PRIMARY KEY, qty int, note text)",
            "CREATE INDEX orders_qty ON orders (qty)",
            "INSERT INTO orders SELECT g, g % 17, 'n' || g FROM generate_series(1, 3000) g")
    return ord_plan(tmp_path)


def status(dsn):
    r = mover(dsn, "status", "ord", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def tables(dsn):
    return sorted(r[0] for r in sql_run(dsn, "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace"
                                             " AND relkind = 'r'"))


def columns(dsn, table):
    return [r[0] for r in sql_run(dsn, "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                                       " AND NOT attisdropped ORDER BY attnum", params=(table,))]


def hang(dsn, point, release, *args):
    """A mover process stopped at a fault point until `release` exists; returns it once it is there."""
    proc = spawn(dsn, *args, env={"MOVER_FAULT": f"hang@{point}", "MOVER_FAULT_RELEASE": str(release)})
    seen = []
    for line in proc.stderr:  # progress lines come first; EOF if it ended without getting there
        seen.append(line)
        if f"hanging at {point}" in line:
            return proc
    proc.wait(10)
    raise AssertionError(f"mover never reached {point} (exit {proc.returncode}): {''.join(seen)}")


def assert_stopped(r_code, stderr, *needles):
    assert r_code == 2, stderr
    assert "Traceback" not in stderr and "KeyError" not in stderr, stderr
    for n in needles:
        assert n in stderr, stderr


def updater(dsn, column="qty") -> AppWriter:
    """The application: updates random rows until stopped, through DDL (a column not there yet
    is the application's to retry)."""
    stmt = sql.SQL("UPDATE orders SET {c} = coalesce({c}, 0) + 1 WHERE id = %s").format(c=sql.Identifier(column))
    return AppWriter(dsn, seed=7, delay=0.002, prepare_threshold=5, tolerate=(psycopg.errors.UndefinedColumn,),
                     each=lambda conn, rnd: conn.execute(stmt, (rnd.randint(1, 3000),)))


# ---------------------------------------------------------------------------------------------
# The reproduction: ADD COLUMN mid-backfill, then adopt, and nothing is lost


def test_add_column_mid_backfill_stops_then_adopt_carries_it_through_cutover(db_dsn, orders, tmp_path):
    release = tmp_path / "release"
    proc = hang(db_dsn, "backfill_range:2", release, "run", orders)
    sql_run(db_dsn, "ALTER TABLE orders ADD COLUMN priority int NOT NULL DEFAULT 0",
            "UPDATE orders SET priority = 9 WHERE id <= 100")
    release.touch()
    code, err = finish(proc, 120)
    assert_stopped(code, err, 'column "priority" was added to "public"."orders"', "mover adopt ord")
    st = status(db_dsn)
    assert (st["state"], st["step"]) == ("failed", "backfill")
    assert 'column "priority"' in st["error"]
    assert tables(db_dsn) == ["orders", "orders_new"]  # nothing swapped
    kinds = [e["kind"] for e in json.loads(mover(db_dsn, "events", "ord", "--json").stdout)]
    assert "shape_changed" in kinds
    # A resume stops again, as clearly: it never copies past the change.
    r = mover(db_dsn, "run", "ord")
    assert_stopped(r.returncode, r.stderr, 'column "priority" was added')

    with updater(db_dsn, "priority") as app:
        r = mover(db_dsn, "adopt", "ord")
        assert r.returncode == 0, r.stderr
        assert 'adopted: column "priority" was added' in r.stderr
        r = mover(db_dsn, "run", "ord")
        assert r.returncode == 3, r.stderr
        assert "ready for cutover" in r.stderr
    assert app.errors == [] and app.ops > 0
    r = mover(db_dsn, "cutover", "ord")
    assert r.returncode == 0, r.stderr
    assert tables(db_dsn) == ["orders", "orders_old"]
    assert columns(db_dsn, "orders") == ["id", "qty", "note", "priority"]
    cols = ["id", "qty", "note", "priority"]
    assert differences(db_dsn, "orders", "orders_old", cols) == (0, 0)
    # The 100 rows the application set to 9 before adopting: still 9, unless it bumped them since.
    got = sql_run(db_dsn, "SELECT count(*) FILTER (WHERE o.priority = n.priority), count(*) FILTER (WHERE n.priority"
                          " >= 9) FROM orders n JOIN orders_old o USING (id) WHERE id <= 100")[0]
    assert got == (100, 100)
    assert sql_run(db_dsn, "SELECT attnotnull, pg_get_expr(adbin, adrelid) FROM pg_attribute"
                           " LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum"
                           " WHERE attrelid = 'orders'::regclass AND attname = 'priority'") == [(True, "0")]
    r = mover(db_dsn, "rollback", "ord")
    assert r.returncode == 0, r.stderr
    assert differences(db_dsn, "orders", "orders_new", cols) == (0, 0)


def test_drop_column_stops_clearly_and_abort_works(db_dsn, orders, tmp_path):
    release = tmp_path / "release"
    proc = hang(db_dsn, "backfill_range:2", release, "run", orders)
    sql_run(db_dsn, "ALTER TABLE orders DROP COLUMN note")
    release.touch()
    code, err = finish(proc, 120)
    assert_stopped(code, err, 'column "note" was dropped from "public"."orders"', "mover abort ord")
    r = mover(db_dsn, "run", "ord")
    assert_stopped(r.returncode, r.stderr, 'column "note" was dropped')
    r = mover(db_dsn, "adopt", "ord")
    assert_stopped(r.returncode, r.stderr, "cannot adopt", 'column "note" was dropped', "mover abort ord")
    r = mover(db_dsn, "abort", "ord")
    assert r.returncode == 0, r.stderr
    assert tables(db_dsn) == ["orders"]
    assert sql_run(db_dsn, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass")[0][0] == 0


# ---------------------------------------------------------------------------------------------
# Each kind of change, detected at a step start


@pytest.mark.parametrize("ddl,needle", [
    ("ALTER TABLE orders ALTER COLUMN qty TYPE bigint", 'column "qty" of "public"."orders" changed type from'
                                                        ' integer to bigint'),
    ("DROP INDEX orders_qty", 'index "orders_qty" (USING btree (qty)) was dropped'),
    ("CREATE INDEX orders_note ON orders (note)", 'index "orders_note" was added'),
    ("ALTER TABLE orders ALTER COLUMN qty SET NOT NULL", 'column "qty" of "public"."orders" was made NOT NULL'),
    ("ALTER TABLE orders SET UNLOGGED", 'was made UNLOGGED'),
    ("ALTER TABLE orders RENAME TO orders2", 'table "public"."orders" was renamed to "public"."orders2"'),
    ("ALTER TABLE orders ALTER COLUMN note SET DEFAULT 'x'", 'column "note" of "public"."orders" changed default'),
    ("ALTER TABLE orders ADD CONSTRAINT qty_pos CHECK (qty >= 0) NOT VALID", 'CHECK constraint "qty_pos" was added'),
    ("ALTER TABLE orders ALTER COLUMN note TYPE text COLLATE \"C\"", 'column "note" of "public"."orders" changed'
                                                                    ' collation'),
])
def test_each_kind_of_change_is_detected_at_a_step_start(db_dsn, orders, ddl, needle):
    r = mover(db_dsn, "step", orders)  # create_target
    assert r.returncode == 0, r.stderr
    sql_run(db_dsn, ddl)
    r = mover(db_dsn, "run", "ord")
    assert_stopped(r.returncode, r.stderr, needle)
    assert status(db_dsn)["step"] == "install_capture"


def test_renamed_source_is_refused_and_abort_removes_the_capture_from_it(db_dsn, orders):
    r = mover(db_dsn, "step", orders)
    r = mover(db_dsn, "step", "ord")  # install_capture
    assert r.returncode == 0, r.stderr
    sql_run(db_dsn, "ALTER TABLE orders RENAME TO orders2")
    r = mover(db_dsn, "run", "ord")
    assert_stopped(r.returncode, r.stderr, 'table "public"."orders" was renamed to "public"."orders2"',
                   "mover abort ord")
    r = mover(db_dsn, "abort", "ord")
    assert r.returncode == 0, r.stderr
    assert sql_run(db_dsn, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders2'::regclass")[0][0] == 0
    sql_run(db_dsn, "UPDATE orders2 SET qty = 1 WHERE id = 1")  # the application is unharmed


# ---------------------------------------------------------------------------------------------
# Detected between backfill ranges, in a reconcile pass, inside the cutover lock


def test_index_added_between_backfill_ranges_then_adopted(db_dsn, orders, tmp_path):
    release = tmp_path / "release"
    proc = hang(db_dsn, "backfill_range:3", release, "run", orders)
    sql_run(db_dsn, "CREATE INDEX orders_note ON orders (note)",
            "ALTER TABLE orders ADD CONSTRAINT qty_small CHECK (qty < 100)")
    release.touch()
    code, err = finish(proc, 120)
    assert_stopped(code, err, 'index "orders_note" was added', 'CHECK constraint "qty_small" was added')
    done = status(db_dsn)["backfill"]["ranges_done"]
    assert done < 6  # stopped between ranges, not at the end
    r = mover(db_dsn, "adopt", "ord")
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "run", "ord")
    assert r.returncode == 3, r.stderr
    # The backfill built the adopted index with the others; the CHECK came with the adoption.
    idx = sql_run(db_dsn, "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'orders_new'::regclass"
                          " ORDER BY 1")
    assert ("orders_note_m1",) in idx and ("orders_qty_m1",) in idx
    assert sql_run(db_dsn, "SELECT convalidated FROM pg_constraint WHERE conrelid = 'orders_new'::regclass"
                           " AND conname = 'qty_small'") == [(True,)]


def test_change_during_a_reconcile_pass_is_detected(db_dsn, tmp_path):
    sql_run(db_dsn, "CREATE TABLE orders (id int PRIMARY KEY, qty int, note text)",
            "INSERT INTO orders SELECT g, g % 17, 'n' || g FROM generate_series(1, 3000) g")
    plan = ord_plan(tmp_path, reconcile={"range_rows": 500})
    release = tmp_path / "release"
    proc = hang(db_dsn, "reconcile_range:2", release, "run", plan)
    sql_run(db_dsn, "ALTER TABLE orders ALTER COLUMN qty TYPE bigint")
    release.touch()
    code, err = finish(proc, 120)
    assert_stopped(code, err, 'column "qty" of "public"."orders" changed type from integer to bigint')
    st = status(db_dsn)
    assert (st["step"], st["state"]) == ("reconcile", "failed")
    assert st["reconcile"]["ranges_done"] < 6
    r = mover(db_dsn, "adopt", "ord")
    assert_stopped(r.returncode, r.stderr, "cannot adopt", "mover abort ord")


def test_change_committed_between_preflight_and_lock_aborts_the_swap(db_dsn, orders, tmp_path):
    assert mover(db_dsn, "run", orders).returncode == 3
    release = tmp_path / "release"
    proc = hang(db_dsn, "swap:before_lock", release, "cutover", "ord")
    sql_run(db_dsn, "ALTER TABLE orders ADD COLUMN priority int")
    release.touch()
    code, err = finish(proc, 120)
    assert_stopped(code, err, 'column "priority" was added to "public"."orders"')
    assert tables(db_dsn) == ["orders", "orders_new"]  # nothing swapped
    assert "priority" in columns(db_dsn, "orders") and "priority" not in columns(db_dsn, "orders_new")
    st = status(db_dsn)
    assert (st["step"], st["state"], st["cutover"]) == ("cutover", "failed", None)
    r = mover(db_dsn, "cutover", "ord")
    assert_stopped(r.returncode, r.stderr, 'column "priority" was added')
    # Adopted at the gate: reconcile runs again, fully, before the gate opens.
    sql_run(db_dsn, "UPDATE orders SET priority = id % 5")
    assert mover(db_dsn, "adopt", "ord").returncode == 0
    assert status(db_dsn)["step"] == "reconcile"
    r = mover(db_dsn, "run", "ord")
    assert r.returncode == 3, r.stderr
    assert differences(db_dsn, "orders", "orders_new", ["id", "qty", "note", "priority"]) == (0, 0)


def test_change_to_the_new_table_is_detected_before_the_swap(db_dsn, orders):
    assert mover(db_dsn, "run", orders).returncode == 3
    sql_run(db_dsn, "DROP INDEX orders_qty_m1")
    r = mover(db_dsn, "cutover", "ord")
    assert_stopped(r.returncode, r.stderr, 'index "orders_qty_m1"', '"public"."orders_new"')
    assert tables(db_dsn) == ["orders", "orders_new"]


# ---------------------------------------------------------------------------------------------
# The rollback window: the application now writes the new table


def test_ddl_on_the_new_table_during_the_window_blocks_rollback_and_run(db_dsn, orders):
    assert mover(db_dsn, "run", orders).returncode == 3
    assert mover(db_dsn, "cutover", "ord").returncode == 0
    sql_run(db_dsn, "ALTER TABLE orders DROP COLUMN note")
    for args in (("rollback", "ord"), ("run", "ord"), ("retire", "ord", "--force")):
        r = mover(db_dsn, *args)
        assert_stopped(r.returncode, r.stderr, 'column "note" was dropped from "public"."orders"')
    assert tables(db_dsn) == ["orders", "orders_old"]
    assert status(db_dsn)["step"] == "rollback_window"


def test_column_added_during_the_window_is_adopted_by_the_old_table(db_dsn, orders):
    assert mover(db_dsn, "run", orders).returncode == 3
    assert mover(db_dsn, "cutover", "ord").returncode == 0
    sql_run(db_dsn, "ALTER TABLE orders ADD COLUMN tag text DEFAULT 'a'", "UPDATE orders SET tag = 'b' WHERE id < 50")
    r = mover(db_dsn, "rollback", "ord")
    assert_stopped(r.returncode, r.stderr, 'column "tag" was added to "public"."orders"', "mover adopt ord")
    assert mover(db_dsn, "adopt", "ord").returncode == 0
    sql_run(db_dsn, "UPDATE orders SET tag = 'c' WHERE id BETWEEN 40 AND 60")
    r = mover(db_dsn, "rollback", "ord")
    assert r.returncode == 0, r.stderr
    assert differences(db_dsn, "orders", "orders_new", ["id", "qty", "note", "tag"]) == (0, 0)
    assert sql_run(db_dsn, "SELECT tag, count(*) FROM orders GROUP BY 1 ORDER BY 1") == [
        ("a", 3000 - 60), ("b", 39), ("c", 21)]


def test_adopt_killed_before_recording_runs_again(db_dsn, orders):
    assert mover(db_dsn, "run", orders).returncode == 3
    sql_run(db_dsn, "ALTER TABLE orders ADD COLUMN tag text DEFAULT 'a'", "CREATE INDEX orders_tag ON orders (tag)",
            "ALTER TABLE orders ADD CONSTRAINT tag_short CHECK (length(tag) < 5) NOT VALID",
            "UPDATE orders SET tag = 'b' WHERE id % 3 = 0")
    r = mover(db_dsn, "adopt", "ord", env={"MOVER_FAULT": "kill@adopt:before_record"})
    assert r.returncode == -9, r.stderr
    assert "tag" in columns(db_dsn, "orders_new")
    # Half adopted: the run still stops, and says to adopt (not to abort).
    r = mover(db_dsn, "run", "ord")
    assert_stopped(r.returncode, r.stderr, 'column "tag" was added to "public"."orders"', "mover adopt ord")
    sql_run(db_dsn, "UPDATE orders SET tag = 'c' WHERE id % 5 = 0")
    r = mover(db_dsn, "adopt", "ord")
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "run", "ord")
    assert r.returncode == 3, r.stderr
    assert differences(db_dsn, "orders", "orders_new", ["id", "qty", "note", "tag"]) == (0, 0)
    assert sql_run(db_dsn, "SELECT convalidated FROM pg_constraint WHERE conrelid = 'orders_new'::regclass"
                           " AND conname = 'tag_short'") == [(False,)]
    assert sql_run(db_dsn, "SELECT indisvalid FROM pg_index WHERE indexrelid = 'orders_tag_m1'::regclass") == [(True,)]


def test_check_added_not_valid_then_validated_is_adopted_twice(db_dsn, orders):
    """The routine two-step deploy: ADD CONSTRAINT ... NOT VALID, later VALIDATE CONSTRAINT."""
    assert mover(db_dsn, "run", orders).returncode == 3
    sql_run(db_dsn, "ALTER TABLE orders ADD CONSTRAINT qty_small CHECK (qty < 100) NOT VALID")
    assert_stopped(*_run(db_dsn), 'CHECK constraint "qty_small" was added', "mover adopt ord")
    assert mover(db_dsn, "adopt", "ord").returncode == 0
    assert mover(db_dsn, "run", "ord").returncode == 3
    sql_run(db_dsn, "ALTER TABLE orders VALIDATE CONSTRAINT qty_small")
    assert_stopped(*_run(db_dsn), 'constraint "qty_small" of "public"."orders" was validated', "mover adopt ord")
    assert mover(db_dsn, "adopt", "ord").returncode == 0
    assert mover(db_dsn, "run", "ord").returncode == 3
    assert sql_run(db_dsn, "SELECT convalidated FROM pg_constraint WHERE conrelid = 'orders_new'::regclass"
                           " AND conname = 'qty_small'") == [(True,)]
    r = mover(db_dsn, "adopt", "ord")
    assert r.returncode == 0 and "nothing to adopt" in r.stderr, r.stderr
    assert mover(db_dsn, "cutover", "ord").returncode == 0


def _run(dsn):
    r = mover(dsn, "run", "ord")
    return r.returncode, r.stderr


def test_a_worker_whose_mapping_predates_adopt_copies_with_the_new_column(db_dsn, orders, tmp_path):
    """A `mover worker` on another host built its column list, then the operator adopted a new
    column: its next range must not be copied without it."""
    orchestrator = hang(db_dsn, "backfill_range:1", tmp_path / "never", "run", orders)
    release = tmp_path / "release"
    helper = hang(db_dsn, "claimed", release, "worker", "ord")  # holds a claimed range, mapping built
    orchestrator.kill()
    finish(orchestrator, 30)
    # Rows get 3, the default is 5 afterwards: no logged change would repair a row copied without it.
    sql_run(db_dsn, "ALTER TABLE orders ADD COLUMN priority int DEFAULT 3",
            "ALTER TABLE orders ALTER COLUMN priority SET DEFAULT 5")
    r = mover(db_dsn, "adopt", "ord")
    assert r.returncode == 0, r.stderr
    release.touch()
    code, err = finish(helper, 120)
    assert code == 0, err
    r = mover(db_dsn, "run", "ord")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    assert differences(db_dsn, "orders", "orders_new", ["id", "qty", "note", "priority"]) == (0, 0)
