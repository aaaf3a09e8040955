"""SQL over text that is not a literal goes through one door, mover.sql.trusted, which names where
the text came from; and the engines stay siblings over shared services. Both read the source with
`ast`, so they fail on the line that breaks the rule, before any server runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from psycopg import sql

from mover.sql import SOURCES, trusted

MOVER = Path(__file__).resolve().parents[2] / "mover"
HELPER = MOVER / "sql" / "__init__.py"


def _modules() -> list[Path]:
    return sorted(MOVER.rglob("*.py"))


def _sql_calls_over_non_literals(source: str) -> list[str]:
    """Each sql.SQL(...) call whose one argument is not a string literal, as `line: call`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or ast.unparse(node.func) not in ("sql.SQL", "psycopg.sql.SQL", "SQL"):
            continue
        args = [*node.args, *(k.value for k in node.keywords)]
        if len(args) == 1 and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_sql_over_anything_but_a_literal_goes_through_trusted():
    offenders = [f"{p.relative_to(MOVER.parent)}:{line}" for p in _modules() if p != HELPER
                 for line in _sql_calls_over_non_literals(p.read_text())]
    assert offenders == [], "use mover.sql.trusted(text, source) for text that is not a literal:\n" + "\n".join(
        offenders)


def test_the_helper_is_the_one_exception():
    # The scan sees the helper's own call, so a scan that matched nothing would fail here.
    assert len(_sql_calls_over_non_literals(HELPER.read_text())) == 1


def test_the_scan_catches_each_way_of_building_the_text():
    bad = ('from psycopg import sql\nt = "int"\n'
           'sql.SQL(t)\nsql.SQL("a" + t)\nsql.SQL(f"CAST(x AS {t})")\nsql.SQL("a" if t else "b")\n'
           'sql.SQL(obj=t)\nsql.SQL("fine")\n')
    assert [line.split(": ", 1)[1] for line in _sql_calls_over_non_literals(bad)] == [
        "sql.SQL(t)", "sql.SQL('a' + t)", "sql.SQL(f'CAST(x AS {t})')", "sql.SQL('a' if t else 'b')",
        "sql.SQL(obj=t)"]


def test_trusted_text_is_spliced_as_it_is_and_must_say_where_it_came_from():
    assert trusted("numeric(12, 2)", "format_type").as_string(None) == "numeric(12, 2)"
    assert isinstance(trusted("bigint", "plan type"), sql.SQL)
    with pytest.raises(ValueError, match="unknown source"):
        trusted("bigint", "the user said so")
    assert "format_type" in SOURCES and "pg_get_indexdef" in SOURCES


# ---------------------------------------------------------------------------------------------
# Engines are siblings over shared services (capture, chunks, control, throttle, introspect...):
# none imports another, so the chain cutover -> reconcile -> backfill cannot come back. The steps
# (mover/steps/) are where one engine's work is handed to another's (the copy to the builds after it).

ENGINES = {"backfill": "bulk/backfill.py", "builds": "bulk/builds.py", "preflight": "bulk/preflight.py",
           "reconcile": "bulk/reconcile.py", "cutover": "swap/cutover.py"}


def _imported_mover_modules(path: Path) -> set[str]:
    """The last names of the engine modules `path` imports (`from mover.engines.bulk import
    backfill`, `from mover.engines.bulk.backfill import x`, `import mover.engines.swap.cutover`)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mover.engines"):
            out |= {a.name for a in node.names} | {node.module.split(".")[-1]}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[-1] for a in node.names if a.name.startswith("mover.engines.")}
    return out


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_an_engine_imports_no_other_engine(engine):
    imported = _imported_mover_modules(MOVER / "engines" / ENGINES[engine])
    assert imported & (set(ENGINES) - {engine}) == set()
