"""What is bound to a table's identity (its oid, or its row type) rather than to its name, and so
would stay on the old table at the swap (invariant 15, docs/design.md; docs/operating.md "Objects
bound to the table's identity").

The swap renames the tables: whatever reaches the table by name (PL/pgSQL bodies, the application's
statements, publications' subscribers) meets the new table; whatever PostgreSQL bound to the oid
stays with the old one. mover/engines/swap/carry.py and metadata.py move some of those across: the
table's own objects (indexes, constraints, triggers, rules, policies, statistics, publication
memberships, owned sequences, the row security), the views and materialized views that read it
(recursively) and the foreign keys that reference it. Everything else found here is refused, named,
with the statement that fixes it. The search is generic: every `pg_depend` row that points at the
table, at a column of it, at a view the swap re-creates, or at the row type of any of them (and the
arrays and domains over those types), plus what `pg_depend` does not hold: inheritance both ways
(`pg_inherits`) and the subscriptions that apply into the table (`pg_subscription_rel`). A kind of
object this module does not know is refused by its catalog description, never passed over.

`bound` is what the swap would leave behind (plan check, the gate, the swap's preflight and, when
the catalog digest changed, its lock: carry.SWAP_INPUTS covers every row read here). `blocking` is
what `DROP TABLE` of a table would refuse over (retire and abort, before they drop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from mover import names
from mover.errors import Waiting

# The views and materialized views that read the table, recursively (the swap re-creates them:
# carry._views); then the row types of the table and of those views, and every array or domain
# over them, recursively; then each object with an ordinary or automatic dependency on any of them,
# with the relation it belongs to. What belongs to the table (indexes, constraints, triggers, rules,
# policies, statistics, owned sequences, partitions) is its own: dropped with it, and carried by the
# swap; internal dependencies ('i': the row type, its array, the toast table) are parts of it.
DEPENDENTS = """
WITH RECURSIVE views(oid, depth) AS (
    SELECT %(oid)s::oid, 0
    UNION
    SELECT r.ev_class, v.depth + 1 FROM views v
    JOIN pg_depend d ON d.refobjid = v.oid AND d.classid = 'pg_rewrite'::regclass
                    AND d.refclassid = 'pg_class'::regclass
    JOIN pg_rewrite r ON r.oid = d.objid AND r.ev_class <> v.oid AND r.rulename = '_RETURN'
    WHERE v.depth < 50 AND %(views)s
), rel AS (
    SELECT DISTINCT oid FROM views
), types(oid, depth) AS (
    SELECT c.reltype, 0 FROM pg_class c WHERE c.oid IN (SELECT oid FROM rel) AND c.reltype <> 0
    UNION
    SELECT d.objid, t.depth + 1 FROM types t
    JOIN pg_depend d ON d.refclassid = 'pg_type'::regclass AND d.refobjid = t.oid
                    AND d.classid = 'pg_type'::regclass
    WHERE t.depth < 20
), deps AS (
    SELECT d.classid, d.objid, d.objsubid,
       -- the relation the object belongs to, if it belongs to one: the swap carries what belongs to
       -- the table (or to a view it re-creates), and the foreign keys that reference it
       CASE d.classid
           WHEN 'pg_rewrite'::regclass THEN (SELECT r.ev_class FROM pg_rewrite r WHERE r.oid = d.objid)
           WHEN 'pg_constraint'::regclass THEN (SELECT k.conrelid FROM pg_constraint k WHERE k.oid = d.objid)
           WHEN 'pg_policy'::regclass THEN (SELECT p.polrelid FROM pg_policy p WHERE p.oid = d.objid)
           WHEN 'pg_trigger'::regclass THEN (SELECT g.tgrelid FROM pg_trigger g WHERE g.oid = d.objid)
           WHEN 'pg_statistic_ext'::regclass THEN (SELECT x.stxrelid FROM pg_statistic_ext x WHERE x.oid = d.objid)
           WHEN 'pg_attrdef'::regclass THEN (SELECT a.adrelid FROM pg_attrdef a WHERE a.oid = d.objid)
           WHEN 'pg_publication_rel'::regclass THEN (SELECT p.prrelid FROM pg_publication_rel p WHERE p.oid = d.objid)
           WHEN 'pg_class'::regclass THEN coalesce(
               (SELECT i.indrelid FROM pg_index i WHERE i.indexrelid = d.objid),
               -- a partition (of a partitioned new table, in the window) belongs to its parent
               (SELECT h.inhparent FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhrelid
                 WHERE h.inhrelid = d.objid AND p.relispartition),
               -- a sequence OWNED BY a column of the table (handed over at the swap)
               (SELECT d.refobjid FROM pg_class q WHERE q.oid = d.objid AND q.relkind = 'S' AND d.deptype = 'a'),
               CASE WHEN d.objsubid = 0 THEN d.objid END)
       END IN (SELECT oid FROM rel UNION SELECT unnest(%(dropped)s::oid[])) AS own,
       d.classid = 'pg_constraint'::regclass
           AND EXISTS (SELECT 1 FROM pg_constraint k WHERE k.oid = d.objid AND k.contype = 'f') AS foreign_key
    FROM pg_depend d
    -- Ordinary and automatic dependencies: an automatic one of an object that is not the table's own
    -- (a CONSTRAINT TRIGGER ... FROM t on another table) would go with the old table silently.
    WHERE d.deptype IN ('n', 'a')
      AND ((d.refclassid = 'pg_class'::regclass AND d.refobjid IN (SELECT oid FROM rel))
           OR (d.refclassid = 'pg_type'::regclass AND d.refobjid IN (SELECT oid FROM types)))
)
SELECT d.classid::regclass::text, d.objid, d.objsubid, pg_describe_object(d.classid, d.objid, d.objsubid),
       coalesce(bool_and(d.own), false), bool_or(d.foreign_key),
       -- what the fix statements name
       CASE d.classid
           WHEN 'pg_class'::regclass THEN (SELECT ARRAY[n.nspname, c.relname, c.relkind::text,
                                                      (SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.oid
                                                         AND a.attnum = d.objsubid),
                                                      EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = c.oid
                                                                AND h.inhparent = %(oid)s)::text]
                                          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                                          WHERE c.oid = d.objid)
           WHEN 'pg_constraint'::regclass THEN (SELECT ARRAY[n.nspname, c.relname, k.conname] FROM pg_constraint k
                                               JOIN pg_class c ON c.oid = k.conrelid
                                               JOIN pg_namespace n ON n.oid = c.relnamespace WHERE k.oid = d.objid)
           WHEN 'pg_rewrite'::regclass THEN (SELECT ARRAY[n.nspname, c.relname, r.rulename, c.relkind::text]
                                            FROM pg_rewrite r
                                            JOIN pg_class c ON c.oid = r.ev_class
                                            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE r.oid = d.objid)
           WHEN 'pg_policy'::regclass THEN (SELECT ARRAY[n.nspname, c.relname, p.polname] FROM pg_policy p
                                           JOIN pg_class c ON c.oid = p.polrelid
                                           JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.oid = d.objid)
           WHEN 'pg_trigger'::regclass THEN (SELECT ARRAY[n.nspname, c.relname, g.tgname] FROM pg_trigger g
                                            JOIN pg_class c ON c.oid = g.tgrelid
                                            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE g.oid = d.objid)
           WHEN 'pg_type'::regclass THEN (SELECT ARRAY[n.nspname, t.typname, t.typtype::text] FROM pg_type t
                                         JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = d.objid)
           WHEN 'pg_proc'::regclass THEN (SELECT ARRAY[n.nspname, p.proname,
                                                      pg_get_function_identity_arguments(p.oid),
                                                      (p.prosqlbody IS NOT NULL)::text, p.prokind::text]
                                         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                                         WHERE p.oid = d.objid)
       END AS names
