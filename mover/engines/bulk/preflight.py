"""What the backfill will cost, before it starts, for `mover plan check` to print beside the free
space the operator knows of: what the new table and its indexes take and the WAL the copy and the
index builds write (preflight), and whether that WAL finds segment files ready (wal_segments).

Invariants:
- Read-only, in the caller's transaction: the source's size and statistics, the plan's type
  changes, the server's WAL settings and pg_wal's listing. pg_ls_waldir() needs pg_monitor:
  without it, how many segments lie ahead is said to be unknown (None), never guessed.
- Estimates, not measurements: the source's dead rows left out (the copy is compact), widened by
  the plan's fixed-length type changes, with the WAL per byte measured in bench/README.md.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from mover import names
from mover.catalog import introspect
from mover.db import one
from mover.engines.governor import pacing

# The WAL a backfill writes, per byte of what it builds (bench/README.md, the profile of the
# narrow table: the copy wrote 1.8x the heap with its key index; a plain index build logs the
# index whole, before wal_compression).
WAL_PER_HEAP_BYTE = 1.3
WAL_PER_KEY_INDEX_BYTE = 2.5


def preflight(cur: psycopg.Cursor, source: names.QualifiedName, columns: dict[str, str]) -> dict[str, Any]:
    """What the target and its indexes will take and the WAL the backfill will write, estimated
    from the source's size (its dead rows left out: the copy is compact) and the plan's type
    changes, for `mover plan check` to print beside the free space the operator knows of."""
    # Over the leaves: a partitioned table's rows and indexes are its partitions'.
    cur.execute(sql.SQL("SELECT to_regclass(%(t)s)::oid, coalesce(sum(pg_table_size(c.oid)), 0)::bigint,"
                        " coalesce(sum(pg_indexes_size(c.oid)), 0)::bigint,"
                        " coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint,"
                        " coalesce(sum(s.n_live_tup), 0)::bigint, coalesce(sum(s.n_dead_tup), 0)::bigint"
                        " FROM ({leaves}) t JOIN pg_class c ON c.oid = t.relid"
                        " LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid").format(leaves=introspect.LEAVES),
                {"t": str(source)})
    oid, table_bytes, index_bytes, rows, live, dead = one(cur)
    live_share = live / (live + dead) if live + dead else 1.0
    info = introspect.describe(cur, source)
    cur.execute(sql.SQL("SELECT coalesce(sum(pg_relation_size(t.relid)), 0)::bigint FROM ({leaves}) t").format(
        leaves=introspect.LEAVES), {"t": str(names.QualifiedName(source.schema, info.key_index))})
    key_bytes = int(one(cur)[0])
    widened = 0
    for col, new_type in columns.items():
        cur.execute("SELECT (SELECT typlen FROM pg_type WHERE oid = a.atttypid), (SELECT typlen FROM pg_type"
                    " WHERE oid = to_regtype(%s)) FROM pg_attribute a WHERE a.attrelid = %s AND a.attname = %s",
                    (new_type, oid, col))
        got = cur.fetchone()
        if got and got[0] and got[1] and got[0] > 0 and got[1] > 0:
            widened += (got[1] - got[0]) * int(rows)
    heap = max(0, int(table_bytes * live_share) + widened)
    indexes = int(index_bytes * live_share)
    wal_copy = int(heap * WAL_PER_HEAP_BYTE + key_bytes * live_share * WAL_PER_KEY_INDEX_BYTE)
    wal_builds = max(0, indexes - int(key_bytes * live_share))
    h = pacing.human_bytes
    lines = [
        f"the target will take about {h(heap + indexes)}: {h(heap)} of rows ({int(rows):,} estimated; the source "
        f"takes {h(table_bytes)}, {1 - live_share:.0%} of its rows dead) and {h(indexes)} of indexes",
        f"the backfill writes about {h(wal_copy + wal_builds)} of WAL: {h(wal_copy)} copying (each row and its key "
        f"index entry), {h(wal_builds)} building the other indexes (less with wal_compression); the change log "
        f"adds what the application writes meanwhile",
        "compare with the free space where the data directory and pg_wal live: that WAL stays until a checkpoint, "
        "the archiver and every replication slot are done with it",
    ]
    return {"rows": int(rows), "target_bytes": heap + indexes, "heap_bytes": heap, "index_bytes": indexes,
            "wal_bytes": wal_copy + wal_builds, "lines": lines}


def wal_segments(cur: psycopg.Cursor, wal_bytes: int) -> dict[str, Any]:
    """Whether the backfill's WAL finds segment files ready: a segment that is not (recycled at a
    checkpoint, up to min_wal_size) is a new file, written out whole when wal_init_zero is on by
    the backend that needs it while it holds WALWriteLock, and every commit of the application
    waits meanwhile (bench/README.md, "WAL segments ready ahead": with them the copy's p99 had a
    median of 85 ms over six runs, 144 ms without). pg_ls_waldir() needs pg_monitor: without it,
    what lies ahead is not known."""
    cur.execute("SELECT pg_size_bytes(current_setting('wal_segment_size')),"
                " pg_size_bytes(current_setting('min_wal_size')), current_setting('wal_recycle')::bool,"
                " current_setting('wal_init_zero')::bool, has_function_privilege('pg_ls_waldir()', 'EXECUTE')"
                " AND NOT pg_is_in_recovery()")
    segment, keep, recycle, zero, readable = one(cur)
    ahead = None
    if readable:
        cur.execute("SELECT count(*) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'"
                    " AND name > pg_walfile_name(pg_current_wal_insert_lsn())")
        ahead = int(one(cur)[0])
    needed = -(-wal_bytes // segment)
    h = pacing.human_bytes
    made = ("each written out whole (wal_init_zero) while the application's commits wait" if zero
            else "each made while the application's commits wait")
    if not recycle:
        line = (f"WAL segments: this server recycles none (wal_recycle = off): each of the backfill's {needed:,} is a "
                f"new file, {made}")
    elif ahead is not None and ahead >= needed:
        line = f"WAL segments: {ahead:,} ready for reuse in pg_wal, enough for the backfill's {needed:,}"
    else:
        held = (f"{ahead:,} ready for reuse in pg_wal" if ahead is not None
                else "how many pg_wal holds ready for reuse is not readable (pg_ls_waldir needs pg_monitor)")
        line = (f"WAL segments: {held}; the backfill's WAL needs about {needed:,}: the others are new files, {made}"
                + (f"; a min_wal_size of at least {h(wal_bytes)} (now {h(keep)}) keeps them for reuse once made"
                   if keep < wal_bytes else "")
                + " (docs/operating.md, \"WAL segments\")")
    return {"wal_segments_needed": needed, "wal_segments_ahead": ahead, "line": line}
