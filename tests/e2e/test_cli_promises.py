"""CLI promises: two `mover init` at once, and passwords never printed."""

from __future__ import annotations

import re
import socket
import urllib.parse
import uuid

import psycopg
from psycopg import sql

from tests.conftest import dsn_with_dbname
from tests.workload import create_orders, finish, mover, plan_text, spawn, write_plan


def control_schema(dsn: str) -> list:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT c.relname, c.relkind, (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid"
            " AND a.attnum > 0 AND NOT a.attisdropped) FROM pg_class c"
            " WHERE c.relnamespace = 'mover'::regnamespace ORDER BY 1").fetchall()


def test_concurrent_inits_all_succeed_with_one_schema(pg_dsn, db_dsn):
    name = f"init_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    fresh = dsn_with_dbname(pg_dsn, name)
    try:
        procs = [spawn(fresh, "init") for _ in range(3)]
        results = [finish(p, 120) for p in procs]
        assert all(code == 0 for code, _ in results), results
        revisions = {err.strip().splitlines()[-1] for _, err in results}
        assert len(revisions) == 1 and revisions.pop().startswith("control schema at revision"), results
        # The same schema as one init on its own builds (the test template), applied once.
        assert control_schema(fresh) == control_schema(db_dsn)
        with psycopg.connect(fresh, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM mover.alembic_version").fetchone()[0] == 1
        r = mover(fresh, "init")
        assert r.returncode == 0, r.stderr
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


SECRET = "Pa55-w0rd_zx81"

PLAN = plan_text("masked", columns={"id": "bigint"})


def with_password(dsn: str) -> str:
    """The same DSN (URL form, as the suite's server gives it) carrying a password; the test server
    trusts local connections, so the password is accepted and ignored."""
    parts = urllib.parse.urlsplit(dsn)
    netloc = parts.netloc.replace("@", f":{SECRET}@", 1) if "@" in parts.netloc else f"postgres:{SECRET}@{parts.netloc}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_password_is_never_printed(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    dsn = with_password(db_dsn)
    assert SECRET in dsn
    plan = write_plan(tmp_path / "masked.toml", PLAN)
    outputs = []

    def run(*args, env=None, dsn_arg=dsn, expect):
        # Real processes: the promise is about what a process prints, from its start to its exit.
        r = mover(dsn_arg, *args, env=env, process=True)
        assert r.returncode == expect, (args, r.stderr)
        outputs.append((args, r.stdout + r.stderr))
        return r

    run("plan", "check", plan, expect=0)
    run("run", plan, expect=3)
    run("status", "masked", expect=0)
    run("status", "--json", expect=0)
    # Off a terminal (a pipe) nothing is cut, however narrow the terminal the shell reports.
    events = run("events", "masked", env={"COLUMNS": "60"}, expect=0).stdout
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", events) and "…" not in events, events
    run("--debug", "status", "nope", expect=2)
    run("-v", "cutover", "masked", expect=0)
    # A server that cannot be reached: the message names the connection, with the password masked.
    parts = urllib.parse.urlsplit(dsn)
    unreachable = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit(":", 1)[0] + f":{closed_port()}"))
    r = run("status", dsn_arg=unreachable, expect=1)
    assert "cannot connect to" in r.stderr and "password=***" in r.stderr, r.stderr
    # libpq's cause and its advice both kept, on one line, single-spaced.
    said = " ".join(r.stderr.split("\nnext:")[0].split())  # the console folds long lines
    assert "Connection refused; Is the server running" in said, r.stderr
    r = run("--debug", "status", dsn_arg=unreachable, expect=1)
    keyvalue = f"host=127.0.0.1 port={closed_port()} user=postgres password={SECRET} dbname=x"
    r = run("status", dsn_arg=keyvalue, expect=1)
    assert "password=***" in r.stderr, r.stderr
    # DATABASE_URL instead of --dsn.
    r = mover("", "status", "masked", env={"DATABASE_URL": unreachable})
    outputs.append(("DATABASE_URL", r.stdout + r.stderr))
    assert r.returncode == 1 and "password=***" in r.stderr, r.stderr
    leaked = [args for args, text in outputs if SECRET in text]
    assert leaked == [], leaked
