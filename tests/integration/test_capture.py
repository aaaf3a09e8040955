"""What the capture trigger logs for each kind of write: keys only, once each."""

from __future__ import annotations

import psycopg
import pytest

from tests.workload import mover, write_plan


def test_each_write_logs_exactly_the_keys_it_touches(db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE "T" (a int NOT NULL, b text NOT NULL, v text, PRIMARY KEY (a, b))')
        conn.execute("""INSERT INTO "T" VALUES (1, 'x', 'before')""")
    plan = write_plan(tmp_path / "p.toml", '[migration]\nname = "cap"\nsource = \'"T"\'\n[rollback]\nwindow = "1h"\n')
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


def test_capture_path_check_matches_what_each_writer_can_really_do(db_dsn):
    """privileges.capture_path_missing names exactly the writers that a trigger inserting into the
    log would fail: the owner, a role with only column UPDATE, a member inheriting it, a role with
    only DELETE; not a reader. Checked against the real trigger, run as each role."""
    import uuid

    from psycopg import sql

    from mover import privileges
    from mover.names import QualifiedName

    tag = uuid.uuid4().hex[:6]
    owner, group, member, deleter, reader = (f"{r}_{tag}" for r in ("own", "grp", "mem", "del", "rd"))
    ident = sql.Identifier
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for role in (owner, group, member, deleter, reader):
            conn.execute(sql.SQL("CREATE ROLE {}").format(ident(role)))
        try:
            conn.execute(sql.SQL("GRANT {} TO {}").format(ident(group), ident(member)))
            conn.execute("CREATE SCHEMA logs")  # owned by the superuser; PUBLIC has no USAGE
            conn.execute("CREATE TABLE logs.l (seq bigint GENERATED ALWAYS AS IDENTITY, k int)")
            conn.execute("GRANT INSERT ON logs.l TO PUBLIC")
            conn.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
            conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
            conn.execute(sql.SQL("ALTER TABLE t OWNER TO {}").format(ident(owner)))
            conn.execute(sql.SQL("GRANT UPDATE (v) ON t TO {}").format(ident(group)))
            conn.execute(sql.SQL("GRANT SELECT ON t TO {}, {}, {}").format(ident(group), ident(deleter), ident(reader)))
            conn.execute(sql.SQL("GRANT DELETE ON t TO {}").format(ident(deleter)))
            conn.execute("CREATE FUNCTION log_k() RETURNS trigger LANGUAGE plpgsql AS"
                         " $$BEGIN INSERT INTO logs.l (k) VALUES (coalesce(NEW.k, OLD.k)); RETURN NULL; END$$")
            conn.execute("CREATE TRIGGER log_k AFTER UPDATE OR DELETE ON t FOR EACH ROW EXECUTE FUNCTION log_k()")
            table, log = QualifiedName("public", "t"), QualifiedName("logs", "l")
            writers = {owner, group, member, deleter}
            with conn.cursor() as cur:
                assert set(privileges.writers(cur, table)) == writers  # the reader is none
                missing = privileges.capture_path_missing(cur, table, log)
            assert {m.role for m in missing} == {"PUBLIC", *(f'"{w}"' for w in writers)}
            assert {m.what for m in missing} == {'USAGE on schema "logs"'}

            def write_as(role, statement):
                conn.execute(sql.SQL("SET ROLE {}").format(ident(role)))
                try:
                    conn.execute(statement)
                finally:
                    conn.execute("RESET ROLE")

            writes = {owner: "UPDATE t SET v = 'o' WHERE k = 1", group: "UPDATE t SET v = 'g' WHERE k = 2",
                      member: "UPDATE t SET v = 'm' WHERE k = 3", deleter: "DELETE FROM t WHERE k = 4"}
            for role, statement in writes.items():  # the check was right: each one fails in the trigger
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match='schema logs'):
                    write_as(role, statement)
            conn.execute("GRANT USAGE ON SCHEMA logs TO PUBLIC")
            with conn.cursor() as cur:
                assert privileges.capture_path_missing(cur, table, log) == []
            for role, statement in writes.items():
                write_as(role, statement)
            assert conn.execute("SELECT count(*) FROM logs.l").fetchone()[0] == 4
        finally:
            conn.execute("DROP SCHEMA IF EXISTS logs CASCADE")
            conn.execute("DROP TABLE IF EXISTS t")
            conn.execute("DROP FUNCTION IF EXISTS log_k()")
            for role in (owner, group, member, deleter, reader):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(ident(role)))
            for role in (member, owner, group, deleter, reader):
                conn.execute(sql.SQL("DROP ROLE {}").format(ident(role)))


