"""The capture trigger against other roles (issue 20, items 3 and 4): nothing a role without rights
on the source can do makes the application's writes fail or runs its code in them, and a
session holding the change log is named when it blocks a locked step.

The application writes as a DML-only role (`webapp`), mover runs as the table's owner (`app`,
setup B of docs/operating.md), and a third role (`evil`) has no right on the source but what
every database upgraded from PostgreSQL 14 gives: USAGE on schema mover (setup B's old grant to
PUBLIC) and CREATE on public."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql

from tests.e2e.test_privileges import (
    PLAN,
    Roles,
    as_user,
    finish_migration,
    roles,  # noqa: F401 (the fixture; F811 below: its parameters)
)
from tests.workload import Writer, assert_oracle, differences, mover, plan_file, write_plan


def setup_b(r: Roles, evil: str) -> None:
    A, E = sql.Identifier(r.app_name), sql.Identifier(evil)
    r.su(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(A),
         sql.SQL("GRANT USAGE, CREATE ON SCHEMA mover TO {}").format(A),
         sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA mover TO {}").format(A),
         "GRANT USAGE ON SCHEMA mover TO PUBLIC",  # what setup B used to grant (and may still)
         "GRANT CREATE ON SCHEMA public TO PUBLIC",  # the pre-15 default
         sql.SQL("CREATE ROLE {} LOGIN").format(E))


def migration_id(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT id FROM mover.migrations").fetchone()[0]


def wait_for_ops(writer: Writer, more: int) -> None:
    target, deadline = writer.ops + more, time.monotonic() + 60
    while writer.ops < target:
        assert time.monotonic() < deadline, "the writer made no progress"
        writer.stop.wait(0.01)


@pytest.fixture
def evil(roles):  # noqa: F811
    name = "evil_" + roles.app_name.split("_", 1)[1]
    setup_b(roles, name)
    yield name
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(sql.Identifier(roles.dbname),
                                                                        sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_role_without_rights_on_the_source_cannot_forge_lock_or_borrow_the_log(roles, evil, tmp_path):  # noqa: F811
    """Issue 20, item 3: `evil` tries to insert the seq values the log's identity hands out next
    (before: granted to PUBLIC, and every application write then failed on the log's primary
    key), to lock the log, and to attach mover's trigger function to a table of its own. All
    refused; the application's writer sees no error, and nothing is lost (the mirror). Even the
    log's owner forging seq values cannot fail a write: the log has no unique key."""
    r = roles
    plan = write_plan(tmp_path / "priv.toml", PLAN)
    writer = Writer(r.web, seed=41).start()
    try:
        out = mover(r.app, "run", plan)
        assert out.returncode == 3, out.stderr  # at the cutover gate, the capture installed
        mid = migration_id(r.admin)
        log = sql.Identifier("mover", f"m{mid}_changes")
        fn = sql.Identifier("mover", f"m{mid}_capture")
        with psycopg.connect(as_user(r.admin, evil), autocommit=True) as conn:
            for attempt in (
                    sql.SQL("INSERT INTO {} (seq, id) OVERRIDING SYSTEM VALUE"
                            " SELECT g, 1 FROM generate_series(1, 300000) g").format(log),
                    sql.SQL("INSERT INTO {} (id) VALUES (1)").format(log),
                    sql.SQL("DELETE FROM {}").format(log),
                    sql.SQL("TRUNCATE {}").format(log)):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(attempt)
            for mode in ("ROW EXCLUSIVE", "ACCESS SHARE", "ACCESS EXCLUSIVE"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                    conn.execute(sql.SQL("LOCK TABLE {} IN {} MODE").format(log, sql.SQL(mode)))
            conn.execute("CREATE TABLE public.evil_t (id int)")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("CREATE TRIGGER t AFTER INSERT ON public.evil_t FOR EACH ROW"
                                     " EXECUTE FUNCTION {}()").format(fn))
            # Nor through the owner's rights, which the function runs with: it cannot be called.
            with pytest.raises(psycopg.Error):
                conn.execute(sql.SQL("SELECT {}()").format(fn))
        wait_for_ops(writer, 50)
        # The log's owner (or a superuser) can still insert; a collision is no longer possible.
        with psycopg.connect(r.app, autocommit=True) as conn:
            (top,) = conn.execute(sql.SQL("SELECT coalesce(max(seq), 0) FROM {}").format(log)).fetchone()
            conn.execute(sql.SQL("INSERT INTO {} (seq, id) OVERRIDING SYSTEM VALUE"
                                 " SELECT g, 1 FROM generate_series(%s::bigint, %s::bigint + 20000) g").format(log),
                         (top + 1, top + 1))
        wait_for_ops(writer, 200)
        assert writer.errors == []
        writer.pause()
        assert mover(r.app, "run", "priv").returncode == 3
        assert differences(r.admin, "Orders", "Orders_new") == (0, 0)
        assert_oracle(r.admin, "Orders", "Orders_new")
        writer.resume()
        finish_migration(r, writer)
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 0


