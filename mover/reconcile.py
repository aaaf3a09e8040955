"""Reconcile engine: compare the original and the new table completely, range by range.

Invariants:
- Each range of both tables, and the change log, are read by one statement: one snapshot, so a
  concurrent write cannot make equal tables look different (no false positives).
- A key that differs while a change to it is still pending in the log is re-checked after the
  applier has caught up; only a difference that persists is recorded as a divergence.
- Ranges done are recorded (chunks of kind 'reconcile') with their divergences in the same
  transaction, so a crashed reconcile resumes after the last range it finished.
"""

from __future__ import annotations

import logging
import time

from mover import capture, control, faults, names
from mover.context import Context
from mover.sql import compare as q
from mover.sql import copy as copy_sql

log = logging.getLogger("mover.reconcile")

KIND = "reconcile"
RANGE_ROWS = 50_000
SETTLE_ROUNDS = 20


def run(ctx: Context) -> int:
    """Compare everything; return the number of open divergences."""
    capture.drain(ctx, reverse=False, backfill_done=True)

    def start_pass(cur):
        last = control.last_chunk(cur, ctx.mid, KIND)
        if last is None or last[2] is None:
            # A new pass: earlier findings are superseded by what this one finds.
            control.clear_chunks(cur, ctx.mid, KIND)
            cur.execute("UPDATE mover.divergences SET resolved_at = now(), resolution = 'superseded by a new pass'"
                        " WHERE migration_id = %s AND resolved_at IS NULL AND kind <> 'apply_error'", (ctx.mid,))
            return 1, None
        return last[0] + 1, last[2]

    chunk_no, lo = ctx.db.transaction(start_pass)
    log_table = names.change_log(ctx.mid)
    unsettled = 0
    while True:
        ctx.checkpoint()
        for round_no in range(SETTLE_ROUNDS):
            final = round_no == SETTLE_ROUNDS - 1

            def one_range(cur):
                control.guard(cur, ctx.mid, "reconcile", ctx.owner)
                m = ctx.mapping(cur)
                started = time.monotonic()
                stmt, params = copy_sql.next_bound(m, lo)
                cur.execute(stmt, [*params, RANGE_ROWS - 1])
                row = cur.fetchone()
                hi = list(row) if row else None
                stmt, params = q.compare_range(m, log_table, lo, hi)
                cur.execute(stmt, params)
                diffs = cur.fetchall()
                pending = [d for d in diffs if d[3]]
                if pending and not final:
                    return ("retry", len(pending))
                for key, kind, columns, is_pending in diffs:
                    if not is_pending:
                        control.record_divergence(cur, ctx.mid, key, kind, columns)
                control.record_chunk(cur, ctx.mid, KIND, chunk_no, lo, hi, len(diffs) - len(pending),
                                     (time.monotonic() - started) * 1000, ctx.owner)
                return ("done", hi, len(pending))

            result = ctx.db.transaction(one_range, statement_timeout="300s", label="reconcile range")
            if result[0] == "retry":
                capture.drain(ctx, reverse=False, backfill_done=True)
                continue
            _, hi, still_pending = result
            unsettled += still_pending
            break
        faults.point(f"reconcile_range:{chunk_no}")
        ctx.report("reconcile", chunk=chunk_no)
        if hi is None:
            break
        chunk_no, lo = chunk_no + 1, hi
    if unsettled:
        # Keys written on every round: capture keeps them in sync and the cutover drains them
        # under its lock; they were never seen equal-and-quiet, so say so.
        ctx.db.transaction(lambda cur: control.event(cur, ctx.mid, ctx.owner, "reconcile", "unsettled",
                                                     f"{unsettled} keys kept changing during reconcile"))
    return ctx.db.transaction(lambda cur: control.open_divergences(cur, ctx.mid))
