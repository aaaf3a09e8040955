"""What the swap carries from the table giving up the name to the table taking it, besides rows:
index and constraint names, foreign keys both ways, triggers, rules, row-level security with its
policies, and the views and materialized views that read the table.

The same code serves the swap and the swap back: `live` carries the application's objects and
its name before the swap, `other` takes both. Everything is read from the catalog before any
statement runs (what `plan check` prints is what runs), in two parts:
- `before`: runs before the tables are renamed; takes the objects off `live` (so the other side
  never fires the application's triggers for the reverse replay, nor checks its foreign keys or
  policies against replayed rows) and parks `live`'s index names;
- `after`: runs after the renames; the catalog printed the definitions with the table's name,
  which now resolves to the table that took it, so they re-create each object there.
Foreign keys are added NOT VALID (no scan under the lock) and validated after the lock is
released (`validate`), each one recorded so that a crash in between resumes the validation.
PostgreSQL before 18 takes no NOT VALID foreign key on a partitioned table: an outbound one that
moves to a partitioned table is added NOT VALID to each of its partitions (plain tables), each
validated after the lock, then added to the partitioned table itself, which attaches the
partitions' validated copies without scanning them again (`to_attach`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from mover import faults, names
from mover.catalog import introspect, reading, shape
from mover.db import one
from mover.names import QualifiedName
from mover.sql import ddl, trusted
from mover.state import control

if TYPE_CHECKING:
    from mover.engines.context import Context

# A statement of the swap: its SQL, or its SQL and the parameters it runs with.
Statement = sql.SQL | sql.Composed | tuple[sql.SQL | sql.Composed, tuple[Any, ...]]

VALIDATE_EVENT = shape.VALIDATE_EVENT  # which another migration's shape check reads (shape.validated_by_another)


@dataclass
class Carried:
    before: list[Statement] = field(default_factory=list)
    after: list[Statement] = field(default_factory=list)
    # (schema, table, constraint) added NOT VALID that were valid before: VALIDATE after the lock
    to_validate: list[tuple[str, str, str]] = field(default_factory=list)
    # (schema, partitioned table, constraint, definition): added after its partitions' copies are validated
    to_attach: list[tuple[str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what plan check says about the swap


def _oid(cur: psycopg.Cursor, table: QualifiedName) -> int:
    cur.execute("SELECT to_regclass(%s)::oid", (str(table),))
    oid = one(cur)[0]
    assert oid is not None  # both tables are locked by the swap (or rehearsed by plan check)
    return int(oid)


def partner_index(mid: int, target: QualifiedName, index: str, key_index: str, primary: bool) -> str:
    """The name the new table's copy of the original's index `index` was built with
    (steps/create_target.py for the key, builds.deferred_index_name for the others)."""
    if index == key_index:
        return names.derived(target.name, "_pkey" if primary else "_key")
    return names.derived(index, f"_m{mid}")


def _names(cur: psycopg.Cursor, ctx: Context, live: QualifiedName, other: QualifiedName, out: Carried) -> None:
    """Index (and so primary key, unique and exclusion constraint) names change sides: the table
    taking the table's name takes its index names, the other takes the names its partners were
    built with. Renaming a constraint's index renames the constraint (an exclusion constraint's
    partner, or a temporal key's, is built by ADD CONSTRAINT under the partner name,
    mover/engines/bulk/builds.py). Swapped through a parking name, so the same statements serve the
    swap back."""
    m = ctx.migration
    live_oid, other_oid = _oid(cur, live), _oid(cur, other)
    cur.execute("SELECT relkind FROM pg_class WHERE oid = %s", (other_oid,))
    partitioned = one(cur)[0] == "p"
    key_index = introspect.key_index(cur, live_oid, live)  # one query: the lock is held
    cur.execute("""
        SELECT ic.relname, i.indisprimary, k.contype, coalesce(k.condeferrable, false),
               coalesce(k.condeferred, false)
        FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
        LEFT JOIN pg_constraint k ON k.conindid = i.indexrelid AND k.conrelid = i.indrelid
                                 AND k.contype IN ('p', 'u', 'x')
        WHERE i.indrelid = %s ORDER BY ic.relname""", (live_oid,))
    rows = cur.fetchall()
    cur.execute("SELECT ic.relname, EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid"
                " AND k.conrelid = i.indrelid) FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
                " WHERE i.indrelid = %s", (other_oid,))
    theirs_backs_constraint: dict[str, bool] = dict(cur.fetchall())
    assert live.schema is not None
    # The names the application knows are those on `live`; its partners' names are derived from
    # them the same way in both directions (the swap back finds the same pairs).
    for mine, primary, contype, deferrable, deferred in rows:
        theirs = partner_index(m.id, m.target, mine, key_index, primary)
        if theirs not in theirs_backs_constraint:
            out.notes.append(f"index {names.display_ident(mine)} of {live} has no partner"
                             f" {names.display_ident(theirs)} on {other}; its name is not carried over")
            continue
        if contype == "u" and not theirs_backs_constraint[theirs] and not partitioned:
            # A unique constraint stays a constraint (ON CONFLICT ON CONSTRAINT names it); the index
            # is built already, so this checks nothing and scans nothing. (A temporal UNIQUE's
            # partner is its constraint already: USING INDEX takes no GiST index.)
            out.before.append(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} UNIQUE USING INDEX {}{}").format(
                other.ident, sql.Identifier(theirs), sql.Identifier(theirs),
                sql.SQL(" DEFERRABLE INITIALLY DEFERRED") if deferred
                else sql.SQL(" DEFERRABLE") if deferrable else sql.SQL("")))
        parking = names.derived(mine, f"_m{m.id}_swap")
        out.before += [
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(sql.Identifier(live.schema, mine), sql.Identifier(parking)),
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(sql.Identifier(live.schema, theirs), sql.Identifier(mine)),
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(sql.Identifier(live.schema, parking),
                                                          sql.Identifier(theirs)),
        ]


def _leaves(cur: psycopg.Cursor, oid: int) -> list[QualifiedName]:
    """The leaf partitions of a partitioned table (none for a plain one)."""
    cur.execute("SELECT n.nspname, c.relname FROM pg_partition_tree(%s) t JOIN pg_class c ON c.oid = t.relid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.isleaf AND t.relid <> %s ORDER BY 1, 2",
                (oid, oid))
    return [QualifiedName(s, n) for s, n in cur.fetchall()]


def _partition_only_keys(cur: psycopg.Cursor, live_oid: int, mid: int) -> list[tuple[Any, ...]]:
    """Outbound foreign keys a swap put on the partitions of `live` (partitioned) that are not yet on
    `live` itself (a swap back before `validate` attached them): like _foreign_keys' rows, one per
    name, valid if the swap recorded it to attach; with the partitions that hold a copy."""
    leaves = _leaves(cur, live_oid)
    if not leaves:
        return []
    attach = {name for _, _, name, _ in pending_attach(cur, mid)}
    rows = reading.read(cur, """
        SELECT k.conname, min(pg_get_constraintdef(k.oid)), bool_and(k.convalidated),
               array_agg(ARRAY[n.nspname, c.relname] ORDER BY n.nspname, c.relname)
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE k.contype = 'f' AND k.conparentid = 0 AND k.conrelid IN (SELECT relid FROM pg_partition_tree(%(oid)s)
                                                                       WHERE isleaf AND relid <> %(oid)s)
        AND NOT EXISTS (SELECT 1 FROM pg_constraint p WHERE p.conrelid = %(oid)s AND p.conname = k.conname)
        GROUP BY k.conname ORDER BY k.conname""", {"oid": live_oid},
        missing=reading.printed(1, name=lambda r: f"foreign key {names.display_ident(r[0])} of a partition"))
    return [(name, definition.removesuffix(" NOT VALID"), valid or name in attach,
             [QualifiedName(s, t) for s, t in tables]) for name, definition, valid, tables in rows]


def _foreign_keys(cur: psycopg.Cursor, live_oid: int, live: QualifiedName, skip: tuple[str, ...], out: Carried,
                  after_name: QualifiedName, other_oid: int, mid: int, *, own_only: bool = False,
                  family: frozenset[int] = frozenset()) -> None:
    """Outbound (the table's own, self-references included) and inbound (other tables' that
    reference it) foreign keys move to the table taking the name, NOT VALID, validated after.
    The other table keeps none: the replay into it must not wait for the parent's rows, nor
    block the application's deletes of them. A key to or from another table of the same family
    (`family`: their live tables) stays where it is: both sides hold it (mover/engines/swap/keys.py)."""
    assert after_name.schema is not None
    found = reading.read(cur, """
        SELECT k.conrelid = %(oid)s, n.nspname, c.relname, k.conname, pg_get_constraintdef(k.oid), k.convalidated,
               obj_description(k.oid, 'pg_constraint')
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE k.contype = 'f' AND k.conparentid = 0 AND (k.conrelid = %(oid)s OR k.confrelid = %(oid)s)
          AND NOT (k.conrelid = ANY(%(family)s) OR k.confrelid = ANY(%(family)s))
        ORDER BY k.conrelid = %(oid)s DESC, n.nspname, c.relname, k.conname""",
        {"oid": live_oid, "family": sorted(family)},
        missing=reading.printed(4, name=lambda r: f"foreign key {names.display_ident(r[3])} of"
                                                  f" {QualifiedName(r[1], r[2])}"))
    rows = [(*r, None) for r in found]
    # A swap back before `validate` attached them: the partitions hold the only copies.
    rows += [(True, None, None, name, definition, valid, None, tables)
             for name, definition, valid, tables in _partition_only_keys(cur, live_oid, mid)]
    leaves = _leaves(cur, other_oid)
    for own, schema, table_name, name, definition, validated, comment, held_by in rows:
        if not own and own_only:
            continue
        if own and name in skip:
            continue  # acknowledged in [target] drop_foreign_keys: left on the old table
        child = QualifiedName(schema, table_name) if schema is not None else live
        table = after_name if own else child
        out.before += [sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(t.ident, sql.Identifier(name))
                       for t in (held_by or [live if own else child])]
        # pg_get_constraintdef() text; the referenced table's name resolves after the renames
        text = definition if definition.endswith(" NOT VALID") else definition + " NOT VALID"
        on = leaves if own and leaves else [table]
        out.after += [sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(t.ident, sql.Identifier(name),
                                                                            trusted(text, "pg_get_constraintdef"))
                      for t in on]
        if own and leaves:
            # Never a NOT VALID one: the partitioned table's own copy could only be added validated
            # (plan check refuses such a key: mover/checks/foreign_keys.py).
            assert validated, name
            assert table.schema is not None
            out.to_attach.append((table.schema, table.name, name, definition))
        if comment is not None:
            # On the partitioned table's copy once it exists: `validate` adds it there.
            out.after += [] if own and leaves else [sql.SQL("COMMENT ON CONSTRAINT {} ON {} IS {}").format(
                sql.Identifier(name), table.ident, sql.Literal(comment))]
            if own and leaves:
                out.notes.append(f"the comment on foreign key {name} is not carried to the partitioned table")
        if validated:
            out.to_validate += [(t.schema, t.name, name) for t in on if t.schema is not None]


ENABLE = {"D": "DISABLE TRIGGER", "R": "ENABLE REPLICA TRIGGER", "A": "ENABLE ALWAYS TRIGGER"}
ENABLE_RULE = {"D": "DISABLE RULE", "R": "ENABLE REPLICA RULE", "A": "ENABLE ALWAYS RULE"}


def _triggers(cur: psycopg.Cursor, oid: int, table: sql.Composable, after_table: sql.Composable, out: Carried,
              drop: bool = True) -> None:
    """The application's triggers (mover's capture triggers stay mover's), same names (so the same
    firing order) and enabled state."""
    for name, definition, enabled, comment in reading.read(
            cur, "SELECT tgname, pg_get_triggerdef(oid), tgenabled, obj_description(oid, 'pg_trigger')"
                 " FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal AND tgname !~ '^mover_m[0-9]+_'"
                 " ORDER BY tgname", (oid,),
            missing=reading.printed(1, name=lambda r: f"trigger {names.display_ident(r[0])}")):
        if drop:
            out.before.append(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(name), table))
        out.after.append(trusted(definition, "pg_get_triggerdef"))
        if enabled in ENABLE:
            out.after.append(sql.SQL("ALTER TABLE {} {} {}").format(after_table, trusted(ENABLE[enabled], "keyword"),
                                                                    sql.Identifier(name)))
        if comment is not None:
            out.after.append(sql.SQL("COMMENT ON TRIGGER {} ON {} IS {}").format(
                sql.Identifier(name), after_table, sql.Literal(comment)))


def _rules(cur: psycopg.Cursor, oid: int, live: QualifiedName, after_name: QualifiedName, out: Carried) -> None:
    for name, definition, enabled in reading.read(
            cur, "SELECT rulename, pg_get_ruledef(oid), ev_enabled FROM pg_rewrite"
                 " WHERE ev_class = %s AND rulename <> '_RETURN' ORDER BY rulename", (oid,),
            missing=reading.printed(1, name=lambda r: f"rule {names.display_ident(r[0])} of {live}")):
        out.before.append(sql.SQL("DROP RULE {} ON {}").format(sql.Identifier(name), live.ident))
        out.after.append(trusted(definition.rstrip(";"), "pg_get_ruledef"))
        if enabled in ENABLE_RULE:
            out.after.append(sql.SQL("ALTER TABLE {} {} {}").format(
                after_name.ident, trusted(ENABLE_RULE[enabled], "keyword"), sql.Identifier(name)))


def _row_security(cur: psycopg.Cursor, oid: int, live: QualifiedName, after_name: QualifiedName, out: Carried) -> None:
    """RLS and its policies move; the other table gets neither, so the replay into it is never
    filtered (with RLS on and no policy, everything but the owner would see no row)."""
    cur.execute("SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = %s", (oid,))
    enabled, forced = one(cur)
    policies = reading.read(cur, """
        SELECT p.polname, p.polpermissive, p.polcmd,
               (SELECT array_agg(CASE WHEN r = 0 THEN NULL ELSE pg_get_userbyid(r) END ORDER BY r)
                FROM unnest(p.polroles) r),
               pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid),
               p.polqual IS NOT NULL, p.polwithcheck IS NOT NULL
        FROM pg_policy p WHERE p.polrelid = %s ORDER BY p.polname""", (oid,),
        missing=lambda r: f"policy {names.display_ident(r[0])} of {live}"
                          if (r[6] and r[4] is None) or (r[7] and r[5] is None) else None)
    commands = {"r": "SELECT", "a": "INSERT", "w": "UPDATE", "d": "DELETE", "*": "ALL"}
    for name, permissive, cmd, roles, qual, check, _, _ in policies:
        out.before.append(sql.SQL("DROP POLICY {} ON {}").format(sql.Identifier(name), live.ident))
        role_list = sql.SQL(", ").join(sql.SQL("PUBLIC") if r is None else sql.Identifier(r) for r in roles or [None])
        out.after.append(sql.SQL("CREATE POLICY {} ON {} AS {} FOR {} TO {}{}{}").format(
            sql.Identifier(name), after_name.ident, sql.SQL("PERMISSIVE") if permissive else sql.SQL("RESTRICTIVE"),
            trusted(commands[cmd], "keyword"), role_list,
            # pg_get_expr() text: the catalog's rendering of the policy's expressions
            sql.SQL(" USING ({})").format(trusted(qual, "pg_get_expr")) if qual is not None else sql.SQL(""),
            sql.SQL(" WITH CHECK ({})").format(trusted(check, "pg_get_expr")) if check is not None else sql.SQL("")))
    if forced:
        out.before.append(sql.SQL("ALTER TABLE {} NO FORCE ROW LEVEL SECURITY").format(live.ident))
        out.after.append(sql.SQL("ALTER TABLE {} FORCE ROW LEVEL SECURITY").format(after_name.ident))
    if enabled:
        out.before.append(sql.SQL("ALTER TABLE {} DISABLE ROW LEVEL SECURITY").format(live.ident))
        out.after.append(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(after_name.ident))


DEPENDENT_VIEWS = """
WITH RECURSIVE dep(oid, depth) AS (
    SELECT r.ev_class, 1 FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
    WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
      AND d.refobjid = %(oid)s AND r.ev_class <> %(oid)s
    UNION
    SELECT r.ev_class, dep.depth + 1 FROM dep
    JOIN pg_depend d ON d.refobjid = dep.oid AND d.classid = 'pg_rewrite'::regclass
                    AND d.refclassid = 'pg_class'::regclass
    JOIN pg_rewrite r ON r.oid = d.objid AND r.ev_class <> dep.oid
    WHERE dep.depth < 50
)
SELECT c.oid, n.nspname, c.relname, c.relkind, max(dep.depth), pg_get_viewdef(c.oid),
       pg_get_userbyid(c.relowner), coalesce(c.reloptions, '{}'), obj_description(c.oid, 'pg_class'),
       c.relispopulated
