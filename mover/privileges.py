"""Privileges as facts from the catalog, checked before they are relied on.

The capture trigger runs as whichever role writes the table (it is not SECURITY DEFINER, see
sql/capture.py): every such role must be able to insert into the change log. mover grants that
to PUBLIC, but a GRANT by a role that does not own the object is a silent no-op (PostgreSQL
only logs a WARNING), so the grants are verified with has_*_privilege, never assumed; a missing
one refuses the step before any application write could fail on it (invariant 3).

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
    what: str  # "USAGE on schema ...", ...
    grant: str  # the statement that fixes it


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


def capture_path_missing(cur: psycopg.Cursor, table: names.QualifiedName,
                         log: names.QualifiedName) -> list[Missing]:
    """What PUBLIC or a writer of `table` lacks to run the capture trigger, which inserts into `log`
    (a table with an identity column: its sequence needs no privilege of its own, unlike serial's)."""
    schema = _ident(cur, log.schema)
    log_sql = log.ident.as_string(cur)
    missing: list[Missing] = []
    for role in ["public", *writers(cur, table)]:
        shown = "PUBLIC" if role == "public" else _ident(cur, role)
        cur.execute("SELECT has_schema_privilege(%s, %s, 'USAGE'), has_table_privilege(%s, %s::regclass, 'INSERT')",
                    (role, log.schema, role, log_sql))
        usage, insert = one(cur)
        if not usage:
            missing.append(Missing(shown, f"USAGE on schema {schema}", f"GRANT USAGE ON SCHEMA {schema} TO {shown}"))
        if not insert:
            missing.append(Missing(shown, f"INSERT on {log_sql}", f"GRANT INSERT ON {log_sql} TO {shown}"))
    return missing


def require_capture_path(cur: psycopg.Cursor, table: names.QualifiedName, log: names.QualifiedName,
                         migration: str) -> None:
    """Refuse (exit 2, in the caller's transaction, so nothing is installed) unless PUBLIC and
    every writer of `table` can run the capture trigger."""
    missing = capture_path_missing(cur, table, log)
    if missing:
        raise PlanError(capture_message(table, missing), hint=capture_hint(cur, missing, migration))


def capture_message(table: names.QualifiedName, missing: list[Missing]) -> str:
    lacks = "; ".join(f"{m.role} lacks {m.what}" for m in missing)
    return (f"the capture trigger on {table} would fail the application's writes: it runs as the writing role, "
            f"and {lacks}")


def capture_hint(cur: psycopg.Cursor, missing: list[Missing], migration: str) -> str:
    # PUBLIC's privileges reach every role: when PUBLIC lacks one, granting it there is the whole fix.
    grants = list(dict.fromkeys(m.grant for m in missing if m.role == "PUBLIC")) or \
        list(dict.fromkeys(m.grant for m in missing))
    who = "the owner of schema " + _ident(cur, names.CONTROL_SCHEMA) + " (or a superuser)"
    return f"as {who} run: {'; '.join(grants)}; then the same `mover ... {migration}` command again"


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
