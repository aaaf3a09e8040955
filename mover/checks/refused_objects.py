"""What the swap cannot carry over, refused rather than lost at the cutover: exclusion
constraints and inheritance. (Triggers, rules, row-level security, dependent views and foreign
keys are carried over: mover/engines/carry.py.)"""

from __future__ import annotations

from mover import names
from mover.catalog import introspect
from mover.checks import Subject, versions
from mover.errors import PlanError


def exclusion_constraints(s: Subject) -> None:
    temporal = versions.temporal_key_indexes(s)  # refused as such (checks/versions.py)
    for ix in s.table.indexes:
        if ix.is_exclusion and ix.oid not in temporal:
            s.report(PlanError(f"{s.src} has the exclusion constraint index {names.display_ident(ix.name)}, which "
                               f"mover cannot recreate yet",
                               hint="drop the exclusion constraint for the migration, or move the table by other "
                                    "means"))


def table_properties(s: Subject) -> None:
    meta = introspect.metadata(s.cur, s.table.oid)
    if meta.inheritance:
        raise PlanError(f"[migration] source: {s.src} {meta.inheritance}: not supported yet",
                        hint="mover refuses rather than lose this at the swap; see docs/operating.md,"
                             " \"Known limitations\"")
