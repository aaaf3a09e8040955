"""What a table is besides its rows, carried over the swap or refused clearly: persistence,
constraints with their validation state, outbound foreign keys, index comments, the identity
sequence's name; and a crash in the middle of CREATE INDEX CONCURRENTLY."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg

from tests.workload import create_orders, differences, finish, hung_at, mover, plan_file, plan_text, spawn, write_plan


def query(dsn, q, params=()):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(q, params).fetchall()


def execute(dsn, statements):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statements)


def wait_for(predicate, what, timeout=60.0):
    """Poll the database for a state another process reaches, bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def status(dsn, name):
    r = mover(dsn, "status", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def plan(tmp_path, name, source):
    return plan_file(tmp_path, name, source, columns={"id": "bigint"}, backfill={"range_rows": 500})


def same_rows(dsn, a, b):
    """Independent of mover's reconcile: EXCEPT ALL both ways over whole rows."""
    q = f"SELECT (SELECT count(*) FROM (TABLE {a} EXCEPT ALL TABLE {b}) x), " \
        f"(SELECT count(*) FROM (TABLE {b} EXCEPT ALL TABLE {a}) y)"
    return query(dsn, q)[0] == (0, 0)


# ---------------------------------------------------------------------------------------------
# kill -9 during an index build


IX_PLAN = plan_text("ix")


def test_kill9_during_an_index_build_then_resume_cancels_the_orphan(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    p = write_plan(tmp_path / "ix.toml", IX_PLAN)
    release = tmp_path / "release"
    proc = spawn(db_dsn, "run", p, env={"MOVER_FAULT": "hang@index_building", "MOVER_FAULT_RELEASE": str(release)})
    blocker = psycopg.connect(db_dsn)
    try:
        assert hung_at(proc, "index_building")
        # A lock on the new table that conflicts with the build's SHARE lock makes the build wait:
        # the moment a crash leaves a backend that goes on (and would commit its index) by itself.
        blocker.execute('LOCK "Orders_new" IN ROW EXCLUSIVE MODE')
        release.touch()
        orphan = wait_for(lambda: query(db_dsn, "SELECT pid FROM pg_locks WHERE relation = '\"Orders_new\"'::regclass"
                                                " AND mode = 'ShareLock' AND NOT granted"), "the index build")[0][0]
        proc.kill()
        finish(proc, 60)
        # The build is one transaction: the crash left no index, valid or not; and its backend
        # notices the lost client (client_connection_check_interval) and ends by itself.
        assert query(db_dsn, "SELECT count(*) FROM pg_index WHERE indrelid = '\"Orders_new\"'::regclass"
                             " AND NOT indisprimary") == [(0,)]
        wait_for(lambda: not query(db_dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (orphan,)),
                 "the orphaned build to end", 30)
        # An orphan that did not notice (a server whose system cannot tell): a mover backend
        # waiting for a build's lock on the new table. The resume cancels it before it builds.
        with psycopg.connect(db_dsn, application_name="mover:elsewhere:1") as stray:
            pid = stray.info.backend_pid
            cancelled: list[BaseException] = []

            def wait_for_lock() -> None:
                try:
                    stray.execute('LOCK "Orders_new" IN SHARE MODE')
                except psycopg.Error as exc:
                    cancelled.append(exc)
            waiter = threading.Thread(target=wait_for_lock)
            waiter.start()
            wait_for(lambda: query(db_dsn, "SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)),
                     "the stray build to wait")
            resume = spawn(db_dsn, "run", "ix")
            waiter.join(90)
            if waiter.is_alive():  # not cancelled: end it, so that the test fails rather than hangs
                query(db_dsn, "SELECT pg_terminate_backend(%s)", (pid,))
                waiter.join(10)
            assert len(cancelled) == 1 and isinstance(cancelled[0], psycopg.errors.QueryCanceled), cancelled
        assert resume.poll() is None  # it waits for the blocker, and for nothing else
        blocker.rollback()
        code, err = finish(resume, 120)
        assert code == 3 and "ready for cutover" in err, err
        assert f"cancelling the orphaned index builds on \"public\".\"Orders_new\" in backends [{pid}]" in err, err
    finally:
        blocker.close()
        if proc.poll() is None:
            proc.kill()
    (valid, definition), = query(db_dsn, "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i"
                                         " WHERE i.indrelid = '\"Orders_new\"'::regclass AND NOT i.indisprimary")
    assert valid and '("Account", created_at)' in definition
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)


def test_an_expression_index_is_built_before_analyze_gathers_its_statistics(db_dsn, tmp_path):
    """ANALYZE gathers an expression index's statistics only if the index exists: with one among
    the deferred indexes it runs after the builds, not beside them, and the statistics are there."""
    create_orders(db_dsn, 3_000)
    execute(db_dsn, 'CREATE INDEX orders_lower_status ON "Orders" (lower(status))')
    p = write_plan(tmp_path / "ix.toml", IX_PLAN)
    code, err = finish(spawn(db_dsn, "run", p), 120)
    assert code == 3, err
    assert query(db_dsn, "SELECT detail->>'beside_builds' FROM mover.events WHERE kind = 'analyzed'") == [("false",)]
    assert query(db_dsn, "SELECT count(*) > 0 FROM pg_statistic WHERE starelid = 'orders_lower_status_m1'::regclass"
                 ) == [(True,)]


# ---------------------------------------------------------------------------------------------
# Persistence


def test_unlogged_source_stays_unlogged_after_the_swap(db_dsn, tmp_path):
    execute(db_dsn, """
        CREATE UNLOGGED TABLE cache (id int PRIMARY KEY, v text NOT NULL);
        INSERT INTO cache SELECT g, md5(g::text) FROM generate_series(1, 3000) g;
    """)
    p = plan(tmp_path, "cache", "public.cache")
    r = mover(db_dsn, "run", p)
    assert r.returncode == 3, r.stderr
    assert query(db_dsn, "SELECT relpersistence FROM pg_class WHERE oid = 'cache_new'::regclass") == [("u",)]
    execute(db_dsn, "UPDATE cache SET v = 'changed' WHERE id <= 10; DELETE FROM cache WHERE id = 11")
    r = mover(db_dsn, "cutover", "cache")
    assert r.returncode == 0, r.stderr
    assert query(db_dsn, "SELECT relpersistence, format_type(a.atttypid, a.atttypmod) FROM pg_class c"
                         " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'id'"
                         " WHERE c.oid = 'cache'::regclass") == [("u", "bigint")]
    assert same_rows(db_dsn, "cache", "cache_old")
    assert query(db_dsn, "SELECT count(*) FROM cache WHERE v = 'changed'") == [(10,)]


# ---------------------------------------------------------------------------------------------
# Constraints keep their validation state


def test_not_valid_check_with_violating_rows_is_copied_not_valid(db_dsn, tmp_path):
    execute(db_dsn, """
        CREATE TABLE stock (id int PRIMARY KEY, qty int NOT NULL, sku text);
        INSERT INTO stock SELECT g, CASE WHEN g % 10 = 0 THEN -g ELSE g END, 'sku' || g
          FROM generate_series(1, 3000) g;
        ALTER TABLE stock ADD CONSTRAINT "qty not negative" CHECK (qty >= 0) NOT VALID;
        ALTER TABLE stock ADD CONSTRAINT sku_set CHECK (sku IS NOT NULL);
        COMMENT ON CONSTRAINT "qty not negative" ON stock IS 'old rows may break it';
    """)
    p = plan(tmp_path, "stock", "public.stock")
    r = mover(db_dsn, "plan", "check", p, "--sql")
    assert r.returncode == 0, r.stderr
    checked = " ".join(r.stdout.split())
    assert 'ALTER TABLE "public"."stock_new" DROP CONSTRAINT "qty not negative"' in checked
    assert 'ALTER TABLE "public"."stock_new" ADD CONSTRAINT "qty not negative" CHECK ((qty >= 0)) NOT VALID' in checked
    r = mover(db_dsn, "run", p)
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    # The application goes on: it repairs one old row, adds one, and cannot break the check anew.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE stock SET qty = 20, sku = 'fixed' WHERE id = 20")
        conn.execute("INSERT INTO stock VALUES (5000, 1, 'new')")
        try:
            conn.execute("UPDATE stock SET qty = -1 WHERE id = 21")
            raise AssertionError("the source enforces its NOT VALID check on new row versions")
        except psycopg.errors.CheckViolation:
            pass
    r = mover(db_dsn, "cutover", "stock")
    assert r.returncode == 0, r.stderr
    assert same_rows(db_dsn, "stock", "stock_old")
    assert query(db_dsn, "SELECT count(*) FROM stock WHERE qty < 0") == [(299,)]
    cons = query(db_dsn, "SELECT conname, convalidated, pg_get_constraintdef(oid),"
                         " obj_description(oid, 'pg_constraint') FROM pg_constraint"
                         " WHERE conrelid = 'stock'::regclass AND contype = 'c' ORDER BY 1")
    assert cons == [("qty not negative", False, "CHECK ((qty >= 0)) NOT VALID", "old rows may break it"),
                    ("sku_set", True, "CHECK ((sku IS NOT NULL))", None)]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for bad in ("INSERT INTO stock VALUES (6000, -5, 'x')", "INSERT INTO stock VALUES (6001, 5, NULL)"):
            try:
                conn.execute(bad)
                raise AssertionError(f"the swapped-in table accepted {bad!r}")
            except psycopg.errors.CheckViolation:
                pass
    # A rollback and a second cutover find the constraint already there.
    assert mover(db_dsn, "rollback", "stock").returncode == 0
    assert mover(db_dsn, "run", "stock").returncode == 3
    r = mover(db_dsn, "cutover", "stock")
    assert r.returncode == 0, r.stderr
    assert query(db_dsn, "SELECT count(*) FROM pg_constraint WHERE conrelid = 'stock'::regclass"
                         " AND conname = 'qty not negative' AND NOT convalidated") == [(1,)]


# ---------------------------------------------------------------------------------------------
# The identity sequence keeps its name; index comments follow


def test_identity_sequence_keeps_its_name_through_swap_rollback_and_retire(db_dsn, tmp_path):
    app = f"app_{uuid.uuid4().hex[:8]}"  # roles are cluster-wide: one of its own
    execute(db_dsn, f"""
        CREATE TABLE ida (id int GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, v text);
        INSERT INTO ida (v) SELECT 'v' || g FROM generate_series(1, 2000) g;
        CREATE ROLE {app};
        GRANT SELECT, INSERT ON ida TO {app};
        GRANT USAGE ON SEQUENCE ida_id_seq TO {app};
    """)
    try:
        _identity_sequence_keeps_its_name(db_dsn, tmp_path, app)
    finally:
        execute(db_dsn, f"DROP OWNED BY {app}; DROP ROLE {app}")


def _identity_sequence_keeps_its_name(db_dsn, tmp_path, app):
    p = plan(tmp_path, "ida", "public.ida")
    assert mover(db_dsn, "run", p).returncode == 3

    def sequence_of(table):
        return query(db_dsn, "SELECT pg_get_serial_sequence(%s, 'id')", (table,))[0][0]

    r = mover(db_dsn, "cutover", "ida")
    assert r.returncode == 0, r.stderr
    assert sequence_of("ida") == "public.ida_id_seq"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"SET ROLE {app}")  # the application's role, with its grant on the sequence
        new_id = conn.execute("INSERT INTO ida (v) VALUES ('after swap') RETURNING id").fetchone()[0]
        assert new_id == 2001
        assert conn.execute("SELECT currval('ida_id_seq')").fetchone()[0] == new_id
    r = mover(db_dsn, "rollback", "ida")
    assert r.returncode == 0, r.stderr
    assert sequence_of("ida") == "public.ida_id_seq"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        again = conn.execute("INSERT INTO ida (v) VALUES ('after rollback') RETURNING id").fetchone()[0]
        assert again == 2002 and conn.execute("SELECT currval('ida_id_seq')").fetchone()[0] == again
    assert mover(db_dsn, "run", "ida").returncode == 3
    assert mover(db_dsn, "cutover", "ida").returncode == 0
    r = mover(db_dsn, "retire", "ida", "--force")
    assert r.returncode == 0, r.stderr
    assert query(db_dsn, "SELECT to_regclass('ida_old')") == [(None,)]
    assert sequence_of("ida") == "public.ida_id_seq"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"SET ROLE {app}")
        last = conn.execute("INSERT INTO ida (v) VALUES ('after retire') RETURNING id").fetchone()[0]
        assert last == 2003 and conn.execute("SELECT currval('ida_id_seq')").fetchone()[0] == last
    assert query(db_dsn, "SELECT count(*), count(DISTINCT id) FROM ida") == [(2003, 2003)]


