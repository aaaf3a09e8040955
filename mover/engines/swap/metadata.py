"""The rest of a table's metadata, carried to the new table (mover/engines/swap/parity.py checks it arrived).

At create_target (nothing reads the new table yet, so anything that does not depend on its
indexes): per-column statistics targets, storage and compression of the columns whose type
changes (ALTER COLUMN TYPE resets them to the new type's defaults; LIKE copied the others),
extended statistics (under parking names: the source holds the names) and security labels.
At the swap, in its locked transaction (catalog-only statements): the replica identity (its
index exists only once the backfill built it), publication membership (the old table leaves
the publication, or subscribers would see the reverse replay's writes twice), and the
extended statistics' names. The swap back runs the same code the other way.

Invariants:
- Statements only, built from what the catalog printed before any of them runs: the create_target
  step and the swap execute them (`plan check` prints the same lists; invariant 10 for the text).
- Under the swap's lock, catalog-only statements (no scan, no rewrite): the lock is held briefly
  (invariant 6). What cannot be carried is named by `plan check` (plan_notes) and by parity.
"""

from __future__ import annotations

from typing import Any

import psycopg

from mover import names
from mover.catalog import reading, shape
from mover.names import QualifiedName
from mover.sql import ddl

Statement = Any  # sql.Composable, or (Composable, params) as mover/engines/swap/cutover.py executes them


def _statistics(cur: psycopg.Cursor, oid: int) -> list[tuple[str, list[str], str, int | None, str | None]]:
    """(name, kinds, column list, statistics target, comment) of a table's extended statistics."""
    return [(n, list(k), c, t, cm) for n, k, c, t, cm in reading.read(
        cur, "SELECT s.stxname, array(SELECT CASE k WHEN 'd' THEN 'ndistinct' WHEN 'f' THEN 'dependencies'"
             " WHEN 'm' THEN 'mcv' END FROM unnest(s.stxkind) k WHERE k <> 'e' ORDER BY 1),"
             " pg_get_statisticsobjdef_columns(s.oid), nullif(s.stxstattarget::int, -1),"
             " obj_description(s.oid, 'pg_statistic_ext')"
             " FROM pg_statistic_ext s WHERE s.stxrelid = %s ORDER BY 1", (oid,),
        missing=reading.printed(2, name=lambda r: f"statistics {names.display_ident(r[0])}"))]


def statistics_name(mid: int, name: str) -> str:
    """The new table's statistics object's name until the swap gives it the source's (then the
    old table's: per migration, like the deferred indexes' names, so a kept old table's do not
    collide with a later migration's)."""
    return names.derived(name, f"_m{mid}")


