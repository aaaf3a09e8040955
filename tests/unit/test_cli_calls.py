"""The command line keeps nothing between calls. Two commands run one after the other in one
process (as the tests' runner runs them, tests/workload.py) each see only their own --debug and
--dsn, and each leaves the process as it found it: signal handlers, the root logger, the
excepthook, the passwords remembered for masking. mover/cli.py holds no state to carry over: at
module level only the typer apps and the option declarations are assigned. No database needed
(the DSNs name servers that are not there)."""

from __future__ import annotations

import ast
import logging
import signal
import sys
from pathlib import Path

from mover import db
from tests.workload import mover

CLI = Path(__file__).resolve().parents[2] / "mover" / "cli.py"
APPS = {"app", "plan_app", "partitions_app", "fleet_app"}


def _process_wide() -> tuple:
    root = logging.getLogger()
    return (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), tuple(root.handlers), root.level,
            sys.excepthook)


def test_two_calls_in_one_process_each_see_only_their_own_options(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGHOST", "/nonexistent-mover-dir")  # libpq reads it at each connection
    before = _process_wide()

    first = mover("postgresql://u:pwFirst1@127.0.0.1:1/x", "--debug", "status", process=False)
    assert _process_wide() == before
    # No --debug, and an empty --dsn: the PG* variables, not the first call's DSN.
    second = mover("", "status", process=False)
    assert _process_wide() == before
    third = mover("postgresql://u:pwThird3@127.0.0.1:3/x", "-v", "history", process=False)
    assert _process_wide() == before

    assert first.returncode == second.returncode == third.returncode == 1, (first, second, third)
    assert "Traceback" in first.stderr and "port=1" in first.stderr, first.stderr
    assert "Traceback" not in second.stderr, second.stderr  # the first call's --debug stayed its own
    assert "given by the PG* variables" in second.stderr and "127.0.0.1" not in second.stderr, second.stderr
    assert "Traceback" not in third.stderr and "port=3" in third.stderr and "port=1" not in third.stderr, third.stderr
    for r in (first, second, third):
        assert "pwFirst1" not in r.stdout + r.stderr and "pwThird3" not in r.stdout + r.stderr
    # The passwords each command remembered were its own: none is remembered after it returned.
    assert db.mask("pwFirst1 pwThird3") == "pwFirst1 pwThird3"


def _is_call_of(node: ast.expr, *names: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        isinstance(node.func.value, ast.Name) and f"{node.func.value.id}.{node.func.attr}" in names


def module_state(source: str) -> list[str]:
    """The module-level statements of `source` that keep state: anything but imports, functions,
    the docstring, the typer apps (and adding one to another) and option declarations; and any
    `global` or `nonlocal`."""
    tree = ast.parse(source)
    found = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node is tree.body[0]:
            continue  # the docstring
        if isinstance(node, ast.Expr) and _is_call_of(node.value, "app.add_typer"):
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in APPS and _is_call_of(node.value, "typer.Typer"):
                continue
            if name.endswith(("Option", "Argument")) and _is_call_of(node.value, "typer.Option", "typer.Argument"):
                continue
        found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found + [f"line {n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
                    if isinstance(n, (ast.Global, ast.Nonlocal))]


def test_cli_holds_no_state_at_module_level():
    found = module_state(CLI.read_text())
    assert found == [], "mover/cli.py keeps state at module level (a command's own belongs to its context):\n" \
        + "\n".join(found)


def test_the_state_reader_sees_each_kind_of_state():
    source = ('"""doc"""\nimport typer\napp = typer.Typer()\nclass State:\n    debug = False\nerr = object()\n'
              'typer.core.TyperOption.x = 1\nDsnOption = typer.Option(None)\nP = typer.Option\n'
              'app.add_typer(app)\nprint("x")\ndef f():\n    global err\n')
    assert [line.split(": ", 1)[1] for line in module_state(source)] == [
        "class State:", "err = object()", "typer.core.TyperOption.x = 1", "P = typer.Option", "print('x')",
        "global err"]
