"""docs/api.md holds to mover.api: every function it documents exists, with exactly the parameters
its heading lists, in that order and of that kind; every public function of mover.api is
documented (but the two it names as mover's own); every error class it names exists in the
hierarchy with the exit code it gives; and the example program compiles and calls only what
exists, with keywords each function takes."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from mover import api, db, errors

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "api.md").read_text()
INTERNAL = {"session", "resolve_plan"}  # named in the doc as not part of the interface


def documented() -> dict[str, str]:
    """{function: its heading's parameter list}."""
    return dict(re.findall(r"^#### `(\w+)\((.*)\)`$", DOC, re.M))


def public_functions() -> dict[str, object]:
    return {name: fn for name, fn in vars(api).items()
            if inspect.isfunction(fn) and fn.__module__ == api.__name__ and not name.startswith("_")}


def as_heading(fn) -> str:
    """The signature as the doc writes it: names, defaults (a function by its name), `*`."""
    parts, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.default is p.empty:
            parts.append(p.name)
        else:
            default = p.default.__name__ if callable(p.default) else repr(p.default)
            parts.append(f"{p.name}={default}")
    return ", ".join(parts)


def test_every_documented_function_exists_with_the_signature_its_heading_gives():
    docs = documented()
    assert len(docs) >= 25, docs
    for name, params in docs.items():
        fn = getattr(api, name, None)
        assert inspect.isfunction(fn), f"docs/api.md documents api.{name}, which does not exist"
        assert params == as_heading(fn), f"api.{name}: the doc says ({params}), the code ({as_heading(fn)})"


def test_every_public_function_is_documented():
    missing = set(public_functions()) - set(documented()) - INTERNAL
    assert not missing, f"functions of mover.api without a heading in docs/api.md: {sorted(missing)}"
    for name in INTERNAL:
        assert f"`{name}`" in DOC


def test_the_error_table_matches_the_hierarchy():
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \|", DOC, re.M)
    assert {name for name, _ in rows} == {"MoverError", "Failed", "BadInput", "Waiting", "Interrupted"}, rows
    for name, code in rows:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.MoverError) and cls.exit_code == int(code), name
    # The subclasses the table names exist under the class of their row.
    for row in re.findall(r"^\| `(\w+)` \| \d+ \| (.*) \|$", DOC, re.M):
        base = getattr(errors, row[0])
        for sub in re.findall(r"`([A-Z]\w+)`", row[1]):
            cls = getattr(errors, sub, None) or getattr(db, sub)
            assert issubclass(cls, base), f"{sub} is named under {base.__name__}"


def example() -> str:
    return DOC.split("## An example program\n", 1)[1].split("```python\n", 1)[1].split("\n```\n", 1)[0]


def test_the_example_calls_only_what_exists_with_keywords_it_takes():
    tree = ast.parse(example())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "api"]
    assert {c.func.attr for c in calls} >= {"check_plan", "run", "status", "cutover_now", "retire"}
    for call in calls:
        fn = getattr(api, call.func.attr)
        params = inspect.signature(fn).parameters
        for kw in call.keywords:
            assert kw.arg in params, f"api.{call.func.attr} takes no {kw.arg}"
        positional = [p for p in params.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert len(call.args) <= len(positional), f"api.{call.func.attr}: too many arguments"
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("mover.errors", "Waiting") in imported and all(getattr(errors, a) for m, a in imported
                                                         if m == "mover.errors")
