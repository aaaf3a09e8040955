"""mover as a non-superuser, with the application writing as a third, DML-only role.

Setup A: the migrating role runs `mover init` and owns schema "mover".
Setup B: a superuser runs `mover init` and grants what docs/operating.md "Privileges" lists.
In both, a missing privilege is refused up front (exit 2, one line naming the GRANT to run), the
application's roles need nothing on mover's schema, and the capture trigger never makes an
application write fail."""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from tests.workload import Writer, assert_oracle, create_orders, differences, mover, plan_text, write_plan

PLAN = plan_text("priv", columns={"id": "bigint"}, backfill={"range_rows": 500}, cutover={"lock_timeout": "500ms"})


@dataclass
class Roles:
    admin: str  # the superuser DSN
    app: str  # the migrating role's DSN (owns the table)
    web: str  # the application's DSN (DML only)
    app_name: str
    web_name: str
    dbname: str

    def su(self, *statements: sql.Composable | str) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            for s in statements:
                conn.execute(s)


def as_user(dsn: str, user: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def roles(db_dsn) -> Iterator[Roles]:
    tag = uuid.uuid4().hex[:8]
    app, web = f"app_{tag}", f"webapp_{tag}"
    dbname = urllib.parse.urlsplit(db_dsn).path.lstrip("/")
    r = Roles(db_dsn, as_user(db_dsn, app), as_user(db_dsn, web), app, web, dbname)
    A, W = sql.Identifier(app), sql.Identifier(web)
    create_orders(db_dsn, 3_000)
    r.su(sql.SQL("CREATE ROLE {} LOGIN").format(A), sql.SQL("CREATE ROLE {} LOGIN").format(W),
         sql.SQL('ALTER TABLE "Orders" OWNER TO {}').format(A),
         sql.SQL('GRANT SELECT, INSERT, UPDATE, DELETE ON "Orders" TO {}').format(W),
         sql.SQL('GRANT USAGE ON SEQUENCE "Orders_id_seq" TO {}').format(W))
    try:
        yield r
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename IN (%s, %s)",
                         (app, web))
            conn.execute(sql.SQL("DROP OWNED BY {}, {} CASCADE").format(A, W))
        with psycopg.connect(db_dsn, dbname="postgres", autocommit=True) as conn:
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM {}, {}").format(sql.Identifier(dbname), A, W))
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(dbname)))
            conn.execute(sql.SQL("DROP ROLE {}, {}").format(A, W))


def triggers_on_orders(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = '\"Orders\"'::regclass"
                                           " AND NOT tgisinternal").fetchall()]


def id_type(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                            " WHERE attrelid = '\"Orders\"'::regclass AND attname = 'id'").fetchone()[0]


def one_line_refusal(r, *needles: str) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 3, r.stderr
    for needle in needles:
        assert needle in r.stderr, (needle, r.stderr)


def finish_migration(r: Roles, writer: Writer) -> None:
    """Cutover, the window, retire, all as the migrating role, checked by independent queries."""
    out = mover(r.app, "cutover", "priv")
    assert out.returncode == 0, out.stderr
    assert id_type(r.admin) == "bigint"
    writer.pause()
    out = mover(r.app, "run", "priv")
    assert out.returncode == 3, out.stderr  # the window: the old table follows the new one
    assert differences(r.admin, "Orders", "Orders_old") == (0, 0)
    assert_oracle(r.admin, "Orders", "Orders_old")
    writer.resume()
    out = mover(r.app, "retire", "priv", "--force")
    assert out.returncode == 0, out.stderr
    st = json.loads(mover(r.app, "status", "priv", "--json").stdout)
    assert (st["state"], st["error"]) == ("done", None)


def test_setup_a_migrating_role_runs_init_and_owns_the_schema(roles, tmp_path):
    r = roles
    db, A = sql.Identifier(r.dbname), sql.Identifier(r.app_name)
    r.su("DROP SCHEMA mover CASCADE")
    out = mover(r.app, "init")
    one_line_refusal(out, "lacks CREATE on database", "GRANT CREATE ON DATABASE")
    r.su(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(db, A))
    out = mover(r.app, "init")
    assert out.returncode == 0, out.stderr

    plan = write_plan(tmp_path / "priv.toml", PLAN)
    out = mover(r.app, "plan", "check", plan)
    # PostgreSQL 15: ordinary roles no longer have CREATE on public.
    one_line_refusal(out, 'CREATE on schema "public"', f'GRANT CREATE ON SCHEMA "public" TO "{r.app_name}"')
    r.su(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(A))
    out = mover(r.app, "plan", "check", plan)
    assert out.returncode == 0, out.stderr

    writer = Writer(r.web, seed=31).start()
    try:
        out = mover(r.app, "run", plan)
        assert out.returncode == 3, out.stderr
        writer.pause()
        assert mover(r.app, "run", "priv").returncode == 3
        assert differences(r.admin, "Orders", "Orders_new") == (0, 0)
        assert_oracle(r.admin, "Orders", "Orders_new")
        writer.resume()
        finish_migration(r, writer)
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 0


