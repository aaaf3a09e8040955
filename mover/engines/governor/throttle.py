"""The one throttle of a migration: the governor that keeps what the application pays for mover's
bulk work inside a budget, and the WAL and replication guards. Every engine that does bulk work
asks it: the range loop (mover/engines/bulk/rangework.py: backfill and reconcile workers, here and in
`mover worker` processes), the backfill's applier, the index builds and ANALYZE.

How it decides (docs/design.md, "The application barely notices"; the arithmetic is
mover/engines/governor/pacing.py, what it reads mover/engines/governor/signals.py):
- The signal is the server's, not the application's: a probe, a one-row write and commit on
  mover.throttle every 250 ms on a connection of its own, timed. Its median over the last five
  probes against a budget ([throttle] max_latency_increase over the probe's median before the
  step's bulk work started, measured with mover idle; or [throttle] probe_latency) sets the duty, the share
  of their time the engines work: they rest elapsed * (1 - duty) / duty after each unit of work
  and ask for ranges duty times their size. [throttle] max_wal_per_second feeds the same duty.
- Nothing to protect, nothing paced: while no application session (pg_stat_activity, server-wide,
  mover's own left out) has run a statement for [throttle] idle_after, the duty is 1 and the
  state `quiet` says why; the budget applies again from the first busy reading. Sessions this
  role cannot see count as busy (failing closed).
- The guards are waits: a standby lagging more than [backfill] max_replica_lag or gone (failing
  closed), a replication slot (any, mover's own included) near invalidation or over [throttle]
  max_slot_wal, archiving failing or more than [throttle] max_archive_backlog behind. `mover
  pause` and the rows/s caps stay what they were, inputs of the same gate.

Invariants:
- One decision per migration, whatever the number of processes: the process that holds the
  probe (the orchestrator, from the start of each phase; any other once the probe is stale)
  measures, decides, records state changes as events and publishes the decision in its row of
  mover.throttle (mover/state/throttle.py) with each probe; every other process's engines follow
  the published decision. So a helper on another host is held to the same budget, measured from
  the same place, and `mover status` shows one state.
- Failing closed: an engine whose governor has no fresh decision (the sampler is stuck, the row
  is not read) waits; an error in the sampler thread is raised in the engines' threads at their
  next question, and fails the step.
- Asked only between units of work, never inside one: a range, an applier batch, an index build
  (a CREATE INDEX cannot be paced once started: only whether and when the next one starts, and
  how many at once), ANALYZE (waits at its start).
- The capture is never paced. A slot that mover's own capture consumes (logical capture) holds the
  bulk engines like any slot, but never the engine that consumes it (the backfill's applier); and
  while a guard holds the engines, the process that probes feeds the change log from that slot
  itself (Governor._keep_fed), so that no wait (a standby, a subscriber's slot, mover's own slot during the
  index builds or a reconcile pass, when no applier runs) leaves mover's slot unread until the
  server invalidates it. The feed writes only the keys the trigger would have written in the
  application's own transactions.
- A Governor is per process and migration, shared by any number of loops (threads); a Throttle is
  one loop's view of it, with the loop's own rows/s cap.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from mover import threads
from mover.db import Database, bind, connect
from mover.engines.capture import logical
from mover.engines.context import Context
from mover.engines.governor import pacing, signals
from mover.plan import Plan, percent, plan_from_canonical
from mover.state import control
from mover.state import throttle as rows

if TYPE_CHECKING:
    from mover.engines.context import Reporter

log = logging.getLogger("mover.throttle")

RECHECK_SECONDS = 1.0  # how long an engine waits on a reason before asking again
MEASURING_RECHECK_SECONDS = 0.05  # ... while the baseline is measured: a quarter second, over at any probe
GUARD_SECONDS = 1.0  # between two readings of the guards (and of the plan: `mover set` takes effect)
STALE_SECONDS = 5.0  # an engine waits when its governor has decided nothing for this long
BASELINE_SPACING = 0.03  # between the probes that measure the baseline (8 of them: about a quarter second)
FEED_SECONDS = 1.0  # between two feeds of mover's own slot while a guard holds the engines


@dataclass
class Limits:
    """One loop's own limits (the governor holds the rest); re-read between ranges (`mover set`
    takes effect there)."""

    max_rows_per_second: int = 0  # 0: no cap
    max_rows: int = 10**9  # the largest range the engine wants
    burst_ms: int = 1000  # how long one range is meant to take: its share of the cap is sized on it


@dataclass(frozen=True)
class Gate:
    """The answer before a range: wait `seconds` and ask again (`wait` says why), or go with a
    range of `rows` keys."""

    wait: str | None = None
    seconds: float = 0.0
    rows: int = 0


# The copy's phase (mover/engines/bulk/backfill.py KIND), held to [throttle] copy_latency_increase.
COPY_PHASE = "backfill"


def budget_setting(plan: Plan, phase: str | None) -> str:
    """The [throttle] setting that sets `phase`'s latency budget. The copy has its own (the same
    by default), since it yields between ranges of a fraction of a second and can be given more
    room than what cannot be paced once started (an index build), which keeps
    max_latency_increase; max_latency_increase = "off" governs nothing by latency, the copy
    included."""
    t = plan.throttle
    if t.probe_latency_ms:
        return "probe_latency"
    if phase == COPY_PHASE and percent(t.max_latency_increase) is not None:
        return "copy_latency_increase"
    return "max_latency_increase"


def limits_of(plan: Plan, baseline_ms: float | None, phase: str | None = None) -> pacing.Limits:
    """What the plan holds the governor to in `phase`, with the probe's baseline for a relative budget."""
    t = plan.throttle
    setting = budget_setting(plan, phase)
    increase = t.copy_latency_increase if setting == "copy_latency_increase" else t.max_latency_increase
    return pacing.Limits(
        latency_ms=pacing.budget_ms(baseline_ms, percent(increase), t.probe_latency_ms), budget_setting=setting,
        floor=percent(t.floor) or 0.0, max_wal_per_second=t.max_wal_per_second,
        max_replica_lag_ms=plan.backfill.max_replica_lag_ms, max_slot_wal=t.max_slot_wal,
        max_archive_backlog=t.max_archive_backlog)


