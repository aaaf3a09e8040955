"""Catalog features of PostgreSQL 17 and 18 that mover refuses rather than change silently, each
with its reason and the way out. What the server version has is decided in
mover/catalog/server.py; docs/operating.md ("Server versions") lists every catalog change of 17 and
18 and what mover does with it (most are carried through the swap and the rollback like anything
else)."""

from __future__ import annotations

from psycopg import sql

from mover import names
from mover.catalog import server
from mover.checks import Subject
from mover.errors import PlanError


def temporal_keys(s: Subject) -> None:
    """PRIMARY KEY / UNIQUE (..., col WITHOUT OVERLAPS) and FOREIGN KEY (..., PERIOD col) (18).

    A temporal key is an exclusion constraint underneath (a GiST index, pg_index.indisexclusion,
    pg_constraint.conperiod) that is a PRIMARY KEY or UNIQUE constraint. Exclusion constraints
    (contype 'x') are built on the target after the copy and named back at the swap
    (engines/backfill.py); temporal keys are what builds on that next: the same build, as the key
    or unique constraint they are, their replay conflicts found by overlap rather than equality,
    and the PERIOD foreign keys that reference them validated after the swap like the others.
    Until then they are refused here. A PERIOD foreign key of the source references such a key
    and goes with it (another table's PERIOD key referencing the source references one of the
    source's temporal keys, refused as such)."""
    srv = server.of(s.cur)
    if not srv.temporal_constraints:
        return
    s.cur.execute(sql.SQL(
        "SELECT k.conname, k.contype, pg_get_constraintdef(k.oid), k.conrelid = %(oid)s FROM pg_constraint k"
        " WHERE {period} AND (k.conrelid = %(oid)s OR k.confrelid = %(oid)s) ORDER BY k.conname"
    ).format(period=srv.conperiod("k")), {"oid": s.table.oid})
    for name, contype, definition, own in s.cur.fetchall():
        con = names.display_ident(name)
        if contype in ("p", "u"):
            s.report(PlanError(
                f"{s.src} has the temporal key {con} ({definition}): WITHOUT OVERLAPS makes it an exclusion"
                f" constraint that is a key, which mover does not build on the new table yet",
                hint="move the table by other means, or drop the constraint for the migration and add it back"
                     " after the retire"))
        elif contype == "f" and own and name not in s.plan.drop_foreign_keys:
            s.report(PlanError(
                f"{s.src} has the temporal foreign key {con} ({definition}): PERIOD foreign keys are carried with"
                f" the temporal keys they reference, which mover cannot build yet",
                hint="drop the foreign key for the migration and add it back after the retire, or name it in"
                     " [target] drop_foreign_keys to leave it on the old table"))


def no_inherit_not_null(s: Subject) -> None:
    """NOT NULL ... NO INHERIT (18) on a table converted to a partitioned one: on a partitioned
    table it binds none of the partitions, where the rows are, so the new table would accept
    NULL where the source refuses it."""
    if s.plan.partition is None or not server.of(s.cur).catalogued_not_null:
        return
    s.cur.execute("SELECT k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k WHERE k.conrelid = %s"
                  " AND k.contype = 'n' AND k.connoinherit ORDER BY k.conname", (s.table.oid,))
    for name, definition in s.cur.fetchall():
        s.report(PlanError(
            f"[target.partition]: {s.src} has the NOT NULL constraint {names.display_ident(name)} ({definition}),"
            f" which a partitioned table does not pass to its partitions: the new table would take NULL there",
            hint=f"make it inherited first (ALTER TABLE {s.src} ALTER CONSTRAINT {names.display_ident(name)}"
                 f" INHERIT), then check the plan again"))