def test_setup_b_superuser_runs_init_and_grants(roles, tmp_path):
    r = roles
    A = sql.Identifier(r.app_name)
    # The grants of docs/operating.md "Privileges", setup B: nothing for the application's roles.
    r.su(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(A),
         sql.SQL("GRANT USAGE, CREATE ON SCHEMA mover TO {}").format(A),
         sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA mover TO {}").format(A),
         # plan check peeks at the next migration id (control.next_id)
         sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA mover TO {}").format(A))
    plan = write_plan(tmp_path / "priv.toml", PLAN)
    # Default privileges that would grant the application's (or any) role rights on each new change
    # log: another role could then fail the trigger's insert or empty the log.
    grant_default = sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA mover GRANT INSERT ON TABLES TO PUBLIC"
                            ).format(A)
    revoke_default = sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA mover REVOKE INSERT ON TABLES"
                             " FROM PUBLIC").format(A)
    writer = Writer(r.web, seed=32).start()
    try:
        out = mover(r.app, "plan", "check", plan)
        assert out.returncode == 0, out.stderr
        out = mover(r.app, "step", plan)  # registered, target created
        assert out.returncode == 0, out.stderr
        r.su(grant_default)
        # The install itself checks the new log's ACL, in its transaction: nothing installed.
        out = mover(r.app, "run", "priv")
        one_line_refusal(out, "PUBLIC holds INSERT on", "REVOKE ALL ON")
        assert triggers_on_orders(r.admin) == []
        r.su(revoke_default)
        out = mover(r.app, "run", "priv")
        assert out.returncode == 3, out.stderr

        # The reverse capture at the swap is checked inside the swap's transaction: nothing swapped.
        writer.pause()
        r.su(grant_default)
        out = mover(r.app, "cutover", "priv")
        assert out.returncode == 2 and "REVOKE ALL ON" in out.stderr, out.stderr
        assert id_type(r.admin) == "integer"
        r.su(revoke_default)
        writer.resume()
        out = mover(r.app, "run", "priv")
        assert out.returncode == 3, out.stderr
        writer.pause()
        assert mover(r.app, "run", "priv").returncode == 3
        assert differences(r.admin, "Orders", "Orders_new") == (0, 0)
        assert_oracle(r.admin, "Orders", "Orders_new")
        writer.resume()
        finish_migration(r, writer)
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 0


def test_dependents_the_migrating_role_cannot_recreate_are_refused_up_front(roles, tmp_path):
    """The swap drops and re-creates the foreign keys referencing the table and the views that
    read it: a role that does not own them is told at plan check, not by the swap's lock."""
    r = roles
    A = sql.Identifier(r.app_name)
    r.su(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(A),  # setup B, as above
         sql.SQL("GRANT USAGE, CREATE ON SCHEMA mover TO {}").format(A),
         sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA mover TO {}").format(A),
         # plan check peeks at the next migration id (control.next_id)
         sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA mover TO {}").format(A),
         "GRANT USAGE ON SCHEMA mover TO PUBLIC",
         'CREATE TABLE lines (id int PRIMARY KEY, order_id int REFERENCES "Orders")',
         'CREATE VIEW orders_v AS SELECT id FROM "Orders"')
    plan = write_plan(tmp_path / "priv.toml", PLAN)
    out = mover(r.app, "plan", "check", plan)
    assert out.returncode == 2, out.stderr
    flat = " ".join(out.stderr.split())
    # Qualified: mover's sessions resolve names through pg_catalog only (docs/operating.md "Security").
    assert "mover's role does not own" in flat and "table public.lines" in flat, out.stderr
    assert "view public.orders_v" in flat, out.stderr
    r.su(sql.SQL("ALTER TABLE lines OWNER TO {}").format(sql.Identifier(r.app_name)),
         sql.SQL("ALTER VIEW orders_v OWNER TO {}").format(sql.Identifier(r.app_name)))
    out = mover(r.app, "plan", "check", plan)
    assert out.returncode == 0, out.stderr