def guard_wait(r: signals.Readings, limits: pacing.Limits, seen: frozenset[str], wal_per_second: float,
               ignore: frozenset[str] = frozenset()) -> tuple[str | None, frozenset[str]]:
    """The first guard that holds the engines, if one does (standbys, slots, archiving), and the
    standbys seen streaming so far. The slot guard watches every slot, the migration's own
    (r.own_slots: what the bulk engines write, it holds back until the capture reads it)
    included; `ignore`: the slots of the engine that asks, which consumes them and so never waits
    on them (it would stop the only thing that frees them)."""
    lag_limit = limits.max_replica_lag_ms if r.standbys_visible else 0
    standby, seen = pacing.standby_wait(r.standbys, seen, lag_limit)
    slot = pacing.slot_wait(r.slots, r.keep_size, limits.max_slot_wal, wal_per_second, ignore, r.own_slots)
    return standby or slot or pacing.archive_wait(r.archiver, limits.max_archive_backlog), seen


class Ramp:
    """The statements of one migration that the throttle cannot pace once they run (index builds,
    ANALYZE beside them). Under a governed duty, at most `at_once` of them run together
    ([backfill] index_builds, one by default), and while one runs the next starts only
    pacing.SETTLE_SECONDS after the last one began, so that the duty it asks has read what already
    runs. Two CPU-bound statements side by side took both cores of a 2-core server, and the
    application's commits stalled for as long as they ran, where either alone cost it little
    (docs/design.md, "What cannot be paced inside a statement")."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._last = -math.inf

    def claim(self, governed: bool, at_once: int) -> float:
        """0 and counted as running (release() when it ends), or the seconds to wait first."""
        with self._changed:
            if governed and self._running:
                if self._running >= at_once:
                    return RECHECK_SECONDS
                if (left := self._last + pacing.SETTLE_SECONDS - time.monotonic()) > 0:
                    return left
            self._running += 1
            self._last = time.monotonic()
            return 0.0

    def wait(self, seconds: float) -> None:
        """Up to `seconds`, less when one of them ends."""
        with self._changed:
            self._changed.wait(seconds)

    def release(self) -> None:
        with self._changed:
            self._running -= 1
            self._changed.notify_all()


class Governor:
    """The throttle of one migration in one process, shared by every loop of it (thread-safe:
    the engines read an immutable decision that the sampler thread replaces)."""

    def __init__(self, dsn: str, migration: control.Migration, *, report: Reporter | None = None,
                 feed: Callable[[], object] | None = None):
        self.dsn, self.mid, self.migration = dsn, migration.id, migration
        self.owner = f"{control.new_owner_id()}:governor"
        self.report = report
        self.feed = feed  # feeds the change log from mover's own slot (logical capture), or None
        self.decision = pacing.Decision(state="measuring")
        self.decided_at = time.monotonic()
        self.phase: str | None = None
        self.leading = False
        self.baseline_ms: float | None = None
        self._plan = plan_from_canonical(migration.plan)
        self.limits = limits_of(self._plan, None)
        self.readings: signals.Readings | None = None
        self.ramp = Ramp()
        self._wait: str | None = None  # the guards' verdict, for every engine
        self._consumer_wait: str | None = None  # the same without the slots the capture consumes
        self._quiet: str | None = None  # why nothing needs protecting (no application session busy), or None
        self._pressure: float | None = None  # the latest reading over its limits (over 1: over the budget)
        self._latencies: deque[float] = deque(maxlen=pacing.WINDOW)
        self._lsns: deque[tuple[float, int]] = deque()
        self._seen: frozenset[str] = frozenset()
        self._guards_at = -1e9
        self._published_at = time.monotonic()
        self._lag_warned = False
        self._db = Database(dsn, role="mover-governor")
        self._probe_conn: psycopg.Connection | None = None
        self._halt = threading.Event()
        self._thread = threads.Group()

    # -- what the engines ask (any thread) ---------------------------------------------------

    def reason(self, *, consumer: bool = False) -> str | None:
        """Why every engine waits now, or None. `consumer`: asked by the engine that consumes
        mover's own slots (the applier, with logical capture), which a slot of its own never
        holds. Raises what the sampler thread raised."""
        self.check()
        d, age = self.decision, time.monotonic() - self.decided_at
        if age > STALE_SECONDS:
            return f"the governor has decided nothing for {age:.0f} s (waiting: it fails closed)"
        if d.state == "measuring":
            return "measuring the probe's latency before the work starts"
        if d.wait is not None:
            if consumer and self.leading and self._consumer_wait is None:
                return None
            return d.wait
        if d.duty < pacing.MIN_DUTY:
            return self.throttled()
        return None

    @property
    def duty(self) -> float:
        return self.decision.duty

    @property
    def measuring(self) -> bool:
        return self.decision.state == "measuring"

    @property
    def protecting(self) -> bool:
        """Whether a latency budget holds the engines now: governed, and the application busy.
        What cannot be paced once started (an index build) reads it when it starts."""
        return self.decision.state not in ("quiet", "off")

    def throttled(self) -> str:
        """What a rest is for, as the worker's row and `mover status` say it."""
        return f"throttled: {self.decision.reason}" if self.decision.reason else "throttled"

    @property
    def recovered(self) -> bool:
        """Whether the probe's latest median is back under the release ratio of its budget (the WAL
        rate under its cap): the application no longer pays for what just ran. Only where this
        process probes; a follower cannot tell, and says no."""
        return self.leading and self._pressure is not None and self._pressure < pacing.RELEASE_RATIO

    def rest(self, elapsed: float) -> float:
        """Seconds to rest after `elapsed` seconds of work at the duty now."""
        return pacing.wait_after(elapsed, self.duty)

    def check(self) -> None:
        """Raise what the sampler thread raised (a bug, not a database error: those it retries)."""
        if (exc := self._thread.error) is not None:
            raise exc

    # -- lifecycle ------------------------------------------------------------------------------

    def lead(self, phase: str) -> None:
        """Govern `phase` from this process (the orchestrator): take the probe, measure the
        baseline with mover idle (the other processes' engines wait meanwhile), then probe and
        decide in a thread of its own until close()."""
        self.phase = phase
        self._db.transaction(bind(rows.lead, self.mid, self.owner, phase), label="governor")
        self.leading = True
        self._measure()
        self._start()

    def enter(self, phase: str | None) -> None:
        """Govern `phase` from now on with the same baseline (the backfill step's copy, then its
        index builds): its budget holds from the next reading."""
        self.phase = phase
        self.limits = limits_of(self._plan, self.baseline_ms, phase)

    def follow(self) -> None:
        """Follow the published decision from this process (`mover worker`); take the probe over
        when nobody probes."""
        self._start()

    def _start(self) -> None:
        self._thread.start(self._run, f"mover-governor-{self.mid}")
        if self.feed is not None:
            self._thread.start(self._keep_fed, f"mover-governor-feed-{self.mid}")

    def close(self) -> None:
        """Stop the thread; the row says idle if this process held the probe. Raises what the
        thread raised."""
        self._halt.set()
        self._thread.wait(timeout=15)
        try:
            if self.leading:
                if self.decision.throttled:  # a state change too: the work it held is over
                    took = time.monotonic() - (self.decision.throttled_since or time.monotonic())
                    self._event("released", f"released: {self.phase} is over after {took:.1f} s throttled",
                                {"seconds": round(took, 1), "phase": self.phase})
                self._db.transaction(bind(rows.step_down, self.mid, self.owner), label="governor")
        except psycopg.Error as exc:  # the server went away: the row goes stale, which says the same
            log.debug("the governor of migration %s could not step down: %s", self.mid, exc)
        finally:
            if self._probe_conn is not None:
                self._probe_conn.close()
            self._db.close()
        self.check()

    # -- the sampler thread ---------------------------------------------------------------------

    def _run(self) -> None:
        failing = False  # said once per outage, not every PROBE_SECONDS
        while not self._halt.is_set():
            started = time.monotonic()
            try:
                self._lead_tick() if self.leading else self._follow_tick()
                if failing:
                    log.info("the governor of migration %s reads the server again", self.mid)
                failing = False
            except psycopg.Error as exc:
                # The next tick tries again; meanwhile the decision ages, and past STALE_SECONDS
                # the engines wait (fail closed).
                (log.debug if failing else log.warning)(
                    "the governor of migration %s could not read the server (%s: %s); trying again every %g s",
                    self.mid, type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc) else "",
                    pacing.PROBE_SECONDS)
                failing = True
                if self._probe_conn is not None and (self._probe_conn.broken or self._probe_conn.closed):
                    self._probe_conn = None
            self._halt.wait(max(0.0, pacing.PROBE_SECONDS - (time.monotonic() - started)))

    def _keep_fed(self) -> None:
        """While a guard holds the engines (and this process probes), feed the change log from
        mover's own slot every FEED_SECONDS: the engine that would (the backfill's applier, a
        reconcile worker between ranges) may be waiting, or none runs (the index builds). A feed
        another session is doing is skipped (logical.feed without catch_up). What it raises but a
        database error (SlotLost, ShapeChanged) the engines raise at their next question."""
        assert self.feed is not None
        while not self._halt.wait(FEED_SECONDS):
            if not self.leading or self.decision.wait is None:
                continue
            try:
                self.feed()
            except psycopg.Error as exc:  # the next round tries again, as the applier's next batch would
                log.warning("could not feed the change log of migration %s from its slot while waiting (%s: %s); "
                            "retrying", self.mid, type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc)
                            else "")

    def _conn(self) -> psycopg.Connection:
        if self._probe_conn is None or self._probe_conn.closed or self._probe_conn.broken:
            self._probe_conn = connect(self.dsn, role="mover-probe")
        return self._probe_conn

    def _probe(self, published: dict[str, Any]) -> float | None:
        """One probe; None when another process took the probe over (this one follows then)."""
        ms, held = signals.probe(self._conn(), bind(rows.publish, self.mid, self.owner, published))
        if not held:
            log.info("another process took over the governor of migration %s; following it", self.mid)
            self.leading = False
            return None
        return ms

    def _measure(self) -> None:
        """The baseline: the median of BASELINE_PROBES probes with mover's engines waiting."""
        taken: list[float] = []
        while len(taken) < pacing.BASELINE_PROBES and not self._halt.is_set():
            ms = self._probe(self._published(time.monotonic(), readings=None))
            if ms is None:
                return
            taken.append(ms)
            self._halt.wait(BASELINE_SPACING)
        self.baseline_ms = pacing.median(taken) if taken else None
        self._read_guards(time.monotonic())
        budget = f", budget {self.limits.latency_ms:.2f} ms" if self.limits.latency_ms else ", no latency budget"
        self._event("throttle_baseline", f"{self.phase}: probe latency {self.baseline_ms or 0:.2f} ms before the work"
                    + budget,
                    {"phase": self.phase, "baseline_ms": self.baseline_ms, "budget_ms": self.limits.latency_ms,
                     "probes": [round(t, 3) for t in taken]})
        # A guard that holds already: waiting from the start, said as any wait is (an event).
        self.decision, events = pacing.first(time.monotonic(), wait=self._wait, limits=self.limits,
                                             quiet=self._quiet)
        self.decided_at = time.monotonic()
        for e in events:
            self._event(e.kind, e.message, {**e.detail, "phase": self.phase})

    def _lead_tick(self) -> None:
        now = time.monotonic()
        guards = now - self._guards_at >= GUARD_SECONDS
        if guards:
            self._read_guards(now)
            if self._wait is not None and self._wait != self.decision.wait:
                # A guard that holds from now on: decided before this probe, so that the probe
                # publishes it (status says what the engines already do, not a probe later).
                self._decide(None)
        ms = self._probe(self._published(now, readings=self.readings.as_dict() if guards and self.readings else None))
        if ms is None:
            return
        self._latencies.append(ms)
        self._decide(pacing.median(self._latencies) if len(self._latencies) >= 3 else None)

    def _decide(self, latency: float | None) -> None:
        wal_per_second = pacing.wal_rate(self._lsns)
        if latency is not None:
            self._pressure = pacing.pressure(latency, wal_per_second, self.limits)[0]
        decision, events = pacing.decide(self.decision, time.monotonic(), latency_ms=latency,
                                         wal_per_second=wal_per_second, wait=self._wait,
                                         limits=self.limits, quiet=self._quiet)
        self.decision, self.decided_at = decision, time.monotonic()
        for e in events:
            self._event(e.kind, e.message, {**e.detail, "phase": self.phase})

    def _published(self, now: float, readings: dict[str, Any] | None) -> dict[str, Any]:
        d = self.decision
        took, self._published_at = now - self._published_at, now
        latency = pacing.median(self._latencies) if self._latencies else None
        return {"phase": self.phase, "baseline_ms": self.baseline_ms, "budget_ms": self.limits.latency_ms,
                "latency_ms": latency, "duty": d.duty, "state": d.state, "reason": d.reason, "wait": d.wait,
                "throttled": d.throttled, "throttled_for": took if d.throttled else 0.0, "readings": readings}

    def _read_guards(self, now: float) -> None:
        def read(cur: psycopg.Cursor) -> tuple[control.Migration, signals.Readings]:
            return control.get_by_id(cur, self.mid), signals.read(cur, self.mid)

        m, r = self._db.transaction(read, label="governor")
        self._guards_at, self.migration, self.readings = now, m, r
        plan = plan_from_canonical(m.plan)
        self._plan = plan
        self.limits = limits_of(plan, self.baseline_ms, self.phase)
        self._lsns.append((r.at, r.lsn))
        while len(self._lsns) > 2 and r.at - self._lsns[0][0] > pacing.WAL_RATE_SECONDS:
            self._lsns.popleft()
        if not r.standbys_visible and self.limits.max_replica_lag_ms and not self._lag_warned:
            self._lag_warned = True
            # Without pg_read_all_stats the standbys' columns read as NULL rather than failing: say so once.
            log.warning("this role cannot read the standbys' replay lag, so [backfill] max_replica_lag (%gs) is "
                        "not enforced", self.limits.max_replica_lag_ms / 1000,
                        extra={"next": "GRANT pg_read_all_stats TO the role mover runs as, or set [backfill] "
                                       "max_replica_lag = \"0s\" in the plan (no standby to watch)"})
        rate = pacing.wal_rate(self._lsns) or 0.0
        self._wait, seen = guard_wait(r, self.limits, self._seen, rate)
        self._consumer_wait, _ = guard_wait(r, self.limits, self._seen, rate, r.own_slots)
        self._seen = seen
        idle_after = plan.throttle.idle_after_ms / 1000
        self._quiet = None if r.application.busy(idle_after) is not None else r.application.quiet(idle_after)

    def _follow_tick(self) -> None:
        row = self._db.transaction(bind(rows.get, self.mid), label="governor")
        if row is None or row["prober"] is None or row["age"] is None or row["age"] > rows.STALE_SECONDS:
            taken = self._db.transaction(bind(rows.take_over, self.mid, self.owner), label="governor")
            if taken is not None:
                log.info("nobody probes for migration %s: this process takes the governor over", self.mid)
                self.leading, self.phase, self.baseline_ms = True, taken["phase"], taken["baseline_ms"]
                if self.baseline_ms is None:
                    self.decision = pacing.Decision(state="measuring")  # this process's engines wait
                    self._measure()
                else:
                    self.decision = pacing.Decision(state="ok", duty=float(taken["duty"] or 1.0))
                self.decided_at = time.monotonic()
            return
        state = row["state"] if row["state"] != "idle" else "ok"
        self.decision = pacing.Decision(state=state, duty=float(row["duty"]), reason=row["reason"], wait=row["wait"])
        self.decided_at = time.monotonic()

    def _event(self, kind: str, message: str, detail: dict[str, Any]) -> None:
        def write(cur: psycopg.Cursor) -> None:
            step = control.get_by_id(cur, self.mid).step
            control.event(cur, self.mid, self.owner, step, kind, message, detail)
        self._db.transaction(write, synchronous_commit=False, label="governor event")
        if self.report is not None:
            self.report("throttle", event=kind, message=message)


