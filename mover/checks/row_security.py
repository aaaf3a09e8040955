"""Row-level security: a policy that applies to mover's role would show it a share of the table.

mover's sessions run with row_security = off (mover/db.py PINNED), so PostgreSQL raises on such a
read instead of filtering it (invariant 1: a backfill or a reconcile that saw a tenant's rows only
would call the copy complete). `plan check` refuses before anything is created; a policy made
later stops the step that meets it (db.RowSecurityApplies)."""

from __future__ import annotations

import psycopg

from mover.checks.subject import Subject
from mover.db import one, row_security_hint
from mover.errors import PlanError
from mover.names import QualifiedName


def reason(cur: psycopg.Cursor, table: QualifiedName) -> str | None:
    """Why row-level security policies apply to the current role on `table`, or None when they do not:
    RLS is enabled, the role is neither superuser nor BYPASSRLS, and it does not own the table
    (through membership too) or the owner is subject to it (FORCE ROW LEVEL SECURITY)."""
    cur.execute(
        "SELECT c.relrowsecurity, c.relforcerowsecurity, r.rolsuper OR r.rolbypassrls,"
        " pg_has_role(current_user, c.relowner, 'USAGE'), pg_get_userbyid(c.relowner),"
        " (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid)"
        " FROM pg_class c, pg_roles r WHERE c.oid = %s::regclass AND r.rolname = current_user",
        (table.ident.as_string(cur),))
    enabled, forced, bypass, owner, owner_name, policies = one(cur)
    if not enabled or bypass or (owner and not forced):
        return None
    what = f"{policies} polic{'y' if policies == 1 else 'ies'}" if policies else "no policy (so every row is denied)"
    if owner:
        return (f"it has ROW LEVEL SECURITY enabled and FORCEd with {what}, which applies to its owner "
                f"{owner_name} too")
    return (f"it has ROW LEVEL SECURITY enabled with {what}, and mover's role does not own it "
            f"(its owner is {owner_name})")


def policies(s: Subject) -> None:
    why = reason(s.cur, s.src)
    if why is not None:
        s.cur.execute("SELECT current_user")
        role = one(s.cur)[0]
        s.report(PlanError(f"[migration] source: row-level security would hide rows of {s.src} from mover's role "
                           f"{role}: {why}; mover copies and compares every row or none, never a filtered share",
                           hint=row_security_hint(s.cur, role)))