def test_replay_into_an_unanalyzed_partitioned_target_is_driven_by_the_keys(db_dsn, tmp_path):
    """The target's partitions filled but never analyzed, as during the backfill: the replay of a
    batch runs with no hash or merge join and no JIT (the planner would otherwise hash every
    partition and the whole source per batch), replays exactly the logged keys (a row that moved
    to another month, a deleted row), and leaves the transaction's settings as they were."""
    from psycopg import sql

    from mover import capture, control, names
    from mover.context import Context
    from mover.db import Database
    from mover.sql import capture as q

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ev (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, v text)")
        conn.execute("INSERT INTO ev SELECT g, now() - (g % 600) * interval '1 day', md5(g::text)"
                     " FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE ev")
    plan = write_plan(tmp_path / "p.toml", '[migration]\nname = "ev"\nsource = "ev"\n[target.partition]\n'
                      'by = "range"\ncolumn = "created_at"\ninterval = "1 month"\naccept_key_change = true\n'
                      '[rollback]\nwindow = "1h"\n')
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
            saved = capture._drive_by_keys(cur, m)
            replay = q.replay(m, names.change_log(ctx.mid, False), covered=sql.SQL("true"), skip_locked=True)
            cur.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + replay, {"limit": capture.BATCH})
            plan_text = str(cur.fetchone()[0])
            cur.execute("SELECT current_setting('jit')")
            jit = cur.fetchone()[0]
            capture._put_back(cur, saved)
            applied = capture.apply_batch(cur, ctx, m, reverse=False, backfill_done=True)
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


def test_a_value_moved_into_a_closure_after_it_was_computed_is_replayed_at_once(db_dsn, monkeypatch):
    """Race 7 under a swapping writer: between the statements that compute a closure and the one
    that replaces it, the application swaps a value from a row outside the set into it (committed,
    on its own connection). The replacement reads the source in one snapshot and pulls that row in:
    one attempt, no halving, and the target equals the source (EXCEPT ALL both ways)."""
    from mover import capture, introspect
    from mover.names import QualifiedName
    from mover.sql.mapping import Mapping

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, email text NOT NULL UNIQUE, note text)")
        conn.execute("INSERT INTO acct SELECT g, 'u' || g || '@x', 'n' FROM generate_series(1, 100) g")
        conn.execute("CREATE TABLE acct_new (id bigint PRIMARY KEY, email text NOT NULL UNIQUE, note text)")
        conn.execute("INSERT INTO acct_new SELECT * FROM acct")
    app = psycopg.connect(db_dsn, autocommit=True)

    def swap(a: int, b: int) -> None:  # the application's swap through a temporary value
        with app.transaction():
            ea = app.execute("SELECT email FROM acct WHERE id = %s", (a,)).fetchone()[0]
            eb = app.execute("SELECT email FROM acct WHERE id = %s", (b,)).fetchone()[0]
            app.execute("UPDATE acct SET email = 'tmp' WHERE id = %s", (a,))
            app.execute("UPDATE acct SET email = %s WHERE id = %s", (ea, b))
            app.execute("UPDATE acct SET email = %s WHERE id = %s", (eb, a))

    swap(1, 2)  # what the keys to replay hold
    computed = capture._closure
    calls = []

    def closure_then_a_swap(*args):
        keys = computed(*args)
        calls.append(list(keys))
        swap(2, 50 + len(calls))  # row 51, 52...: outside the set until the statement pulls it in
        return keys

    monkeypatch.setattr(capture, "_closure", closure_then_a_swap)
    try:
        with psycopg.connect(db_dsn) as conn, conn.cursor() as cur:
            m = Mapping.between(introspect.describe(cur, QualifiedName("public", "acct")),
                                introspect.describe(cur, QualifiedName("public", "acct_new")), ("id",))
            assert capture.replay_set(cur, m, [("1",), ("2",)]) == {}
            conn.commit()
            for a, b in (("acct", "acct_new"), ("acct_new", "acct")):
                cur.execute(f"SELECT count(*) FROM (TABLE {a} EXCEPT ALL TABLE {b}) d")
                assert cur.fetchone()[0] == 0, (a, b)
    finally:
        app.close()
    assert len(calls) == 1, calls
