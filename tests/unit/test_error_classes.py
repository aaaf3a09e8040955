"""Which errors stop a worker (the server is gone) and which count one attempt of a range."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as e

from mover.engines.bulk import builds
from mover.errors import Failed
from mover.state import ranges


@pytest.mark.parametrize("exc", [
    e.DeadlockDetected("deadlock detected"),
    e.SerializationFailure("could not serialize access"),
    e.LockNotAvailable("canceling statement due to lock timeout"),
    e.QueryCanceled("canceling statement due to statement timeout"),
    e.UniqueViolation("duplicate key"),
    e.NumericValueOutOfRange("integer out of range"),
    e.InternalError_("tuple concurrently updated"),
    Failed("a range failed"),
], ids=lambda x: type(x).__name__)
def test_server_side_errors_count_an_attempt(exc):
    assert not ranges.is_connection_failure(exc)


@pytest.mark.parametrize("exc", [
    psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"),
    e.ConnectionFailure("connection failure"),
    e.ConnectionException("connection exception"),
    e.ConnectionDoesNotExist("connection does not exist"),
    e.AdminShutdown("terminating connection due to administrator command"),
    e.CrashShutdown("terminating connection because of crash of another server process"),
    e.CannotConnectNow("the database system is starting up"),
], ids=lambda x: type(x).__name__)
def test_a_lost_server_stops_the_worker(exc):
    assert ranges.is_connection_failure(exc)


def test_lost_connections_on_a_real_server_are_told_apart(db_dsn):
    """The same classification for errors a real server raises."""
    with psycopg.connect(db_dsn, autocommit=True) as a, psycopg.connect(db_dsn, autocommit=True) as b:
        a.execute("CREATE TABLE t (id int PRIMARY KEY)")
        with a.transaction():
            a.execute("LOCK t")
            with pytest.raises(e.LockNotAvailable) as lock_timeout:
                b.execute("SET lock_timeout = '10ms'; SELECT * FROM t")
        assert not ranges.is_connection_failure(lock_timeout.value)
        pid = b.execute("SELECT pg_backend_pid()").fetchone()[0]
        a.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError) as gone:
            b.execute("SELECT 1")
        assert ranges.is_connection_failure(gone.value)


def test_index_builds_retry_only_transient_catalog_races():
    assert builds._transient_ddl_error(e.LockNotAvailable("lock timeout"))
    assert builds._transient_ddl_error(e.DeadlockDetected("deadlock"))
    assert not builds._transient_ddl_error(e.UniqueViolation("could not create unique index"))
