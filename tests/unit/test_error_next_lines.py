"""Every error the CLI prints ends with a `next:` line, whatever raised it (no database needed):
the mapping in mover/cli.py for each class of failure."""

from __future__ import annotations

import psycopg
import pytest
import typer
from psycopg import errors as e

from mover import cli, errors


@pytest.mark.parametrize("exc, code", [
    (errors.PlanError("[rollback] window is missing", hint="add window = \"24h\""), 2),
    (errors.Failed("a range failed"), 1),  # raised without a hint: the general one
    (errors.Waiting("at the gate [cutover]"), 3),
    (errors.ServerGone("migration 'm': lost the connection", hint="once the server is back, `mover run m`"), 1),
    (errors.Interrupted("stopped"), 130),
    (KeyboardInterrupt(), 130),
    (e.UndefinedTable('relation "x" does not exist'), 1),
    (psycopg.OperationalError("server closed the connection unexpectedly"), 1),
    (ValueError("a bug"), 1),
], ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else str(x))
def test_every_failure_prints_a_next_line(exc, code, capsys):
    def command():
        raise exc

    with pytest.raises(typer.Exit) as caught:
        cli._exits(command)()
    assert caught.value.exit_code == code
    lines = capsys.readouterr().err.splitlines()
    assert any(ln.startswith("next: ") and len(ln) > 10 for ln in lines), lines
    if isinstance(exc, errors.Waiting):
        assert any("[cutover]" in ln for ln in lines), lines  # not taken for markup
    if isinstance(exc, psycopg.OperationalError):
        assert any("lost the connection to the database server" in ln for ln in lines), lines


def test_parse_plan_names_every_problem():
    from mover.plan import parse_plan
    with pytest.raises(errors.PlanError) as caught:
        parse_plan({"migration": {"name": "x y", "source": 5}, "backfill": {"workers": "2", "nope": 1},
                    "extra": {}})
    problems = caught.value.problems
    assert len(problems) == 6, [p.message for p in problems]
    assert all(p.hint for p in problems), [p.message for p in problems if not p.hint]


@pytest.mark.parametrize("argv, expected", [
    (["status", "--debug"], ["--debug", "status"]),
    (["--json", "status", "m"], ["status", "--json", "m"]),
    (["--json", "plan", "check", "p.toml"], ["plan", "check", "--json", "p.toml"]),
    (["--dsn", "x", "-v", "run", "m"], ["--dsn", "x", "-v", "run", "m"]),
    (["accept", "m", "--reason", "why", "--debug"], ["--debug", "accept", "m", "--reason", "why"]),
])
def test_global_options_on_either_side(argv, expected):
    assert cli.normalise_argv(argv) == expected
