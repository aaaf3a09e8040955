"""Every catalog read that prints an object with the catalog's own functions goes through
mover/catalog/reading.py (race 10): a function of mover/ whose SQL calls pg_get_constraintdef(),
pg_get_indexdef(), pg_get_expr(), format_type() ... (in a literal, or a module constant it uses)
calls reading.read() or reading.read_one(). Read from the source (ast); mover/sql/ only builds
statements (their callers are checked), the demo drives the commands."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mover"
PRINTS = re.compile(r"\b(pg_get_(constraintdef|indexdef|triggerdef|ruledef|viewdef|expr|functiondef|"
                    r"statisticsobjdef\w*)|format_type)\s*\(\s*[a-z%]", re.IGNORECASE)
SKIPPED = ("mover/sql/", "mover/demo/", "mover/catalog/reading.py")
# The builders of mover/sql/ whose statements print objects (imported as `q` where they run): their
# callers must read through reading.
BUILDERS = {"unique_indexes", "exclusion_constraints", "partitions_of"}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _prints(node: ast.AST, docs: set[int]) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
               and PRINTS.search(n.value) for n in ast.walk(node))


def _reads(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in ("read", "read_one") and isinstance(n.value, ast.Name)
               and n.value.id == "reading" for n in ast.walk(fn))


def offenders() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(SKIPPED):
            continue
        tree = ast.parse(path.read_text(), rel)
        docs = _docstrings(tree)
        constants = {t.id for node in tree.body if isinstance(node, ast.Assign) and _prints(node.value, docs)
                     for t in node.targets if isinstance(t, ast.Name)}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            own = list(fn.body)
            uses = any(_prints(n, docs) for n in own) or any(
                (isinstance(n, ast.Name) and n.id in constants)
                or (isinstance(n, ast.Attribute) and n.attr in BUILDERS and isinstance(n.value, ast.Name)
                    and n.value.id == "q") for s in own for n in ast.walk(s))
            if uses and not _reads(fn):
                out.append(f"{rel}:{fn.lineno} {fn.name}")
    return out


def test_every_catalog_print_is_read_through_reading():
    assert offenders() == []


def test_the_check_finds_a_read_that_does_not():
    tree = ast.parse('def f(cur):\n    cur.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint")\n')
    assert _prints(tree, set()) and not _reads(tree.body[0])
