"""Publications, and the subscribers behind them (docs/operating.md "Publications and subscribers").

A subscriber applies each change under the publisher's schema-qualified table name; a name it
lacks stops its apply worker, in a loop, and its slot retains WAL on the source. A FOR TABLE
publication names its tables: the swap moves the membership to the table taking the name
(mover/engines/swap/metadata.py swap_sql), so its subscribers only ever see that name. The other kinds publish
tables by where they are, and mover's own tables would reach the subscribers:
- FOR ALL TABLES publishes every permanent table: mover's control tables and change logs (which
  cannot be unlogged without losing crash safety);
- FOR TABLES IN SCHEMA s, s the source's schema: the target, created there under its own name and
  filled by the backfill, and the old table after the swap, written by the reverse replay under
  its own name; s the control schema: mover's tables;
- FOR TABLE of a table converted to a partitioned one, without publish_via_partition_root: the
  partitions' changes, published under the partitions' names.
Each is refused (by `mover init` for what it creates, by `plan check` for the plan), with the
statements that make it safe while leaving every subscriber's tables as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from mover import names
from mover.db import Database
from mover.errors import PlanError, combined
from mover.names import CONTROL_SCHEMA


def _pub(name: str) -> str:
    return names.display_ident(name)


def _table_list(tables: Sequence[tuple[str, str]]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(s, t) for s, t in tables)


def _in_transaction(cur: psycopg.Cursor, statements: Sequence[sql.Composable]) -> str:
    """One transaction, so that the walsenders see the publication change all at once."""
    return "BEGIN; " + " ".join(s.as_string(cur) + ";" for s in statements) + " COMMIT;"


def all_tables(cur: psycopg.Cursor) -> list[PlanError]:
    """FOR ALL TABLES publications: refused, with the FOR TABLE publication of the same name that
    publishes what it publishes now (the subscribers keep their tables), mover's tables left out."""
    cur.execute("SELECT p.pubname, pg_get_userbyid(p.pubowner), p.pubviaroot, concat_ws(', ',"
                " CASE WHEN p.pubinsert THEN 'insert' END, CASE WHEN p.pubupdate THEN 'update' END,"
                " CASE WHEN p.pubdelete THEN 'delete' END, CASE WHEN p.pubtruncate THEN 'truncate' END)"
                " FROM pg_publication p WHERE p.puballtables ORDER BY 1")
    out = []
    for pub, owner, via_root, publish in cur.fetchall():
        cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s"
                    " AND schemaname <> %s ORDER BY 1, 2", (pub, CONTROL_SCHEMA))
        tables = cur.fetchall()
        listed = sql.SQL(" FOR TABLE {}").format(_table_list(tables)) if tables else sql.SQL("")
        create = sql.SQL("CREATE PUBLICATION {p}{f} WITH (publish = {w}, publish_via_partition_root = {r})").format(
            p=sql.Identifier(pub), f=listed,
            w=sql.Literal(publish), r=sql.Literal(bool(via_root)))
        statements: list[sql.Composable] = [sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(pub)), create]
        cur.execute("SELECT current_user")
        row = cur.fetchone()
        if row is None or row[0] != owner:
            statements.append(sql.SQL("ALTER PUBLICATION {} OWNER TO {}").format(sql.Identifier(pub),
                                                                                 sql.Identifier(owner)))
        out.append(PlanError(
            f"publication {_pub(pub)} is FOR ALL TABLES: it would publish mover's control tables and change"
            f" logs, which its subscribers do not have (their apply stops on the first one, and their slots"
            f" retain WAL)",
            hint=f"make it a FOR TABLE publication of the tables it publishes now (its subscribers keep their"
                 f" tables; a table created later must then be added to it by name) - run on this database:"
                 f" {_in_transaction(cur, statements)}"))
    return out