FROM deps d
GROUP BY d.classid, d.objid, d.objsubid
ORDER BY 4
"""

# What pg_depend does not hold: the inheritance parents of the table (the child's dependency points at
# the parent) and the subscriptions that apply into it (pg_subscription_rel, by oid).
PARENTS = """
SELECT n.nspname, c.relname FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhparent
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE h.inhrelid = %(oid)s AND NOT c.relkind = 'p' ORDER BY 1, 2
"""

SUBSCRIPTIONS = """
SELECT s.subname, s.subenabled FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
WHERE r.srrelid = %(oid)s ORDER BY 1
"""

KEYWORDS = {"table": sql.SQL("TABLE"), "view": sql.SQL("VIEW"), "materialized view": sql.SQL("MATERIALIZED VIEW"),
            "DOMAIN": sql.SQL("DOMAIN"), "TYPE": sql.SQL("TYPE"), "FUNCTION": sql.SQL("FUNCTION"),
            "PROCEDURE": sql.SQL("PROCEDURE"), "AGGREGATE": sql.SQL("AGGREGATE"),
            "MATERIALIZED VIEW": sql.SQL("MATERIALIZED VIEW"), "VIEW": sql.SQL("VIEW")}
RELKINDS = {"r": "table", "p": "partitioned table", "v": "view", "m": "materialized view", "c": "composite type",
            "f": "foreign table", "i": "index", "I": "index", "S": "sequence"}


@dataclass(frozen=True)
class Bound:
    """One object bound to the table's identity: what it is (as PostgreSQL describes it), what it
    means for the migration, and the statement that fixes it."""

    what: str
    why: str
    fix: str

    def line(self) -> str:
        return f"{self.what}: {self.why}; fix: {self.fix}"


def _q(cur: psycopg.Cursor, composable: sql.Composable) -> str:
    return composable.as_string(cur)


def _rel(schema: str, name: str) -> sql.Identifier:
    return sql.Identifier(schema, name)


def _classify(cur: psycopg.Cursor, table: sql.Identifier, classid: str, what: str, got: list[str] | None,
              *, dropping: bool) -> Bound:
    """The refusal for one dependent object (`got`: the names the DEPENDENTS query read for its fix)."""
    stays = ("it depends on the table: the drop would fail over it, or take it along" if dropping
             else "bound to the table's oid or row type, it would stay on the old table at the swap")
    again = "" if dropping else " (create it again after the cutover if needed: it then binds to the new table)"
    if got is None:  # a kind without names read for its fix, or an object that vanished while read
        return Bound(what, stays, f"drop or change {what}{again}")
    if classid == "pg_class":
        schema, name, relkind, column, child = got
        rel = _rel(schema, name)
        if child == "true":
            return Bound(what, "an inheritance child of the table: " + (
                "it keeps the old table as its parent, and reads through the table's name lose its rows"
                if not dropping else stays),
                _q(cur, sql.SQL("ALTER TABLE {} NO INHERIT {}").format(rel, table)))
        if column is not None:
            if relkind == "c":
                return Bound(what, stays, _q(cur, sql.SQL("ALTER TYPE {} DROP ATTRIBUTE {}").format(
                    rel, sql.Identifier(column))) + again)
            col = sql.Identifier(column)
            return Bound(what, stays + ("" if dropping else " (writes of the new table's rows into it fail)"),
                         _q(cur, sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE jsonb USING to_jsonb({})").format(
                             rel, col, col)) + " (or another type that does not name the table's row type), or "
                         + _q(cur, sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(rel, col)))
        kind = RELKINDS.get(relkind, "relation")
        return Bound(what, stays, _q(cur, sql.SQL("DROP {} {}").format(KEYWORDS[kind], rel)) + again
                     if kind in ("view", "materialized view", "table") else f"drop or change {what}")
    if classid == "pg_rewrite":
        schema, name, rule, relkind = got
        if rule == "_RETURN":
            kind = "MATERIALIZED VIEW" if relkind == "m" else "VIEW"
            return Bound(what, stays, _q(cur, sql.SQL("DROP {} {}").format(KEYWORDS[kind], _rel(schema, name))) + again)
        return Bound(what, stays, _q(cur, sql.SQL("DROP RULE {} ON {}").format(sql.Identifier(rule),
                                                                               _rel(schema, name))) + again)
    if classid == "pg_constraint":
        schema, name, constraint = got
        return Bound(what, stays, _q(cur, sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
            _rel(schema, name), sql.Identifier(constraint))) + again)
    if classid == "pg_policy":
        schema, name, policy = got
        return Bound(what, stays, _q(cur, sql.SQL("DROP POLICY {} ON {}").format(sql.Identifier(policy),
                                                                                 _rel(schema, name))) + again)
    if classid == "pg_trigger":
        schema, name, trigger = got
        return Bound(what, stays, _q(cur, sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(trigger),
                                                                                  _rel(schema, name))) + again)
    if classid == "pg_type":
        schema, name, typtype = got
        kind = "DOMAIN" if typtype == "d" else "TYPE"
        return Bound(what, stays, _q(cur, sql.SQL("DROP {} {}").format(KEYWORDS[kind], _rel(schema, name))) + again)
    if classid == "pg_proc":
        schema, name, args, atomic, prokind = got
        kind = {"p": "PROCEDURE", "a": "AGGREGATE"}.get(prokind, "FUNCTION")
        drop = _q(cur, sql.SQL("DROP {} {}").format(KEYWORDS[kind], _rel(schema, name))) + f"({args})"
        if atomic == "true":
            return Bound(what, stays + " (a SQL-standard body, BEGIN ATOMIC or RETURN, binds the tables it reads"
                         " when it is created)",
                         f"CREATE OR REPLACE {kind} with its body as a string (AS $$ ... $$, which reads the"
                         f" table by name at each call), or {drop}{again}")
        return Bound(what, stays + " (its arguments or result name the table's row type)", drop + again)
    return Bound(what, stays, f"drop or change {what}{again}")


def bound(cur: psycopg.Cursor, oid: int) -> list[Bound]:
    """What the swap of the table `oid` (the one carrying the name) would leave on it, each with its
    fix: nothing when the swap can carry the table's identity whole."""
    table = _table(cur, oid)
    # Carried: what belongs to the table or to a view the swap re-creates, and the foreign keys
    # that reference them (mover/engines/swap/carry.py).
    out = [_classify(cur, table, classid, what, got, dropping=False)
           for classid, what, own, foreign_key, got in _dependents(cur, oid, views=True)
           if not (own or foreign_key)]
    cur.execute(PARENTS, {"oid": oid})
    out += [Bound(f"inheritance parent {names.display_ident(schema)}.{names.display_ident(name)}",
                  "the table inherits from it: the old table would stay its child, and the parent would read the"
                  " old table's rows, then none once it is dropped",
                  _q(cur, sql.SQL("ALTER TABLE {} NO INHERIT {}").format(table, _rel(schema, name))))
            for schema, name in cur.fetchall()]
    cur.execute(SUBSCRIPTIONS, {"oid": oid})
    out += [Bound(f"subscription {names.display_ident(sub)}", "the table is a logical-replication subscriber's"
                  " table: pg_subscription_rel names it by oid, so after the swap the apply worker would skip every"
                  " change to the new table, without an error" + ("" if enabled else " (the subscription is"
                                                                   " disabled; enabling it would)"),
                  "follow docs/operating.md \"A subscribed source (the source is a subscriber)\": change the table"
                  f" in place while the subscription is disabled (ALTER SUBSCRIPTION {names.display_ident(sub)}"
                  f" DISABLE; ALTER TABLE ...; ALTER SUBSCRIPTION {names.display_ident(sub)} ENABLE), or move the"
                  " publisher's table instead")
            for sub, enabled in cur.fetchall()]
    return out


