"""The backfill waits while a streaming replica lags more than [backfill] max_replica_lag, and
goes on when the replica catches up: a real replica, started by the test from a base backup of a
primary of its own (so no other test sees it), made to lag by pausing its replay."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import psycopg

from mover import api
from mover.demo.embedded import EmbeddedPostgres
from tests.workload import AppWriter, assert_oracle, create_orders, differences, finish, mover, plan_file, spawn

PLAN = dict(columns={"id": "bigint"}, backfill={"range_rows": 500, "max_replica_lag": "1s"})


def ticker(dsn: str) -> AppWriter:
    """WAL that keeps coming, as from any application: a row every 0.1 s."""
    return AppWriter(dsn, delay=0.1, each=lambda conn, rnd: conn.execute("INSERT INTO ticks VALUES (now())"))


class Replica(EmbeddedPostgres):
    """A hot standby of `primary`: a base backup (pg_basebackup -R) instead of initdb, run by the
    same binaries and user as the suite's own server."""

    def __init__(self, primary_dsn: str):
        # Status reports every second, so the primary sees a stuck replay as growing lag promptly.
        super().__init__(fast=True, settings={"wal_receiver_status_interval": "1s"})
        self.primary_dsn = primary_dsn

    def _prepare(self) -> None:
        super()._prepare()  # directories, owner and binaries as for any server; its initdb is replaced
        shutil.rmtree(self.datadir)
        res = subprocess.run([self._bins.exe("pg_basebackup"), "-D", str(self.datadir), "-R", "-X", "stream",
                              "--checkpoint=fast", "--no-sync", "-d", self.primary_dsn], check=False,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                             **self._subprocess_kwargs())
        if res.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {res.stderr.strip()}")


def replay_lag(dsn: str) -> float | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT max(extract(epoch FROM replay_lag))::float8 FROM pg_stat_replication"
                            " WHERE state = 'streaming'").fetchone()[0]


