"""No password is ever printed: DSN redaction and masking for every DSN shape, and the CLI's
output (errors, --debug tracebacks, log lines) for malformed and unreachable DSNs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mover import db

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cretPW"

DSNS = [
    "postgrs://bob:s3cretPW@host/db",
    "postgresql//bob:s3cretPW@localhost/db",
    "postgresql:/bob:s3cretPW@localhost/db",
    "postgresql://bob:s3cretPW@localhost:5432/db",
    "postgres://bob:s3cretPW@[::1]:5432/db?sslmode=disable",
    "postgresql://bob@localhost/db?password=s3cretPW",
    "postgresql://bob@localhost/db?sslmode=disable&password=s3cretPW&connect_timeout=1",
    "postgresql://bob:s3cret%2FPW@localhost/db",
    "postgresql://bob:s3cretPW@localhost/db?bogus=1",
    "host=localhost user=bob password=s3cretPW dbname=db",
    "host=localhost password='s3cret PW' dbname=db",
    "host=localhost password = s3cretPW",
    "host=localhost password=s3cretPW dbname",
    "host=localhost PASSWORD=s3cretPW",
    "bob:s3cretPW@localhost/db",
    "host=localhost 'password=s3cretPW",
    "postgrs://bob@host/db?sslmode=disable&password=s3cretPW",
    "postgresql:///db?host=/tmp&password=s3cretPW&",
]


@pytest.fixture(autouse=True)
def no_remembered_secrets(monkeypatch):
    """Each case on its own: passwords remembered from another case (in whatever order the
    workers run them) must not be what masks this one."""
    monkeypatch.setattr(db, "_known_secrets", set())


def secrets_of(dsn: str) -> list[str]:
    return [s for s in ("s3cretPW", "s3cret PW", "s3cret%2FPW", "s3cret/PW") if s in dsn or
            s.replace("/", "%2F") in dsn]


@pytest.mark.parametrize("dsn", DSNS)
def test_redact_and_problem_never_show_the_password(dsn):
    shown = db.redact(dsn) + " " + (db.dsn_problem(dsn) or "")
    for secret in secrets_of(dsn) or [SECRET]:
        assert secret not in shown, shown
    assert "s3cret" not in shown, shown


@pytest.mark.parametrize("dsn", DSNS)
def test_mask_removes_the_password_from_any_text_quoting_the_dsn(dsn):
    db.remember_secrets(dsn)
    text = f'psycopg.ProgrammingError: missing "=" after "{dsn}" in connection info string\n  dsn={dsn!r}'
    assert "s3cret" not in db.mask(text)


def test_mask_keeps_the_text_readable():
    db.remember_secrets("host=h password=xyz")
    assert db.mask("connection to server at h failed: password authentication failed for user bob") == \
        "connection to server at h failed: password authentication failed for user bob"
    # A short password is masked only where it stands alone, not in every word that contains it.
    assert db.mask("expected xyzzy, got xyz") == "expected xyzzy, got ***"


def test_pgpassword_is_masked(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "env-Secret-42")
    assert "env-Secret-42" not in db.mask("could not connect with env-Secret-42")


def test_malformed_dsns_say_what_is_wrong():
    assert "invalid URI scheme 'postgrs'" in db.dsn_problem("postgrs://bob:s3cretPW@host/db")
    assert "missing \":\" after the URI scheme" in db.dsn_problem("postgresql//bob:s3cretPW@localhost/db")
    assert "missing \"=\"" in db.dsn_problem("host=localhost password=s3cretPW dbname")
    assert db.dsn_problem("postgresql://bob:s3cretPW@localhost/db") is None
    assert db.dsn_problem("host=localhost password=s3cretPW") is None


# ---------------------------------------------------------------------------------------------
# Through the CLI, as a subprocess: nothing the user sees carries the password


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "COLUMNS": "60", "NO_COLOR": "1", "TERM": "dumb", **(env or {})}
    for var in ("DATABASE_URL", "PGPASSWORD", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE"):
        if not env or var not in env:
            full_env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "mover", *args], capture_output=True, text=True, env=full_env,
                          cwd=ROOT, timeout=60)


MALFORMED = ["postgrs://bob:s3cretPW@host/db", "postgresql//bob:s3cretPW@localhost/db",
             "host=localhost password=s3cretPW dbname", "postgrs://bob@host/db?sslmode=disable&password=s3cretPW"]


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("dsn", MALFORMED)
@pytest.mark.parametrize("via", ["--dsn", "DATABASE_URL"])
def test_cli_malformed_dsn_exits_2_without_the_password(dsn, debug, via):
    flags = ["--debug"] if debug else []
    if via == "--dsn":
        r = run_cli(*flags, "--dsn", dsn, "status")
    else:
        r = run_cli(*flags, "status", env={"DATABASE_URL": dsn})
    output = r.stdout + r.stderr
    assert r.returncode == 2, output
    assert "s3cret" not in output, output
    flat = " ".join(r.stderr.split())
    assert "the DSN is malformed" in flat and "next:" in flat, flat
    if debug:
        assert "Traceback" in output


# A socket directory that does not exist: the connection fails at once, without a server.
UNREACHABLE = ["postgresql://bob:s3cretPW@/db?host=/nonexistent-mover-dir",
               "postgresql://bob@/db?host=/nonexistent-mover-dir&password=s3cretPW",
               "host=/nonexistent-mover-dir user=bob password=s3cretPW dbname=db"]


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("dsn", UNREACHABLE)
def test_cli_unreachable_dsn_fails_without_the_password(dsn, debug):
    r = run_cli(*(["--debug"] if debug else []), "-v", "--dsn", dsn, "status")
    output = r.stdout + r.stderr
    assert r.returncode == 1, output
    assert "s3cret" not in output, output
    assert "cannot connect to" in " ".join(r.stderr.split())


def test_cli_pgpassword_is_never_printed():
    r = run_cli("--debug", "status", env={"PGHOST": "/nonexistent-mover-dir", "PGPASSWORD": "s3cretPW"})
    assert r.returncode == 1
    assert "s3cret" not in r.stdout + r.stderr


def test_log_lines_and_their_tracebacks_are_masked():
    import io
    import logging

    from rich.console import Console

    from mover.views.console import ConsoleLog
    dsn = "postgrs://bob:Zq9-secret@h/db"
    try:
        raise ValueError(f"cannot use {dsn}")
    except ValueError:
        record = logging.LogRecord("mover", logging.WARNING, __file__, 1, "retrying %s", (dsn,), sys.exc_info())
    buf = io.StringIO()
    handler = ConsoleLog(Console(file=buf, width=200, color_system=None))
    handler.setFormatter(logging.Formatter())
    handler.emit(record)
    line = buf.getvalue()
    assert "Zq9-secret" not in line and "ValueError" in line and "retrying postgrs://bob:***@h/db" in line
