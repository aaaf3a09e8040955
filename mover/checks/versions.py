"""Catalog features of PostgreSQL 17 and 18 that mover refuses rather than change silently, each
with its reason and the way out. What the server version has is decided in
mover/catalog/server.py; docs/operating.md ("Server versions") lists every catalog change of 17 and
18 and what mover does with it (most are carried through the swap and the rollback like anything
else)."""

from __future__ import annotations

from mover import names
from mover.catalog import reading, server
from mover.checks.subject import Subject
from mover.errors import PlanError


def no_inherit_not_null(s: Subject) -> None:
    """NOT NULL ... NO INHERIT (18) on a table converted to a partitioned one: on a partitioned
    table it binds none of the partitions, where the rows are, so the new table would accept
    NULL where the source refuses it."""
    if s.plan.new_layout is None or not server.of(s.cur).catalogued_not_null:
        return
    for name, definition in reading.read(
            s.cur, "SELECT k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k WHERE k.conrelid = %s"
                   " AND k.contype = 'n' AND k.connoinherit ORDER BY k.conname", (s.table.oid,),
            missing=reading.printed(1, name=lambda r: f"constraint {names.display_ident(r[0])} of {s.src}")):
        s.report(PlanError(
            f"[target.partition]: {s.src} has the NOT NULL constraint {names.display_ident(name)} ({definition}),"
            f" which a partitioned table does not pass to its partitions: the new table would take NULL there",
            hint=f"make it inherited first (ALTER TABLE {s.src} ALTER CONSTRAINT {names.display_ident(name)}"
                 f" INHERIT), then check the plan again"))
