"""kill -9 of mover at every step boundary and inside steps, then `mover run NAME` resumes and
ends with identical content; a second orchestrator is refused; a stalled one loses its lease."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess

import psycopg
import pytest

from tests.workload import Writer, create_orders, differences, finish, mover, spawn, write_plan

PLAN = """
[migration]
name = "crashy"
source = 'public."Orders"'

[target]
columns = { id = "bigint" }

[backfill]
chunk_rows = 1000
max_rows = 1000

[rollback]
window = "1h"
"""


@pytest.fixture
def orders(db_dsn, tmp_path):
    create_orders(db_dsn, 6_000)
    return write_plan(tmp_path / "crashy.toml", PLAN)


def status(dsn):
    r = mover(dsn, "status", "crashy", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def settle_and_compare(dsn, writer, live="Orders", other="Orders_new"):
    writer.pause()
    r = mover(dsn, "run", "crashy")
    assert r.returncode == 3, r.stderr
    assert differences(dsn, live, other) == (0, 0)


@pytest.mark.parametrize("point", [
    "after:create_target", "after:install_capture", "chunk:2", "chunk_copied:3", "index_built",
    "after:backfill", "reconcile_range:1", "after:reconcile",
])
def test_kill9_before_cutover_then_resume(db_dsn, orders, point):
    writer = Writer(db_dsn, seed=hash(point) % 1000).start()
    try:
        r = mover(db_dsn, "run", orders, env={"MOVER_FAULT": f"kill@{point}"})
        assert r.returncode == -signal.SIGKILL, r.stderr
        st = status(db_dsn)
        assert st["lease"] is not None  # the dead process still "holds" it...
        r = mover(db_dsn, "run", "crashy")  # ...and a new run on this host takes it over at once
        assert r.returncode == 3, r.stderr
        assert "ready for cutover" in r.stderr
        st = status(db_dsn)
        assert (st["step"], st["divergences"]) == ("cutover", 0)
        settle_and_compare(db_dsn, writer)
    finally:
        writer.halt()
    assert writer.errors == []


def test_kill9_inside_the_cutover_swap_changes_nothing(db_dsn, orders):
    writer = Writer(db_dsn, seed=11).start()
    try:
        assert mover(db_dsn, "run", orders).returncode == 3
        r = mover(db_dsn, "cutover", "crashy", env={"MOVER_FAULT": "kill@swap:locked"})
        assert r.returncode == -signal.SIGKILL
        st = status(db_dsn)
        assert st["step"] == "cutover" and st["cutover"] is None  # rolled back with the process
        r = mover(db_dsn, "cutover", "crashy")
        assert r.returncode == 0, r.stderr
        writer.pause()
        assert mover(db_dsn, "run", "crashy").returncode == 3  # window open: old table synced
        assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)
        writer.resume()
        r = mover(db_dsn, "rollback", "crashy", env={"MOVER_FAULT": "kill@swap_back:locked"})
        assert r.returncode == -signal.SIGKILL
        assert status(db_dsn)["step"] == "rollback_window"
        r = mover(db_dsn, "rollback", "crashy")
        assert r.returncode == 0, r.stderr
        settle_and_compare(db_dsn, writer)
    finally:
        writer.halt()
    assert writer.errors == []


def test_kill9_at_random_points_until_done(db_dsn, orders):
    rnd = random.Random(20261129)
    writer = Writer(db_dsn, seed=5).start()
    kills = 0
    try:
        for attempt in range(4):
            proc = spawn(db_dsn, "run", orders)  # the plan file: registration is idempotent
            try:
                # Three kills at random instants, then a run left to finish (however slow the machine).
                code, err = finish(proc, rnd.uniform(0.2, 1.0) if attempt < 3 else 300)
            except subprocess.TimeoutExpired:
                proc.kill()
                finish(proc, 60)
                kills += 1
                continue
            assert code == 3, err
            break
        else:
            pytest.fail("mover never reached the cutover gate")
        assert kills >= 1
        settle_and_compare(db_dsn, writer)
    finally:
        writer.halt()
    assert writer.errors == []


def test_second_orchestrator_is_refused_and_dead_one_is_taken_over(db_dsn, orders):
    first = spawn(db_dsn, "run", orders, env={"MOVER_FAULT": "hang@after:create_target"})
    try:
        assert "hanging at after:create_target" in first.stderr.readline()
        r = mover(db_dsn, "run", "crashy")
        assert r.returncode == 3
        assert f"pid {first.pid}" in r.stderr and "is being run by" in r.stderr
        r = mover(db_dsn, "abort", "crashy")
        assert r.returncode == 3  # operator commands respect the lease too
    finally:
        first.kill()
        finish(first, 60)
    r = mover(db_dsn, "run", "crashy")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr


def test_lease_of_another_host_waits_for_expiry(db_dsn, orders):
    assert mover(db_dsn, "step", orders).returncode == 0
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE mover.migrations SET lease_owner = 'elsewhere:1:x', lease_host = 'elsewhere',"
                     " lease_pid = 1, lease_expires_at = now() + interval '1 hour'")
    r = mover(db_dsn, "run", "crashy")
    assert r.returncode == 3 and "elsewhere" in r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE mover.migrations SET lease_expires_at = now() - interval '1 second'")
    r = mover(db_dsn, "run", "crashy")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr


def test_stalled_orchestrator_cannot_commit_after_takeover(db_dsn, orders, tmp_path):
    """Race 6: a process whose lease expired while it was stalled must not write afterwards."""
    writer = Writer(db_dsn, seed=9).start()
    release = tmp_path / "release"
    stalled = spawn(db_dsn, "run", orders, env={"MOVER_FAULT": "hang@chunk:2", "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert "hanging at chunk:2" in stalled.stderr.readline()
        os.kill(stalled.pid, signal.SIGSTOP)  # the whole process, heartbeat included
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("UPDATE mover.migrations SET lease_expires_at = now() - interval '1 second'")
        r = mover(db_dsn, "run", "crashy")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        os.kill(stalled.pid, signal.SIGCONT)
        release.touch()
        code, err = finish(stalled, 120)
        assert code == 1 and "lost the lease" in err, err
        st = status(db_dsn)
        assert (st["step"], st["state"]) == ("cutover", "waiting")
        settle_and_compare(db_dsn, writer)
    finally:
        if stalled.poll() is None:
            os.kill(stalled.pid, signal.SIGCONT)
            stalled.kill()
        writer.halt()
    assert writer.errors == []


def test_immediate_shutdown_of_postgres_mid_backfill(tmp_path):
    """The server dies (immediate shutdown, no checkpoint) while mover copies and the writer
    writes; mover reconnects and retries whole transactions, or a rerun resumes."""
    from mover import api
    from mover.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(fast=False)
    dsn = server.start()
    writer = None
    try:
        api.init(dsn)
        create_orders(dsn, 6_000)
        plan = write_plan(tmp_path / "crashy.toml", PLAN)
        writer = Writer(dsn, seed=13).start()
        release = tmp_path / "release"
        proc = spawn(dsn, "run", plan, env={"MOVER_FAULT": "hang@chunk:3", "MOVER_FAULT_RELEASE": str(release)})
        assert "hanging at chunk:3" in proc.stderr.readline()
        server.restart(immediate=True)
        release.touch()
        code, _ = finish(proc, 120)
        if code != 3:  # a retry budget spent during the restart: the rerun resumes
            r = mover(dsn, "run", "crashy")
            assert r.returncode == 3, r.stderr
        writer.pause()
        r = mover(dsn, "run", "crashy")
        assert r.returncode == 3, r.stderr
        assert differences(dsn, "Orders", "Orders_new") == (0, 0)
    finally:
        if writer is not None:
            writer.halt()
        server.stop()