def test_shadowing_operators_and_functions_in_public_never_run_in_the_trigger(roles, evil, tmp_path):  # noqa: F811
    """Issue 20, item 4 (the trigger): `evil` creates `public.=` for (varchar, varchar), an exact
    match that beats pg_catalog's text = text in any session whose search_path has public, and
    a `public.format` for the TRUNCATE message's arguments; each writes a marker with the session
    it ran in. The application's role writes (key changes included) and truncates: no marker
    from its sessions, no error but mover's own TRUNCATE refusal, and the log holds exactly the
    keys each write touched."""
    r = roles
    A, W, E = (sql.Identifier(x) for x in (r.app_name, r.web_name, evil))
    r.su("CREATE TABLE doc (k varchar(20) PRIMARY KEY, v int NOT NULL)",
         "INSERT INTO doc SELECT 'k' || g, g FROM generate_series(1, 500) g",
         sql.SQL("ALTER TABLE doc OWNER TO {}").format(A),
         sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON doc TO {}").format(W))
    with psycopg.connect(as_user(r.admin, evil), autocommit=True) as conn:
        conn.execute("CREATE TABLE public.marks (who text, app text, what text)")
        conn.execute("GRANT INSERT ON public.marks TO PUBLIC")
        conn.execute("""CREATE FUNCTION public.evil_eq(varchar, varchar) RETURNS boolean LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.marks VALUES (session_user, current_setting('application_name'), '=');
                RETURN $1::text OPERATOR(pg_catalog.=) $2::text;
            END $$""")
        conn.execute("CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.evil_eq)")
        conn.execute("""CREATE FUNCTION public.format(text, name, text) RETURNS text LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.marks VALUES (session_user, current_setting('application_name'), 'format');
                RETURN 'hijacked';
            END $$""")
    plan = plan_file(tmp_path, "doc", "doc")
    assert mover(r.app, "step", plan).returncode == 0  # create_target
    out = mover(r.app, "step", "doc")  # install_capture
    assert out.returncode == 0, out.stderr
    mid = migration_id(r.admin)
    log = sql.Identifier("mover", f"m{mid}_changes")

    eq = "OPERATOR(pg_catalog.=)"  # the application's own statements must not run evil's operator either
    with psycopg.connect(r.web, autocommit=True, application_name="webapp-writer") as conn:
        assert conn.execute("SHOW search_path").fetchone()[0] == '"$user", public'
        conn.execute(f"UPDATE doc SET v = v + 1 WHERE k {eq} 'k1'")
        conn.execute(f"UPDATE doc SET k = 'moved' WHERE k {eq} 'k2'")  # a key change: both keys
        conn.execute(f"UPDATE doc SET k = k WHERE k {eq} 'k3'")  # same key: one
        conn.execute("INSERT INTO doc VALUES ('new', 0)")
        conn.execute(f"DELETE FROM doc WHERE k {eq} 'k4'")
        with pytest.raises(psycopg.errors.ObjectInUse) as refused:
            conn.execute("TRUNCATE doc")
        assert "is being moved by mover migration doc" in str(refused.value)
    with psycopg.connect(r.admin, autocommit=True) as conn:
        marks = conn.execute("SELECT who, app, what FROM public.marks WHERE app = 'webapp-writer'").fetchall()
        assert marks == []
        logged = [k for (k,) in conn.execute(sql.SQL("SELECT k FROM {} ORDER BY seq").format(log)).fetchall()]
    assert logged == ["k1", "moved", "k2", "k3", "new", "k4"]


def test_a_session_holding_the_change_log_is_named_with_its_pid(db_dsn, tmp_path):
    """Issue 20, item 3: a session holding the change log (here the log's owner, the only role
    besides a superuser that can; an application session idle after a write holds the source
    too) makes the cutover give up naming the log, the pid, its role, state and age -- not
    "could not lock public.Orders" and no pid."""
    from tests.e2e.test_lock_conflicts import PLAN as LOCK_PLAN
    from tests.workload import create_orders

    create_orders(db_dsn, 2_000)
    plan = write_plan(tmp_path / "locked.toml", LOCK_PLAN)
    out = mover(db_dsn, "run", plan)
    assert out.returncode == 3, out.stderr
    mid = migration_id(db_dsn)
    holder = psycopg.connect(db_dsn, application_name="psql-operator")
    try:
        log = sql.Identifier("mover", f"m{mid}_changes")
        holder.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(log))
        pid = holder.info.backend_pid
        out = mover(db_dsn, "cutover", "locked")
        assert out.returncode == 3, out.stderr
        flat = " ".join(out.stderr.split())
        assert f'could not lock "mover"."m{mid}_changes"' in flat, flat
        assert f"pid {pid} (user postgres, application 'psql-operator', idle in transaction, transaction open" in flat
        assert f'holding "mover"."m{mid}_changes")' in flat, flat
    finally:
        holder.close()
    # An application session idle in a transaction that wrote the source holds both: named with both.
    holder = psycopg.connect(db_dsn, application_name="app-idle")
    try:
        holder.execute('UPDATE "Orders" SET note = note WHERE id = 1')
        pid = holder.info.backend_pid
        out = mover(db_dsn, "cutover", "locked")
        assert out.returncode == 3, out.stderr
        flat = " ".join(out.stderr.split())
        assert 'could not lock "public"."Orders"' in flat, flat
        assert f"pid {pid} (user postgres, application 'app-idle', idle in transaction" in flat, flat
        assert f'holding "mover"."m{mid}_changes", "public"."Orders")' in flat, flat
    finally:
        holder.close()
    assert mover(db_dsn, "cutover", "locked").returncode == 0
