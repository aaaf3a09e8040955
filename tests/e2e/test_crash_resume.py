"""kill -9 of mover at every step boundary and inside steps, then `mover run NAME` resumes and
ends with identical content; a second orchestrator is refused; a stalled one loses its lease."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import psycopg
import pytest

from tests.workload import (
    Spawned,
    Writer,
    assert_oracle,
    create_orders,
    differences,
    finish,
    hung_at,
    mover,
    plan_text,
    spawn,
    write_plan,
)

PLAN = plan_text("crashy", columns={"id": "bigint"}, backfill={"range_rows": 1000, "max_rows": 1000})


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
    assert_oracle(dsn, live, other)


@pytest.mark.parametrize("point", [
    "after:create_target", "after:install_capture", "backfill_range:2", "range_copied:3", "index_built",
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
        assert_oracle(db_dsn, "Orders", "Orders_old")
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


RANDOM_PLAN = plan_text("crashy", columns={"id": "bigint"}, backfill={"range_rows": 1000, "max_rows": 1000},
                        reconcile={"range_rows": 1500, "workers": 1})

# Where a kill can land, by the step the migration is in: the fault points that step passes
# (each one a moment of database work: inside a range's transaction, just after a commit, around
# an index build). "{next}" is the next reconcile range this run will verify.
STEP_POINTS = {
    "create_target": ["after:create_target"],
    "install_capture": ["after:install_capture"],
    "backfill": ["range_copied", "range_copied", "range_copied", "index_building"],  # while ranges are open
    "reconcile": ["reconcile_compared:{next}", "reconcile_range:{next}", "after:reconcile"],
}


def where(dsn) -> tuple[str, int, bool]:
    """The migration's step (create_target before it is registered), reconcile ranges done, and
    whether backfill ranges are still to copy: read directly, cheaper than a `mover status`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT step FROM mover.migrations WHERE state <> 'aborted'").fetchone()
        (done,) = conn.execute("SELECT count(*) FROM mover.ranges WHERE kind = 'reconcile' AND status = 'done'"
                               ).fetchone()
        (copying,) = conn.execute(
            "SELECT NOT coalesce((SELECT exhausted FROM mover.frontiers WHERE kind = 'backfill'), false)"
            " OR EXISTS (SELECT 1 FROM mover.ranges WHERE kind = 'backfill' AND status <> 'done')").fetchone()
    return (row[0] if row else "create_target"), done, copying


# With logical capture, also the feeder's points: in its transaction, after its commit, after the
# slot's advance (mover/engines/capture/logical.py), wherever the log is fed (the backfill's applier, drains).
FEED_POINTS = ["feed:inserted", "feed:committed", "feed:advanced"]