def describe(cur: psycopg.Cursor, plan: Plan, mid: int | None = None) -> dict[str, Any]:
    """What `mover plan check` says of the governor: one line per input, read now from the same
    views and judged by the same functions as the governor's (describe == run), and the guard
    that would hold mover at its first range if it started now. `mid`: a registered migration,
    whose own slot (logical capture) is named as such."""
    r = signals.read(cur, mid)
    limits = limits_of(plan, None)
    t = plan.throttle
    h = pacing.human_bytes
    lines = []
    increase = percent(t.max_latency_increase)
    probe = "the probe (a one-row write and commit on mover.throttle every 250 ms, on mover's own connection)"
    if t.probe_latency_ms:
        lines.append(f"application latency: {probe} kept under {t.probe_latency_ms} ms ([throttle] probe_latency)")
    elif increase is None:
        lines.append("application latency: not governed ([throttle] max_latency_increase = \"off\")")
    else:
        copy = percent(t.copy_latency_increase)
        lines.append(f"application latency: {probe} kept within {t.max_latency_increase} of its latency before each "
                     f"step's bulk work (measured then, with mover idle; at least {pacing.MIN_SLACK_MS:g} ms over it): "
                     f"over it, every engine works a smaller share of its time, never under {t.floor} "
                     f"([throttle] max_latency_increase, floor); "
                     + (f"the copy within {t.copy_latency_increase}, as it yields between ranges" if copy is not None
                        else "the copy not by latency")
                     + " ([throttle] copy_latency_increase)")
    if increase is not None or t.probe_latency_ms or t.max_wal_per_second:
        idle = t.idle_after_ms / 1000
        now = r.application.busy(idle) or r.application.quiet(idle)
        lines.append("application sessions: " + (
            f"mover works at full speed while none has run a statement for {idle:g} s, the budget holds "
            f"from the first busy one ([throttle] idle_after); now: {now}" if idle else
            "the budget holds whether or not the application is busy ([throttle] idle_after = \"0s\")"))
    lag = plan.backfill.max_replica_lag_ms
    streaming = ", ".join(f"{s.name} {s.state}" + (f" lag {s.replay_lag_s:.1f}s" if s.replay_lag_s is not None else "")
                          for s in r.standbys)
    if not lag:
        lines.append("standbys: not watched ([backfill] max_replica_lag = \"0s\")")
    elif not r.standbys_visible:
        lines.append("standbys: not visible to this role (GRANT pg_read_all_stats): [backfill] max_replica_lag is not "
                     "enforced")
    else:
        lines.append(f"standbys: {len(r.standbys)} ({streaming or 'none'}); mover waits while one lags more than "
                     f"{lag / 1000:g}s, or stops streaming ([backfill] max_replica_lag)")
    keep = "unlimited" if r.keep_size < 0 else h(r.keep_size)
    held = ", ".join(f"{s.name}{' (mover' + chr(39) + 's own)' if s.name in r.own_slots else ''} holds back "
                     f"{h(s.retained or 0)} ({s.wal_status})" for s in r.slots)
    lines.append(f"replication slots: {len(r.slots)}{f' ({held})' if held else ''}; mover waits while one holds back "
                 + (f"more than {h(t.max_slot_wal)} ([throttle] max_slot_wal) or " if t.max_slot_wal else "")
                 + f"nears invalidation (max_slot_wal_keep_size {keep})")
    a = r.archiver
    if a is None:
        lines.append("archiving: off (archive_mode)")
    else:
        backlog = pacing.archive_backlog(a)
        lines.append(f"archiving: {'unknown' if backlog is None else h(backlog)} waiting; mover waits while it fails"
                     + (f" or more than {h(t.max_archive_backlog)} waits ([throttle] max_archive_backlog)"
                        if t.max_archive_backlog else ""))
    lines.append(f"WAL rate: kept under {h(t.max_wal_per_second)}/s ([throttle] max_wal_per_second)"
                 if t.max_wal_per_second else "WAL rate: not capped ([throttle] max_wal_per_second)")
    wait, _ = guard_wait(r, limits, frozenset(), 0.0)  # no rate yet: mover has written nothing
    return {"lines": lines, "wait": wait, "readings": r.as_dict()}


