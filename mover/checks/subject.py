"""What the plan's checks read and what they find (mover/checks/__init__.py runs them in order):
one object every check module takes, kept apart from the registry so that no check imports the
package that imports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from mover.catalog import introspect
from mover.errors import PlanError
from mover.names import QualifiedName
from mover.plan import Plan


@dataclass
class Subject:
    """What the checks read and what they find, in check order."""

    cur: psycopg.Cursor
    plan: Plan
    source: QualifiedName | None = None
    info: introspect.TableInfo | None = None
    target: QualifiedName | None = None
    old: QualifiedName | None = None
    rehearsed: introspect.TableInfo | None = None  # the target as the rehearsal created it
    lossy: dict[str, str] = field(default_factory=dict)
    # Changed columns whose values a rollback may not carry back, and why (mover/checks/types.py).
    carried_back: dict[str, str] = field(default_factory=dict)
    partitioning: Any = None  # what a partition conversion creates (engines/partitioning/partitions.py)
    metadata: dict[str, list[str]] = field(default_factory=dict)  # carried when, or not (mover/engines/swap/carry.py)
    problems: list[PlanError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what plan check says without refusing
    operator_schemas: list[str] = field(default_factory=list)  # the key's operators' (checks/search_path.py)

    def report(self, problem: PlanError) -> None:
        """One more problem; the check may go on looking for others of its own."""
        self.problems.append(problem)

    # For checks that run once the fatal ones passed: the names they rely on are resolved.
    @property
    def src(self) -> QualifiedName:
        assert self.source is not None
        return self.source

    @property
    def table(self) -> introspect.TableInfo:
        assert self.info is not None
        return self.info

    @property
    def new(self) -> QualifiedName:
        assert self.target is not None
        return self.target
