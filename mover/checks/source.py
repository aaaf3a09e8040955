"""The source table: it exists, it is a user's permanent table (ordinary or partitioned), and it
has a key."""

from __future__ import annotations

from mover import names
from mover.catalog import introspect
from mover.checks.subject import Subject
from mover.db import one
from mover.errors import PlanError


def exists(s: Subject) -> None:
    s.source = introspect.resolve(s.cur, s.plan.source)
    if s.source is None:
        raise PlanError(f"[migration] source: table {s.plan.source} does not exist",
                        hint="check the name; unquoted names fold to lower case, quote mixed-case names")


def is_user_table(s: Subject) -> None:
    source = s.src
    assert source.schema is not None  # resolve() names the schema
    if source.schema == names.CONTROL_SCHEMA:
        raise PlanError(f"[migration] source: {source} belongs to mover itself",
                        hint="name an application table in [migration] source")
    if introspect.persistence(s.cur, source) == "t":
        raise PlanError(f"[migration] source: {source} is a temporary table; mover cannot move it, because it "
                        f"exists only in the session that created it (mover works from sessions of its own)",
                        hint="move a permanent table: copy the rows into one (CREATE TABLE ... AS) if you need to")
    if source.schema in ("pg_catalog", "information_schema") or source.schema.startswith("pg_"):
        raise PlanError(f"[migration] source: {source} is a system table", hint="mover moves user tables")


KINDS = {"v": "a view", "m": "a materialized view", "f": "a foreign table",
         "S": "a sequence", "i": "an index", "I": "an index", "c": "a composite type"}


def is_ordinary(s: Subject) -> None:
    # The kind before the description: describe() would report a view's missing key, or choke on
    # a partitioned table's index definitions, before saying what is really wrong.
    source = s.src
    s.cur.execute("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                  " WHERE n.nspname = %s AND c.relname = %s", (source.schema, source.name))
    relkind = one(s.cur)[0]
    if relkind not in ("r", "p"):
        raise PlanError(f"[migration] source: {source} is {KINDS.get(relkind, 'not an ordinary table')}",
                        hint="mover moves tables (ordinary or partitioned)")


def describe(s: Subject) -> None:
    try:
        s.info = introspect.describe(s.cur, s.src)
    except PlanError as exc:  # no usable key, an index form mover cannot read
        raise PlanError(f"[migration] source: {exc.message}", hint=exc.hint) from None


def heap(s: Subject) -> None:
    """The target is created with the server's default table access method (CREATE TABLE ... (LIKE)
    copies none); a source stored by another one would change under the application's feet. (From
    PostgreSQL 17 on a partitioned table has an access method too: the target's partitions take
    the default as well.)"""
    s.cur.execute("SELECT a.amname, current_setting('default_table_access_method') FROM pg_class c"
                  " JOIN pg_am a ON a.oid = c.relam WHERE c.oid = %s", (s.table.oid,))
    row = s.cur.fetchone()
    if row is not None and row[0] != row[1]:
        raise PlanError(f"[migration] source: {s.src} is stored by the table access method {row[0]!r}; mover creates"
                        f" the new table with the default one ({row[1]!r}) and would change it",
                        hint=f"move it by other means, or ALTER TABLE {s.src} SET ACCESS METHOD {row[1]} first")