def wait_for(predicate, what: str, proc=None, timeout: float = 90):
    """The predicate's first true value."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"mover exited ({proc.returncode}) before {what}: {err}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def test_backfill_waits_for_a_lagging_replica_and_resumes(tmp_path):
    # full_page_writes is needed for a base backup (fast=True turns it off).
    with EmbeddedPostgres(fast=True, settings={"full_page_writes": "on"}) as primary:
        dsn = primary.dsn
        api.init(dsn)
        create_orders(dsn, 3_000)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE ticks (at timestamptz)")
        with Replica(dsn) as replica:
            wait_for(lambda: _streaming(dsn), "the replica to stream")
            # WAL keeps coming while the replica stops replaying it.
            ticks = ticker(dsn).start()
            try:
                with psycopg.connect(replica.dsn, autocommit=True) as conn:
                    conn.execute("SELECT pg_wal_replay_pause()")
                wait_for(lambda: (replay_lag(dsn) or 0) > 2, "the replica to lag")

                plan = plan_file(tmp_path, "lagging", **PLAN)
                proc = spawn(dsn, "run", plan)
                try:
                    def waiting() -> bool:
                        r = mover(dsn, "status", "lagging", "--json")
                        if r.returncode != 0:
                            return False  # not registered yet
                        b = json.loads(r.stdout)["backfill"]
                        return any("replica lag" in w for w in b["waiting_for"])
                    wait_for(waiting, "the backfill to wait for the replica", proc)
                    st = json.loads(mover(dsn, "status", "lagging", "--json").stdout)
                    assert st["step"] == "backfill" and st["backfill"]["rows_copied"] == 0, st
                    r = mover(dsn, "status", "lagging")
                    assert "waiting: replica lag" in r.stdout, r.stdout

                    with psycopg.connect(replica.dsn, autocommit=True) as conn:
                        conn.execute("SELECT pg_wal_replay_resume()")
                    code, err = finish(proc, 120)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                assert code == 3, err  # the backfill went on once the replica caught up: at the gate
                assert differences(dsn, "Orders", "Orders_new") == (0, 0)
                assert_oracle(dsn, "Orders", "Orders_new")
                st = json.loads(mover(dsn, "status", "lagging", "--json").stdout)
                assert st["backfill"]["rows_copied"] == 3_000 and st["backfill"]["waiting_for"] == [], st
            finally:
                ticks.halt()


def _streaming(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'").fetchone()[0] > 0


def test_reconcile_waits_for_a_lagging_replica_and_resumes(tmp_path):
    # Reconcile reads both whole tables: it waits on the same limit ([backfill] max_replica_lag).
    with EmbeddedPostgres(fast=True, settings={"full_page_writes": "on"}) as primary:
        dsn = primary.dsn
        api.init(dsn)
        create_orders(dsn, 3_000)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE ticks (at timestamptz)")
        with Replica(dsn) as replica:
            wait_for(lambda: _streaming(dsn), "the replica to stream")
            plan = plan_file(tmp_path, "lagging", **PLAN)
            for _ in ("create_target", "install_capture", "backfill"):
                r = mover(dsn, "step", plan)
                assert r.returncode == 0, r.stderr
            ticks = ticker(dsn).start()
            try:
                with psycopg.connect(replica.dsn, autocommit=True) as conn:
                    conn.execute("SELECT pg_wal_replay_pause()")
                wait_for(lambda: (replay_lag(dsn) or 0) > 2, "the replica to lag")
                proc = spawn(dsn, "step", "lagging")
                try:
                    def waiting() -> bool:
                        st = json.loads(mover(dsn, "status", "lagging", "--json").stdout)
                        return any("replica lag" in w for w in st["reconcile"]["waiting_for"])
                    wait_for(waiting, "the reconcile to wait for the replica", proc)
                    st = json.loads(mover(dsn, "status", "lagging", "--json").stdout)
                    assert st["step"] == "reconcile" and st["reconcile"]["ranges_done"] == 0, st
                    with psycopg.connect(replica.dsn, autocommit=True) as conn:
                        conn.execute("SELECT pg_wal_replay_resume()")
                    code, err = finish(proc, 120)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                assert code == 0, err
                st = json.loads(mover(dsn, "status", "lagging", "--json").stdout)
                assert st["step"] == "cutover" and st["reconcile"]["rows_compared"] == 3_000, st
                assert st["reconcile"]["waiting_for"] == [], st
            finally:
                ticks.halt()


GONE_PLAN = dict(columns={"id": "bigint"}, backfill={"range_rows": 500, "min_rows": 100, "max_rows": 500,
                                                      "max_rows_per_second": 1000, "max_replica_lag": "30s"})


def test_a_standby_that_stops_streaming_holds_the_backfill_until_the_operator_lets_it_go(tmp_path):
    # Failing closed: a standby mover saw streaming disappears (stopped, or its network gone). Its
    # lag is unknown and grows with every range, so the backfill waits; the operator who knows it
    # is gone for good says so by not watching standbys ([backfill] max_replica_lag = "0s").
    with EmbeddedPostgres(fast=True, settings={"full_page_writes": "on"}) as primary:
        dsn = primary.dsn
        api.init(dsn)
        create_orders(dsn, 6_000)
        replica = Replica(dsn)
        replica.start()
        try:
            wait_for(lambda: _streaming(dsn), "the replica to stream")
            plan = plan_file(tmp_path, "lagging", **GONE_PLAN)
            proc = spawn(dsn, "run", plan)
            try:
                def copied() -> int:
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        return conn.execute("SELECT coalesce(sum(rows), 0) FROM mover.ranges"
                                            " WHERE kind = 'backfill' AND status = 'done'").fetchone()[0]
                wait_for(lambda: copied() >= 1_000, "the backfill to be under way", proc)
                replica.stop()

                def held() -> str | None:
                    t = api.status(dsn, "lagging")["throttle"]
                    return t["wait"] if t["state"] == "waiting" else None
                why = wait_for(held, "the backfill to wait for the standby that went away", proc)
                assert why.startswith("standby walreceiver (127.0.0.1) stopped streaming; mover waits for it"), why
                r = mover(dsn, "status", "lagging")
                assert "waiting: standby walreceiver" in r.stdout, r.stdout
                r = mover(dsn, "set", "lagging", "backfill.max_replica_lag=0s")
                assert r.returncode == 0, r.stderr
                code, err = finish(proc, 120)
            finally:
                if proc.poll() is None:
                    proc.kill()
            assert code == 3, err
        finally:
            replica.stop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            got = conn.execute("SELECT extract(epoch FROM at)::float8, kind, message FROM mover.events"
                               " WHERE kind IN ('throttle_waiting', 'throttle_resumed') ORDER BY id").fetchall()
            assert [k for _, k, _ in got[:2]] == ["throttle_waiting", "throttle_resumed"], got
            waited, resumed = got[0][0], got[1][0]
            # Held: no range but the one its only worker may have had under way ended while it waited.
            during = conn.execute("SELECT count(*) FROM mover.ranges WHERE kind = 'backfill'"
                                  " AND finished_at > to_timestamp(%s) AND finished_at < to_timestamp(%s)",
                                  (waited, resumed)).fetchone()[0]
            assert during <= 1, got
        assert differences(dsn, "Orders", "Orders_new") == (0, 0)
        assert_oracle(dsn, "Orders", "Orders_new")
