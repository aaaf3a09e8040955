"""Foreign keys: the swap re-points none yet. Inbound ones are refused; the source's own
(outbound) ones must each be acknowledged in the plan, so that nothing is dropped silently."""

from __future__ import annotations

import json

from mover import introspect, names
from mover.checks import Subject
from mover.errors import PlanError


def inbound(s: Subject) -> None:
    fks = introspect.inbound_foreign_keys(s.cur, s.table.oid)
    if fks:
        raise PlanError(f"{s.src} is referenced by foreign keys ({'; '.join(fks)}); re-pointing them at cutover "
                        f"is not supported yet", hint="drop them before the migration and recreate them after")


def outbound(s: Subject) -> None:
    plan, source = s.plan, s.src
    fks = dict(introspect.outbound_foreign_keys(s.cur, s.table.oid))
    unknown = [n for n in plan.drop_foreign_keys if n not in fks]
    if unknown:
        raise PlanError(f"[target] drop_foreign_keys: {', '.join(names.display_ident(n) for n in unknown)} "
                        f"{'is not a foreign key' if len(unknown) == 1 else 'are not foreign keys'} of {source}",
                        hint=f"its foreign keys are: {', '.join(names.display_ident(n) for n in fks) or 'none'}")
    missing = [n for n in fks if n not in plan.drop_foreign_keys]
    if missing:
        listed = "; ".join(f"{names.display_ident(n)} {fks[n]}" for n in missing)
        keys = ", ".join(json.dumps(n) for n in sorted(plan.drop_foreign_keys + tuple(missing)))  # TOML strings
        raise PlanError(f"{source} has foreign keys that the new table would not have after the swap ({listed}); "
                        f"mover does not carry them over yet, and afterwards rows that break them would be accepted",
                        hint=f"to go ahead without them, acknowledge each one in the plan: [target] drop_foreign_keys"
                             f" = [{keys}] (and recreate them after the migration); or drop them first")
