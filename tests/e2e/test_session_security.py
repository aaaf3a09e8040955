"""What a mover session sees and runs (issue 20, docs/operating.md "Security").

- Row-level security: a policy that applies to mover's role is refused by `plan check` (it would
  show mover a tenant's share of the table) and stops a step that meets one later; with
  BYPASSRLS the migration loses nothing.
- Conversion settings: fixed at registration and set in every transaction, so a mover process in
  another time zone (PGTZ, PGOPTIONS) converts timestamp <-> timestamptz exactly as the first did.
- search_path: pinned to pg_catalog, pg_temp; objects another role plants in a writable schema
  on the application's path never run in a mover session.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from tests.workload import Writer, assert_oracle, count, create_orders, differences, mover, plan_text, write_plan


@dataclass
class Cast:
    admin: str  # the superuser DSN
    roles: dict[str, str]  # role name -> its DSN
    dbname: str

    def su(self, *statements: sql.Composable | str) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            for s in statements:
                conn.execute(s)


def as_user(dsn: str, user: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


def make_cast(db_dsn: str, *names: str) -> Cast:
    """LOGIN roles (unique per test: roles belong to the cluster), none a superuser."""
    tag = uuid.uuid4().hex[:6]
    roles = {f"{n}_{tag}": as_user(db_dsn, f"{n}_{tag}") for n in names}
    c = Cast(db_dsn, roles, urllib.parse.urlsplit(db_dsn).path.lstrip("/"))
    c.su(*(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(r)) for r in roles))
    return c


def drop_cast(c: Cast) -> None:
    idents = sql.SQL(", ").join(sql.Identifier(r) for r in c.roles)
    with psycopg.connect(c.admin, dbname="postgres", autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)",
                     (list(c.roles),))
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(c.dbname)))
        conn.execute(sql.SQL("DROP ROLE {}").format(idents))


def setup_b(c: Cast, owner: str) -> sql.Composable:
    """docs/operating.md "Privileges", setup B: `mover init` ran as a superuser (the template's)."""
    o = sql.Identifier(owner)
    return sql.SQL("GRANT CREATE ON SCHEMA public TO {o}; GRANT USAGE, CREATE ON SCHEMA mover TO {o};"
                   " GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA mover TO {o};"
                   " GRANT USAGE ON SCHEMA mover TO PUBLIC;"
                   # plan check peeks at the next migration id (control.next_id)
                   " GRANT SELECT ON ALL SEQUENCES IN SCHEMA mover TO {o}").format(o=o)


# ---------------------------------------------------------------------------------------------
# Row-level security

RLS_PLAN = plan_text("rls", columns={"id": "bigint"}, backfill={"range_rows": 2000}, cutover={"lock_timeout": "500ms"})


@pytest.fixture
def tenants(db_dsn) -> Iterator[Cast]:
    """Issue 20's scenario: the owner (not a superuser) and two tenant roles; a policy by tenant,
    ENABLE and FORCE ROW LEVEL SECURITY, so that the owner sees only its third of the rows."""
    c = make_cast(db_dsn, "app", "tenant_a", "tenant_b")
    owner, *writers = c.roles
    create_orders(db_dsn, 6_000)
    o = sql.Identifier(owner)
    c.su(sql.SQL('ALTER TABLE "Orders" ADD COLUMN tenant text'),
         sql.SQL('UPDATE "Orders" SET tenant = ({}::text[])[1 + id % 3]').format(sql.Literal([owner, *writers])),
         'ALTER TABLE "Orders" ALTER tenant SET DEFAULT current_user',
         sql.SQL('ALTER TABLE "Orders" OWNER TO {}').format(o),
         """CREATE POLICY by_tenant ON "Orders" USING (tenant IN (current_user, 'shared'))""",
         'ALTER TABLE "Orders" ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY',
         setup_b(c, owner),
         *(sql.SQL('GRANT SELECT, INSERT, UPDATE, DELETE ON "Orders" TO {w};'
                   ' GRANT USAGE ON SEQUENCE "Orders_id_seq" TO {w}').format(w=sql.Identifier(w)) for w in writers))
    try:
        yield c
    finally:
        drop_cast(c)


def test_row_security_is_refused_at_plan_check_and_bypassrls_loses_nothing(tenants, tmp_path):
    c = tenants
    owner, *writers = c.roles
    app = c.roles[owner]
    plan = write_plan(tmp_path / "rls.toml", RLS_PLAN)
    assert count(c.admin, "Orders") == 6_000

    # Refused before anything is created, naming the table, the reason and the fix.
    out = mover(app, "plan", "check", plan)
    assert out.returncode == 2, out.stderr
    for needle in ('"Orders"', "row-level security", "FORCE", f'ALTER ROLE "{owner}" BYPASSRLS'):
        assert needle in out.stderr, (needle, out.stderr)
    out = mover(app, "run", plan)
    assert out.returncode == 2 and "BYPASSRLS" in out.stderr, out.stderr
    with psycopg.connect(c.admin, autocommit=True) as conn:
        assert conn.execute("""SELECT to_regclass('"Orders_new"') IS NULL""").fetchone()[0]

    c.su(sql.SQL("ALTER ROLE {} BYPASSRLS").format(sql.Identifier(owner)))
    ws = [Writer(c.roles[w], seed=40 + i).start() for i, w in enumerate(writers)]
    try:
        out = mover(app, "step", plan)  # registered, target created
        assert out.returncode == 0, out.stderr
        # Taken away later: the next step stops with the reason and the fix, it does not filter.
        c.su(sql.SQL("ALTER ROLE {} NOBYPASSRLS").format(sql.Identifier(owner)))
        out = mover(app, "run", "rls")
        assert out.returncode == 1, out.stderr
        assert "row-level security" in out.stderr and "BYPASSRLS" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
        c.su(sql.SQL("ALTER ROLE {} BYPASSRLS").format(sql.Identifier(owner)))

        out = mover(app, "run", "rls")
        assert out.returncode == 3, out.stderr  # at the gate
        for w in ws:
            w.pause()
        assert mover(app, "run", "rls").returncode == 3
        # Judged as the superuser, who sees every row: nothing lost by the copy.
        assert differences(c.admin, "Orders", "Orders_new") == (0, 0)
        assert count(c.admin, "Orders_new") == count(c.admin, "Orders") > 6_000 // 3
        assert_oracle(c.admin, "Orders", "Orders_new")
        for w in ws:
            w.resume()
        out = mover(app, "cutover", "rls")
        assert out.returncode == 0, out.stderr
        for w in ws:
            w.pause()
        out = mover(app, "run", "rls")
        assert out.returncode == 3, out.stderr  # the window: the old table follows the new one
        assert differences(c.admin, "Orders", "Orders_old") == (0, 0)
        assert_oracle(c.admin, "Orders", "Orders_old")
    finally:
        for w in ws:
            w.halt()
    assert all(w.errors == [] and w.ops > 0 for w in ws), [w.errors for w in ws]


# ---------------------------------------------------------------------------------------------
# Conversion settings fixed at registration

TZ_PLAN = plan_text("tz", columns={"created_at": "timestamptz"}, target={"accept_lossy": ["created_at"]},
                    backfill={"range_rows": 500}, cutover={"lock_timeout": "500ms"})

UTC = {"PGTZ": "UTC"}
# Another zone and other conversion settings, by each of the ways a client sets them.
ELSEWHERE = {"PGTZ": "America/New_York", "PGDATESTYLE": "SQL, DMY",
             "PGOPTIONS": "-c TimeZone=Asia/Kolkata -c IntervalStyle=sql_standard -c extra_float_digits=-2"}


def test_processes_in_other_time_zones_convert_as_registration_did(db_dsn, tmp_path, monkeypatch):
    """Issue 20 item 2: `timestamp` -> `timestamptz` converts in the session's TimeZone. The
    application writes in UTC; mover registers in UTC; later mover processes run elsewhere."""
    for var in ("PGTZ", "PGDATESTYLE", "PGOPTIONS"):
        monkeypatch.delenv(var, raising=False)  # the application (Writer) runs in the database's zone
    dbname = urllib.parse.urlsplit(db_dsn).path.lstrip("/")
    create_orders(db_dsn, 3_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET TimeZone = 'UTC'").format(sql.Identifier(dbname)))
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute('ALTER TABLE "Orders" ALTER created_at TYPE timestamp')
        conn.execute('ALTER TABLE "Orders_mirror" ALTER created_at TYPE timestamp')
    plan = write_plan(tmp_path / "tz.toml", TZ_PLAN)
    writer = Writer(db_dsn, seed=51).start()
    try:
        out = mover(db_dsn, "run", plan, env=UTC)
        assert out.returncode == 3, out.stderr
        # Before the cutover, a catch-up pass and a reconcile from another zone: no divergence.
        out = mover(db_dsn, "run", "tz", env=ELSEWHERE)
        assert out.returncode == 3, out.stderr
        st = json.loads(mover(db_dsn, "status", "tz", "--json", env=UTC).stdout)
        assert st["divergences"] == 0 and "equals" in st["error"], st
        out = mover(db_dsn, "cutover", "tz", env=UTC)
        assert out.returncode == 0, out.stderr
        # The window, followed from another zone while the application writes.
        out = mover(db_dsn, "run", "tz", env=ELSEWHERE)
        assert out.returncode == 3, out.stderr
        writer.pause()
        out = mover(db_dsn, "run", "tz", env=ELSEWHERE)
        assert out.returncode == 3, out.stderr
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            # The old table, what a rollback swaps in, holds what the application wrote, to the microsecond.
            assert conn.execute('SELECT count(*) FROM "Orders_old" o JOIN "Orders_mirror" m USING (id)'
                                ' WHERE o.created_at IS DISTINCT FROM m.created_at').fetchone()[0] == 0
        assert_oracle(db_dsn, "Orders_old")
        writer.resume()
        out = mover(db_dsn, "run", "tz", env=ELSEWHERE)
        assert out.returncode == 3, out.stderr
        writer.pause()
        out = mover(db_dsn, "rollback", "tz", env=UTC)
        assert out.returncode == 0, out.stderr
        assert_oracle(db_dsn, "Orders")
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 0


# ---------------------------------------------------------------------------------------------
# search_path: another role's objects in a writable schema never run in a mover session

HIJACK_PLAN = plan_text("hijack", columns={"id": "bigint"}, backfill={"range_rows": 500},
                        cutover={"lock_timeout": "500ms"})

# Each shadow records who ran it (and, run as the owner, would hand its author the owner's other
# table), then behaves as the built-in it shadows, so that only the record tells it ran.
SHADOW = """
CREATE TABLE public.hostile_ran (fn text, role name, app text, at timestamptz DEFAULT clock_timestamp());
GRANT INSERT ON public.hostile_ran TO PUBLIC;
CREATE FUNCTION public.hostile_mark(fn text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.hostile_ran (fn, role, app) VALUES (fn, current_user, current_setting('application_name'));
    BEGIN
        EXECUTE format('GRANT SELECT ON public.secret TO %I', {mallory});
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
END $f$;
CREATE FUNCTION public.h_eq(varchar, varchar) RETURNS boolean LANGUAGE plpgsql AS
    $f$ BEGIN PERFORM public.hostile_mark('='); RETURN $1::text OPERATOR(pg_catalog.=) $2::text; END $f$;
CREATE FUNCTION public.h_lt(varchar, varchar) RETURNS boolean LANGUAGE plpgsql AS
    $f$ BEGIN PERFORM public.hostile_mark('<'); RETURN $1::text OPERATOR(pg_catalog.<) $2::text; END $f$;
CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.h_eq);
CREATE OPERATOR public.< (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.h_lt);
CREATE FUNCTION public.hashtext(varchar) RETURNS integer LANGUAGE plpgsql AS
    $f$ BEGIN PERFORM public.hostile_mark('hashtext'); RETURN pg_catalog.hashtext($1::text); END $f$;
CREATE FUNCTION public.lower(varchar) RETURNS text LANGUAGE plpgsql AS
    $f$ BEGIN PERFORM public.hostile_mark('lower'); RETURN pg_catalog.lower($1::text); END $f$;
CREATE FUNCTION public.coalesce(varchar, varchar) RETURNS varchar LANGUAGE plpgsql AS
    $f$ BEGIN PERFORM public.hostile_mark('coalesce'); RETURN COALESCE($1, $2); END $f$;
CREATE FUNCTION public.md5(varchar) RETURNS text LANGUAGE plpgsql AS
    $f$ BEGIN PERFORM public.hostile_mark('md5'); RETURN pg_catalog.md5($1::text); END $f$;
"""


@pytest.fixture
def hostile(db_dsn) -> Iterator[Cast]:
    """The pre-15 default (every database upgraded from 14 or older keeps it): anyone may create
    in public. The owner `app` is not a superuser; `mallory` has no right on the table."""
    c = make_cast(db_dsn, "app", "mallory", "web")
    owner, mallory, web = c.roles
    create_orders(db_dsn, 3_000)
    c.su('ALTER TABLE "Orders" ADD COLUMN code varchar(24)',
         """UPDATE "Orders" SET code = 'c' || lpad(id::text, 8, '0')""",
         """CREATE SEQUENCE "Orders_code_seq" START 100000000""",
         """ALTER TABLE "Orders" ALTER code SET NOT NULL,"""
         """ ALTER code SET DEFAULT 'c' || nextval('"Orders_code_seq"'),"""
         ' DROP CONSTRAINT "Orders_pkey", ADD PRIMARY KEY (code), ADD UNIQUE (id)',
         sql.SQL('ALTER TABLE "Orders" OWNER TO {o}; ALTER SEQUENCE "Orders_code_seq" OWNER TO {o};'
                 ' CREATE TABLE public.secret (s text); ALTER TABLE public.secret OWNER TO {o}'
                 ).format(o=sql.Identifier(owner)),
         "GRANT CREATE ON SCHEMA public TO PUBLIC",
         setup_b(c, owner),
         # The application writes as a DML-only role (docs/operating.md "Privileges").
         sql.SQL('GRANT SELECT, INSERT, UPDATE, DELETE ON "Orders" TO {w};'
                 ' GRANT USAGE ON SEQUENCE "Orders_id_seq", "Orders_code_seq" TO {w}').format(w=sql.Identifier(web)))
    with psycopg.connect(c.roles[mallory], autocommit=True) as conn:
        conn.execute(sql.SQL(SHADOW.replace("{mallory}", "{}")).format(sql.Literal(mallory)))
    try:
        yield c
    finally:
        drop_cast(c)


def hostile_runs(c: Cast) -> list[tuple]:
    with psycopg.connect(c.admin, autocommit=True) as conn:
        return conn.execute("SELECT fn, role, app FROM public.hostile_ran ORDER BY at").fetchall()


def test_shadowing_objects_in_a_writable_schema_never_run_in_a_mover_session(hostile, tmp_path):
    c = hostile
    owner, mallory, web = c.roles
    app = c.roles[owner]
    plan = write_plan(tmp_path / "hijack.toml", HIJACK_PLAN)
    with psycopg.connect(c.roles[mallory], autocommit=True) as conn:
        # The shadows are live: an ordinary session with public on its path runs them.
        assert conn.execute("SELECT 'c1'::varchar = 'c1'::varchar").fetchone()[0]
        assert [r[0] for r in conn.execute("SELECT fn FROM public.hostile_ran")] == ["="]
        conn.execute("DELETE FROM public.hostile_ran")

    out = mover(app, "plan", "check", plan)
    assert out.returncode == 0, out.stderr
    assert 'schema "public"' in out.stdout and "CREATE" in out.stdout and "PUBLIC" in out.stdout, out.stdout
    writer = Writer(c.roles[web], seed=61).start()
    try:
        out = mover(app, "run", plan)
        assert out.returncode == 3, out.stderr
        out = mover(app, "cutover", "hijack")
        assert out.returncode == 0, out.stderr
        out = mover(app, "run", "hijack")
        assert out.returncode == 3, out.stderr
        writer.pause()
        assert mover(app, "run", "hijack").returncode == 3
        assert differences(c.admin, "Orders", "Orders_old") == (0, 0)
        assert_oracle(c.admin, "Orders", "Orders_old")
        writer.resume()
        out = mover(app, "rollback", "hijack")
        assert out.returncode == 0, out.stderr
        out = mover(app, "run", "hijack")
        assert out.returncode == 3, out.stderr  # back at the gate
        out = mover(app, "cutover", "hijack")
        assert out.returncode == 0, out.stderr
        writer.pause()
        assert mover(app, "run", "hijack").returncode == 3
        assert_oracle(c.admin, "Orders", "Orders_old")
        writer.resume()
        out = mover(app, "retire", "hijack", "--force")
        assert out.returncode == 0, out.stderr
        writer.pause()
        assert_oracle(c.admin, "Orders")
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 0
    runs = hostile_runs(c)
    # No shadow ran in any of mover's sessions (mover:..., mover-applier:..., mover-init:...), nor
    # as the owner (the role mover runs as; the application writes as another).
    assert [r for r in runs if r[2].startswith("mover") or r[1] == owner] == [], runs

    with psycopg.connect(c.admin, autocommit=True) as conn:
        assert not conn.execute("SELECT has_table_privilege(%s, 'public.secret', 'SELECT')",
                                (mallory,)).fetchone()[0]
    # Nor in the application's sessions through the capture trigger (its body resolves nothing
    # through their search path): the application's own statements here use no shadowed name.
    assert runs == [], runs


CITEXT_PLAN = plan_text("citext", columns={"id": "bigint"}, backfill={"range_rows": 300},
                        cutover={"lock_timeout": "500ms"})


def test_a_key_whose_operators_live_outside_pg_catalog_compares_with_them(db_dsn, tmp_path):
    """citext's = and < live in the schema of its extension (public here, which on PostgreSQL 15
    no other role can write): with search_path pinned to pg_catalog, an unqualified `<` on a citext
    key would silently become text's (through citext's implicit cast), whose order differs (in
    "C", every 'K...' sorts before every 'k...'), and key ranges cut in one order and read in the
    other lose rows. The migration's search_path holds the key's operator schema."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # Asked of the server, not assumed: the pgserver wheel's 16.2 ships no citext.
        if not conn.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'citext'").fetchone()[0]:
            pytest.skip("this server has no citext extension (the pgserver wheel's build ships none)")
    create_orders(db_dsn, 3_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION citext")
        conn.execute('ALTER TABLE "Orders" ADD COLUMN code citext COLLATE "C"')
        conn.execute("""UPDATE "Orders" SET code = CASE WHEN id % 2 = 0 THEN 'K' ELSE 'k' END"""
                     """ || lpad(id::text, 8, '0')""")
        conn.execute("""CREATE SEQUENCE "Orders_code_seq" START 10000000""")
        conn.execute("""ALTER TABLE "Orders" ALTER code SET NOT NULL,"""
                     """ ALTER code SET DEFAULT 'K' || nextval('"Orders_code_seq"'),"""
                     ' DROP CONSTRAINT "Orders_pkey", ADD PRIMARY KEY (code), ADD UNIQUE (id)')
    plan = write_plan(tmp_path / "citext.toml", CITEXT_PLAN)
    writer = Writer(db_dsn, seed=71).start()
    try:
        out = mover(db_dsn, "run", plan)
        assert out.returncode == 3 and "equals" in out.stderr, out.stderr
        writer.pause()
        assert mover(db_dsn, "run", "citext").returncode == 3
        assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
        assert_oracle(db_dsn, "Orders", "Orders_new")
        writer.resume()
        out = mover(db_dsn, "cutover", "citext")
        assert out.returncode == 0, out.stderr
        writer.pause()
        assert mover(db_dsn, "run", "citext").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_old")
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 0
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        settings = conn.execute("SELECT session_settings FROM mover.migrations WHERE name = 'citext'").fetchone()[0]
    assert settings["search_path"] == 'pg_catalog, "public", pg_temp', settings
