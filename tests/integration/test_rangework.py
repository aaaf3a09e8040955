"""Threads that fail (mover/threads.py, mover/engines/bulk/rangework.py): an error in a backfill
worker thread, in the applier beside the workers, or in a heartbeat's beat reaches the
orchestrator and fails the step with that error, never vanishes, and never passes for a stop the
operator asked for; the step is resumable afterwards."""

from __future__ import annotations

import threading

import pytest

from mover import api
from mover.engines.capture import changelog
from mover.state import ranges
from mover.state.heartbeat import Heartbeat
from tests.workload import create_orders, differences, write_plan

PLAN = """
[migration]
name = "threads"
source = 'public."Orders"'

[target]
columns = { id = "bigint" }

[backfill]
range_rows = 100
workers = 2

[rollback]
window = "1h"
"""


@pytest.fixture
def at_backfill(db_dsn, tmp_path):
    create_orders(db_dsn, 2_000)
    plan = write_plan(tmp_path / "p.toml", PLAN)
    for _ in ("create_target", "install_capture"):
        api.run(db_dsn, plan, one_step=True)
    assert api.status(db_dsn, "threads")["step"] == "backfill"
    return plan


def _failed_with(dsn: str, text: str) -> None:
    st = api.status(dsn, "threads")
    assert st["state"] == "failed" and text in (st["error"] or ""), st


def _resumes(dsn: str) -> None:
    api.run(dsn, "threads", one_step=True)
    assert api.status(dsn, "threads")["step"] == "reconcile"
    assert differences(dsn, "Orders", "Orders_new") == (0, 0)


def test_a_worker_threads_error_fails_the_backfill_with_that_error(db_dsn, at_backfill, monkeypatch):
    original = ranges.work
    broke = threading.Event()

    def work(*args, **kwargs):
        if threading.current_thread().name == "mover-worker-1":
            broke.set()
            raise RuntimeError("worker 1 broke")
        assert broke.wait(60)  # worker 0, in the step's thread, copies only once worker 1 has failed
        return original(*args, **kwargs)

    monkeypatch.setattr(ranges, "work", work)
    # Worker 0 then stops at its next safe point (Interrupted): what fails the step is worker 1's
    # error, not a stop nobody asked for.
    with pytest.raises(RuntimeError, match="worker 1 broke"):
        api.run(db_dsn, "threads", one_step=True)
    _failed_with(db_dsn, "worker 1 broke")
    monkeypatch.setattr(ranges, "work", original)
    _resumes(db_dsn)


def test_an_applier_error_fails_the_backfill_with_that_error(db_dsn, at_backfill, monkeypatch):
    drain, work = changelog.drain, ranges.work
    broke = threading.Event()

    def failing_drain(*args, **kwargs):
        if threading.current_thread().name == "mover-applier":
            broke.set()
            raise RuntimeError("applier broke")
        return drain(*args, **kwargs)

    def late_work(*args, **kwargs):
        assert broke.wait(60)  # no range is copied before the applier has failed
        return work(*args, **kwargs)

    monkeypatch.setattr(changelog, "drain", failing_drain)
    monkeypatch.setattr(ranges, "work", late_work)
    with pytest.raises(RuntimeError, match="applier broke"):
        api.run(db_dsn, "threads", one_step=True)
    _failed_with(db_dsn, "applier broke")
    monkeypatch.setattr(changelog, "drain", drain)
    monkeypatch.setattr(ranges, "work", work)
    _resumes(db_dsn)


def test_a_beat_that_raises_stops_the_workers_and_stop_raises_it(db_dsn):
    lost, stop = threading.Event(), threading.Event()

    def beat(cur):
        cur.execute("SELECT 1")
        raise ValueError("a bug in the beat")

    hb = Heartbeat(db_dsn, beat, lost, stop, interval=0.01, name="test")
    hb.start()
    try:
        assert lost.wait(30) and stop.is_set()  # the lease is not kept: the workers stop without writing
    finally:
        with pytest.raises(ValueError, match="a bug in the beat"):
            hb.stop()


def test_a_beat_that_meets_a_database_error_goes_on_beating(db_dsn):
    lost = threading.Event()
    calls = []
    beaten = threading.Event()

    def beat(cur):
        calls.append(1)
        if len(calls) == 1:
            cur.execute("SELECT 1/0")  # a database error: said, and retried at the next beat
        beaten.set()
        return True

    hb = Heartbeat(db_dsn, beat, lost, interval=0.01, name="test")
    hb.start()
    try:
        assert beaten.wait(30)
    finally:
        hb.stop()
    assert not lost.is_set() and len(calls) >= 2