@pytest.mark.parametrize("method", ["trigger", "logical"])
def test_kill9_at_random_points_until_done(db_dsn, tmp_path, method):
    """At least ten kill -9 at random moments of database work, in every step up to and including
    the cutover's locked swap, then runs left to finish: the result holds every committed write."""
    seed = int(os.environ.get("MOVER_TEST_SEED") or random.SystemRandom().randrange(2**31))
    print(f"MOVER_TEST_SEED={seed}")  # shown on failure: rerun with it to replay the same kills
    rnd = random.Random(seed)
    create_orders(db_dsn, 6_000)
    capture = f'\n[capture]\nmethod = "{method}"\n' if method != "trigger" else ""
    plan = write_plan(tmp_path / "crashy.toml", RANDOM_PLAN + capture)
    step_points = {step: [*points, *(FEED_POINTS if method == "logical" and step in ("backfill", "reconcile")
                                     else [])] for step, points in STEP_POINTS.items()}
    writer = Writer(db_dsn, seed=seed).start()
    kills: list[tuple[str, str, str]] = []  # (step, point, how)
    try:
        for attempt in range(40):
            step, done, copying = where(db_dsn)
            if step not in STEP_POINTS:
                break
            points = step_points[step] if step != "backfill" or copying else ["after:backfill"]
            point = rnd.choice(points).format(next=done + 1)
            release = tmp_path / f"release{attempt}"
            p = Spawned(db_dsn, "run", plan, env={"MOVER_FAULT": f"hang@{point}", "MOVER_FAULT_RELEASE": str(release)})
            try:
                if not p.wait_for(f"hanging at {point}"):
                    continue  # the point was not on this run's way (the run went on to the gate)
                # The first kill of each step lands on its point; later ones anywhere after it.
                if step in {k[0] for k in kills} and rnd.random() < 0.5:
                    release.touch()  # let it go on with its work, and kill it somewhere in there
                    time.sleep(rnd.uniform(0, 0.15))  # a random instant, not a synchronisation
                    if p.kill():
                        kills.append((where(db_dsn)[0], point, "after it"))
                elif p.kill():
                    kills.append((step, point, "at the point"))
            finally:
                p.kill()
        assert where(db_dsn)[0] == "cutover", (seed, kills)
        if "reconcile" not in {k[0] for k in kills}:  # a kill after a point ran through all of it
            p = Spawned(db_dsn, "reconcile", "crashy", "--full", env={"MOVER_FAULT": "hang@reconcile_compared:1"})
            assert p.wait_for("hanging at reconcile_compared:1"), (seed, "".join(p.err))
            assert p.kill()
            kills.append(("reconcile", "reconcile_compared:1", "at the point (a full pass)"))
        # The locked swap: killed inside it, until ten kills in all; nothing may change.
        while len(kills) < 10 or not any(step == "cutover" for step, _, _ in kills):
            point = "swap:fed" if method == "logical" and rnd.random() < 0.5 else "swap:locked"
            p = Spawned(db_dsn, "cutover", "crashy", env={"MOVER_FAULT": f"hang@{point}"})
            assert p.wait_for(f"hanging at {point}"), (seed, "".join(p.err))
            assert p.kill()
            kills.append(("cutover", point, "at the point"))
            assert where(db_dsn)[0] == "cutover", seed
        steps = {step for step, _, _ in kills}
        print(kills)
        assert steps == {"create_target", "install_capture", "backfill", "reconcile", "cutover"}, (seed, kills)
        writer.pause()
        r = mover(db_dsn, "run", "crashy")  # the unkilled run: at the gate, the target must be whole
        assert r.returncode == 3, (seed, r.stderr)
        assert_oracle(db_dsn, "Orders", "Orders_new")
        writer.resume()
        r = mover(db_dsn, "cutover", "crashy")
        assert r.returncode == 0, (seed, r.stderr)
        writer.pause()
        assert_oracle(db_dsn, "Orders")
        assert mover(db_dsn, "run", "crashy").returncode == 3
        assert_oracle(db_dsn, "Orders", "Orders_old")
    finally:
        writer.halt()
    assert writer.errors == [], seed
    assert len(kills) >= 10


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
    assert_oracle(db_dsn, "Orders", "Orders_new")


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
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_stalled_orchestrator_cannot_commit_after_takeover(db_dsn, orders, tmp_path):
    """Race 6: a process whose lease expired while it was stalled must not write afterwards."""
    writer = Writer(db_dsn, seed=9).start()
    release = tmp_path / "release"
    stalled = spawn(db_dsn, "run", orders,
                    env={"MOVER_FAULT": "hang@backfill_range:2", "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert hung_at(stalled, "backfill_range:2")  # after the governor's baseline line
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
    from mover.demo.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(fast=False)
    dsn = server.start()
    writer = None
    try:
        api.init(dsn)
        create_orders(dsn, 6_000)
        plan = write_plan(tmp_path / "crashy.toml", PLAN)
        writer = Writer(dsn, seed=13).start()
        release = tmp_path / "release"
        proc = spawn(dsn, "run", plan,
                     env={"MOVER_FAULT": "hang@backfill_range:3", "MOVER_FAULT_RELEASE": str(release)})
        assert hung_at(proc, "backfill_range:3")
        server.restart(immediate=True)
        release.touch()
        code, err = finish(proc, 120)
        # Either it rode through the restart (reconnected, whole transactions retried) and stopped
        # at the gate, or its retries were spent while the server was down: a failure that says so.
        assert code in (3, 1), (code, err)
        if code == 1:
            assert "connection" in err.lower() or "terminat" in err.lower() or "shut" in err.lower(), err
            r = mover(dsn, "run", "crashy")  # the rerun resumes
            assert r.returncode == 3, r.stderr
        else:
            assert "ready for cutover" in err, err
        writer.pause()
        r = mover(dsn, "run", "crashy")
        assert r.returncode == 3, r.stderr
        assert differences(dsn, "Orders", "Orders_new") == (0, 0)
        assert_oracle(dsn, "Orders", "Orders_new")
    finally:
        if writer is not None:
            writer.halt()
        server.stop()
