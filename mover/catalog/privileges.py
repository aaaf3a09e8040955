"""Privileges as facts from the catalog, checked before they are relied on.

The capture trigger's function is SECURITY DEFINER, owned by mover's role (see sql/capture.py):
the roles that write the table need nothing on the change log, and no other role may hold any
right on it but SELECT -- a role that could insert, delete, truncate or put a trigger on the log
could make the trigger's insert fail (invariant 3) or lose logged keys. Default privileges of
schema mover can grant rights on a new log behind mover's back, so the log's ACL is read from
the catalog in the transaction that installs it; a grant there refuses the step before any
application write runs the trigger.

The migrating role's own needs (docs/operating.md, "Privileges") are checked the same way by `plan check`.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from mover import names
from mover.db import one
from mover.errors import PlanError


@dataclass(frozen=True)
class Missing:
    role: str  # as SQL would quote it; PUBLIC for the pseudo-role
    what: str  # "lacks USAGE on schema ...", "holds INSERT on ...", ...
    grant: str  # the statement that fixes it (a GRANT or a REVOKE)


def _ident(cur: psycopg.Cursor, name: str | None) -> str:
    assert name is not None, "names are resolved (schema-qualified) before privileges are checked"
    return sql.Identifier(name).as_string(cur)


def writers(cur: psycopg.Cursor, table: names.QualifiedName) -> list[str]:
    """Every role that can insert, update or delete rows of `table` itself (directly, through an
    inherited role, or as a member of pg_write_all_data), superusers aside: they pass any check."""
    cur.execute(
        "SELECT r.rolname FROM pg_roles r"
        " WHERE NOT r.rolsuper AND r.rolname <> 'pg_write_all_data'"
        " AND (has_any_column_privilege(r.oid, %(t)s::regclass, 'INSERT, UPDATE')"
        "      OR has_table_privilege(r.oid, %(t)s::regclass, 'DELETE'))"
        " ORDER BY r.rolname",
        {"t": table.ident.as_string(cur)})
    return [r[0] for r in cur.fetchall()]


def capture_path_missing(cur: psycopg.Cursor, function: names.QualifiedName,
                         log: names.QualifiedName) -> list[Missing]:
    """What stands between the capture trigger (`function`, inserting into `log`) and a write that
    cannot fail on another role's doing: the function must be SECURITY DEFINER, its owner able to
    insert into the log (a table with an identity column: its sequence needs no privilege of its
    own), and no role but the log's owner may hold a right on the log other than SELECT."""
    schema = _ident(cur, log.schema)
    log_sql = log.ident.as_string(cur)
    fn_sql = function.ident.as_string(cur) + "()"
    cur.execute("SELECT p.prosecdef, pg_get_userbyid(p.proowner), has_schema_privilege(p.proowner, %s, 'USAGE'),"
                " has_table_privilege(p.proowner, %s::regclass, 'INSERT')"
                " FROM pg_proc p WHERE p.oid = %s::regprocedure", (log.schema, log_sql, fn_sql))
    definer, owner, usage, insert = one(cur)
    shown = _ident(cur, owner)
    missing: list[Missing] = []
    if not definer:
        missing.append(Missing(shown, f"owns {fn_sql}, which is not SECURITY DEFINER",
                               f"ALTER FUNCTION {fn_sql} SECURITY DEFINER"))
    if not usage:
        missing.append(Missing(shown, f"lacks USAGE on schema {schema}", f"GRANT USAGE ON SCHEMA {schema} TO {shown}"))
    if not insert:
        missing.append(Missing(shown, f"lacks INSERT on {log_sql}", f"GRANT INSERT ON {log_sql} TO {shown}"))
    # aclexplode: grantee 0 is PUBLIC. The owner's own entries and those of superusers aside.
    cur.execute("SELECT CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END,"
                " string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)"
                " FROM pg_class c, aclexplode(c.relacl) a"
                " WHERE c.oid = %s::regclass AND a.grantee <> c.relowner AND a.privilege_type <> 'SELECT'"
                " AND NOT coalesce((SELECT rolsuper FROM pg_roles WHERE oid = a.grantee), false)"
                " GROUP BY a.grantee ORDER BY 1 NULLS FIRST", (log_sql,))
    for grantee, privs in cur.fetchall():
        who = "PUBLIC" if grantee is None else _ident(cur, grantee)
        missing.append(Missing(who, f"holds {privs} on {log_sql} (a role but its owner could fail or empty the log)",
                               f"REVOKE ALL ON {log_sql} FROM {who}"))
    return missing


