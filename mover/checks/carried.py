"""The swap moves the table's dependents (mover/engines/swap/carry.py): mover's role must be able to drop and
re-create each one, so it must own (or be a member of the owner of) every table whose foreign
key references the source and every view that reads it. Found here, not as a permission error
inside the swap's lock."""

from __future__ import annotations

from mover.checks.subject import Subject
from mover.errors import PlanError


def owned(s: Subject) -> None:
    s.cur.execute("""
        WITH RECURSIVE dep(oid) AS (
            SELECT r.ev_class FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
            WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
              AND d.refobjid = %(oid)s AND r.ev_class <> %(oid)s
            UNION
            SELECT r.ev_class FROM dep JOIN pg_depend d ON d.refobjid = dep.oid
              AND d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
            JOIN pg_rewrite r ON r.oid = d.objid AND r.ev_class <> dep.oid
        )
        SELECT DISTINCT c.oid::regclass::text, pg_get_userbyid(c.relowner),
               CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' ELSE 'table' END
        FROM pg_class c
        WHERE (c.oid IN (SELECT oid FROM dep)
               OR c.oid IN (SELECT conrelid FROM pg_constraint WHERE contype = 'f' AND confrelid = %(oid)s))
          AND c.oid <> %(oid)s AND NOT pg_has_role(current_user, c.relowner, 'USAGE')
        ORDER BY 1""", {"oid": s.table.oid})
    missing = s.cur.fetchall()
    if missing:
        listed = "; ".join(f"{kind} {name} (owner {owner})" for name, owner, kind in missing)
        raise PlanError(f"the swap moves what depends on {s.src} to the new table, but mover's role does not own: "
                        f"{listed}",
                        hint="run mover as a role that is a member of each owner (GRANT owner TO mover_role), "
                             "then `mover plan check PLAN` again")
