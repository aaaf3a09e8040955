"""Objects bound to the source's identity (its oid or row type) that the swap would leave on the old
table (mover/catalog/identity.py, invariant 15): each is refused here, named, with the statement
that fixes it. The swap's preflight (and its lock, when the catalog changed meanwhile) refuses what
appears after registration the same way."""

from __future__ import annotations

from mover.catalog import identity
from mover.checks.subject import Subject
from mover.errors import PlanError


def bound(s: Subject) -> None:
    for b in identity.bound(s.cur, s.table.oid):
        s.report(PlanError(f"[migration] source: {b.what} is bound to the identity of {s.src} (its oid or row type):"
                           f" {b.why}",
                           hint=f"{b.fix}; then `mover plan check PLAN` again (docs/operating.md \"Objects bound to"
                                f" the table's identity\")"))
