"""Foreign keys: the swap carries them over (mover/engines/swap/carry.py). Inbound ones are re-pointed at the
new table; the source's own (outbound) ones move to it, except those the plan lists in
[target] drop_foreign_keys (left on the old table), which must be foreign keys of the source."""

from __future__ import annotations

import psycopg

from mover import names
from mover.catalog import family as family_catalog
from mover.catalog import introspect
from mover.checks.subject import Subject
from mover.errors import PlanError
from mover.state import control


def outbound(s: Subject) -> None:
    check_dropped(s.cur, s.plan.drop_foreign_keys, [s.table.oid], s.src)


def check_dropped(cur: psycopg.Cursor, dropped: tuple[str, ...], oids: list[int], source: names.QualifiedName) -> None:
    """Each name in [target] drop_foreign_keys is a foreign key of the source: its own, on the
    tables `oids` (at registration the source; for an edit of a registered plan also the new
    table, which carries them after a cutover)."""
    fks: dict[str, str] = {}
    for oid in oids:
        fks.update(introspect.outbound_foreign_keys(cur, oid))
    unknown = [n for n in dropped if n not in fks]
    if unknown:
        raise PlanError(f"[target] drop_foreign_keys: {', '.join(names.display_ident(n) for n in unknown)} "
                        f"{'is not a foreign key' if len(unknown) == 1 else 'are not foreign keys'} of {source}",
                        hint=f"its foreign keys are: "
                             f"{', '.join(names.display_ident(n) for n in sorted(fks)) or 'none'}")


def not_valid_to_partitioned(s: Subject) -> None:
    """PostgreSQL before 18 takes no NOT VALID foreign key on a partitioned table, and mover carries
    a foreign key to one by validating it (mover/engines/swap/carry.py): a NOT VALID one, whose old rows may
    break it, cannot be carried to a partitioned target."""
    if s.plan.new_layout is None:
        return
    s.cur.execute("SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid = %s AND NOT convalidated"
                  " ORDER BY conname", (s.table.oid,))
    broken = [r[0] for r in s.cur.fetchall() if r[0] not in s.plan.drop_foreign_keys]
    if broken:
        raise PlanError(f"[target.partition]: the foreign key {names.display_ident(broken[0])} of {s.src} is "
                        f"NOT VALID, and a partitioned table takes a foreign key only validated",
                        hint=f"validate it first (ALTER TABLE {s.src} VALIDATE CONSTRAINT "
                             f"{names.display_ident(broken[0])}), or list it in [target] drop_foreign_keys")


def check_not_in_family(cur: psycopg.Cursor, dropped: tuple[str, ...], family: list[control.Migration]) -> None:
    """A key between two tables of a family (issue 27) stays with them through the swap: it cannot
    be left on the old table alone ([target] drop_foreign_keys of the family's first table, edited
    after registration; registration refuses it for every table)."""
    if len(family) < 2 or not dropped:
        return
    oids = [introspect.table_oid(cur, m.source) for m in family]
    own = oids[0]
    between = {k.name for k in family_catalog.between(cur, [o for o in oids if o is not None]) if k.child == own}
    named = [n for n in dropped if n in between]
    if named:
        raise PlanError(f"[target] drop_foreign_keys: {names.display_ident(named[0])} references another table of "
                        f"this migration, and the keys between its tables move with them",
                        hint="remove it from drop_foreign_keys")
