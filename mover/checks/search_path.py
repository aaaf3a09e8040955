"""Schemas on the search path of the table's owner or of its writers that other roles can write.

mover's own sessions are not exposed (they run with search_path pg_catalog, pg_temp, mover/db.py
PINNED), but the application's are: a function or operator planted there (CVE-2018-1058) runs with
the rights of whoever resolves a name through it, the owner included. Said by `plan check` as a
warning: it is the database's exposure, not the migration's, and mover cannot fix it."""

from __future__ import annotations

import re

import psycopg

from mover.catalog import privileges
from mover.checks.subject import Subject
from mover.db import one
from mover.errors import PlanError
from mover.names import QualifiedName

_ELEMENT = re.compile(r'\s*(?:"((?:[^"]|"")*)"|([^,\s]+))\s*(?:,|$)')


def split(path: str) -> list[str]:
    """The schema names of a search_path value ("$user" kept as it is)."""
    out = []
    for quoted, bare in _ELEMENT.findall(path):
        out.append(quoted.replace('""', '"') if quoted else bare)
    return [s for s in out if s]


def create_grantees(cur: psycopg.Cursor, schema: str) -> str:
    """Who other than its owner may create in `schema` (PUBLIC, roles), as text; empty if no one."""
    cur.execute(
        "SELECT coalesce(string_agg(DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'"
        " ELSE quote_ident(pg_get_userbyid(a.grantee)) END, ', '), '')"
        " FROM pg_namespace n, aclexplode(n.nspacl) a"
        " WHERE n.nspname = %s AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner", (schema,))
    return str(one(cur)[0])


def key_operator_schemas(cur: psycopg.Cursor, table: QualifiedName, key: list[str]) -> list[str]:
    """The schemas other than pg_catalog that hold the operators of the key columns' types'
    default btree operator classes (citext's, in the schema its extension went to): a key must
    compare with its own equality and ordering, not fall back to text's through an implicit cast."""
    cur.execute(
        "SELECT DISTINCT n.nspname FROM pg_attribute a"
        " JOIN pg_type t ON t.oid = a.atttypid"
        " JOIN pg_opclass c ON c.opcmethod = (SELECT oid FROM pg_am WHERE amname = 'btree') AND c.opcdefault"
        "  AND c.opcintype = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END"
        " JOIN pg_amop ao ON ao.amopfamily = c.opcfamily"
        " JOIN pg_operator o ON o.oid = ao.amopopr"
        " JOIN pg_namespace n ON n.oid = o.oprnamespace"
        " WHERE a.attrelid = %s::regclass AND a.attname = ANY(%s) AND n.nspname <> 'pg_catalog'"
        " ORDER BY 1", (table.ident.as_string(cur), key))
    return [r[0] for r in cur.fetchall()]


def key_operators(s: Subject) -> None:
    """The key's operator schemas go on the migration's search_path (db.search_path), which no
    other role may then be able to write."""
    s.operator_schemas = key_operator_schemas(s.cur, s.src, list(s.table.key))
    for schema in s.operator_schemas:
        grantees = create_grantees(s.cur, schema)
        if grantees:
            shown = '"' + schema.replace('"', '""') + '"'
            s.report(PlanError(
                f"[migration] source: the key of {s.src} compares with operators in schema {shown}, which grants "
                f"CREATE to {grantees}: mover's sessions would have to search it, and anyone who can create there "
                f"could shadow them (CVE-2018-1058)",
                hint=f"`REVOKE CREATE ON SCHEMA {shown} FROM PUBLIC` (and from those roles), or move the extension "
                     f"to a schema of its own (`ALTER EXTENSION ... SET SCHEMA ...`); then `mover plan check` again"))


def role_path(s: Subject, role: str) -> str:
    """The search_path a new session of `role` starts with: its per-database or per-role setting,
    the database's, else the server's."""
    s.cur.execute(
        "SELECT c FROM (SELECT unnest(d.setconfig) c, CASE WHEN d.setrole <> 0 AND d.setdatabase <> 0 THEN 1"
        "  WHEN d.setrole <> 0 THEN 2 ELSE 3 END AS rank FROM pg_db_role_setting d"
        "  LEFT JOIN pg_roles r ON r.oid = d.setrole"
        "  WHERE (d.setrole = 0 OR r.rolname = %s)"
        "  AND (d.setdatabase = 0 OR d.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database()))"
        " ) s WHERE c LIKE 'search\\_path=%%' ORDER BY rank LIMIT 1", (role,))
    row = s.cur.fetchone()
    if row:
        return str(row[0]).split("=", 1)[1]
    s.cur.execute("SELECT CASE WHEN source IN ('default', 'configuration file', 'command line',"
                  " 'environment variable') THEN reset_val ELSE boot_val END"
                  " FROM pg_settings WHERE name = 'search_path'")
    return str(one(s.cur)[0])


def writable_by_others(s: Subject) -> None:
    s.cur.execute("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = %s::regclass",
                  (s.src.ident.as_string(s.cur),))
    owner = one(s.cur)[0]
    roles = [owner, *(r for r in privileges.writers(s.cur, s.src) if r != owner)]
    seen: dict[str, list[str]] = {}
    for role in roles:
        for schema in split(role_path(s, role)):
            name = role if schema == "$user" else schema
            if name in ("pg_catalog", "pg_temp") or name.startswith("pg_temp_"):
                continue
            seen.setdefault(name, []).append(role)
    for schema, whose in seen.items():
        grantees = create_grantees(s.cur, schema)
        if grantees:
            shown = '"' + schema.replace('"', '""') + '"'
            s.warnings.append(
                f"schema {shown}, on the search path of {', '.join(whose)}, grants CREATE to {grantees}: a "
                f"function or operator created there can run with the rights of whoever resolves a name through "
                f"it (CVE-2018-1058). mover's own sessions run with search_path pg_catalog, pg_temp and are not "
                f"exposed; the application's are. `REVOKE CREATE ON SCHEMA {shown} FROM PUBLIC` (and from "
                f"those roles), as PostgreSQL 15 does by default")
