"""pg_terminate_backend of mover's connections (orchestrator, backfill and reconcile workers,
heartbeat) in the middle of a step, with a writer running: mover retries the whole transaction on
a new connection (or a rerun resumes), and nothing is lost -- judged by EXCEPT ALL both ways."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from tests.e2e.test_crash_resume import PLAN
from tests.workload import Writer, assert_oracle, create_orders, finish, mover, spawn, write_plan

ALL = ("mover", "mover-worker", "mover-applier", "mover-reconcile", "mover-heartbeat")


@pytest.fixture
def orders(db_dsn, tmp_path):
    create_orders(db_dsn, 6_000)
    return write_plan(tmp_path / "crashy.toml", PLAN)


def status(dsn):
    r = mover(dsn, "status", "crashy", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def mover_backends(conn, pid: int) -> dict[str, list[int]]:
    """The server processes of mover process `pid`'s connections, by kind (application_name is
    kind:host:pid, see mover/db.py)."""
    out: dict[str, list[int]] = {}
    for app, backend in conn.execute("SELECT application_name, pid FROM pg_stat_activity"
                                     " WHERE application_name LIKE %s", (f"%:{pid}",)).fetchall():
        out.setdefault(app.split(":", 1)[0], []).append(backend)
    return out


def terminate(dsn: str, pid: int, kinds: tuple[str, ...], must: tuple[str, ...]) -> list[str]:
    """Terminate the backends of the given kinds; first wait (bounded) until those in `must`
    exist -- the heartbeat connects on its first beat, a few seconds in."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while True:
            found = mover_backends(conn, pid)
            if all(k in found for k in must):
                break
            assert time.monotonic() < deadline, f"mover's connections {must} never appeared: {found}"
            time.sleep(0.05)
        killed = []
        for kind in kinds:
            for backend in found.get(kind, []):
                if conn.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchone()[0]:
                    killed.append(kind)
    return killed


def hang_terminate_release(dsn, tmp_path, args, point, kinds, must):
    release = tmp_path / f"release-{point.replace(':', '_')}"
    proc = spawn(dsn, *args, env={"MOVER_FAULT": f"hang@{point}", "MOVER_FAULT_RELEASE": str(release)})
    try:
        seen = []
        while not seen or f"hanging at {point}" not in seen[-1]:  # progress lines come first
            line = proc.stderr.readline()
            assert line, "".join(seen)
            seen.append(line)
        killed = terminate(dsn, proc.pid, kinds, must)
        assert set(must) <= set(killed), killed
        release.touch()
        return finish(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
            finish(proc, 60)


@pytest.mark.parametrize("point, kinds, must", [
    ("range_copied:3", ("mover-worker",), ("mover-worker",)),  # a worker inside its copy transaction
    # every connection, between ranges
    ("backfill_range:2", ALL, ("mover", "mover-worker", "mover-applier", "mover-heartbeat")),
    ("reconcile_compared:1", ALL, ("mover-heartbeat",)),  # inside a reconcile range's transaction
])
def test_terminated_backends_before_cutover_lose_nothing(db_dsn, orders, tmp_path, point, kinds, must):
    writer = Writer(db_dsn, seed=41).start()
    try:
        code, err = hang_terminate_release(db_dsn, tmp_path, ("run", orders), point, kinds, must)
        if code != 3:  # a retry budget spent: the rerun resumes
            assert code == 1, err
            r = mover(db_dsn, "run", "crashy")
            assert r.returncode == 3, r.stderr
        st = status(db_dsn)
        assert (st["step"], st["divergences"]) == ("cutover", 0)
        writer.pause()
        r = mover(db_dsn, "run", "crashy")
        assert r.returncode == 3, r.stderr
        assert_oracle(db_dsn, "Orders", "Orders_new")
    finally:
        writer.halt()
    assert writer.errors == []


def test_terminated_backends_inside_cutover_and_rollback_lose_nothing(db_dsn, orders, tmp_path):
    writer = Writer(db_dsn, seed=42).start()
    try:
        assert mover(db_dsn, "run", orders).returncode == 3
        # The orchestrator holds the swap's locks when its backend is terminated: the transaction is
        # gone (nothing swapped), and the retry swaps on a new connection.
        code, err = hang_terminate_release(db_dsn, tmp_path, ("cutover", "crashy"), "swap:locked", ALL, ("mover",))
        if code != 0:
            assert code == 1, err
            r = mover(db_dsn, "cutover", "crashy")
            assert r.returncode == 0, r.stderr
        assert status(db_dsn)["step"] == "rollback_window"
        writer.pause()
        assert mover(db_dsn, "run", "crashy").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_old")
        writer.resume()
        code, err = hang_terminate_release(db_dsn, tmp_path, ("rollback", "crashy"), "swap_back:locked", ALL,
                                           ("mover",))
        if code != 0:
            assert code == 1, err
            r = mover(db_dsn, "rollback", "crashy")
            assert r.returncode == 0, r.stderr
        writer.pause()
        r = mover(db_dsn, "run", "crashy")
        assert r.returncode == 3, r.stderr
        assert_oracle(db_dsn, "Orders", "Orders_new")
        assert status(db_dsn)["error"] is None or "ready for cutover" in status(db_dsn)["error"]
    finally:
        writer.halt()
    assert writer.errors == []
