"""What the capture trigger logs for each kind of write: keys only, once each."""

from __future__ import annotations

import psycopg

from tests.workload import mover, plan_file


def test_each_write_logs_exactly_the_keys_it_touches(db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE "T" (a int NOT NULL, b text NOT NULL, v text, PRIMARY KEY (a, b))')
        conn.execute("""INSERT INTO "T" VALUES (1, 'x', 'before')""")
    plan = plan_file(tmp_path, "cap", '"T"')
    assert mover(db_dsn, "step", plan).returncode == 0
    assert mover(db_dsn, "step", "cap").returncode == 0  # install_capture

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        (mid,) = conn.execute("SELECT id FROM mover.migrations").fetchone()
        log = f"mover.m{mid}_changes"

        def logged(statement, role=None):
            conn.execute(f"DELETE FROM {log}")
            if role:
                conn.execute(f"SET ROLE {role}")
            try:
                conn.execute(statement)
            finally:
                conn.execute("RESET ROLE")
            return sorted(conn.execute(f"SELECT a, b FROM {log}").fetchall())

        assert logged("""INSERT INTO "T" VALUES (2, 'y', 'new')""") == [(2, "y")]
        assert logged("""UPDATE "T" SET v = 'changed' WHERE a = 2""") == [(2, "y")]
        assert logged("""UPDATE "T" SET b = 'z' WHERE a = 2""") == [(2, "y"), (2, "z")]  # the key changed
        assert logged("""DELETE FROM "T" WHERE a = 2""") == [(2, "z")]
        assert logged("""INSERT INTO "T" SELECT g, 'm', NULL FROM generate_series(10, 14) g""") == \
            [(g, "m") for g in range(10, 15)]
        # A role with no rights on mover's schema writes through the trigger all the same.
        conn.execute("DROP ROLE IF EXISTS cap_app")
        conn.execute("CREATE ROLE cap_app")
        conn.execute('GRANT INSERT ON "T" TO cap_app')
        try:
            assert logged("""INSERT INTO "T" VALUES (3, 'w', 'as app')""", role="cap_app") == [(3, "w")]
        finally:
            conn.execute("DROP OWNED BY cap_app")
            conn.execute("DROP ROLE cap_app")


def test_capture_path_check_refuses_rights_of_other_roles_on_the_log(db_dsn, tmp_path):
    """privileges.capture_path_missing: the installed capture is SECURITY DEFINER and its log grants
    nothing; a right another role holds on the log (granted, or by the schema's default
    privileges, which plan check sees on its rehearsed log) is named with the REVOKE to run."""
    from psycopg import sql

    from mover import names
    from mover.catalog import privileges

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
        conn.execute("DROP ROLE IF EXISTS cap_other")
        conn.execute("CREATE ROLE cap_other")
    plan = plan_file(tmp_path, "cap", "t")
    assert mover(db_dsn, "step", plan).returncode == 0
    assert mover(db_dsn, "step", "cap").returncode == 0  # install_capture
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        try:
            (mid,) = conn.execute("SELECT id FROM mover.migrations").fetchone()
            fn, log = names.capture_function(mid), names.change_log(mid)
            with conn.cursor() as cur:
                assert privileges.capture_path_missing(cur, fn, log) == []
                assert cur.execute("SELECT relacl FROM pg_class WHERE oid = %s::regclass",
                                   (str(log),)).fetchone()[0] is None  # the owner's defaults: no grant
                cur.execute(sql.SQL("GRANT INSERT, TRIGGER ON {} TO cap_other").format(log.ident))
                cur.execute(sql.SQL("GRANT SELECT, DELETE ON {} TO PUBLIC").format(log.ident))
                missing = privileges.capture_path_missing(cur, fn, log)
                assert [(m.role, m.what.split(" on ")[0], m.grant) for m in missing] == [
                    ("PUBLIC", "holds DELETE", f"REVOKE ALL ON {log.ident.as_string(cur)} FROM PUBLIC"),
                    ('"cap_other"', "holds INSERT, TRIGGER", f"REVOKE ALL ON {log.ident.as_string(cur)} FROM"
                                                              ' "cap_other"')]
                cur.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC, cap_other").format(log.ident))
                cur.execute(sql.SQL("ALTER FUNCTION {}() SECURITY INVOKER").format(fn.ident))
                assert [m.grant for m in privileges.capture_path_missing(cur, fn, log)] == \
                    [f"ALTER FUNCTION {fn.ident.as_string(cur)}() SECURITY DEFINER"]
                cur.execute(sql.SQL("ALTER FUNCTION {}() SECURITY DEFINER").format(fn.ident))
            # A new log would get INSERT for PUBLIC from the schema's default privileges: plan check says so.
            conn.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA mover GRANT INSERT ON TABLES TO PUBLIC")
            conn.execute("CREATE TABLE t2 (k int PRIMARY KEY)")
            other = plan_file(tmp_path, "cap2", "t2")
            out = mover(db_dsn, "plan", "check", other)
            assert out.returncode == 2, out.stderr
            flat = " ".join(out.stderr.split())
            assert "PUBLIC holds INSERT on" in flat and "REVOKE ALL ON" in flat and "default privileges" in flat, flat
        finally:
            conn.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA mover REVOKE INSERT ON TABLES FROM PUBLIC")
            conn.execute("DROP OWNED BY cap_other")
            conn.execute("DROP ROLE cap_other")


def test_a_capture_installed_by_an_older_mover_is_upgraded_on_resume(db_dsn, tmp_path):
    """The upgrade path: a migration whose capture an older mover installed (the function SECURITY
    INVOKER, with the unqualified body, the log granted to PUBLIC, its primary key on seq) is
    brought to this design by the next command that resumes it, recorded as an event; capture
    goes on (the log's rows and the trigger are kept)."""
    from psycopg import sql

    from mover import names

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 100) g")
    plan = plan_file(tmp_path, "up", "t")
    assert mover(db_dsn, "step", plan).returncode == 0
    assert mover(db_dsn, "step", "up").returncode == 0  # install_capture
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        (mid,) = conn.execute("SELECT id FROM mover.migrations").fetchone()
        fn, log = names.capture_function(mid), names.change_log(mid)
        old_body = ("BEGIN IF TG_OP <> 'DELETE' THEN INSERT INTO {log} (k) VALUES (NEW.k); END IF;"
                    " IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND ROW(OLD.k) IS DISTINCT FROM ROW(NEW.k)) THEN"
                    " INSERT INTO {log} (k) VALUES (OLD.k); END IF; RETURN NULL; END")
        conn.execute(sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql SECURITY INVOKER"
                             " AS {}").format(fn.ident, sql.Literal(sql.SQL(old_body).format(log=log.ident)
                                                                    .as_string(conn))))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA mover TO PUBLIC"))
        conn.execute(sql.SQL("GRANT INSERT ON {} TO PUBLIC").format(log.ident))
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier("mover", f"{log.name}_seq")))
        conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (seq)").format(log.ident))
        conn.execute("UPDATE t SET v = 'y' WHERE k = 1")
    out = mover(db_dsn, "step", "up")  # resumes: the backfill
    assert out.returncode == 0, out.stderr
    assert "capture_upgraded" in out.stdout + out.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        definer, src = conn.execute("SELECT prosecdef, prosrc FROM pg_proc WHERE oid = %s::regprocedure",
                                    (f"{fn}()",)).fetchone()
        assert definer and "OPERATOR(pg_catalog.=)" in src and "IS DISTINCT FROM" not in src
        assert not conn.execute("SELECT has_table_privilege('public', %s::regclass, 'INSERT')",
                                (str(log),)).fetchone()[0]
        assert conn.execute("SELECT count(*) FROM mover.events WHERE kind = 'capture_upgraded'").fetchone()[0] == 1
        conn.execute("UPDATE t SET k = 1000 WHERE k = 2")  # the new body, on the old log
        logged = {r[0] for r in conn.execute(sql.SQL("SELECT k FROM {}").format(log.ident))}
        assert {2, 1000} <= logged, logged
    out = mover(db_dsn, "step", "up")  # nothing left to upgrade: no second event
    assert out.returncode == 0, out.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM mover.events WHERE kind = 'capture_upgraded'").fetchone()[0] == 1