FROM dep JOIN pg_class c ON c.oid = dep.oid JOIN pg_namespace n ON n.oid = c.relnamespace
GROUP BY c.oid, n.nspname, c.relname
ORDER BY max(dep.depth), n.nspname, c.relname
"""

_view_gone = reading.printed(5, name=lambda r: f"view {QualifiedName(r[1], r[2])}")


def _views(cur: psycopg.Cursor, oid: int, out: Carried) -> None:
    """Views bind to the table by oid: each one that reads it (or reads a view that does) is
    dropped (dependents first) and created again after the renames, from the definition the
    catalog printed, with its owner, options, grants, comment, triggers and (materialized) indexes.
    A materialized view is refreshed inside the swap: the application never reads one that is
    not populated (it costs the lock what the refresh takes; see docs/operating.md)."""
    views = reading.read(cur, DEPENDENT_VIEWS, {"oid": oid}, missing=_view_gone)
    creates: list[Statement] = []
    for voids, schema, name, kind, _, definition, owner, options, comment, populated in views:
        view = QualifiedName(schema, name)
        what = sql.SQL("MATERIALIZED VIEW") if kind == "m" else sql.SQL("VIEW")
        out.before.insert(0, sql.SQL("DROP {} {}").format(what, view.ident))  # dependents first
        with_opts = sql.SQL(" WITH ({})").format(sql.SQL(", ").join(trusted(o, "reloptions") for o in options)) \
            if options else sql.SQL("")  # reloptions text: the catalog's rendering
        body = definition.rstrip().rstrip(";")  # pg_get_viewdef(): the catalog's text
        creates.append(sql.SQL("CREATE {} {}{} AS {}{}").format(
            what, view.ident, with_opts, trusted(body, "pg_get_viewdef"),
            sql.SQL(" WITH NO DATA") if kind == "m" else sql.SQL("")))
        creates.append(sql.SQL("ALTER {} {} OWNER TO {}").format(what, view.ident, sql.Identifier(owner)))
        # Table and column grants in one query (the lock is held while the catalog is read).
        cur.execute("SELECT NULL::name, CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END,"
                    " a.privilege_type, a.is_grantable FROM pg_class c, aclexplode(c.relacl) a"
                    " WHERE c.oid = %(v)s AND a.grantee <> c.relowner"
                    " UNION ALL SELECT att.attname, CASE WHEN a.grantee = 0 THEN NULL"
                    " ELSE pg_get_userbyid(a.grantee) END, a.privilege_type, a.is_grantable"
                    " FROM pg_attribute att, aclexplode(att.attacl) a WHERE att.attrelid = %(v)s AND att.attnum > 0"
                    " AND NOT att.attisdropped AND att.attacl IS NOT NULL ORDER BY 1 NULLS FIRST, 2, 3", {"v": voids})
        creates += [_grant(view, priv, role, grantable, col) for col, role, priv, grantable in cur.fetchall()]
        if comment is not None:
            creates.append(sql.SQL("COMMENT ON {} {} IS {}").format(what, view.ident, sql.Literal(comment)))
        if kind == "m":
            creates += [trusted(r[0], "pg_get_indexdef") for r in reading.read(
                cur, "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s ORDER BY indexrelid",
                (voids,), missing=reading.printed(0, name=f"an index of materialized view {view}"))]
            if populated:
                creates.append(sql.SQL("REFRESH MATERIALIZED VIEW {}").format(view.ident))
        view_out = Carried()
        _triggers(cur, voids, view.ident, view.ident, view_out, drop=False)  # INSTEAD OF triggers go with it
        creates += view_out.after
        out.notes.append(f"{'materialized view' if kind == 'm' else 'view'} {view} is re-created at the swap"
                         + (" and refreshed under the lock" if kind == "m" and populated else ""))
    out.after += creates


def _grant(view: QualifiedName, privilege: str, role: str | None, grantable: bool,
           column: str | None = None) -> sql.Composed:
    return ddl.grant(view, privilege, role, grantable, column=column)


def carry_sql(cur: psycopg.Cursor, ctx: Context, live: QualifiedName, other: QualifiedName,
              after_name: QualifiedName, *, forward: bool) -> Carried:
    """Everything the swap moves from `live` to `other` (which is called `after_name` once the
    tables are renamed). Read now, run later in the same transaction."""
    out = Carried()
    live_oid = _oid(cur, live)
    _views(cur, live_oid, out)
    # The other tables of its family (issue 27), by the name the application uses (either side of the swap).
    family = frozenset(_oid(cur, t.migration.source) for t in ctx.family(cur) if t.mid != ctx.mid)
    _foreign_keys(cur, live_oid, live, ctx.plan.drop_foreign_keys if forward else (), out, after_name,
                  _oid(cur, other), ctx.mid, family=family)
    _triggers(cur, live_oid, live.ident, after_name.ident, out)
    _rules(cur, live_oid, live, after_name, out)
    _row_security(cur, live_oid, live, after_name, out)
    _names(cur, ctx, live, other, out)
    return out


def outbound_rehearsal_sql(cur: psycopg.Cursor, source: QualifiedName, target: QualifiedName,
                           skip: tuple[str, ...]) -> list[sql.SQL | sql.Composed]:
    """What the swap and `validate` would run to carry the source's own foreign keys to `target`,
    aimed at `target` under its present name: plan check runs it on the rehearsed (empty) target,
    so that a form the server refuses is found there, not at the cutover."""
    out = Carried()
    _foreign_keys(cur, _oid(cur, source), source, skip, out, target, _oid(cur, target), 0, own_only=True)
    after = [s for s in out.after if not isinstance(s, tuple)]  # carry's foreign key statements take no parameters
    return [*after, *(validate_sql(*c) for c in out.to_validate), *(attach_sql(*c) for c in out.to_attach)]


def also_locked(cur: psycopg.Cursor, table: QualifiedName) -> list[QualifiedName]:
    """The tables whose foreign keys reference `table` and the views that read it: the swap
    changes them, so its first statement locks them with the two tables, all under the
    cutover's lock_timeout, before the drain (a lock taken later, holding the table's, could
    only deadlock with an application transaction that holds one of them)."""
    cur.execute("SELECT to_regclass(%s)::oid", (str(table),))
    oid = one(cur)[0]
    if oid is None:
        return []
    views = [QualifiedName(r[1], r[2]) for r in reading.read(cur, DEPENDENT_VIEWS, {"oid": oid}, missing=_view_gone)
             if r[3] == "v"]  # LOCK takes no materialized view
    cur.execute("SELECT DISTINCT n.nspname, c.relname FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE k.contype = 'f' AND k.conparentid = 0"
                " AND k.confrelid = %s AND k.conrelid <> %s ORDER BY 1, 2", (oid, oid))
    return [QualifiedName(s, n) for s, n in cur.fetchall()] + views


def record_validation(cur: psycopg.Cursor, ctx: Context, to_validate: list[tuple[str, str, str]],
                      to_attach: list[tuple[str, str, str, str]] | None = None) -> None:
    """The constraints the swap added NOT VALID (and those to add to a partitioned table after
    them): `validate` works through them after the lock, and again (from this record) after a
    crash in between."""
    control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, VALIDATE_EVENT,
                  f"{len(to_validate)} foreign keys to validate after the swap",
                  {"constraints": [list(c) for c in to_validate], "attach": [list(c) for c in to_attach or []]})


def pending_attach(cur: psycopg.Cursor, mid: int) -> list[tuple[str, str, str, str]]:
    """(schema, partitioned table, constraint, definition) of the last swap's record that the
    table does not hold yet."""
    cur.execute("SELECT detail FROM mover.events WHERE migration_id = %s AND kind = %s ORDER BY id DESC LIMIT 1",
                (mid, VALIDATE_EVENT))
    row = cur.fetchone()
    out = []
    for schema, table, name, definition in ((row[0] or {}).get("attach", []) if row else []):
        cur.execute("SELECT EXISTS (SELECT 1 FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = %s AND c.relname = %s AND k.conname = %s)", (schema, table, name))
        if not one(cur)[0]:
            out.append((schema, table, name, definition))
    return out


def attach_sql(schema: str, table: str, name: str, definition: str) -> sql.Composed:
    """The partitioned table's own copy of a foreign key its partitions hold validated: PostgreSQL
    attaches theirs (no scan; a partition created since gets a copy, validated as it is added)."""
    return sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
        sql.Identifier(schema, table), sql.Identifier(name), trusted(definition, "pg_get_constraintdef"))


def pending_validation(cur: psycopg.Cursor, mid: int) -> list[tuple[str, str, str]]:
    """(schema, table, constraint) of the last swap's record that exist and are still NOT VALID."""
    cur.execute("SELECT detail FROM mover.events WHERE migration_id = %s AND kind = %s ORDER BY id DESC LIMIT 1",
                (mid, VALIDATE_EVENT))
    row = cur.fetchone()
    if row is None or not row[0]:
        return []
    out = []
    for schema, table, name in row[0].get("constraints", []):
        cur.execute("SELECT NOT k.convalidated FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = %s AND c.relname = %s AND k.conname = %s", (schema, table, name))
        r = cur.fetchone()
        if r is not None and r[0]:
            out.append((schema, table, name))
    return out


