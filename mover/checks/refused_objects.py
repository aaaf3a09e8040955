"""What the swap cannot carry over yet, refused rather than lost at the cutover: exclusion
constraints, inheritance, row-level security, user triggers, rules, dependent views."""

from __future__ import annotations

from mover import introspect, names
from mover.checks import Subject
from mover.errors import PlanError


def exclusion_constraints(s: Subject) -> None:
    for ix in s.table.indexes:
        if ix.is_exclusion:
            s.report(PlanError(f"{s.src} has the exclusion constraint index {names.display_ident(ix.name)}, which "
                               f"mover cannot recreate yet",
                               hint="drop the exclusion constraint for the migration, or move the table by other "
                                    "means"))


def table_properties(s: Subject) -> None:
    meta = introspect.metadata(s.cur, s.table.oid)
    unsupported = []
    if meta.inheritance:
        unsupported.append(meta.inheritance)
    if meta.row_security or meta.policies:
        unsupported.append(f"has row-level security ({len(meta.policies)} policies)")
    if meta.user_triggers:
        unsupported.append(f"has triggers ({', '.join(names.display_ident(t) for t in meta.user_triggers)}) that "
                           f"mover cannot move to the new table yet")
    if meta.rules:
        unsupported.append(f"has rules ({', '.join(names.display_ident(r) for r in meta.rules)})")
    if unsupported:
        raise PlanError(f"[migration] source: {s.src} {'; '.join(unsupported)}: not supported yet",
                        hint="mover refuses rather than lose this at the swap; see docs/operating.md,"
                             " \"Known limitations\"")


def views(s: Subject) -> None:
    found = introspect.dependent_views(s.cur, s.table.oid)
    if found:
        raise PlanError(f"views depend on {s.src} ({', '.join(found)}); they would keep reading the old table "
                        f"after the swap", hint="drop them before the migration and recreate them after")