def blocking(cur: psycopg.Cursor, oid: int, dropped: Sequence[int] = ()) -> list[Bound]:
    """What `DROP TABLE` of `oid` would refuse over (2BP01), or take along silently: every object
    with an ordinary or automatic dependency on it, on a column of it or on its row type (and the
    arrays and domains over it) that is not its own part, inheritance children included. Views
    that read it count too: nothing but the table's own parts may remain. `dropped`: the other
    tables the same transaction drops (a migration's tables: the keys between them go with them)."""
    table = _table(cur, oid)
    # Without views, only the table's own parts belong: they go with it.
    return [_classify(cur, table, classid, what, got, dropping=True)
            for classid, what, own, _, got in _dependents(cur, oid, views=False, dropped=dropped) if not own]


def _dependents(cur: psycopg.Cursor, oid: int, *, views: bool,
                dropped: Sequence[int] = ()) -> list[tuple[str, str, bool, bool, list[str] | None]]:
    cur.execute(DEPENDENTS, {"oid": oid, "views": views, "dropped": list(dropped)})
    return [(classid, what or f"{classid} {objid}", bool(own), bool(fk), got)
            for classid, objid, _, what, own, fk, got in cur.fetchall()]


def _table(cur: psycopg.Cursor, oid: int) -> sql.Identifier:
    cur.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.oid = %s", (oid,))
    row = cur.fetchone()
    assert row is not None, oid
    return sql.Identifier(row[0], row[1])


