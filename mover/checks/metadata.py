"""The rest of the table's metadata (mover/engines/swap/metadata.py): what is carried when, what cannot be,
and what would make the swap fail (a publication mover's role cannot alter)."""

from __future__ import annotations

from mover import names
from mover.catalog import subscribers
from mover.checks.subject import Subject
from mover.engines.swap import metadata
from mover.errors import PlanError


def carried(s: Subject) -> None:
    s.metadata = metadata.plan_notes(s.cur, s.table.oid, s.plan.columns, s.plan.new_layout is not None)


def publications(s: Subject) -> None:
    for pub, owner in metadata.publications_not_owned(s.cur, s.table.oid):
        s.report(PlanError(f"{s.src} belongs to publication {names.display_ident(pub)}, owned by"
                           f" {names.display_ident(owner)}: the swap moves the membership to the new table"
                           f" (ALTER PUBLICATION), which only its owner can do",
                           hint=f"ALTER PUBLICATION {names.display_ident(pub)} OWNER TO the role mover runs as"
                                f" (or GRANT {names.display_ident(owner)} TO it), then `mover plan check` again"))


def subscribers_in_step(s: Subject) -> None:
    """Publications whose subscribers the migration would break (mover/catalog/subscribers.py)."""
    assert s.src.schema is not None
    for problem in subscribers.plan_refusals(s.cur, s.src.schema, s.table.oid, s.plan.new_layout is not None):
        s.report(problem)
