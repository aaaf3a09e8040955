"""The governor end to end (mover/engines/governor/throttle.py): an application burst in the middle of the
backfill throttles it (status and events say so, its ranges shrink) and it resumes after; a
stalled replication slot makes mover wait before the slot's limit, with the helper workers of
another process held by the same decision, and the slot is never invalidated; at the floor mover
says so (status, watch, an event) and keeps copying, and `mover set` moves the budget while it
runs; the index builds wait between builds on the same gate; with logical capture mover's own
slot holds the copy like any slot and is fed while a guard holds every engine; a helper takes the
probe over when the orchestrator dies. Judged by the governor's decisions and events and by the
oracle, never by how fast anything ran (bench/impact.py measures that)."""

from __future__ import annotations

import re
import statistics
import threading
import time
from dataclasses import dataclass, field

import psycopg
import pytest
from rich.console import Console

from mover import api
from mover.demo.embedded import EmbeddedPostgres
from mover.engines.governor import pacing
from mover.views import watch as watch_view
from tests.workload import (
    AppWriter,
    Spawned,
    Writer,
    app_execute,
    assert_oracle,
    create_orders,
    finish,
    mover,
    plan_file,
    spawn,
)


def gov_plan(tmp_path, *, range_rows=2_000, cap=4_000, **sections) -> str:
    """The plan of these tests: ranges of `range_rows`, a rows/s cap (0: none), and any other section
    (`throttle={"probe_latency": "25ms"}`, `capture={"method": "logical"}`)."""
    return plan_file(tmp_path, "gov", columns={"id": "bigint"},
                     backfill={"range_rows": range_rows, "max_rows": range_rows, "max_rows_per_second": cap},
                     **sections)


