"""The error classes' exit codes, the CLI's single mapping from exceptions to exit codes, and
which database errors rerun a whole transaction; no database needed."""

from __future__ import annotations

import psycopg
import pytest
import typer
from psycopg import errors as e

from mover import cli, errors
from mover.db import is_retryable


@pytest.mark.parametrize("cls, code", [
    (errors.MoverError, 1), (errors.Failed, 1), (errors.LeaseLost, 1),
    (errors.BadInput, 2), (errors.PlanError, 2), (errors.NotFound, 2),
    (errors.Waiting, 3), (errors.LeaseHeld, 3),
    (errors.Interrupted, 130),
], ids=lambda x: getattr(x, "__name__", str(x)))
def test_each_error_class_has_its_exit_code(cls, code):
    assert cls.exit_code == code


def _exit_of(exc: BaseException) -> int:
    def command():
        raise exc

    with pytest.raises(typer.Exit) as caught:
        cli._exits(command)()
    return caught.value.exit_code


@pytest.mark.parametrize("exc, code", [
    (errors.PlanError("[rollback] window is not a duration", hint="fix the plan"), 2),
    (errors.Waiting("waiting at the cutover gate", hint="mover cutover m"), 3),
    (errors.Failed("range failed"), 1),
    (errors.Interrupted("stopped"), 130),
    (KeyboardInterrupt(), 130),
    (e.UndefinedTable('relation "x" does not exist'), 1),
    (RuntimeError("a bug"), 1),
], ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else str(x))
def test_the_cli_maps_each_error_to_its_exit_code(exc, code, capsys):
    assert _exit_of(exc) == code
    stderr = capsys.readouterr().err
    assert stderr.strip(), "every failure says something"


def test_the_cli_prints_the_message_and_the_next_command(capsys):
    _exit_of(errors.PlanError('"public"."orders" has no primary key', hint="add one, then mover plan check"))
    stderr = capsys.readouterr().err
    assert '"public"."orders" has no primary key' in stderr
    assert "next: add one, then mover plan check" in stderr
    assert "Traceback" not in stderr


def test_a_bug_shows_its_traceback_and_a_known_error_does_not(capsys):
    _exit_of(RuntimeError("a bug"))
    assert "Traceback" in capsys.readouterr().err
    _exit_of(errors.Failed("known"))
    assert "Traceback" not in capsys.readouterr().err


def test_a_successful_command_returns_its_value():
    assert cli._exits(lambda: 42)() == 42


@pytest.mark.parametrize("exc", [
    e.SerializationFailure("could not serialize access"),
    e.DeadlockDetected("deadlock detected"),
    e.LockNotAvailable("canceling statement due to lock timeout"),
    e.AdminShutdown("terminating connection due to administrator command"),
    e.ConnectionFailure("connection failure"),
    psycopg.OperationalError("server closed the connection unexpectedly"),  # no SQLSTATE: the link is gone
], ids=lambda x: type(x).__name__)
def test_retryable(exc):
    assert is_retryable(exc)


@pytest.mark.parametrize("exc", [
    e.UniqueViolation("duplicate key"),
    e.NumericValueOutOfRange("integer out of range"),
    e.QueryCanceled("canceling statement due to statement timeout"),
    e.UndefinedTable("relation does not exist"),
    e.InsufficientPrivilege("permission denied"),
    errors.Failed("not a database error"),
    ValueError("not a database error"),
], ids=lambda x: type(x).__name__)
def test_not_retryable(exc):
    assert not is_retryable(exc)
