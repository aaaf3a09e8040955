"""SQL of the query rehearsal (mover/engines/swap/query_rehearsal.py): what pg_stat_statements recorded
about a table, and the EXPLAIN of a recorded statement, by a generic plan (its $n parameters
stay parameters), never executed.

The recorded text reaches SQL only through trusted(..., "pg_stat_statements"), as one statement
(mover/sql/statement_text.py checks it, and PREPARE goes by the extended protocol, which refuses a
second one).
"""

from __future__ import annotations

from psycopg import sql

from mover.names import QualifiedName
from mover.sql import trusted


def recorded(view: QualifiedName) -> sql.Composed:
    """The statements of this database pg_stat_statements recorded whose text contains
    `%(needle)s` (in any case), one row per role and text: role, text, calls, total ms. The text
    test is a cheap first cut; the statement's tokens and then its plan decide."""
    return sql.SQL("""
        SELECT r.rolname, s.query, sum(s.calls)::bigint, sum(s.total_exec_time)::float8
        FROM {view} s LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) s.userid
        WHERE s.dbid OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
                                             WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
          AND pg_catalog.strpos(pg_catalog.lower(s.query), pg_catalog.lower(%(needle)s)) OPERATOR(pg_catalog.>) 0
        GROUP BY r.rolname, s.query""").format(view=view.ident)


def hidden(view: QualifiedName) -> sql.Composed:
    """How many statements of this database mover's role may not read (pg_read_all_stats)."""
    return sql.SQL("""
        SELECT count(*) FROM {view} s
        WHERE s.dbid OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
                                             WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
          AND s.query OPERATOR(pg_catalog.=) '<insufficient privilege>'""").format(view=view.ident)


def explain_generic(statement: str) -> sql.Composed:
    """PostgreSQL 16 on: the generic plan of a statement with $n parameters, as they are."""
    return sql.SQL("EXPLAIN (GENERIC_PLAN, FORMAT JSON, VERBOSE) {}").format(trusted(statement, "pg_stat_statements"))


def prepare(name: str, statement: str) -> sql.Composed:
    """Before 16: the statement prepared (not run), its parameters' types inferred as
    EXPLAIN (GENERIC_PLAN) infers them; with plan_cache_mode = force_generic_plan, EXPLAIN EXECUTE
    then shows the same generic plan, whatever values it is given."""
    return sql.SQL("PREPARE {} AS {}").format(sql.Identifier(name), trusted(statement, "pg_stat_statements"))


def explain_execute(name: str, parameters: int) -> sql.Composed:
    """EXPLAIN of the prepared statement, NULL for each parameter (a generic plan ignores them)."""
    args = sql.SQL("({})").format(sql.SQL(", ").join([sql.SQL("NULL")] * parameters)) if parameters else sql.SQL("")
    return sql.SQL("EXPLAIN (FORMAT JSON, VERBOSE) EXECUTE {}{}").format(sql.Identifier(name), args)


def deallocate(name: str) -> sql.Composed:
    return sql.SQL("DEALLOCATE {}").format(sql.Identifier(name))


def temp_view(name: str, table: QualifiedName) -> sql.Composed:
    """A temporary view named `name` over `table`, whole rows: simple, so the planner flattens it
    into the statement (a SELECT plans as on the table) and a write through it is rewritten into
    a write of the table (it is automatically updatable)."""
    return sql.SQL("CREATE TEMPORARY VIEW {} AS SELECT * FROM {}").format(sql.Identifier(name), table.ident)


def grant_view(name: str, role: str) -> sql.Composed:
    return sql.SQL("GRANT ALL ON {} TO {}").format(sql.Identifier("pg_temp", name), sql.Identifier(role))