def create_sql(cur: psycopg.Cursor, source_oid: int, target: QualifiedName,
               changed_columns: dict[str, str], mid: int) -> list[Statement]:
    out: list[Statement] = []
    cur.execute("SELECT a.attname, nullif(a.attstattarget::int, -1), a.attstorage, t.typstorage,"
                " nullif(a.attcompression::text, '')"
                " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
                " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (source_oid,))
    columns = cur.fetchall()
    for column, stattarget, storage, type_storage, compression in columns:
        if stattarget is not None:
            out.append(ddl.set_column_statistics(target, column, stattarget))
        if column in changed_columns and (storage != type_storage or compression):
            cur.execute("SELECT typstorage FROM pg_type WHERE oid = to_regtype(%s)", (changed_columns[column],))
            row = cur.fetchone()
            if row is None or row[0] == "p":
                continue  # the new type is stored inline: nothing to carry (plan check says so)
            if storage != type_storage:
                out.append(ddl.set_storage(target, column, storage))
            if compression:
                out.append(ddl.set_compression(target, column, compression))
    for name, kinds, cols, stattarget, comment in _statistics(cur, source_oid):
        parked = QualifiedName(target.schema, statistics_name(mid, name))
        out.append(ddl.create_statistics(parked, kinds, cols, target))
        if stattarget is not None:
            out.append(ddl.set_statistics_target(parked, stattarget))
        if comment is not None:
            out.append(ddl.comment_on_statistics(parked, comment))
    cur.execute("SELECT l.provider, l.label, a.attname FROM pg_seclabel l"
                " LEFT JOIN pg_attribute a ON a.attrelid = l.objoid AND a.attnum = l.objsubid AND l.objsubid > 0"
                " WHERE l.classoid = 'pg_class'::regclass AND l.objoid = %s ORDER BY 3 NULLS FIRST, 1",
                (source_oid,))
    out += [ddl.security_label(provider, target, label, column) for provider, label, column in cur.fetchall()]
    return out


def swap_sql(cur: psycopg.Cursor, live: QualifiedName, other: QualifiedName) -> list[Statement]:
    """Under the swap's lock, before the renames: `other` takes from `live` what the application
    and replication see by table (replica identity, publications, statistics names)."""
    live_oid, other_oid = _oid(cur, live), _oid(cur, other)
    out: list[Statement] = []
    out += _replica_identity(cur, live_oid, other_oid, other)
    for pub, columns, row_filter, _ in reading.read(
            cur, "SELECT p.pubname, (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a"
                 " WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs::int2[])),"
                 " pg_get_expr(pr.prqual, pr.prrelid), pr.prqual IS NOT NULL"
                 " FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid"
                 " WHERE pr.prrelid = %s AND p.pubname !~ '^mover_m[0-9]+_' ORDER BY 1", (live_oid,),
            missing=lambda r: f"the row filter of publication {names.display_ident(r[0])}" if r[3] and r[2] is None
            else None):
        out += [ddl.publication_add(pub, other, columns, row_filter), ddl.publication_drop(pub, live)]
    out += _swap_statistics_names(cur, live_oid, other_oid)
    return out


def _oid(cur: psycopg.Cursor, table: QualifiedName) -> int:
    cur.execute("SELECT to_regclass(%s)::oid", (str(table),))
    row = cur.fetchone()
    assert row is not None and row[0] is not None, f"{table} exists under the swap's lock"
    return int(row[0])


def _replica_identity(cur: psycopg.Cursor, live_oid: int, other_oid: int, other: QualifiedName) -> list[Statement]:
    cur.execute("SELECT c.oid, c.relreplident, (SELECT ic.relname FROM pg_index i JOIN pg_class ic"
                " ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid AND i.indisreplident)"
                " FROM pg_class c WHERE c.oid = ANY(%s)", ([live_oid, other_oid],))
    got = {oid: (mode, index) for oid, mode, index in cur.fetchall()}
    mode, index = got[live_oid]
    if mode != "i":
        return [] if got[other_oid][0] == mode else [ddl.replica_identity(other, mode)]
    # The index of the other table built from the same definition (its name differs).
    descs = shape.describe(cur, [live_oid, other_oid])
    want = descs[live_oid]["indexes"][index]
    match = next((n for n, ix in sorted(descs[other_oid]["indexes"].items())
                  if (ix["definition"], ix["unique"]) == (want["definition"], want["unique"])), None)
    if match is None or got[other_oid] == ("i", match):
        return []  # no such index: parity reports the difference, and the swap refuses it
    return [ddl.replica_identity(other, "i", match)]


def _swap_statistics_names(cur: psycopg.Cursor, live_oid: int, other_oid: int) -> list[Statement]:
    """Extended statistics matched by definition exchange names (through a parking name, as
    sequences do in mover/engines/swap/cutover.py): statements and tools that name them keep working."""
    rows = reading.read(
        cur, "SELECT s.stxrelid, n.nspname, s.stxname, pg_get_statisticsobjdef_columns(s.oid), s.stxkind::text"
             " FROM pg_statistic_ext s JOIN pg_namespace n ON n.oid = s.stxnamespace"
             " WHERE s.stxrelid = ANY(%s) ORDER BY 3", ([live_oid, other_oid],),
        missing=reading.printed(3, name=lambda r: f"statistics {QualifiedName(r[1], r[2])}"))
    others = {(cols, kinds): QualifiedName(ns, name) for rel, ns, name, cols, kinds in rows if rel == other_oid}
    out: list[Statement] = []
    for rel, ns, name, cols, kinds in rows:
        if rel != live_oid:
            continue
        mine, theirs = QualifiedName(ns, name), others.pop((cols, kinds), None)
        if theirs is None or theirs.name == name or theirs.schema != ns:
            continue
        parking = QualifiedName(ns, names.derived(name, "_mover_swap"))
        out += [ddl.rename_statistics(mine, parking.name), ddl.rename_statistics(theirs, name),
                ddl.rename_statistics(parking, theirs.name)]
    return out


def plan_notes(cur: psycopg.Cursor, source_oid: int, changed_columns: dict[str, str],
               partitioned: bool) -> dict[str, list[str]]:
    """For `plan check`: what is carried when, and what cannot be (the operator decides, recorded
    in the plan as [cutover] accept_parity)."""
    at_create: list[str] = []
    at_swap: list[str] = []
    not_carried: list[str] = []
    cur.execute("SELECT a.attname, nullif(a.attstattarget::int, -1), a.attstorage <> t.typstorage,"
                " a.attcompression::text <> ''"
                " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
                " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (source_oid,))
    for column, stattarget, storage, compression in cur.fetchall():
        col = names.display_ident(column)
        if stattarget is not None:
            at_create.append(f"statistics target {stattarget} of column {col}")
        if not (storage or compression):
            continue
        what = " and ".join(w for w, on in (("storage", storage), ("compression", compression)) if on)
        if column in changed_columns:
            cur.execute("SELECT typstorage FROM pg_type WHERE oid = to_regtype(%s)", (changed_columns[column],))
            row = cur.fetchone()
            if row is None or row[0] == "p":
                not_carried.append(f"the {what} setting of column {col}: its new type "
                                   f"{changed_columns[column]} is stored inline (planned with the type change)")
                continue
        at_create.append(f"the {what} setting of column {col}")
    for name, _, cols, stattarget, _ in _statistics(cur, source_oid):
        at_create.append(f"extended statistics {names.display_ident(name)} on {cols}"
                         + (f" (target {stattarget})" if stattarget is not None else "")
                         + "; its name at the swap")
    cur.execute("SELECT l.provider, count(*) FROM pg_seclabel l WHERE l.classoid = 'pg_class'::regclass"
                " AND l.objoid = %s GROUP BY 1 ORDER BY 1", (source_oid,))
    at_create += [f"{n} security labels of provider {p} (the provider must be loaded)" for p, n in cur.fetchall()]
    cur.execute("SELECT c.relreplident, (SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
                " WHERE i.indrelid = c.oid AND i.indisreplident) FROM pg_class c WHERE c.oid = %s", (source_oid,))
    row = cur.fetchone()
    assert row is not None
    mode, index = row
    if mode == "i" and partitioned:
        not_carried.append(f"replica identity USING INDEX {names.display_ident(index)}: the partitioned target's"
                           f" key holds the partition columns")
    elif mode != "d":
        at_swap.append("replica identity " + (f"USING INDEX {names.display_ident(index)} (the new table's copy)"
                                              if mode == "i" else ddl.REPLICA_IDENTITY[mode]))
    cur.execute("SELECT p.pubname, p.pubviaroot, (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a"
                " WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs::int2[]))"
                " FROM pg_publication_rel pr JOIN pg_publication p"
                " ON p.oid = pr.prpubid WHERE pr.prrelid = %s AND p.pubname !~ '^mover_m[0-9]+_' ORDER BY 1",
                (source_oid,))
    for pub, via_root, published in cur.fetchall():
        at_swap.append(f"membership of publication {names.display_ident(pub)} (with its column list and row"
                       f" filter; the old table leaves it)")
        for column, new_type in changed_columns.items():
            if published is None or column in published:
                # A subscriber applies the values as text into its own column type.
                at_swap.append(f"subscribers of publication {names.display_ident(pub)} receive column"
                               f" {names.display_ident(column)} as {new_type}: change its type on each subscriber"
                               f" before the cutover, or their apply stops on the first value the old type cannot hold")
        if partitioned and not via_root:
            # Subscribers would receive the partitions' names, which they do not have.
            not_carried.append(f"the table name in publication {names.display_ident(pub)}: without"
                               f" publish_via_partition_root its changes are published as the partitions'")
    return {"at_create_target": at_create, "at_swap": at_swap, "not_carried": not_carried}


def publications_not_owned(cur: psycopg.Cursor, source_oid: int) -> list[tuple[str, str]]:
    """(publication, owner) the table belongs to that the current role cannot alter."""
    cur.execute("SELECT p.pubname, pg_get_userbyid(p.pubowner) FROM pg_publication_rel pr"
                " JOIN pg_publication p ON p.oid = pr.prpubid WHERE pr.prrelid = %s"
                " AND p.pubname !~ '^mover_m[0-9]+_' AND NOT pg_has_role(current_user, p.pubowner, 'USAGE')"
                " AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) ORDER BY 1", (source_oid,))
    return [(p, o) for p, o in cur.fetchall()]
