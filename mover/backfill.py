"""Backfill engine: copy the original table into the new one in bounded key ranges.

Invariants:
- Each chunk is one transaction: find the range's upper bound, copy the range with one
  INSERT ... SELECT, and record the chunk done. A crash loses both or neither, which is also
  why these transactions may commit with synchronous_commit = off.
- The chunk's done mark is written under the orchestrator's lease (FOR SHARE on the
  migration row): a process that lost its lease cannot commit a chunk (race 6).
- Chunks advance a watermark through the key; capture replays only keys at or below it.
- The last chunk is open-ended, so keys inserted above the original maximum are copied too.
- Secondary indexes are built after the copy, with CREATE INDEX CONCURRENTLY; an invalid index
  left by a crash is dropped and rebuilt on resume.
"""

from __future__ import annotations

import logging
import time

from mover import capture, control, faults, introspect, names
from mover.context import Context
from mover.sql import copy as q
from mover.sql import ddl

log = logging.getLogger("mover.backfill")

KIND = "backfill"


def is_copied(cur, mid: int) -> bool:
    last = control.last_chunk(cur, mid, KIND)
    return last is not None and last[2] is None


def copy_all(ctx: Context) -> None:
    chunk_rows = ctx.plan.backfill.chunk_rows
    estimate = ctx.db.transaction(lambda cur: _estimate_rows(cur, ctx.original))
    while True:
        ctx.checkpoint()

        def one_chunk(cur):
            control.guard(cur, ctx.mid, "backfill", ctx.owner)
            last = control.last_chunk(cur, ctx.mid, KIND)
            if last is not None and last[2] is None:
                return None  # the open-ended last chunk is done: everything is copied
            chunk_no, lo = (last[0] + 1, last[2]) if last else (1, None)
            m = ctx.mapping(cur)
            started = time.monotonic()
            stmt, params = q.next_bound(m, lo)
            cur.execute(stmt, [*params, chunk_rows - 1])
            row = cur.fetchone()
            hi = list(row) if row else None
            stmt, params = q.copy_range(m, lo, hi)
            cur.execute(stmt, params)
            copied = cur.rowcount
            faults.point(f"chunk_copied:{chunk_no}")  # inside the transaction: a crash here loses the copy
            ms = (time.monotonic() - started) * 1000
            control.record_chunk(cur, ctx.mid, KIND, chunk_no, lo, hi, copied, ms, ctx.owner)
            return chunk_no, copied, ms

        done = ctx.db.transaction(one_chunk, synchronous_commit=False, statement_timeout="300s", label="chunk")
        if done is None:
            break
        faults.point(f"chunk:{done[0]}")
        # Keep capture close behind the copy, so the log stays short.
        capture.drain(ctx, reverse=False, backfill_done=False, max_rounds=1)
        rows, chunks, _ = ctx.db.transaction(lambda cur: control.chunk_totals(cur, ctx.mid, KIND))
        ctx.report("backfill", rows=rows, chunks=chunks, estimate=estimate, chunk_ms=round(done[2], 1))


def _estimate_rows(cur, table) -> int:
    cur.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass(%s)", (str(table),))
    row = cur.fetchone()
    return int(row[0]) if row else 0


def deferred_index_name(mid: int, source_index: str) -> str:
    return names.derived(source_index, f"_m{mid}")


def deferred_indexes(cur, ctx: Context):
    """(name in the new table, source index) for every index still to build."""
    original = introspect.describe(cur, ctx.original)
    return [(deferred_index_name(ctx.mid, ix.name), ix) for ix in original.indexes
            if ix.name != original.key_index]


def build_indexes(ctx: Context) -> None:
    schema = ctx.new.schema
    todo = ctx.db.transaction(lambda cur: deferred_indexes(cur, ctx))
    for name, ix in todo:
        ctx.checkpoint()
        state = ctx.db.transaction(lambda cur: introspect.index_state(cur, schema, name))
        if state is True:
            continue
        if state is False:
            log.warning("index %s.%s is invalid (a build was interrupted); rebuilding", schema, name)
            ctx.db.autocommit(ddl.drop_index(schema, name), lock_timeout="10s")
        started = time.monotonic()
        ctx.report("index", name=name, state="building")
        # Not a transaction (CONCURRENTLY): the catalog says on resume whether it finished.
        ctx.db.autocommit(ddl.create_index(name, ctx.new, ix, concurrently=True),
                          statement_timeout="0", lock_timeout="10min")
        faults.point("index_built")
        ms = (time.monotonic() - started) * 1000
        ctx.db.transaction(lambda cur: control.event(cur, ctx.mid, ctx.owner, "backfill", "index_built",
                                                     f"index {name} built", {"source_index": ix.name}, ms))