def of(ctx: Context) -> Governor | None:
    """The governor holding ctx's bulk work in this process (governing), or None."""
    assert ctx.governor is None or isinstance(ctx.governor, Governor)
    return ctx.governor


@contextmanager
def governing(ctx: Context, phase: str) -> Iterator[Governor]:
    """Govern `phase` of ctx's migration from this process (the orchestrator's bulk work): the
    governor is ctx.governor meanwhile, for every loop the engine starts. Inside another
    phase's governing (the backfill step's copy, then its index builds), the same governor goes
    on with the baseline measured before the step, under the inner phase's name."""
    held = of(ctx)
    if held is not None:
        outer = held.phase
        held.enter(phase)
        try:
            yield held
        finally:
            held.enter(outer)
        return
    with feeding(ctx) as feed:
        gov = Governor(ctx.db.dsn, ctx.migration, report=ctx.report, feed=feed)
        try:
            gov.lead(phase)
            ctx.governor = gov
            yield gov
        finally:
            ctx.governor = None
            gov.close()


@contextmanager
def following(ctx: Context) -> Iterator[Governor]:
    """The governor of a `mover worker` process (ctx: its migration, database and stop flag): it
    follows the published decision, and does what the orchestrator's does if it takes the probe over."""
    with feeding(ctx) as feed:
        gov = Governor(ctx.db.dsn, ctx.migration, report=ctx.report, feed=feed)
        try:
            gov.follow()
            yield gov
        finally:
            gov.close()


