"""Progress samples (mover/runner/sampler.py records them, mover/state/samples.py reads them): what
one records, that a run leaves some, and that a sample that fails inside the heartbeat's
transaction leaves that transaction usable (a savepoint), so the lease is still extended. And the
lock waits `mover watch` names, either way round."""

from __future__ import annotations

import logging
import threading
import time

import psycopg

from mover import api
from mover.db import Database, bind
from mover.runner import sampler
from mover.state import control, samples
from mover.views import report, status, watch
from tests.workload import create_orders, plan_text, write_plan

PLAN = plan_text("orders_sampled", columns={"id": "bigint"})

FIELDS = {"at", "step", "backfill_rows", "reconcile_rows", "pending_forward", "lag_forward", "pending_reverse",
          "lag_reverse", "workers", "range_rows", "waiting_for", "lock_waits"}


def test_a_run_records_samples_and_a_failed_sample_costs_nothing_else(db_dsn, tmp_path, caplog):
    create_orders(db_dsn, 2_000)
    plan = write_plan(tmp_path / "p.toml", PLAN)
    api.run(db_dsn, plan, one_step=True)  # create_target: one short run, a sample at its start and end
    with psycopg.connect(db_dsn) as conn:
        cur = conn.cursor()
        m = control.get(cur, "orders_sampled")
        before = samples.read(cur, m.id)
        assert len(before) == 2 and set(before[-1]) == FIELDS, before
        assert before[-1]["backfill_rows"] == 0 and before[-1]["waiting_for"] == []
        owner = control.new_owner_id()
        control.acquire_lease(cur, m, owner)

        sample = sampler.Sampler(m.id, owner)
        cur.execute("ALTER TABLE mover.workers RENAME TO workers_elsewhere")  # the sample's read fails
        with caplog.at_level(logging.WARNING, logger="mover.samples"):
            sample(cur)
        assert "could not record a progress sample" in caplog.text and "UndefinedTable" in caplog.text
        assert control.heartbeat(cur, m.id, owner)  # the transaction goes on: the beat commits
        assert len(samples.read(cur, m.id)) == 2  # and nothing of the failed sample is left
        cur.execute("ALTER TABLE mover.workers_elsewhere RENAME TO workers")

        assert not sample.due()  # tried just now: the next beat, not this one
        sample(cur, force=True)
        after = samples.read(cur, m.id)
        assert len(after) == 3 and after[-1]["step"] == "install_capture"
        conn.commit()

    # Samples chart; the story `mover events` tells leaves them out.
    assert "sample" not in {e["kind"] for e in api.events(db_dsn, "orders_sampled", 1000)}


def _waiting_pid(dsn: str, app: str) -> int:
    """The pid of the session named `app` once it waits for a lock (asked of the server until then)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(600):
            row = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                               " AND wait_event_type = 'Lock'", (app,)).fetchone()
            if row:
                return row[0]
            time.sleep(0.05)
    raise AssertionError(f"{app} never waited for a lock")


def test_watch_names_lock_waits_either_way(db_dsn, tmp_path):
    create_orders(db_dsn, 500)
    api.run(db_dsn, write_plan(tmp_path / "p.toml", PLAN), one_step=True)
    db = Database(db_dsn)
    try:
        for holder_name, waiter_name in (("app-holder", "mover-cutover-test:h:1"),
                                         ("mover-cutover-test:h:1", "app-waiter")):
            with psycopg.connect(db_dsn, application_name=holder_name) as holder:
                holder.execute('LOCK TABLE "Orders" IN ACCESS EXCLUSIVE MODE')
                holder_pid = holder.info.backend_pid
                waiter = threading.Thread(target=_read_orders, args=(db_dsn, waiter_name))
                waiter.start()
                pid = _waiting_pid(db_dsn, waiter_name)
                snap = db.transaction(bind(watch.snapshot, "orders_sampled"))
                (w,) = [w for w in snap["lock_waits"] if w["pid"] == pid]
                assert w["blocked_by"] == [holder.info.backend_pid] and w["mover"] == waiter_name.startswith("mover")
                assert f"behind pid {holder.info.backend_pid}" in watch.line(snap)
                mid = db.transaction(lambda cur: control.get(cur, "orders_sampled").id)
                db.transaction(lambda cur, mid=mid: sampler.record(cur, mid, "test"))  # the report keeps it
                holder.rollback()
                waiter.join(30)
                assert not waiter.is_alive()
            assert db.transaction(status.lock_waits) == []
            page = report.render_html(api.report(db_dsn, "orders_sampled"))
            assert f"(pid {pid}) behind pid {holder_pid}" in page.split('id="locks"')[1]
    finally:
        db.close()


def _read_orders(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, application_name=name, autocommit=True) as conn:
        conn.execute('SELECT count(*) FROM "Orders"')