def test_replay_into_an_unanalyzed_partitioned_target_is_driven_by_the_keys(db_dsn, tmp_path):
    """The target's partitions filled but never analyzed, as during the backfill: the replay of a
    batch runs with no hash or merge join and no JIT (the planner would otherwise hash every
    partition and the whole source per batch), replays exactly the logged keys (a row that moved
    to another month, a deleted row), and leaves the transaction's settings as they were."""
    from psycopg import sql

    from mover import names
    from mover.db import Database
    from mover.engines.capture import changelog
    from mover.engines.context import Context
    from mover.sql import capture as q
    from mover.state import control

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ev (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, v text)")
        conn.execute("INSERT INTO ev SELECT g, now() - (g % 600) * interval '1 day', md5(g::text)"
                     " FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE ev")
    plan = plan_file(tmp_path, "ev", "ev", target={"partition": {
        "by": "range", "column": "created_at", "interval": "1 month", "accept_key_change": True}})
    assert mover(db_dsn, "step", plan).returncode == 0  # create_target
    assert mover(db_dsn, "step", "ev").returncode == 0  # install_capture
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO ev_new SELECT * FROM ev")  # what the ranges copy; nothing analyzes it
        conn.execute("UPDATE ev SET created_at = created_at - interval '45 days' WHERE id % 100 = 0")
        conn.execute("UPDATE ev SET v = 'changed' WHERE id % 100 = 1")
        conn.execute("DELETE FROM ev WHERE id % 100 = 2")

    db = Database(db_dsn)
    try:
        ctx = Context(db=db, migration=db.transaction(lambda cur: control.get(cur, "ev")), owner="test")

        def settings(cur):
            cur.execute("SELECT current_setting('enable_hashjoin'), current_setting('enable_mergejoin'),"
                        " current_setting('jit')")
            return cur.fetchone()

        def apply(cur):
            before = settings(cur)
            m = ctx.mapping(cur)
            assert m.dst_partition == ("created_at",)
            saved = changelog._drive_by_keys(cur, m)
            replay = q.replay(m, names.change_log(ctx.mid, False), covered=sql.SQL("true"), skip_locked=True)
            cur.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + replay, {"limit": changelog.BATCH})
            plan_text = str(cur.fetchone()[0])
            cur.execute("SELECT current_setting('jit')")
            jit = cur.fetchone()[0]
            changelog._put_back(cur, saved)
            applied = changelog.apply_batch(cur, ctx, m, reverse=False, backfill_done=True)
            return plan_text, jit, applied, before, settings(cur)

        plan_text, jit, applied, before, after = db.transaction(apply)
    finally:
        db.close()
    assert "Hash Join" not in plan_text and "Merge Join" not in plan_text and "Nested Loop" in plan_text
    assert jit == "off"
    assert after == before and before[:2] == ("on", "on")  # put back for the rest of the transaction
    assert (applied.claimed, applied.deleted, applied.failed) == (600, 400, 0)  # 200 moved rows, 200 deleted
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT (SELECT count(*) FROM (TABLE ev EXCEPT ALL TABLE ev_new) a),"
                            " (SELECT count(*) FROM (TABLE ev_new EXCEPT ALL TABLE ev) b)").fetchone() == (0, 0)


