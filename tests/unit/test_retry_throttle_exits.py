"""Pure parts without a database: which errors a transaction is retried on (and that the retry's
log line names the transaction), the throttle's pacing, the exit code of each error, and how
plan-check problems are put together."""

from __future__ import annotations

import logging

import psycopg
import pytest
import typer
from psycopg import errors as e
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_none

from mover import checks, cli, db
from mover.engines.governor import throttle
from mover.errors import BadInput, Failed, Interrupted, LeaseHeld, LeaseLost, NotFound, PlanError, Waiting

# ---------------------------------------------------------------------------------------------
# Retry classification


@pytest.mark.parametrize("exc", [
    e.SerializationFailure("could not serialize access"),
    e.DeadlockDetected("deadlock detected"),
    e.LockNotAvailable("canceling statement due to lock timeout"),
    psycopg.OperationalError("server closed the connection unexpectedly"),  # the client's own: no SQLSTATE
    e.ConnectionFailure("connection failure"),
    e.AdminShutdown("terminating connection due to administrator command"),
    e.CannotConnectNow("the database system is starting up"),
], ids=lambda x: type(x).__name__)
def test_a_conflict_or_a_lost_connection_is_retried(exc):
    assert db.is_retryable(exc)


@pytest.mark.parametrize("exc", [
    e.QueryCanceled("canceling statement due to statement timeout"),
    e.UniqueViolation("duplicate key"),
    e.NumericValueOutOfRange("integer out of range"),
    e.InsufficientPrivilege("permission denied"),
    e.UndefinedTable("relation does not exist"),
    Failed("a range failed"),
    ValueError("a bug"),
], ids=lambda x: type(x).__name__)
def test_what_fails_the_same_way_again_is_not_retried(exc):
    assert not db.is_retryable(exc)


def test_a_protocol_violation_is_a_failure_not_a_lost_connection(capsys):
    """08P01: the server refused what the client sent (a bind message whose parameters do not match
    its statement): the same statement fails the same way on a new connection. It is reported as
    the database error it is (exit 1), neither retried nor called a server that went away."""
    exc = e.ProtocolViolation('bind message supplies 1 parameters, but prepared statement "" requires 2')
    assert exc.sqlstate == "08P01"
    assert not db.is_connection_lost(exc)
    assert not db.is_retryable(exc)
    calls = []

    def body():
        calls.append(1)
        raise exc

    retrying = Retrying(retry=retry_if_exception(db.is_retryable), stop=stop_after_attempt(5), wait=wait_none(),
                        reraise=True)
    with pytest.raises(e.ProtocolViolation):
        retrying(body)
    assert len(calls) == 1

    def command():
        raise exc

    with pytest.raises(typer.Exit) as caught:
        cli._exits(command)()
    assert caught.value.exit_code == 1
    stderr = capsys.readouterr().err
    assert "database error: bind message supplies 1 parameters" in stderr, stderr
    assert "lost the connection" not in stderr and "once the server is back" not in stderr, stderr


def test_retryable_sqlstates_are_the_classes_own():
    assert db.RETRYABLE_SQLSTATES == {"40001", "40P01", "55P03"}


def test_a_retry_is_logged_under_the_transactions_label(caplog):
    calls = []

    def body():
        calls.append(1)
        if len(calls) < 3:
            raise e.DeadlockDetected("deadlock detected")
        return "done"

    retrying = Retrying(retry=retry_if_exception(db.is_retryable), stop=stop_after_attempt(5), wait=wait_none(),
                        before_sleep=db._retry_logger("backfill range"), reraise=True)
    with caplog.at_level(logging.WARNING, logger="mover.db"):
        assert retrying(body) == "done"
    lines = [r.getMessage() for r in caplog.records if r.name == "mover.db"]
    assert lines == ["retrying backfill range (attempt 1) after DeadlockDetected [40P01]",
                     "retrying backfill range (attempt 2) after DeadlockDetected [40P01]"]


# ---------------------------------------------------------------------------------------------
# Throttle


def test_pause_comes_first_and_needs_no_query():
    t = throttle.Throttle(throttle.Limits())
    assert t.reason(paused=True) == "paused (mover unpause)"
    assert throttle.Throttle(throttle.Limits()).reason(paused=False) is None


def test_without_a_cap_ranges_keep_their_size_and_nobody_waits():
    t = throttle.Throttle(throttle.Limits(max_rows=50_000), workers=4)
    assert t.range_rows(10_000) == 10_000
    assert t.range_rows(80_000) == 50_000  # max_rows, as `mover set` left it
    assert t.pace(10_000, 0.01) == (0.0, None)


@pytest.mark.parametrize("cap, workers, burst_ms, hint, expected", [
    (2_000, 1, 500, 5_000, 1_000),  # the cap's share of one burst wins over a big hint
    (2_000, 2, 500, 5_000, 500),  # two workers share the cap
    (2_000, 1, 5_000, 50_000, 2_000),  # a burst counts at most one second
    (2_000, 1, 500, 100, 100),  # a small hint stays small
    (3, 8, 500, 100, 1),  # never an empty range
])
def test_a_capped_range_fits_the_caps_budget(cap, workers, burst_ms, hint, expected):
    t = throttle.Throttle(throttle.Limits(max_rows_per_second=cap, burst_ms=burst_ms), workers=workers)
    assert t.range_rows(hint) == expected


def test_pacing_waits_out_what_the_rows_are_worth():
    t = throttle.Throttle(throttle.Limits(max_rows_per_second=1_000), workers=2)
    # 500 rows at 500 rows/s per worker are worth 1 s; 0.25 s went on copying them.
    assert t.pace(500, 0.25) == (pytest.approx(0.75), "rows/s cap 1000")
    assert t.pace(500, 2.0) == (0.0, None)  # slower than the cap: no wait
    assert t.cap_reason() == "rows/s cap 1000"


# ---------------------------------------------------------------------------------------------
# Exit codes: cli._exits is the one place that maps them


@pytest.mark.parametrize("exc, code", [
    (Failed("x"), 1), (LeaseLost("x"), 1), (BadInput("x"), 2), (PlanError("x"), 2), (NotFound("x"), 2),
    (Waiting("x"), 3), (LeaseHeld("x"), 3), (Interrupted("x"), 130), (KeyboardInterrupt(), 130),
    (e.UndefinedTable("relation does not exist"), 1), (RuntimeError("a bug"), 1),
], ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else str(x))
def test_each_error_has_its_exit_code(exc, code):
    @cli._exits
    def command():
        raise exc

    with pytest.raises(typer.Exit) as done:
        command()
    assert done.value.exit_code == code


# ---------------------------------------------------------------------------------------------
# Plan checks: every problem in one message


def test_one_problem_is_reported_as_it_is():
    p = PlanError("[target] name: x already exists", hint="choose another name")
    assert checks.combined([p]) is p


def test_several_problems_are_listed_each_with_its_next_step():
    got = checks.combined([PlanError("first", hint="do a"), PlanError("second")])
    assert isinstance(got, PlanError) and got.exit_code == 2
    assert got.message.splitlines() == ["the plan has 2 problems:", "1. first (next: do a)", "2. second"]