def require_capture_path(cur: psycopg.Cursor, function: names.QualifiedName, log: names.QualifiedName,
                         migration: str) -> None:
    """Refuse (exit 2, in the caller's transaction, so nothing is installed) unless the capture
    trigger's insert depends on nothing another role can change."""
    missing = capture_path_missing(cur, function, log)
    if missing:
        raise PlanError(capture_message(log, missing), hint=capture_hint(cur, missing, migration))


def capture_message(log: names.QualifiedName, missing: list[Missing]) -> str:
    lacks = "; ".join(f"{m.role} {m.what}" for m in missing)
    return f"the capture trigger's change log {log} is not safe for the application's writes: {lacks}"


def capture_hint(cur: psycopg.Cursor, missing: list[Missing], migration: str) -> str:
    grants = list(dict.fromkeys(m.grant for m in missing))
    who = "the owner of schema " + _ident(cur, names.CONTROL_SCHEMA) + " (or a superuser)"
    return (f"as {who} run: {'; '.join(grants)} (and drop any default privileges of that schema that grant them);"
            f" then the same `mover ... {migration}` command again")


def setup_missing(cur: psycopg.Cursor, source: names.QualifiedName, target: names.QualifiedName) -> list[Missing]:
    """What the migrating role (current_user) lacks for the steps ahead: ownership of the source
    (CREATE TRIGGER ... ENABLE ALWAYS and the swap's renames are ALTER TABLE), CREATE on the
    target's schema (PostgreSQL 15 no longer grants it on public to everyone), USAGE and CREATE
    on mover's schema (change logs live there) and DML on its control tables."""
    cur.execute("SELECT current_user")
    me = _ident(cur, one(cur)[0])
    ctl = _ident(cur, names.CONTROL_SCHEMA)
    out: list[Missing] = []
    cur.execute("SELECT pg_has_role(current_user, c.relowner, 'USAGE'), pg_get_userbyid(c.relowner)"
                " FROM pg_class c WHERE c.oid = %s::regclass", (source.ident.as_string(cur),))
    owns, owner = one(cur)
    if not owns:
        out.append(Missing(me, f"ownership of {source} (owned by {_ident(cur, owner)})",
                           f"GRANT {_ident(cur, owner)} TO {me}"))
    tschema = _ident(cur, target.schema)
    cur.execute("SELECT has_schema_privilege(current_user, %s, 'CREATE')", (target.schema,))
    if not one(cur)[0]:
        out.append(Missing(me, f"CREATE on schema {tschema} (for the target {target})",
                           f"GRANT CREATE ON SCHEMA {tschema} TO {me}"))
    cur.execute("SELECT has_schema_privilege(current_user, %s, 'USAGE'), has_schema_privilege(current_user, %s,"
                " 'CREATE')", (names.CONTROL_SCHEMA, names.CONTROL_SCHEMA))
    usage, create = one(cur)
    if not (usage and create):
        out.append(Missing(me, f"USAGE and CREATE on schema {ctl} (change logs live there)",
                           f"GRANT USAGE, CREATE ON SCHEMA {ctl} TO {me}"))
    if usage:
        # The control tables, not the per-migration logs (m<id>_...), which their creator owns.
        # (has_table_privilege with a list is true if any one is held: ask for each.)
        cur.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname !~ '^m[0-9]+_'"
                    " AND c.relname <> 'alembic_version'"
                    " AND NOT (has_table_privilege(current_user, c.oid, 'SELECT')"
                    "  AND has_table_privilege(current_user, c.oid, 'INSERT')"
                    "  AND has_table_privilege(current_user, c.oid, 'UPDATE')"
                    "  AND has_table_privilege(current_user, c.oid, 'DELETE'))"
                    " ORDER BY 1", (names.CONTROL_SCHEMA,))
        tables = [r[0] for r in cur.fetchall()]
        if tables:
            out.append(Missing(me, f"SELECT, INSERT, UPDATE, DELETE on {ctl}'s tables ({', '.join(tables)})",
                               f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {ctl} TO {me}"))
    return out


def require_setup(cur: psycopg.Cursor, source: names.QualifiedName, target: names.QualifiedName) -> None:
    missing = setup_missing(cur, source, target)
    if missing:
        raise PlanError(
            "the migrating role lacks privileges the migration needs: "
            + "; ".join(f"{m.role} lacks {m.what}" for m in missing),
            hint="as a superuser (or the objects' owners) run: " + "; ".join(m.grant for m in missing)
            + "; docs/operating.md \"Privileges\" lists what each setup needs")