def _replay_alone(db_dsn: str, source: str, target: str, keys: list[tuple[str, ...]], key: tuple[str, ...]):
    """replay_set of `keys` from `source` into `target` in one transaction, counting its statements;
    then whether the two tables hold the same rows (EXCEPT ALL both ways)."""
    from mover.catalog import conversion, introspect
    from mover.engines.capture import changelog
    from mover.names import QualifiedName

    statements: list[object] = []

    class Counting(psycopg.Cursor):
        def execute(self, query, params=None, **kwargs):
            statements.append(query)
            return super().execute(query, params, **kwargs)

    with psycopg.connect(db_dsn, cursor_factory=Counting) as conn, conn.cursor() as cur:
        m = conversion.mapping(introspect.describe(cur, QualifiedName("public", source)),
                               introspect.describe(cur, QualifiedName("public", target)), key)
        statements.clear()
        failed = changelog.replay_set(cur, m, keys)
        conn.commit()
        differ = [cur.execute(f"SELECT count(*) FROM (TABLE {a} EXCEPT ALL TABLE {b}) d").fetchone()[0]
                  for a, b in ((source, target), (target, source))]
    return failed, statements, differ


def test_a_long_cycle_of_swapped_values_is_replayed_in_one_statement(db_dsn):
    """Race 7 after many swaps (issue 21, item 4): each row of a UNIQUE e-mail column has taken the
    next row's value since the target last saw them, a cycle through 1,000 rows (what thousands of
    random two-row swaps leave between two replays of a busy table). Replaying one key of it pulls
    the whole cycle in and replaces it in one statement (a closure computed a step per statement
    stopped after 20 steps, then halved the set down to single keys, each failing)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, email text NOT NULL UNIQUE, note text)")
        conn.execute("INSERT INTO acct SELECT g, 'u' || g || '@x', 'n' FROM generate_series(1, 2000) g")
        conn.execute("CREATE TABLE acct_new (id bigint PRIMARY KEY, email text NOT NULL UNIQUE, note text)")
        conn.execute("INSERT INTO acct_new SELECT * FROM acct")
        with conn.transaction():  # the application's rotation, through temporary values
            conn.execute("UPDATE acct SET email = 'tmp-' || id WHERE id <= 1000")
            conn.execute("UPDATE acct SET email = 'u' || (id % 1000 + 1) || '@x' WHERE id <= 1000")
    failed, statements, differ = _replay_alone(db_dsn, "acct", "acct_new", [("1",)], ("id",))
    assert failed == {}
    assert differ == [0, 0]
    assert sum("RECURSIVE" in str(s) for s in statements) == 1, statements


def test_a_booking_moved_into_a_slot_another_left_is_replayed_with_it(db_dsn):
    """Race 7 under an exclusion constraint: booking 1 moved into the slot booking 2 left, which
    moved into booking 3's, and so on, a chain through 300 bookings; and, beside it,
    a cancelled booking (outside the partial constraint) overlapping a live one. Replaying booking
    1 alone pulls in, by the constraint's own operators over its expression, every booking that
    stands in its way, and the target then equals the source."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for t in ("slot", "slot_new"):
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, room text NOT NULL, lo int NOT NULL, hi int NOT NULL,"
                         f" cancelled boolean NOT NULL DEFAULT false,"
                         f" CONSTRAINT {t}_no_overlap EXCLUDE USING gist (int4range(lo, hi) WITH &&)"
                         f" WHERE (NOT cancelled))")
        conn.execute("INSERT INTO slot SELECT g, 'r1', g * 10, g * 10 + 10, false FROM generate_series(1, 301) g")
        conn.execute("INSERT INTO slot_new SELECT * FROM slot")
        with conn.transaction():  # each booking takes the next one's slot; the last one's is free
            conn.execute("DELETE FROM slot WHERE id = 301")
            conn.execute("UPDATE slot SET lo = lo + 100000, hi = hi + 100000 WHERE id <= 300")
            conn.execute("UPDATE slot SET lo = lo - 100000 + 10, hi = hi - 100000 + 10 WHERE id <= 300")
            conn.execute("INSERT INTO slot VALUES (400, 'r1', 15, 25, true)")  # cancelled: not excluded
    failed, _, differ = _replay_alone(db_dsn, "slot", "slot_new", [("1",), ("400",)], ("id",))
    assert failed == {}
    assert differ == [0, 0]