def in_schemas(cur: psycopg.Cursor, schemas: Sequence[str]) -> list[PlanError]:
    """FOR TABLES IN SCHEMA publications of `schemas` (the source's, the control schema): refused,
    with the same publication listing by name the tables it publishes from that schema now."""
    cur.execute("SELECT p.pubname, n.nspname FROM pg_publication_namespace pn"
                " JOIN pg_publication p ON p.oid = pn.pnpubid JOIN pg_namespace n ON n.oid = pn.pnnspid"
                " WHERE n.nspname = ANY(%s) ORDER BY 1, 2", (list(schemas),))
    out = []
    for pub, schema in cur.fetchall():
        p = sql.Identifier(pub)
        statements: list[sql.Composable] = [
            sql.SQL("ALTER PUBLICATION {} DROP TABLES IN SCHEMA {}").format(p, sql.Identifier(schema))]
        if schema == CONTROL_SCHEMA:
            out.append(PlanError(
                f"publication {_pub(pub)} publishes TABLES IN SCHEMA {names.display_ident(schema)}, mover's"
                f" control schema: its subscribers would receive mover's control tables and change logs",
                hint=f"run on this database: {_in_transaction(cur, statements)}"))
            continue
        # What it publishes from the schema now, less what it names already (ADD would fail on it).
        cur.execute("SELECT t.schemaname, t.tablename FROM pg_publication_tables t WHERE t.pubname = %s"
                    " AND t.schemaname = %s AND NOT EXISTS (SELECT 1 FROM pg_publication_rel pr"
                    " JOIN pg_publication pp ON pp.oid = pr.prpubid WHERE pp.pubname = t.pubname"
                    " AND pr.prrelid = format('%%I.%%I', t.schemaname, t.tablename)::regclass) ORDER BY 1, 2",
                    (pub, schema))
        tables = cur.fetchall()
        if tables:
            statements.append(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(p, _table_list(tables)))
        out.append(PlanError(
            f"publication {_pub(pub)} publishes TABLES IN SCHEMA {names.display_ident(schema)}, where the"
            f" migration creates its target and keeps the old table after the swap, under names its"
            f" subscribers do not have (their apply would stop on the first change, and their slots retain WAL)",
            hint=f"until `mover retire`, publish the schema's tables by name (its subscribers keep their tables;"
                 f" see docs/operating.md \"Publications and subscribers\" for the way back) - run on this"
                 f" database: {_in_transaction(cur, statements)}"))
    return out


def partitions_by_name(cur: psycopg.Cursor, source_oid: int) -> list[PlanError]:
    """For a conversion to a partitioned table: the source's publications that would publish the
    partitions' changes under the partitions' names."""
    cur.execute("SELECT p.pubname FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid"
                " WHERE pr.prrelid = %s AND NOT p.pubviaroot ORDER BY 1", (source_oid,))
    return [PlanError(
        f"publication {_pub(pub)} publishes the table without publish_via_partition_root: once it is partitioned,"
        f" the changes would be published under the partitions' names, which its subscribers do not have",
        hint="its subscribers keep their tables (nothing changes while the table is unpartitioned) - run on this"
             " database: " + _in_transaction(cur, [sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root"
                                                           " = true)").format(sql.Identifier(pub))]))
        for (pub,) in cur.fetchall()]


def init_refusals(cur: psycopg.Cursor) -> list[PlanError]:
    """What `mover init` refuses before it creates anything."""
    return all_tables(cur) + in_schemas(cur, [CONTROL_SCHEMA])


def refuse_init(db: Database) -> None:
    """`mover init`'s refusal, before it creates anything: every publication that would publish
    mover's tables to subscribers that lack them, at once."""
    problems = db.transaction(init_refusals, label="publications")
    if problems:
        raise combined(problems, hint="then `mover init` again")


def plan_refusals(cur: psycopg.Cursor, source_schema: str, source_oid: int, partitioned: bool) -> list[PlanError]:
    """What `plan check` (and so registration) refuses for a plan on the source."""
    out = all_tables(cur) + in_schemas(cur, sorted({source_schema, CONTROL_SCHEMA}))
    if partitioned:
        out += partitions_by_name(cur, source_oid)
    return out