@contextmanager
def feeding(ctx: Context) -> Iterator[Callable[[], object] | None]:
    """What keeps mover's own slot read while a guard holds the engines (Governor._keep_fed): one
    bounded feed of ctx's migration, in a session of its own; None without logical capture."""
    if not logical.enabled(ctx) or ctx.swapped:
        yield None
        return
    fctx = Context(db=ctx.db.sibling(role="mover-feeder"), migration=ctx.migration, owner=ctx.owner,
                   report=ctx.report, stop=ctx.stop, lease_lost=ctx.lease_lost)
    try:
        yield lambda: logical.feed(fctx, catch_up=False)
    finally:
        fctx.db.close()


@dataclass
class Throttle:
    """One loop's throttle: the governor's decision (when it has one: every engine's in a run)
    with the loop's own rows/s cap, which its process's workers share evenly."""

    limits: Limits
    workers: int = 1
    governor: Governor | None = None

    def reason(self, paused: bool, *, consumer: bool = False) -> str | None:
        """Why the next unit of work must wait (the caller read the pause flag in a transaction
        of its own, from the migration's row), or None."""
        if paused:
            return "paused (mover unpause)"
        return None if self.governor is None else self.governor.reason(consumer=consumer)

    def gate(self, paused: bool, hint: int) -> Gate:
        """Before each range: wait (pause, a guard, the governor measuring), or go with a range
        of about `hint` keys within what the limits allow."""
        reason = self.reason(paused)
        if reason:
            return Gate(wait=reason, seconds=self.recheck_seconds())
        return Gate(rows=self.range_rows(hint))

    def recheck_seconds(self) -> float:
        """How long to wait on a reason before asking again: RECHECK_SECONDS, or much less while
        the governor measures its baseline (over within a quarter second: a whole second's wait
        each phase would cost an idle server's backfill a tenth of its time)."""
        measuring = self.governor is not None and self.governor.measuring
        return MEASURING_RECHECK_SECONDS if measuring else RECHECK_SECONDS

    @property
    def duty(self) -> float:
        return 1.0 if self.governor is None else self.governor.duty

    def range_rows(self, hint: int) -> int:
        """Keys to ask for in the next range: the engine's hint, within max_rows (so `mover set`
        reaches the very next range), within the rows/s cap's budget, and `duty` times that. A
        range bigger than the cap allows in burst_ms (at most a second) would break the cap within
        the second it runs, however long we wait after it: the cap wins over any minimum size."""
        lim = self.limits
        rows = min(hint, lim.max_rows)
        if lim.max_rows_per_second:
            per_worker = lim.max_rows_per_second / max(self.workers, 1)
            rows = min(rows, max(1, int(per_worker * min(lim.burst_ms, 1000) / 1000)))
        return pacing.scaled_rows(max(rows, 1), self.duty)

    def pace(self, rows: int, elapsed: float) -> tuple[float, str | None]:
        """Seconds to wait after handling `rows` in `elapsed` seconds, and why: the rows/s cap
        (shared evenly among the workers) or the governor's duty, whichever asks more."""
        cap = self.limits.max_rows_per_second
        capped = max(0.0, rows / (cap / max(self.workers, 1)) - elapsed) if cap else 0.0
        rest = 0.0 if self.governor is None else self.governor.rest(elapsed)
        if rest > capped:
            assert self.governor is not None
            return rest, self.governor.throttled()
        return capped, self.cap_reason() if capped else None

    def cap_reason(self) -> str:
        return f"rows/s cap {self.limits.max_rows_per_second}"
