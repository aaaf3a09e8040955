"""An edit of a registered plan, checked the way registration checks the same settings (the
foreign keys it names, the partition manager), on the tables as they are now."""

from __future__ import annotations

import psycopg

from mover.checks import foreign_keys
from mover.engines.partitioning import partitions
from mover.errors import PlanError, combined
from mover.plan import Edit, Plan, edits
from mover.state import control


def check(cur: psycopg.Cursor, existing: control.Migration, plan: Plan) -> list[Edit]:
    """An edit of a registered plan (same shape), checked against the catalog the way registration
    checks the same settings, every problem at once; returns the edits, each with when it takes
    effect (plan.TAKES_EFFECT). Nothing is stored when one is refused."""
    found = edits(existing.plan, plan)
    problems: list[PlanError] = []
    for e in found:
        if e.effect is None:
            problems.append(PlanError(
                f"{e.key} of migration {plan.name!r} changed, but it is read only when the plan is registered: "
                f"the edit would have no effect", hint=f"restore {e.key} in the plan file as it was registered"))
    if any(e.path == "drop_foreign_keys" for e in found):
        recorded = control.shapes(cur, existing.id)
        oids = [d["oid"] for d in (recorded["source"], recorded["target"]) if d is not None]
        try:
            foreign_keys.check_dropped(cur, plan.drop_foreign_keys, oids, existing.source)
            foreign_keys.check_not_in_family(cur, plan.drop_foreign_keys, control.family(cur, existing))
        except PlanError as exc:
            problems.append(exc)
    if any(e.path == "partitions.manager" for e in found) and plan.upkeep.manager == "pg_partman":
        try:
            partitions.check_partman(cur, existing.source)
        except PlanError as exc:
            problems.append(exc)
    if problems:
        raise combined(problems)
    return found
