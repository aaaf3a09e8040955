"""Shared fixtures: one real PostgreSQL per test session, one fresh database per test.

* ``pg_dsn`` (session): ``MOVER_TEST_DSN`` if set (a superuser DSN: the fixtures create
  and drop databases), else a throwaway server started with ``EmbeddedPostgres(fast=True)``.
  If no server can be had the session fails: a suite that skips its database tests when
  the database is missing passes without testing anything.
* ``template_db`` (session): a database with mover's control schema already applied,
  built once, cloned for every test; cloning a template is a file copy, much cheaper
  than running the migrations again.
* ``db_dsn`` (function): a fresh clone of the template, dropped after the test.

Under pytest-xdist each worker gets its own server (or, with ``MOVER_TEST_DSN``, its
own template name), since a template cannot be cloned while another session is
connected to it.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from mover.demo.embedded import EmbeddedPostgres


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "pgserver: starts servers from the PostgreSQL wheels' binaries (MOVER_EMBEDDED=16|17|18); "
        "part of the normal suite, needs the test extras installed",
    )


def connect(dsn: str, **kwargs) -> psycopg.Connection:
    """An autocommit connection: CREATE/DROP DATABASE cannot run inside a transaction."""
    kwargs.setdefault("autocommit", True)
    kwargs.setdefault("connect_timeout", 10)
    return psycopg.connect(dsn, **kwargs)


def dsn_with_dbname(dsn: str, dbname: str) -> str:
    """`dsn` pointed at another database on the same server, in the same form (URL or
    key=value): a URL stays a URL, which SQLAlchemy/alembic also accept."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urllib.parse.urlsplit(dsn)
        return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(dbname, safe="")))
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def _worker_suffix() -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"_{worker}" if worker else ""


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    external = os.environ.get("MOVER_TEST_DSN")
    if external:
        try:
            with connect(external) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            pytest.fail(f"MOVER_TEST_DSN is set but the server cannot be reached: {exc}", pytrace=False)
        yield external
        return

    # wal_level = logical: the tests of logical capture ([capture] method = "logical") run on the same
    # server as the rest (measured: no slower for the others, docs/testing.md).
    server = EmbeddedPostgres(fast=True, settings={"wal_level": "logical"})
    try:
        dsn = server.start()
    except Exception as exc:  # RuntimeError from EmbeddedPostgres, OSError, ...
        pytest.fail(
            "cannot start the test PostgreSQL server (set MOVER_TEST_DSN to use an existing one, "
            f"or install postgresql / the test extras' server wheels): {exc}",
            pytrace=False,
        )
    try:
        yield dsn
    finally:
        server.stop()


def require_icu(dsn: str) -> None:
    """Skip, saying why, on a server built without ICU (the wheels' 16, 17 and 18 are): asked of the
    server, not assumed. CI runs the same tests on PostgreSQL 15, which has it."""
    # Not "any collation with provider 'i'": PostgreSQL 16 lists its "unicode" collation even
    # when built without ICU. The ICU collations that initdb imports exist only with it.
    with connect(dsn) as conn:
        if conn.execute("SELECT count(*) FROM pg_collation WHERE collname = 'en-x-icu'").fetchone()[0] == 0:
            pytest.skip("this PostgreSQL server was built without ICU (it has no \"en-x-icu\" collation)")


@pytest.fixture
def icu(pg_dsn: str) -> None:
    require_icu(pg_dsn)


def require_partman(dsn: str) -> None:
    """Skip, saying why, on a server without pg_partman (the wheels' 16, 17 and 18 ship
    none); CI installs Debian's postgresql-15-partman for the 15 run."""
    with connect(dsn) as conn:
        if not conn.execute("SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman')"
                            ).fetchone()[0]:
            pytest.skip("this PostgreSQL server has no pg_partman extension (Debian: postgresql-15-partman)")


def _init_control_schema(dsn: str) -> None:
    """Apply mover's control schema with mover.api.init, once the package has it."""
    try:
        import mover.api as api
    except ModuleNotFoundError as exc:
        # Only a missing mover.api means "not written yet"; a dependency it cannot import
        # is a real failure and must not be hidden.
        if exc.name not in ("mover.api",):
            raise
        return
    init = getattr(api, "init", None)
    if callable(init):
        init(dsn)


@pytest.fixture(scope="session")
def template_db(pg_dsn: str) -> Iterator[str]:
    name = "mover_template" + _worker_suffix()
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    _init_control_schema(dsn_with_dbname(pg_dsn, name))
    with connect(pg_dsn) as conn:
        # CREATE DATABASE ... TEMPLATE fails while anyone is connected to the template:
        # end any session that init left behind (a pool, a lingering connection).
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
    yield name
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db_dsn(pg_dsn: str, template_db: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with connect(pg_dsn) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db))
        )
    try:
        yield dsn_with_dbname(pg_dsn, name)
    finally:
        with connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