def validate_sql(schema: str, table: str, name: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(sql.Identifier(schema, table), sql.Identifier(name))


def validate(ctx: Context) -> list[tuple[str, str, str]]:
    """VALIDATE each foreign key the last swap added NOT VALID, one transaction each: it takes
    only SHARE UPDATE EXCLUSIVE on the table (writes go on) while it scans. Returns what it validated."""
    done = []
    for schema, table, name in ctx.db.transaction(lambda cur: pending_validation(cur, ctx.mid),
                                                  label="pending validation"):
        faults.point("validate")
        def one_constraint(cur: psycopg.Cursor, schema: str = schema, table: str = table, name: str = name) -> None:
            cur.execute(validate_sql(schema, table, name))
            # a validated constraint of the migrated table changes its recorded shape
            shape.rerecord(cur, ctx.mid)
        ctx.db.transaction(one_constraint, statement_timeout="0", label="validate foreign key")
        done.append((schema, table, name))
    for schema, table, name, definition in ctx.db.transaction(lambda cur: pending_attach(cur, ctx.mid),
                                                              label="pending attach"):
        def attach(cur: psycopg.Cursor, schema: str = schema, table: str = table, name: str = name,
                   definition: str = definition) -> None:
            cur.execute(attach_sql(schema, table, name, definition))
            shape.rerecord(cur, ctx.mid)
        ctx.db.transaction(attach, statement_timeout="0", label="add foreign key to the partitioned table")
        done.append((schema, table, name))
    if done:
        ctx.db.transaction(lambda cur: control.event(
            cur, ctx.mid, ctx.owner, ctx.migration.step, "constraints_validated",
            f"validated {', '.join(f'{n} on {s}.{t}' for s, t, n in done)}"), label="validated")
    return done


# What the swap's statements, its parity description of the live table and the two tables' shapes
# (mover/catalog/shape.py, which the swap's drain maps columns by) are built from (cutover.swap_plan with
# carry_sql and metadata.swap_sql, parity.live_description, shape.DESCRIBE: all read before the
# lock, read nothing else): the two tables and, recursively, the views that read them; their
# indexes, sequences, column defaults, publications, extended statistics, security labels and the
# tables whose foreign keys reference them; and of each, the catalog rows read; and what
# mover/catalog/identity.py reads of them (the swap's refusal of what it would leave behind). A row's xmin changes
# with every transactional update of it, so an equal digest means the statements and the description
# read then are still what the catalog would give now. pg_class is compared by content instead:
# VACUUM's in-place updates keep xmin anyway, but an ALTER TABLE SET (autovacuum_enabled = ...)
# before the lock would change it without changing anything the swap or parity reads (both leave
# autovacuum_enabled out). An index's validity flags are compared by content too (a concurrent
# index build or drop may set them in place). Not covered: a role, type or collation renamed in
# between (the parity check after the DDL then reads a name the description lacks and refuses).
SWAP_INPUTS = """
WITH RECURSIVE tab AS (
    SELECT to_regclass(t)::oid AS oid FROM unnest(%(tables)s::text[]) t WHERE to_regclass(t) IS NOT NULL
), dep(oid, depth) AS (
    SELECT r.ev_class, 1 FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
    WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
      AND d.refobjid IN (SELECT oid FROM tab) AND r.ev_class <> d.refobjid
    UNION
    SELECT r.ev_class, dep.depth + 1 FROM dep
    JOIN pg_depend d ON d.refobjid = dep.oid AND d.classid = 'pg_rewrite'::regclass
                    AND d.refclassid = 'pg_class'::regclass
    JOIN pg_rewrite r ON r.oid = d.objid AND r.ev_class <> dep.oid
    WHERE dep.depth < 50
), owners AS (
    SELECT oid FROM tab UNION SELECT oid FROM dep
), rel AS (
    SELECT oid FROM owners
    UNION SELECT d.objid FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
        AND d.refclassid = 'pg_class'::regclass AND d.refobjid IN (SELECT oid FROM owners)
    UNION SELECT i.indexrelid FROM pg_index i WHERE i.indrelid IN (SELECT oid FROM owners)
    UNION SELECT k.conrelid FROM pg_constraint k WHERE k.confrelid IN (SELECT oid FROM tab)
), cons AS (
    SELECT oid, xmin FROM pg_constraint WHERE conrelid IN (SELECT oid FROM rel) OR confrelid IN (SELECT oid FROM tab)
), trig AS (
    SELECT oid, xmin, tgfoid FROM pg_trigger WHERE tgrelid IN (SELECT oid FROM rel)
), stx AS (
    SELECT oid, xmin FROM pg_statistic_ext WHERE stxrelid IN (SELECT oid FROM rel)
)
SELECT md5(coalesce(string_agg(x, ',' ORDER BY x), '')) FROM (
    SELECT concat_ws(':', 'c', c.oid, c.relname, c.relnamespace, n.xmin, c.relowner, c.relkind, c.relacl,
                     c.relrowsecurity, c.relforcerowsecurity, c.relispopulated, c.relreplident,
                     c.relpersistence, c.relispartition, c.reloftype,
                     CASE WHEN c.relkind IN ('v', 'm') THEN c.reloptions
                          ELSE ARRAY(SELECT o FROM unnest(c.reloptions) o
                                     WHERE split_part(o, '=', 1) <> 'autovacuum_enabled') END) AS x
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid IN (SELECT oid FROM rel)
    UNION ALL SELECT concat_ws(':', 'a', attrelid, attnum, xmin) FROM pg_attribute
        WHERE attrelid IN (SELECT oid FROM rel) AND attnum > 0
    UNION ALL SELECT concat_ws(':', 'i', indexrelid, xmin, indisvalid, indisready, indislive) FROM pg_index
        WHERE indrelid IN (SELECT oid FROM rel)
    UNION ALL SELECT concat_ws(':', 'k', oid, xmin) FROM cons
    UNION ALL SELECT concat_ws(':', 't', oid, xmin) FROM trig
    UNION ALL SELECT concat_ws(':', 'f', p.oid, p.xmin) FROM pg_proc p WHERE p.oid IN (SELECT tgfoid FROM trig)
    UNION ALL SELECT concat_ws(':', 'r', oid, xmin) FROM pg_rewrite WHERE ev_class IN (SELECT oid FROM rel)
    UNION ALL SELECT concat_ws(':', 'p', oid, xmin) FROM pg_policy WHERE polrelid IN (SELECT oid FROM rel)
    UNION ALL SELECT concat_ws(':', 's', seqrelid, xmin) FROM pg_sequence WHERE seqrelid IN (SELECT oid FROM rel)
    UNION ALL SELECT concat_ws(':', 'u', pr.oid, pr.xmin, p.xmin) FROM pg_publication_rel pr
        JOIN pg_publication p ON p.oid = pr.prpubid WHERE pr.prrelid IN (SELECT oid FROM rel)
    UNION ALL SELECT concat_ws(':', 'x', oid, xmin) FROM stx
    UNION ALL SELECT concat_ws(':', 'e', oid, xmin) FROM pg_attrdef WHERE adrelid IN (SELECT oid FROM rel)
    UNION ALL SELECT concat_ws(':', 'l', classoid, objoid, objsubid, provider, label) FROM pg_seclabel
        WHERE classoid = 'pg_class'::regclass AND objoid IN (SELECT oid FROM rel)
    UNION ALL SELECT concat_ws(':', 'd', classid, objid, objsubid, refobjid, refobjsubid, deptype) FROM pg_depend
        WHERE refclassid = 'pg_class'::regclass AND refobjid IN (SELECT oid FROM rel)
    -- What mover/catalog/identity.py reads besides (invariant 15): what depends on the row types and
    -- their arrays (a column, domain or function made since would be left on the old table),
    -- inheritance both ways, the subscriptions applying into the tables.
    UNION ALL SELECT concat_ws(':', 'y', classid, objid, objsubid, refobjid, deptype) FROM pg_depend
        WHERE refclassid = 'pg_type'::regclass AND refobjid IN (
            SELECT c.reltype FROM pg_class c WHERE c.oid IN (SELECT oid FROM rel)
            UNION SELECT t.typarray FROM pg_type t JOIN pg_class c ON c.reltype = t.oid
                                   WHERE c.oid IN (SELECT oid FROM rel))
    UNION ALL SELECT concat_ws(':', 'h', inhrelid, inhparent, xmin) FROM pg_inherits
        WHERE inhrelid IN (SELECT oid FROM tab) OR inhparent IN (SELECT oid FROM tab)
    UNION ALL SELECT concat_ws(':', 'b', srsubid, srrelid, xmin) FROM pg_subscription_rel
        WHERE srrelid IN (SELECT oid FROM tab)
    UNION ALL SELECT concat_ws(':', 'm', objoid, classoid, objsubid, xmin) FROM pg_description
        WHERE objoid IN (SELECT oid FROM rel UNION ALL SELECT oid FROM cons UNION ALL SELECT oid FROM trig
                         UNION ALL SELECT oid FROM stx)
) inputs
"""


def catalog_digest(cur: psycopg.Cursor, tables: list[QualifiedName]) -> str:
    """One query: a digest of every catalog row the swap's statements between `tables` and the
    parity description of the live one are built from (SWAP_INPUTS). Read before the lock, before
    the statements (a change committed in between then changes it), and again under the lock."""
    cur.execute(SWAP_INPUTS, {"tables": [str(t) for t in tables]})
    return str(one(cur)[0])
