"""SQL builders, one module per concern, and `trusted`: the one door for SQL text that is not a literal."""

from __future__ import annotations

from psycopg import sql

# Where text spliced into SQL may come from. Each is text PostgreSQL itself rendered from its catalog
# (it quotes identifiers and literals as it prints them), the operator's plan checked by the server
# before any step runs, or a word mover picked from a closed set: never a value from the table's rows.
# One exception, which never runs: the query rehearsal's statements, recorded by pg_stat_statements
# from whatever any role ran, are only EXPLAINed (planned, not executed), one statement at a time,
# as the role that ran them.
SOURCES = {
    "format_type": "a type name printed by the catalog (format_type, regtype::text)",
    "pg_get_indexdef": "an index definition or key expression printed by pg_get_indexdef()",
    "pg_get_constraintdef": "a constraint definition printed by pg_get_constraintdef()",
    "pg_get_triggerdef": "a trigger's CREATE TRIGGER statement printed by pg_get_triggerdef()",
    "pg_get_ruledef": "a rule's CREATE RULE statement printed by pg_get_ruledef()",
    "pg_get_viewdef": "a view's query printed by pg_get_viewdef()",
    "pg_get_expr": "a column default, a publication's row filter, a policy's expression or a partition bound"
                   " printed by pg_get_expr()",
    "pg_get_partkeydef": "a partitioned table's PARTITION BY clause printed by pg_get_partkeydef()",
    "pg_get_statisticsobjdef": "the columns and expressions of extended statistics printed by"
                               " pg_get_statisticsobjdef_columns()",
    "pg_collation": "a collation name as the catalog quotes it",
    "pg_operator": "an operator's name from pg_operator.oprname (symbol characters only, checked)",
    "reloptions": "a storage option as pg_class.reloptions holds it (name=value)",
    "plan type": "a type from the plan's [target] columns, resolved by the server (to_regtype) in plan check",
    "keyword": "an SQL keyword the caller chose from a closed set",
    "plan hook": "the operator's own statement from the plan's [hooks] (sql = ...), run as written",
    "composed": "a statement mover composed with psycopg.sql and rendered once (as_string), kept to run again",
    "fleet discover": "the operator's query from a fleet file's [discover] query, run as written on the catalog"
                      " database it names (mover/fleet/members.py)",
    "pg_stat_statements": "an application's statement as pg_stat_statements recorded it (constants are $n"
                          " parameters), read as one statement (mover/sql/statement_text.py), only ever"
                          " EXPLAINed, as the role that ran it (mover/engines/swap/query_rehearsal.py)",
}


def trusted(text: str, source: str) -> sql.SQL:
    """`text` as raw SQL, for the positions PostgreSQL takes no bind parameter in (a type, an index or
    constraint definition, a keyword) and where the text is not one identifier for sql.Identifier.

    Safe because of where the text comes from, which `source` names (a key of SOURCES): the catalog's
    own rendering, a plan value the server resolved, or a keyword from a fixed list. A unit test
    (tests/unit/test_trusted_sql.py) fails if any other code calls sql.SQL with anything but a string
    literal, so every such splice is here and says where its text came from."""
    if source not in SOURCES:
        raise ValueError(f"unknown source of trusted SQL text {source!r}; known: {', '.join(SOURCES)}")
    return sql.SQL(text)


__all__ = ["SOURCES", "trusted"]
