"""Read mover/ and check who writes the range queue and who starts threads: mover.ranges,
mover.frontiers and mover.workers are written only by their owner (mover/state/ranges.py), the
queue's module imports nothing from the layers above it, and only mover/threads.py starts a
thread in the runtime path (the demo, outside it, has its own writer thread)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

MOVER = Path(__file__).resolve().parents[2] / "mover"

WRITES_QUEUE = re.compile(r"\b(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+mover\.(ranges|frontiers|workers)\b", re.I)
ABOVE_STATE = ("mover.engines", "mover.runner", "mover.steps", "mover.views", "mover.api", "mover.cli")


def _sources() -> dict[str, str]:
    return {str(p.relative_to(MOVER.parent)): p.read_text() for p in sorted(MOVER.rglob("*.py"))}


def _imports(text: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_only_the_queue_module_writes_the_queue_tables():
    writers = {path for path, text in _sources().items() if WRITES_QUEUE.search(text)}
    assert writers == {"mover/state/ranges.py"}


def test_the_queue_and_the_heartbeat_import_nothing_from_the_layers_above():
    for module in ("mover/state/ranges.py", "mover/state/heartbeat.py", "mover/threads.py"):
        upward = {i for i in _imports((MOVER.parent / module).read_text()) if i.startswith(ABOVE_STATE)}
        assert not upward, f"{module} imports {sorted(upward)}"


def test_threads_are_started_in_one_place():
    starters = {path for path, text in _sources().items()
                if "threading.Thread(" in text or "(threading.Thread)" in text}
    assert starters == {"mover/threads.py", "mover/demo/demo.py"}