class IdentityBound(Waiting):
    """Objects bound to the table's identity refuse the swap, or the drop (exit 3): named, each with
    its fix; the command runs again once they are fixed."""


def refusal(found: list[Bound], table: str, doing: str, why: str, again: str) -> IdentityBound:
    listed = "; ".join(f"{i}. {b.line()}" for i, b in enumerate(found, 1))
    return IdentityBound(f"{doing} refused: {len(found)} object{'s' if len(found) > 1 else ''} bound to the identity"
                         f" of {table} (its oid or row type), {why}: {listed}",
                         hint=f"fix each as named (docs/operating.md \"Objects bound to the table's identity\"),"
                              f" then {again}")


def refuse_bound(cur: psycopg.Cursor, oid: int, doing: str, again: str) -> None:
    """The swap's refusal (before its lock, and under it when the catalog digest changed): what
    `bound` finds on the table carrying the name."""
    found = bound(cur, oid)
    if found:
        raise refusal(found, _table(cur, oid).as_string(cur), doing, f"which {doing} would leave behind", again)


def refuse_blocking(cur: psycopg.Cursor, oid: int | None, doing: str, again: str, dropped: Sequence[int] = ()) -> None:
    """Retire's and abort's refusal before they drop a table: what PostgreSQL would refuse the drop
    over (2BP01), named with the fix, instead of its raw error. `dropped`: as for blocking."""
    if oid is None:
        return
    found = blocking(cur, oid, dropped)
    if found:
        raise refusal(found, _table(cur, oid).as_string(cur), doing,
                      "which PostgreSQL would refuse to drop it over (nothing was dropped)", again)