def test_index_and_key_comments_follow_the_swap(db_dsn, tmp_path):
    execute(db_dsn, """
        CREATE TABLE notes (id int PRIMARY KEY, author text NOT NULL, body text);
        CREATE INDEX "notes by author" ON notes (author);
        INSERT INTO notes SELECT g, 'a' || (g % 50), 'b' FROM generate_series(1, 2000) g;
        COMMENT ON INDEX notes_pkey IS 'the key index';
        COMMENT ON CONSTRAINT notes_pkey ON notes IS 'the key';
        COMMENT ON INDEX "notes by author" IS 'for the author page';
    """)
    p = plan(tmp_path, "notes", "public.notes")
    assert mover(db_dsn, "run", p).returncode == 3
    r = mover(db_dsn, "cutover", "notes")
    assert r.returncode == 0, r.stderr
    comments = query(db_dsn, "SELECT pg_get_indexdef(i.indexrelid), obj_description(i.indexrelid, 'pg_class')"
                             " FROM pg_index i WHERE i.indrelid = 'notes'::regclass ORDER BY i.indisprimary")
    assert [c for _, c in comments] == ["for the author page", "the key index"], comments
    assert "(author)" in comments[0][0]
    assert query(db_dsn, "SELECT obj_description(oid, 'pg_constraint') FROM pg_constraint"
                         " WHERE conrelid = 'notes'::regclass AND contype = 'p'") == [("the key",)]
