"""Helper workers (`mover worker NAME`): range workers in a process of their own, on any host,
that take ranges beside the orchestrator's (invariant 5: claimed with FOR UPDATE SKIP LOCKED
under an expiring lease, mover/state/ranges.py), first the backfill's, then those of a reconcile
pass the orchestrator started. A helper holds no lease of the migration's own: a heartbeat keeps
its ranges' leases, and losing one shows when the range commits (race 6)."""

from __future__ import annotations

import threading

import psycopg

from mover.db import Database, bind
from mover.engines.bulk import backfill as backfill_engine
from mover.engines.bulk import rangework
from mover.engines.bulk import reconcile as reconcile_engine
from mover.engines.context import Context, Reporter
from mover.engines.governor import throttle
from mover.state import control, ranges
from mover.state.heartbeat import Heartbeat

WAIT_SECONDS = 1.0  # between looks at a migration whose next range work has not begun


def work(db: Database, name: str, *, threads: int, report: Reporter, stop: threading.Event) -> None:
    """Help with the ranges of the backfill, then of a reconcile pass the orchestrator has started;
    return when there are none left to take (or the migration ended)."""
    served: set[tuple[int, str]] = set()
    while not stop.is_set():
        m = db.transaction(lambda cur: working_table(cur, control.get(cur, name)))
        if m.state in ("aborted", "failed", "done"):
            return
        if m.step in control.SETTING_UP:
            stop.wait(WAIT_SECONDS)  # the orchestrator has not reached the backfill yet
            continue
        if m.step not in control.HELPED:
            return
        kind = backfill_engine.KIND if m.step == "backfill" else reconcile_engine.KIND
        if (m.id, kind) in served:
            if kind == backfill_engine.KIND and db.transaction(bind(control.lease_live, m.id)):
                stop.wait(WAIT_SECONDS)  # the orchestrator builds the indexes; a reconcile pass comes next
                continue
            return
        if kind == reconcile_engine.KIND:
            st = db.transaction(bind(ranges.state, m.id, reconcile_engine.KIND))
            if m.step == "reconcile" and not st["started"] and db.transaction(bind(control.lease_live, m.id)):
                stop.wait(WAIT_SECONDS)  # the orchestrator has yet to start the first pass
                continue
            if st["exhausted"] and st["open"] == 0:
                return  # no pass is under way: nothing to help with
        served.add((m.id, kind))
        serve(db, m, kind, threads, report, stop)


def working_table(cur: psycopg.Cursor, m: control.Migration) -> control.Migration:
    """The table whose ranges a helper takes: the migration's; in a family (issue 27), whose tables
    take their turns, the first table at the family's step (the one its orchestrator works on)."""
    rows = control.family(cur, control.head_of(cur, m))
    order = [*control.STEPS, control.FINISHED]
    step = min((r.step for r in rows), key=order.index)
    return next(r for r in rows if r.step == step)


def serve(db: Database, m: control.Migration, kind: str, threads: int, report: Reporter,
          stop: threading.Event) -> None:
    """Run `threads` workers of one engine on this migration's ranges until none is left, under a
    heartbeat that keeps their ranges' leases (a worker holds no lease of the migration's own)."""
    lost = threading.Event()
    registry: set[str] = set()

    def keep(cur: psycopg.Cursor) -> bool:
        ranges.keep_leases(cur, m.id, sorted(registry))
        return True  # a worker's only lease is its ranges': losing one shows when it commits

    # The migration's governor, as published by the process that probes (the orchestrator): the
    # same budget and guards as its own engines; this process probes when nobody else does.
    ctx = Context(db=db, migration=m, owner=control.new_owner_id(), report=report, stop=stop, lease_lost=lost)
    with throttle.following(ctx) as governor:
        workers: list[rangework.RangeWorker]
        if kind == backfill_engine.KIND:
            workers = [backfill_engine.Worker(db.dsn, m, ranges.worker_id(i), stop=stop, lost=lost, registry=registry,
                                              report=report, n_workers=threads, governor=governor)
                       for i in range(threads)]
        else:
            spec = db.transaction(lambda cur: reconcile_engine.spec_for(
                cur, ctx.mapping(cur), fingerprints=ctx.plan.reconcile.fingerprints))
            result = reconcile_engine.PassResult("helper")
            workers = [reconcile_engine.Worker(db.dsn, m, ranges.worker_id(i), spec, result, stop=stop, lost=lost,
                                               registry=registry, report=report, n_workers=threads, governor=governor)
                       for i in range(threads)]
        beat = Heartbeat(db.dsn, keep, lost, name=f"worker-lease-{m.id}")
        beat.start()
        try:
            rangework.run_workers(workers, f"helper-{kind}")
        finally:
            beat.stop()
