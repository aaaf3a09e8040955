"""The layers' import order (docs/design.md, "Architecture"): every module of mover/ imports only
from its own layer or a layer below it. Read from the source (ast), every import statement
counted, those inside functions and under TYPE_CHECKING included: a lazy import up the stack is
still an arrow pointing up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mover"

# Top to bottom. A module belongs to the first layer one of whose prefixes it matches; it may
# import from its own layer and from any layer below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # The frameworks' ways in (Alembic's operations and Django's call the api; Django's command
    # runs the command line).
    ("contrib", ("mover.contrib",)),
    # The command line, and the demo that drives the commands like an operator would.
    ("interface", ("mover.cli", "mover.__main__")),
    ("demo", ("mover.demo",)),
    # Fleets: many members' migrations, each moved by the api's commands.
    ("fleet", ("mover.fleet",)),
    # The commands as plain functions: a session, then one call into the runner or the views.
    ("api", ("mover.api",)),
    # Everything that moves a migration: the lease, the step loop, the operator commands,
    # registration, following, helper workers, the heartbeat's samples.
    ("runner", ("mover.runner",)),
    # The read side: the status read model and what renders it. Under the runner because the
    # heartbeat samples what the status counts (runner/sampler.py).
    ("views", ("mover.views",)),
    # The plan's checks against the live catalog; the rehearsal runs create_target's DDL.
    ("checks", ("mover.checks",)),
    ("steps", ("mover.steps",)),
    # The engines, by concern (each package's __init__ says what it owns), bottom to top inside
    # the layer: what the swap does uses the bulk engines' names, the bulk work asks the
    # governor, the governor reads capture's slot, capture works from the context.
    ("engines.swap", ("mover.engines.swap",)),
    ("engines.bulk", ("mover.engines.bulk",)),
    ("engines.governor", ("mover.engines.governor",)),
    ("engines.capture", ("mover.engines.capture",)),
    ("engines.context", ("mover.engines.context", "mover.engines.hooks", "mover.engines")),
    ("engines.partitioning", ("mover.engines.partitioning",)),
    # Catalog reads (and the shapes they record through control).
    ("catalog", ("mover.catalog",)),
    # mover's own control schema: transitions, leases, events, ranges, samples.
    ("state", ("mover.state",)),
    # Pure SQL builders: no I/O, no catalog types.
    ("sql", ("mover.sql",)),
    ("foundation", ("mover.db", "mover.names", "mover.plan", "mover.errors", "mover.faults", "mover.threads", "mover")),
]

# (importing module, imported module) pairs allowed to point up, each with its reason. Keep it
# short; an entry is a debt with a name on it.
ALLOWED: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The mover modules `path` imports: `from mover.x import y` is mover.x.y when that is a module
    (a package's submodule), else mover.x."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "mover" or node.module.startswith("mover.")):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name == "mover" or a.name.startswith("mover."))
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: a relative import; mover imports absolutely")
    return out


def upward() -> list[str]:
    known = set(modules())
    found = []
    for name, path in modules().items():
        mine = layer_of(name)
        for imported in sorted(imports(path, known)):
            theirs = layer_of(imported)
            if theirs < mine and (name, imported) not in ALLOWED:
                found.append(f"{name} ({LAYERS[mine][0]}) imports {imported} ({LAYERS[theirs][0]})")
    return found


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_imports_point_down():
    assert upward() == [], "imports that point up a layer:\n" + "\n".join(upward())


def _graph() -> dict[str, set[str]]:
    known = set(modules())
    return {name: imports(path, known) - {name} for name, path in modules().items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (strongly connected components of more than one module),
    each sorted; Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_circle_anywhere():
    """No module reaches itself through imports, inside a layer either (type-only imports count:
    a circle closed by one is still two modules that cannot be read apart)."""
    assert circles(_graph()) == []


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_every_engine_package_says_what_it_owns():
    """Each package under mover/engines/ opens with a docstring saying what it owns."""
    for init in sorted((PACKAGE / "engines").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 20, f"{init.relative_to(ROOT)}: say what this package owns"


def test_api_calls_only_the_layer_below():
    """The facade reaches nothing past the runner and the views (no engine, no control table),
    only the foundation besides."""
    known = set(modules())
    below = ("mover.runner", "mover.views")
    foundation = dict(LAYERS)["foundation"]
    reached = sorted(i for i in imports(modules()["mover.api"], known)
                     if not any(i == p or i.startswith(p + ".") for p in below) and i not in foundation)
    assert reached == [], f"mover/api.py reaches past the runner and the views: {reached}"


def test_each_allowance_is_still_needed():
    """An allowance whose import is gone is removed from the list, so the list says what is left."""
    known = set(modules())
    for (name, imported), why in ALLOWED.items():
        assert imported in imports(modules()[name], known), f"{name} no longer imports {imported}: drop it ({why})"


@pytest.mark.parametrize(("source", "expected"), [
    ("from mover.engines.swap import cutover\n", {"mover.engines.swap.cutover"}),
    ("from mover import api, db\n", {"mover.api", "mover.db"}),
    ("def f():\n    from mover.views.status import status_of\n", {"mover.views.status"}),
    ("import mover.state.control\n", {"mover.state.control"}),
])
def test_the_reader_sees_every_kind_of_import(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert imports(path, set(modules())) == expected


# Registration writes the column; nothing else above the engines asks whether a migration has
# several tables: the runner, the steps and the views take a list of tables, one or many.
FAMILY_COLUMN_WRITERS = {"mover.runner.register"}
ABOVE_THE_ENGINES = ("mover.cli", "mover.api", "mover.runner", "mover.views", "mover.steps", "mover.demo")


def test_no_branch_on_family_id_above_the_engines():
    found = []
    for name, path in modules().items():
        if not name.startswith(ABOVE_THE_ENGINES) or name in FAMILY_COLUMN_WRITERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "family_id":
                found.append(f"{name}:{node.lineno}")
    assert found == [], f"a branch on family_id above the engines (take the list of tables instead): {found}"