def wait_for(predicate, what: str, *procs, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for proc in procs:
            if proc is not None and proc.poll() is not None:
                _, err = proc.communicate()
                raise AssertionError(f"mover exited ({proc.returncode}) before {what}: {err[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def query(dsn, q, params=()):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(q, params)
        return cur.fetchall() if cur.description else []


def events(dsn, *kinds):
    """(at as epoch seconds, kind, message, detail) of the governor's events, oldest first."""
    return query(dsn, "SELECT extract(epoch FROM at)::float8, kind, message, detail FROM mover.events"
                      " WHERE kind = ANY(%s) ORDER BY id", (list(kinds),))


def copied(dsn) -> list[tuple[int, float]]:
    """(rows, finished_at as epoch seconds) of the backfill's done ranges, in the order they finished."""
    return query(dsn, "SELECT rows, extract(epoch FROM finished_at)::float8 FROM mover.ranges"
                      " WHERE kind = 'backfill' AND status = 'done' ORDER BY finished_at")


def rows_copied(dsn) -> int:
    return sum(r for r, _ in copied(dsn))


def server_now(dsn) -> float:
    return query(dsn, "SELECT extract(epoch FROM clock_timestamp())::float8")[0][0]


@dataclass(eq=False, kw_only=True)
class TimedWriter(AppWriter):
    """The application: one-row updates of the source, mirrored for the oracle, each timed by the
    test itself (completion time, latency in ms)."""

    delay: float = 0.01
    times: list = field(default_factory=list)

    def connected(self, conn: psycopg.Connection) -> None:
        conn.execute("SET synchronous_commit = on")

    def write(self, conn: psycopg.Connection, rnd) -> None:
        k = self.ops % 50_000 + 7
        started = time.perf_counter()
        try:
            app_execute(conn, "UPDATE {t} SET amount = amount + 1 WHERE id = %s", (k,))
        finally:
            self.times.append((time.time(), (time.perf_counter() - started) * 1000))

    def median_between(self, a: float, b: float) -> float | None:
        got = [ms for at, ms in self.times if a <= at < b]
        return round(statistics.median(got), 2) if got else None


class Burst:
    """An application burst: sessions writing a lot of WAL (bulk inserts into a table of their
    own), which every commit on the server then queues behind."""

    def __init__(self, dsn, sessions=3):
        self.dsn, self.sessions, self.writers = dsn, sessions, []

    def start(self):
        self.writers = [AppWriter(self.dsn, each=lambda conn, rnd: conn.execute(
            "INSERT INTO app_log (body) SELECT repeat('x', 200) FROM generate_series(1, 10000)")).start()
            for _ in range(self.sessions)]
        return self

    def halt(self):
        for w in self.writers:
            w.halt()
        assert all(not w.errors for w in self.writers), [w.errors for w in self.writers]
        self.writers = []


def test_an_application_burst_throttles_the_backfill_which_resumes_after_it(db_dsn, tmp_path):
    # 60,000 rows at 4,000 rows/s in ranges of 2,000: a 15-second backfill with room for a burst.
    # The budget is relative, as by default, but twice the probe's latency before the work: a
    # burst of bulk writers raises a quiet server's commits three to eight times (measured on this
    # machine), a shared one's noise less. A throttle that noise brought on before the burst is
    # the governor doing its work too: what is asserted is a throttled spell during the burst.
    create_orders(db_dsn, 60_000)
    query(db_dsn, "CREATE TABLE app_log (id bigserial PRIMARY KEY, body text)")
    plan = gov_plan(tmp_path, throttle={"max_latency_increase": "100%", "copy_latency_increase": "100%"})
    writer = TimedWriter(db_dsn).start()
    proc = spawn(db_dsn, "run", plan)
    burst = Burst(db_dsn, sessions=6)
    seen: list[dict] = []
    try:
        wait_for(lambda: rows_copied(db_dsn) >= 8_000, "the backfill to be under way", proc)
        burst_at = server_now(db_dsn)
        burst.start()

        def throttled() -> bool:
            # The governor's published decision; a worker's rest between two ranges is shorter than
            # a status read on a loaded machine, so it is not required to be caught as well.
            st = api.status(db_dsn, "gov")
            seen.append({"throttle": st["throttle"], "waiting": st["backfill"]["waiting_for"]})
            return st["throttle"]["state"] in ("throttled", "floor")
        wait_for(throttled, "the governor to throttle the backfill", proc)
        observed = server_now(db_dsn)
        shown = mover(db_dsn, "status", "gov")
        # Two ranges copied while throttled: the work goes on, in smaller ranges.
        wait_for(lambda: sum(1 for _, at in copied(db_dsn) if at > observed) >= 2, "ranges copied while throttled",
                 proc)
        burst.halt()
        burst_end = server_now(db_dsn)
        # Released once the burst is over (or, if noise holds it to the end, when the copy ends).
        wait_for(lambda: [e for e in events(db_dsn, "released") if e[0] > observed], "the governor to release", proc)
        code, err = finish(proc, 300)
        assert code == 3, err  # at the gate: the backfill finished
    finally:
        burst.halt()
        writer.halt()
        if proc.poll() is None:
            proc.kill()
    assert "throttle" in shown.stdout and "throttled: probe latency" in shown.stdout, shown.stdout
    timeline = events(db_dsn, "throttle_baseline", "throttled", "released", "throttle_floor")
    kinds = [k for _, k, _, _ in timeline]
    base = timeline[0][3]
    assert kinds[0] == "throttle_baseline" and base["phase"] == "backfill", timeline
    assert base["budget_ms"] == pytest.approx(max(2 * base["baseline_ms"], base["baseline_ms"] + 1), abs=0.01), base
    # The spell status showed: the last throttled event before it, and its release after.
    spell = [e for e in timeline if e[1] == "throttled" and e[0] <= observed][-1]
    assert re.fullmatch(r"throttled: probe latency [\d.]+ ms > [\d.]+ ms budget", spell[2]), spell
    assert spell[3]["duty"] < 1 and spell[3]["budget_ms"] == pytest.approx(base["budget_ms"], abs=0.01), spell
    released = [e for e in timeline if e[1] == "released" and e[0] > spell[0]]
    assert released, timeline
    # Each state change is one event: never one per range or per probe.
    assert len(timeline) < 40, timeline
    # While throttled, ranges were asked for at the duty's share of their size (2,000 unthrottled).
    ranges = copied(db_dsn)
    throttled_ranges = [rows for rows, at in ranges if spell[0] < at < released[0][0]]
    assert throttled_ranges and min(throttled_ranges) < 2_000, (throttled_ranges, timeline, seen[-3:])
    assert sum(rows for rows, _ in ranges) == 60_000
    st = api.status(db_dsn, "gov")
    assert st["throttle"]["throttled_seconds"] > 0 and st["throttle"]["state"] == "idle", st["throttle"]
    # The application never failed, and its latency (measured here, for the record) was higher in the burst.
    assert writer.errors == []
    assert writer.median_between(0, burst_at) is not None, writer.times[:5]
    print("writer median latency ms: before the burst", writer.median_between(0, burst_at),
          "during", writer.median_between(burst_at, burst_end), "after", writer.median_between(burst_end, 1e12))
    assert mover(db_dsn, "run", "gov").returncode == 3  # the writer has stopped: the gate drains the rest
    assert_oracle(db_dsn, "Orders", "Orders_new")


def slot_row(dsn, name):
    return query(dsn, "SELECT wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint"
                      " FROM pg_replication_slots WHERE slot_name = %s", (name,))[0]


def test_an_idle_server_is_not_paced_and_the_application_arriving_is_governed_at_once(tmp_path):
    # A server of its own: nothing but mover and this test runs there. The test reads it on one
    # connection named as mover's own are, so that its reads are not taken for the application's.
    with EmbeddedPostgres(fast=True) as pg, \
            psycopg.connect(pg.dsn, autocommit=True, application_name="mover-test:observer") as observer:
        dsn = pg.dsn
        api.init(dsn)
        create_orders(dsn, 60_000)

        def seen(kind: str, after: float = 0.0) -> list:
            return observer.execute("SELECT extract(epoch FROM at)::float8, message FROM mover.events"
                                    " WHERE kind = %s AND extract(epoch FROM at) > %s ORDER BY id",
                                    (kind, after)).fetchall()

        def governor() -> tuple[str, str | None]:
            row = observer.execute("SELECT state, reason FROM mover.throttle").fetchone()
            return (row[0], row[1]) if row else ("", None)

        def now() -> float:
            return observer.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]

        def copied_since(after: float) -> list[int]:  # on the observer: a poll is not the application
            return [r for (r,) in observer.execute(
                "SELECT rows FROM mover.ranges WHERE kind = 'backfill' AND status = 'done'"
                " AND extract(epoch FROM finished_at) > %s", (after,)).fetchall()]

        plan = gov_plan(tmp_path, range_rows=1_000, cap=4_000, throttle={"idle_after": "2s"})
        proc = spawn(dsn, "run", plan)
        app = TimedWriter(dsn, delay=0.02)
        try:
            quiet_at = wait_for(lambda: seen("throttle_quiet"), "the governor to find nothing to protect", proc)[0][0]
            # The row follows the event at the next probe's write.
            state, reason = wait_for(lambda: governor() if governor()[0] == "quiet" else None,
                                     "the governor's row to say quiet", proc, timeout=5)
            assert reason.startswith("no application session has run a statement"), reason
            shown = mover(dsn, "status", "gov").stdout
            assert "full speed, nothing to protect: no application session has run a statement" in shown, shown
            wait_for(lambda: len(copied_since(quiet_at)) >= 3, "ranges copied quiet", proc)
            arrived = now()
            app.start()
            busy = wait_for(lambda: seen("throttle_busy", arrived), "the governor to see the application", proc)
            assert busy[0][0] - arrived < 5, (arrived, busy)  # within a few readings of the guards
            # The row follows the event at the next probe's write.
            wait_for(lambda: governor()[0] in ("ok", "throttled", "floor"), "the governor to govern", proc, timeout=5)
            app.halt()
            left = now()
            wait_for(lambda: seen("throttle_quiet", left), "the governor to find the application quiet again", proc)
            code, err = finish(proc, 300)
            assert code == 3, err
        finally:
            app.halt()
            if proc.poll() is None:
                proc.kill()
        assert app.errors == []
        # Quiet, the ranges kept their whole size: nothing paced them.
        quiet_ranges = [r for r, at in copied(dsn) if quiet_at < at < arrived]
        assert quiet_ranges and set(quiet_ranges) == {1_000}, quiet_ranges
        assert rows_copied(dsn) >= 60_000
        assert mover(dsn, "run", "gov").returncode == 3  # the gate drains what the application wrote
        assert_oracle(dsn, "Orders", "Orders_new")


def test_a_stalled_slot_holds_mover_before_its_limit_and_is_never_invalidated(tmp_path):
    # A logical slot nobody consumes, a server that invalidates a slot past 64 MB of WAL
    # (max_slot_wal_keep_size), a plan limit of 16 MB below that, and ranges of about 1 MB of WAL.
    with EmbeddedPostgres(fast=True, settings={"wal_level": "logical", "max_slot_wal_keep_size": "64MB",
                                               "max_wal_size": "32MB", "min_wal_size": "32MB"}) as pg:
        dsn = pg.dsn
        api.init(dsn)
        create_orders(dsn, 150_000)
        query(dsn, "SELECT pg_create_logical_replication_slot('stalled', 'pgoutput')")
        query(dsn, "CHECKPOINT")
        # 20,000 rows/s: the governor reads the guards every second, and a copy at full speed could
        # write the limit and be done within one.
        plan = gov_plan(tmp_path, range_rows=5_000, cap=20_000, throttle={"max_slot_wal": "16MB"})
        statuses: list[str] = []
        stop = threading.Event()

        def watch_slot():  # the slot's wal_status throughout, from outside mover
            while not stop.wait(0.1):
                statuses.append(slot_row(dsn, "stalled")[0])
        watcher = threading.Thread(target=watch_slot, daemon=True)
        watcher.start()
        orchestrator = spawn(dsn, "run", plan)
        helper = None
        try:
            def held() -> str | None:
                rows = query(dsn, "SELECT waiting_for FROM mover.workers WHERE waiting_for LIKE 'replication slot%%'")
                return rows[0][0] if rows else None
            why = wait_for(held, "the backfill to wait for the slot", orchestrator)
            assert why.startswith("replication slot stalled holds back") and "([throttle] max_slot_wal)" in why, why
            # Held before the limit the server would invalidate the slot at, even across a checkpoint.
            query(dsn, "CHECKPOINT")
            status, retained = slot_row(dsn, "stalled")
            assert status in ("reserved", "extended") and 16 * 2**20 < retained < 64 * 2**20, (status, retained)
            st = api.status(dsn, "gov")
            assert st["throttle"]["state"] == "waiting" and "replication slot stalled" in st["throttle"]["wait"], \
                st["throttle"]
            assert st["step"] == "backfill", st["step"]
            before = rows_copied(dsn)
            assert 0 < before < 150_000
            # A helper on "another host" is held by the same published decision.
            helper = spawn(dsn, "worker", "gov")
            wait_for(lambda: query(dsn, "SELECT count(DISTINCT pid) FROM mover.workers"
                                        " WHERE waiting_for LIKE 'replication slot%%'")[0][0] == 2,
                     "the helper's workers to wait for the slot too", orchestrator, helper)
            # The subscriber comes back and consumes: mover goes on, and waits again whenever the
            # slot falls behind by the limit.
            consuming = threading.Event()

            def consume():
                while not consuming.wait(0.2):
                    query(dsn, "SELECT pg_replication_slot_advance('stalled', pg_current_wal_lsn())")
            consumer = threading.Thread(target=consume, daemon=True)
            consumer.start()
            try:
                code, err = finish(orchestrator, 300)
                assert code == 3, err
                code, err = finish(helper, 120)
                assert code == 0, err
            finally:
                consuming.set()
                consumer.join(30)
        finally:
            stop.set()
            watcher.join(10)
            for p in (orchestrator, helper):
                if p is not None and p.poll() is None:
                    p.kill()
        assert statuses and "lost" not in statuses and "unreserved" not in statuses, sorted(set(statuses))
        assert rows_copied(dsn) == 150_000
        kinds = [k for _, k, _, _ in events(dsn, "throttle_waiting", "throttle_resumed")]
        assert kinds[:2] == ["throttle_waiting", "throttle_resumed"], kinds
        r = mover(dsn, "plan", "check", plan)
        assert "replication slots: 1 (stalled holds back" in r.stdout, r.stdout
        assert_oracle(dsn, "Orders", "Orders_new")


def test_at_the_floor_mover_says_so_and_keeps_copying_and_mover_set_moves_the_budget_while_it_runs(db_dsn, tmp_path):
    # A server slow whatever mover does: every commit of the probe takes 30 ms more (a trigger of
    # the test's on the probe's row), against a 10 ms budget. The governor cuts the duty to its
    # floor, says so after 10 s there (status, watch, an event) and keeps copying at it; a budget
    # raised with `mover set` while it runs releases it.
    create_orders(db_dsn, 40_000)
    query(db_dsn, "CREATE FUNCTION slow_probe() RETURNS trigger LANGUAGE plpgsql"
                  " AS $$ BEGIN PERFORM pg_sleep(0.03); RETURN NEW; END $$")
    query(db_dsn, "CREATE TRIGGER slow_probe BEFORE UPDATE ON mover.throttle FOR EACH ROW"
                  " EXECUTE FUNCTION slow_probe()")
    plan = gov_plan(tmp_path, range_rows=1_000, cap=4_000, throttle={"probe_latency": "10ms"})
    app = TimedWriter(db_dsn, delay=0.05).start()  # an application busy throughout: something to protect
    proc = spawn(db_dsn, "run", plan)
    try:
        def at_floor() -> dict | None:
            if not query(db_dsn, "SELECT 1 FROM mover.migrations WHERE name = 'gov'"):
                return None
            st = api.status(db_dsn, "gov")
            return st if (st["throttle"] or {}).get("state") == "floor" else None
        st = wait_for(at_floor, "the governor to report the floor", proc)
        t = st["throttle"]
        assert t["duty"] == pytest.approx(0.1) and t["budget_ms"] == 10.0 and t["throttled_for_seconds"] >= 10, t
        assert t["reason"].startswith("probe latency ") and t["reason"].endswith(" ms > 10.0 ms budget"), t
        shown = mover(db_dsn, "status", "gov").stdout
        assert "at the floor, throttled: probe latency" in shown and "working 10% of the time for" in shown, shown
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            snap = watch_view.snapshot(conn.cursor(), "gov")
        assert "throttle at the floor, throttled: probe latency" in watch_view.line(snap), watch_view.line(snap)
        console = Console(record=True, width=200)
        console.print(watch_view.screen(snap))
        assert "throttle: at the floor, throttled: probe latency" in console.export_text()
        # Never starved: ranges go on being copied at the floor, a tenth of their size.
        since = server_now(db_dsn)
        wait_for(lambda: len([r for r, at in copied(db_dsn) if at > since]) >= 2, "ranges copied at the floor", proc)
        assert all(rows <= 100 for rows, at in copied(db_dsn) if at > since), copied(db_dsn)[-5:]
        # The operator decides: a budget the slow server keeps within, set while mover runs.
        assert mover(db_dsn, "set", "gov", "throttle.probe_latency=500ms").returncode == 0
        set_at = server_now(db_dsn)
        wait_for(lambda: [e for e in events(db_dsn, "released") if e[0] > set_at], "the governor to release", proc)
        assert api.status(db_dsn, "gov")["throttle"]["budget_ms"] == 500.0
        app.halt()
        code, err = finish(proc, 300)
        assert code == 3, err
    finally:
        app.halt()
        if proc.poll() is None:
            proc.kill()
    assert app.errors == []
    assert mover(db_dsn, "run", "gov").returncode == 3  # the writer has stopped: the gate drains the rest
    timeline = [(k, m) for _, k, m, _ in events(db_dsn, "throttled", "throttle_floor", "released")]
    assert [k for k, _ in timeline][:3] == ["throttled", "throttle_floor", "released"], timeline
    assert timeline[1][1].startswith("at the floor: mover works 10% of its time and still probe latency"), timeline
    assert rows_copied(db_dsn) == 40_000
    st = api.status(db_dsn, "gov")
    assert st["throttle"]["state"] == "idle" and st["throttle"]["throttled_seconds"] >= 10, st["throttle"]
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_the_index_builds_wait_between_builds_on_the_same_throttle(db_dsn, tmp_path):
    # A CREATE INDEX cannot be paced once it runs: the throttle (here `mover pause`, the gate every
    # guard and the governor's duty share) decides whether the next one starts, and says why it waits.
    create_orders(db_dsn, 3_000)
    query(db_dsn, 'CREATE INDEX "Orders by status" ON "Orders" (status)')
    plan = plan_file(tmp_path, "gov", columns={"id": "bigint"}, backfill={"index_builds": 1})
    release = tmp_path / "release"
    p = Spawned(db_dsn, "run", plan, env={"MOVER_FAULT": "hang@index_built", "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert p.wait_for("hanging at index_built"), "".join(p.err)  # the first build committed
        assert mover(db_dsn, "pause", "gov").returncode == 0
        release.touch()
        assert p.wait_for("index builds wait: paused (mover unpause)"), "".join(p.err)
        built = query(db_dsn, "SELECT count(*) FROM pg_indexes WHERE tablename = 'Orders_new'")[0][0]
        assert built == 2, built  # the key's index and the first build: the second waits
        assert mover(db_dsn, "unpause", "gov").returncode == 0
        assert p.wait(120) == 3, "".join(p.err)
    finally:
        p.kill()
    order = [k for _, k, _, _ in events(db_dsn, "index_built", "paused", "unpaused")]
    assert order == ["index_built", "paused", "unpaused", "index_built"], order
    assert_oracle(db_dsn, "Orders", "Orders_new")


@pytest.mark.parametrize("governed", [True, False], ids=["governed", "off"])
def test_builds_side_by_side_start_a_probe_window_apart_under_the_governor(db_dsn, tmp_path, governed):
    # Two builds started together take two cores before one probe can say so; under the governor
    # the second starts only once the governor has read the first running (throttle.Ramp). Each
    # build hangs after its CREATE INDEX, in its transaction, so the first still runs when the
    # second may start.
    create_orders(db_dsn, 3_000)
    query(db_dsn, 'CREATE INDEX "Orders by status" ON "Orders" (status)')
    query(db_dsn, 'CREATE INDEX "Orders by amount" ON "Orders" (amount)')
    plan = plan_file(tmp_path, "gov", columns={"id": "bigint"}, backfill={"index_builds": 2},
                     throttle={} if governed else {"max_latency_increase": "off"})
    release = tmp_path / "release"
    # The application busy throughout: the governed builds have something to protect.
    app = TimedWriter(db_dsn, delay=0.05).start()
    p = Spawned(db_dsn, "run", plan, env={"MOVER_FAULT": "hang@index_build_done",
                                          "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert p.wait_for("hanging at index_build_done"), "".join(p.err)
        first = time.monotonic()
        assert p.wait_for("hanging at index_build_done"), "".join(p.err)  # the second, the first still open
        apart = time.monotonic() - first
        building = query(db_dsn, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX%%'"
                                 " AND state = 'idle in transaction'")[0][0]
        assert building == 2, building  # both builds open at once: side by side, not one after the other
        app.halt()
        release.touch()
        assert p.wait(120) == 3, "".join(p.err)
    finally:
        app.halt()
        p.kill()
    assert app.errors == []
    assert mover(db_dsn, "run", "gov").returncode == 3  # the writer has stopped: the gate drains the rest
    if governed:
        assert apart >= pacing.SETTLE_SECONDS * 0.8, apart
    else:
        assert apart < pacing.SETTLE_SECONDS, apart  # nothing holds the second back
    assert_oracle(db_dsn, "Orders", "Orders_new")


def own_slot(dsn) -> dict:
    """mover's own slot (logical capture) as `mover status` shows it: wal_status, retained_bytes, changes fed."""
    return api.status(dsn, "gov")["capture"]["slot"]


def worker_waits(dsn, prefix) -> str | None:
    rows = query(dsn, "SELECT waiting_for FROM mover.workers WHERE waiting_for LIKE %s", (prefix + "%",))
    return rows[0][0] if rows else None


def test_movers_own_slot_is_watched_and_kept_fed_while_a_guard_holds_the_engines(tmp_path):
    # Logical capture: mover's own slot holds back the WAL of everything (the copy's first of all)
    # until its feeder reads it. The slot guard watches it like any slot, and names it as mover's;
    # the applier that feeds it is never held by it. And while any guard holds every engine, the
    # applier among them (here a subscriber's stalled slot), the governor goes on feeding mover's
    # slot: a wait must not leave mover's own slot unread until the server invalidates it.
    with EmbeddedPostgres(fast=True, settings={"wal_level": "logical", "max_slot_wal_keep_size": "256MB"}) as pg:
        dsn = pg.dsn
        api.init(dsn)
        create_orders(dsn, 200_000)
        # 10,000 rows/s: a copy of 20 s, long enough for a subscriber's slot to stall in the middle.
        plan = gov_plan(tmp_path, range_rows=5_000, cap=10_000, capture={"method": "logical"},
                        throttle={"max_slot_wal": "8MB", "max_latency_increase": "off"})
        statuses: list[str] = []
        stop = threading.Event()

        def checkpoints():
            # The slots' wal_status throughout, from outside mover; and once asked, a checkpoint a
            # second. A logical slot's restart point moves only to a running-transactions record
            # its consumer has read past: the server's background writer logs one every 15 s, a
            # checkpoint logs one at once (a busy server's frequent checkpoints, sooner).
            while not stop.wait(0.2):
                statuses.extend(r[0] for r in query(dsn, "SELECT wal_status FROM pg_replication_slots"))
                if checkpointing.is_set():
                    query(dsn, "CHECKPOINT")
        checkpointing = threading.Event()
        watcher = threading.Thread(target=checkpoints, daemon=True)
        watcher.start()
        writer = Writer(dsn, delay=0.02).start()
        proc = spawn(dsn, "run", plan)
        try:
            # mover's own slot over the limit: the copy waits, and status says whose slot it is.
            def own_wait() -> dict | None:
                if not query(dsn, "SELECT 1 FROM mover.migrations WHERE name = 'gov'"):
                    return None  # not registered yet
                st = api.status(dsn, "gov")
                return st if (st["throttle"] or {}).get("wait", "") and \
                    st["throttle"]["wait"].startswith("mover's own replication slot") else None
            st = wait_for(own_wait, "the copy to wait for mover's own slot", proc)
            why = st["throttle"]["wait"]
            assert st["throttle"]["state"] == "waiting" and why.startswith("mover's own replication slot mover_m") \
                and "(its logical capture) holds back" in why \
                and "([throttle] max_slot_wal); its feeder goes on reading it meanwhile" in why, why
            assert st["capture"]["slot"]["wal_status"] in ("reserved", "extended"), st["capture"]["slot"]
            # Its feeder (the applier, which the wait does not hold) reads it, the restart point
            # follows at the next running-transactions record, and the copy goes on.
            checkpointing.set()
            copied_then = rows_copied(dsn)
            wait_for(lambda: rows_copied(dsn) > copied_then + 5_000, "the copy to go on once mover's slot is read",
                     proc)

            # A subscriber's slot stalls: every engine waits, the applier too.
            query(dsn, "SELECT pg_create_logical_replication_slot('stalled', 'pgoutput')")
            why = wait_for(lambda: worker_waits(dsn, "replication slot stalled"), "the copy to wait for the stalled "
                           "slot", proc)
            assert "([throttle] max_slot_wal)" in why and "its feeder" not in why, why
            held_at, fed = rows_copied(dsn), own_slot(dsn)["changes"]
            # mover's own slot is still read meanwhile: the application's changes reach the change log.
            wait_for(lambda: own_slot(dsn)["changes"] >= fed + 100, "mover's slot to be fed while the engines wait",
                     proc, timeout=60)
            assert worker_waits(dsn, "replication slot stalled"), query(dsn, "SELECT waiting_for FROM mover.workers")
            assert rows_copied(dsn) <= held_at + 5_000  # held: at most the range under way finished
            # The subscriber is gone for good: its slot is dropped, and mover finishes the copy.
            query(dsn, "SELECT pg_drop_replication_slot('stalled')")
            code, err = finish(proc, 300)
            assert code == 3, err
        finally:
            writer.halt()
            stop.set()
            watcher.join(30)
            if proc.poll() is None:
                proc.kill()
        assert statuses and "lost" not in statuses and "unreserved" not in statuses, sorted(set(statuses))
        assert writer.errors == []
        kinds = [(k, m.split(" holds back")[0]) for _, k, m, _ in events(dsn, "throttle_waiting")]
        assert kinds[0][1].startswith("waiting: mover's own replication slot"), kinds
        assert mover(dsn, "run", "gov").returncode == 3  # the writer has stopped: the gate drains the rest
        assert_oracle(dsn, "Orders", "Orders_new")


def test_a_helper_takes_the_probe_over_when_the_orchestrator_dies(db_dsn, tmp_path):
    create_orders(db_dsn, 16_000)
    # About 16 s of copy at the cap, quiet server or not: the helper joins well before its end.
    plan = gov_plan(tmp_path, range_rows=1_000, cap=1_000)
    orchestrator = spawn(db_dsn, "run", plan)
    helper = None
    try:
        wait_for(lambda: rows_copied(db_dsn) >= 2_000, "the backfill to be under way", orchestrator)
        prober = query(db_dsn, "SELECT prober FROM mover.throttle")[0][0]
        assert f":{orchestrator.pid}:" in prober, prober
        helper = spawn(db_dsn, "worker", "gov")
        wait_for(lambda: query(db_dsn, "SELECT count(*) FROM mover.workers WHERE pid = %s", (helper.pid,))[0][0],
                 "the helper to work", helper)
        orchestrator.kill()
        finish(orchestrator, 30)
        wait_for(lambda: f":{helper.pid}:" in (query(db_dsn, "SELECT coalesce(prober, '') FROM mover.throttle")[0][0]),
                 "the helper to take the probe over", helper)
        code, err = finish(helper, 300)
        assert code == 0, err
    finally:
        for p in (orchestrator, helper):
            if p is not None and p.poll() is None:
                p.kill()
    assert rows_copied(db_dsn) == 16_000
    # The budget the helper governed with is the one measured before the phase: taken over, not measured again.
    baselines = events(db_dsn, "throttle_baseline")
    assert len(baselines) == 1, baselines


@pytest.mark.parametrize("increase", ["50%", "200%"])
def test_the_baseline_is_measured_before_the_work_and_the_budget_follows_it(db_dsn, tmp_path, increase):
    create_orders(db_dsn, 3_000)
    plan = gov_plan(tmp_path, range_rows=1_000, cap=0,
                    throttle={"max_latency_increase": increase, "copy_latency_increase": "300%"})
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    got = events(db_dsn, "throttle_baseline")
    # One baseline per step: the backfill's index builds run under the copy's.
    assert [d["phase"] for _, _, _, d in got] == ["backfill", "reconcile"], got
    for _, _, _, d in got:  # the copy's own budget, reconcile's max_latency_increase
        share = 3.0 if d["phase"] == "backfill" else float(increase.rstrip("%")) / 100
        assert d["budget_ms"] == pytest.approx(max(d["baseline_ms"] * (1 + share), d["baseline_ms"] + 1.0)), d
        assert len(d["probes"]) == 8 and d["baseline_ms"] == pytest.approx(statistics.median(d["probes"]), abs=0.01)
    assert api.status(db_dsn, "gov")["throttle"]["state"] == "idle"
