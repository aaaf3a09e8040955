"""The governor's arithmetic (mover/engines/governor/throttle.py), pure: readings in, decisions out, no I/O
and no clock of its own (time is an argument), so that every rule is a unit test
(tests/unit/test_governor.py).

Invariants:
- One duty for every bulk engine of a migration: the share of their time they work. A loop that
  worked `elapsed` seconds waits elapsed * (1 - duty) / duty before its next range, and asks for
  ranges `duty` times their size, so that at any duty mover works in short bursts with short
  waits between them (no stop-and-go): a range's period stays near the engine's target duration.
- The duty follows the pressure, the worst of the probe's latency over its budget and the
  server's WAL rate over [throttle] max_wal_per_second: over 1, it is cut in proportion (by at
  most half, at least a tenth, at most every DECREASE_SECONDS); under RELEASE_RATIO it grows back
  by INCREASE_STEP a reading (about five seconds from the floor to full speed). Between the two
  it holds: no hunting around the budget.
- The duty never goes under the floor ([throttle] floor): mover never stops because of the
  application's own load, and after FLOOR_NOTICE_SECONDS at the floor with the pressure still
  over 1, the state says so (status, a `throttle_floor` event) and the operator decides.
- Protection costs what there is to protect: while no application session has run a statement
  for [throttle] idle_after, the duty is 1 whatever the probe reads (state quiet); the probe
  measures mover's own commits slowing each other then, which no budget needs to hold. The
  first busy reading governs again from full duty, cut at once if the probe is over its budget.
- A guard (a lagging or vanished standby, a slot near its limit, archiving failing or behind) is
  a wait, not a duty: every engine stops between its units of work until it clears, quiet or not.
- Events mark changes of state only (throttled, released, at the floor, waiting, going on),
  never one per range or per reading.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

PROBE_SECONDS = 0.25  # between two probes
WINDOW = 5  # probes in the median the controller reads: a single slow commit is noise
DECREASE_SECONDS = 0.5  # at most one cut per this long: let the engines feel the last one first
INCREASE_STEP = 0.05  # duty regained per reading under the budget
RELEASE_RATIO = 0.9  # the pressure under which the duty grows again (hysteresis)
RELEASE_SECONDS = 2.0  # at full duty this long after the last cut: released
FLOOR_NOTICE_SECONDS = 10.0  # at the floor this long, still over: say so
MIN_SLACK_MS = 1.0  # a budget is at least this far above the baseline: sub-millisecond noise is no signal
BASELINE_PROBES = 8  # probes before a phase, mover idle: their median is the baseline
MIN_DUTY = 0.01  # under this, engines wait rather than work in slivers
SLOT_MARGIN_FRACTION = 0.2  # keep a fifth of max_slot_wal_keep_size clear of invalidation ...
SLOT_MARGIN_SECONDS = 10.0  # ... or ten seconds of WAL at the current rate, whichever is more
WAL_RATE_SECONDS = 5.0  # the WAL rate is read over this window
# A statement the throttle cannot pace (an index build, ANALYZE) runs this long before another
# starts beside it: the probes' median the duty comes from then reads what it costs.
SETTLE_SECONDS = WINDOW * PROBE_SECONDS


# ---------------------------------------------------------------------------------------------
# Budget and duty


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def budget_ms(baseline_ms: float | None, increase: float | None, absolute_ms: float) -> float | None:
    """What the probe's latency may reach: `absolute_ms` when given ([throttle] probe_latency),
    else the baseline raised by `increase` (0.5 for "50%") and at least MIN_SLACK_MS above it;
    None when there is no latency budget ("off", or no baseline yet)."""
    if absolute_ms > 0:
        return absolute_ms
    if increase is None or baseline_ms is None:
        return None
    return max(baseline_ms * (1 + increase), baseline_ms + MIN_SLACK_MS)


@dataclass(frozen=True)
class Limits:
    """What the governor holds the engines to, from the plan ([throttle], [backfill] max_replica_lag)."""

    latency_ms: float | None = None  # the probe's budget; None: none
    budget_setting: str = "max_latency_increase"  # what sets it ([throttle]), as messages name it
    floor: float = 0.1
    max_wal_per_second: int = 0  # bytes/s; 0: none
    max_replica_lag_ms: int = 0  # 0: standbys not watched
    max_slot_wal: int = 0  # bytes; 0: only the risk of invalidation
    max_archive_backlog: int = 0  # bytes; 0: only a failing archiver

    @property
    def governed(self) -> bool:
        """Whether anything sets the duty (else it stays 1: only the guards and caps hold)."""
        return self.latency_ms is not None or self.max_wal_per_second > 0


def pressure(latency_ms: float | None, wal_per_second: float | None, limits: Limits) -> tuple[float, str | None]:
    """The worst ratio of a signal to its limit (over 1: over the budget), and what it is, as
    status prints it."""
    worst, why = 0.0, None
    if limits.latency_ms is not None and latency_ms is not None:
        worst = latency_ms / limits.latency_ms
        why = f"probe latency {latency_ms:.1f} ms {'>' if worst > 1 else 'within'} {limits.latency_ms:.1f} ms budget"
    if limits.max_wal_per_second and wal_per_second is not None:
        ratio = wal_per_second / limits.max_wal_per_second
        if ratio > worst:
            worst = ratio
            why = (f"WAL {human_bytes(wal_per_second)}/s {'>' if ratio > 1 else 'within'} "
                   f"{human_bytes(limits.max_wal_per_second)}/s ([throttle] max_wal_per_second)")
    return worst, why


@dataclass(frozen=True)
class Event:
    kind: str
    message: str
    detail: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """What every engine of the migration is held to now, and the controller's memory."""

    state: str = "ok"  # ok | throttled | floor | waiting | off | measuring | quiet
    duty: float = 1.0
    reason: str | None = None  # why the duty is under 1 (or what it reads, within the budget)
    wait: str | None = None  # a guard every engine waits on
    throttled_since: float | None = None  # monotonic seconds
    waiting_since: float | None = None
    decreased_at: float = -math.inf
    floor_since: float | None = None

    @property
    def throttled(self) -> bool:
        return self.state in ("throttled", "floor")


def next_duty(duty: float, over: float, now: float, decreased_at: float, floor: float) -> tuple[float, float]:
    """The duty after a reading of `over` (the pressure), and when it was last cut."""
    if over > 1:
        if now - decreased_at < DECREASE_SECONDS:
            return duty, decreased_at
        cut = min(0.9, max(0.5, 1 / over))  # proportional: twice the budget halves the duty
        return max(floor, duty * cut), now
    if over < RELEASE_RATIO:
        return min(1.0, duty + INCREASE_STEP), decreased_at
    return duty, decreased_at


def decide(prev: Decision, now: float, *, latency_ms: float | None, wal_per_second: float | None,
           wait: str | None, limits: Limits, quiet: str | None = None) -> tuple[Decision, list[Event]]:
    """The next decision from the readings at `now` (monotonic seconds): a guard's `wait`, the
    probe's median latency, the server's WAL rate, `quiet` (why nothing needs protecting: no
    application session busy; None while one is); and the events its change of state makes."""
    events: list[Event] = []
    d = prev
    # A guard first: while one holds, the duty keeps its value and mover waits.
    if wait is not None:
        if prev.wait is None:
            events.append(Event("throttle_waiting", f"waiting: {wait}", {"wait": wait}))
            d = replace(d, waiting_since=now)
        d = replace(d, wait=wait, state="waiting")
        return d, events
    if prev.wait is not None:
        held = now - (prev.waiting_since or now)
        events.append(Event("throttle_resumed", f"going on after waiting {held:.1f} s ({prev.wait})",
                            {"was": prev.wait, "seconds": round(held, 1)}))
        d = replace(d, wait=None, waiting_since=None, state="throttled" if prev.throttled_since else "ok")
    if not limits.governed:
        if prev.throttled_since is not None:
            events.append(_released(prev, now, f"no budget any more ([throttle] {limits.budget_setting} off)"))
        return Decision(state="off", duty=1.0, reason=f'[throttle] {limits.budget_setting} = "off"'), events
    if quiet is not None:
        # Nothing to protect: full duty at once. Only the application's own sessions say so; the
        # probe reads mover slowing its own commits, which no budget needs to hold.
        if prev.throttled_since is not None:
            events.append(_released(prev, now, quiet))
        if prev.state != "quiet":
            events.append(Event("throttle_quiet", f"full speed: {quiet}", {"reason": quiet}))
        return Decision(state="quiet", duty=1.0, reason=quiet), events
    if prev.state == "quiet":
        # The application is back: governed from full duty, cut at this very reading if over.
        events.append(Event("throttle_busy", "the application is busy again: governing to the budget", {}))
        d = replace(d, state="ok", reason=None)
    over, why = pressure(latency_ms, wal_per_second, limits)
    duty, cut_at = next_duty(d.duty, over, now, d.decreased_at, limits.floor)
    d = replace(d, duty=duty, decreased_at=cut_at, reason=why)
    detail: dict[str, object] = {
        "duty": round(duty, 3), "latency_ms": _r(latency_ms), "budget_ms": _r(limits.latency_ms),
        "wal_per_second": None if wal_per_second is None else round(wal_per_second)}
    if d.throttled_since is None and duty < 1:
        events.append(Event("throttled", f"throttled: {why}", detail))
        d = replace(d, throttled_since=now, state="throttled")
    elif d.throttled_since is not None and duty >= 1 and now - cut_at >= RELEASE_SECONDS:
        events.append(_released(d, now, why))
        return replace(d, state="ok", throttled_since=None, floor_since=None), events
    if d.throttled_since is None:
        return replace(d, state="ok"), events
    at_floor = duty <= limits.floor + 1e-9 and over > 1
    floor_since = (d.floor_since or now) if at_floor else None
    if at_floor and d.state != "floor" and now - (floor_since or now) >= FLOOR_NOTICE_SECONDS:
        events.append(Event(
            "throttle_floor",
            f"at the floor: mover works {limits.floor:.0%} of its time and still {why}; the application is "
            f"slow with mover nearly idle: raise the budget ([throttle] {limits.budget_setting}), pause, or wait",
            {**detail, "floor": limits.floor}))
        return replace(d, state="floor", floor_since=floor_since), events
    state = "floor" if at_floor and d.state == "floor" else "throttled"
    return replace(d, state=state, floor_since=floor_since), events


def first(now: float, *, wait: str | None, limits: Limits, quiet: str | None = None) -> tuple[Decision, list[Event]]:
    """The decision once a phase's baseline is measured, before any reading under load: full
    duty, or waiting from the start when a guard holds already, or quiet when nothing needs
    protecting (each with its event, as any change of state)."""
    start = Decision(state="ok" if limits.governed else "off")
    if wait is None and (quiet is None or not limits.governed):
        return start, []
    return decide(start, now, latency_ms=None, wal_per_second=None, wait=wait, limits=limits, quiet=quiet)


def _released(d: Decision, now: float, why: str | None) -> Event:
    took = now - (d.throttled_since or now)
    return Event("released", f"released after {took:.1f} s throttled" + (f": {why}" if why else ""),
                 {"seconds": round(took, 1)})


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def wait_after(elapsed: float, duty: float, longest: float = 30.0) -> float:
    """Seconds to rest after `elapsed` seconds of work at `duty` (at most `longest`: the loop asks
    again then, and a duty that rose meanwhile is not waited out)."""
    if duty >= 1:
        return 0.0
    if duty < MIN_DUTY:
        return longest
    return min(longest, max(0.0, elapsed) * (1 - duty) / duty)


def scaled_rows(rows: int, duty: float) -> int:
    """A range `duty` times its unthrottled size (at least one key): a shorter burst, not only a
    longer rest."""
    return max(1, int(rows * min(1.0, max(duty, MIN_DUTY))))


def sessions_allowed(sessions: int, duty: float) -> int:
    """How many index builds may run at once at `duty` (at least one: a build cannot be paced
    inside, only whether and when the next one starts)."""
    return max(1, min(sessions, math.ceil(sessions * duty - 1e-9)))


# ---------------------------------------------------------------------------------------------
# Guards


@dataclass(frozen=True)
class Standby:
    name: str  # application_name, and the address: a standby's name is often just walreceiver
    state: str | None  # streaming, catchup, ...; None: not visible to this role
    replay_lag_s: float | None


def standby_wait(standbys: Sequence[Standby], seen: frozenset[str], limit_ms: int
                 ) -> tuple[str | None, frozenset[str]]:
    """Why mover waits for the standbys, if it does, and the standbys seen streaming so far. A
    standby that was streaming and is no longer listed (or no longer streams) fails closed: its
    lag is unknown and grows while mover writes. `limit_ms` 0: standbys are not watched (and
    forgotten, so that setting the limit again starts from those streaming then)."""
    if not limit_ms:
        return None, frozenset()
    streaming = frozenset(s.name for s in standbys if s.state == "streaming")
    gone = sorted(seen - streaming)
    if gone:
        return (f"standby {gone[0]} stopped streaming; mover waits for it (failing closed: its lag is unknown). "
                f"If it is gone for good, restart mover, or set [backfill] max_replica_lag = \"0s\" while it is "
                f"away"), seen | streaming
    worst = max((s for s in standbys if s.replay_lag_s is not None), key=lambda s: s.replay_lag_s or 0.0,
                default=None)
    if worst is not None and (worst.replay_lag_s or 0) * 1000 > limit_ms:
        return (f"replica lag {worst.replay_lag_s:.1f}s above {limit_ms / 1000:g}s (standby {worst.name})",
                seen | streaming)
    return None, seen | streaming


@dataclass(frozen=True)
class Slot:
    name: str
    kind: str  # physical | logical
    active: bool
    wal_status: str | None  # reserved, extended, unreserved, lost
    retained: int | None  # bytes of WAL from its restart_lsn to the current position
    safe_wal_size: int | None  # bytes it may still fall behind before invalidation (NULL: no limit)


def slot_wait(slots: Sequence[Slot], keep_size: int, limit: int, wal_per_second: float,
              ignore: frozenset[str] = frozenset(), own: frozenset[str] = frozenset()) -> str | None:
    """Why mover waits for a replication slot, if it does: a slot near invalidation under
    max_slot_wal_keep_size (`keep_size` bytes, -1: unlimited), or holding back more than `limit`
    bytes ([throttle] max_slot_wal, 0: no limit). `own`: mover's own slots (its logical capture),
    watched as any other and named as mover's, with what frees them. `ignore`: slots the caller
    itself consumes (waiting on them would stop their consumer: throttle.Governor.reason). A lost
    slot retains nothing: waiting would not bring it back (the feed of mover's own stops the
    migration with SlotLost)."""
    margin = max(keep_size * SLOT_MARGIN_FRACTION, wal_per_second * SLOT_MARGIN_SECONDS) if keep_size >= 0 else 0
    for s in sorted(slots, key=lambda s: -(s.retained or 0)):
        if s.name in ignore or s.wal_status == "lost" or s.retained is None:
            continue
        name = f"replication slot {s.name}"
        after = ""
        if s.name in own:
            name = f"mover's own {name} (its logical capture)"
            after = "; its feeder goes on reading it meanwhile"
        if s.wal_status == "unreserved":
            return (f"{name} is about to lose WAL it needs (wal_status unreserved: "
                    f"{human_bytes(s.retained)} held back, max_slot_wal_keep_size {human_bytes(keep_size)}){after}")
        if keep_size >= 0 and s.safe_wal_size is not None and s.safe_wal_size < margin:
            return (f"{name} is {human_bytes(max(s.safe_wal_size, 0))} from invalidation under "
                    f"max_slot_wal_keep_size {human_bytes(keep_size)} (mover keeps {human_bytes(margin)} clear){after}")
        if limit and s.retained > limit:
            return (f"{name} holds back {human_bytes(s.retained)} of WAL, over "
                    f"{human_bytes(limit)} ([throttle] max_slot_wal){after}")
    return None


@dataclass(frozen=True)
class Archiver:
    mode: str  # archive_mode: off, on, always
    current_wal: str  # the segment being written
    segment_size: int
    archived_wal: str | None
    archived_at: datetime | None
    failed_wal: str | None
    failed_at: datetime | None


def segment_number(wal_file: str, segment_size: int) -> int:
    """The position of a WAL segment file (TTTTTTTTXXXXXXXXYYYYYYYY), across timelines."""
    log_id, seg = int(wal_file[8:16], 16), int(wal_file[16:24], 16)
    return log_id * (0x100000000 // segment_size) + seg


def archive_backlog(a: Archiver) -> int | None:
    """Bytes of WAL completed but not yet archived, or None when it cannot be known (archiving
    off, nothing archived yet, or not a WAL segment: a history or backup file)."""
    if a.mode not in ("on", "always") or a.archived_wal is None or len(a.archived_wal) != 24:
        return None
    done = segment_number(a.archived_wal, a.segment_size)
    return max(0, segment_number(a.current_wal, a.segment_size) - done - 1) * a.segment_size


def archive_wait(a: Archiver | None, limit: int) -> str | None:
    """Why mover waits for the archiver, if it does: archiving failing (its last failure newer
    than its last success), or more than `limit` bytes waiting for it (0: no limit). The WAL
    mover writes would pile up in pg_wal meanwhile."""
    if a is None or a.mode not in ("on", "always"):
        return None
    if a.failed_at is not None and (a.archived_at is None or a.failed_at > a.archived_at):
        return (f"archiving fails ({a.failed_wal} failed at {a.failed_at:%H:%M:%S}, pg_stat_archiver); the WAL "
                f"mover writes would pile up in pg_wal")
    backlog = archive_backlog(a)
    if limit and backlog is not None and backlog > limit:
        return (f"archiving is {human_bytes(backlog)} behind, over {human_bytes(limit)} "
                f"([throttle] max_archive_backlog)")
    return None


# Which guard holds the engines, from the first words of its wait (what standby_wait, slot_wait and
# archive_wait say): `mover metrics` labels each guard's wait with it. "other" for a text none of
# them wrote (tests/unit/test_metrics.py feeds every message of each guard through it).
GUARDS = ("standby", "replication_slot", "archiving")


def guard_of(wait: str) -> str:
    if wait.startswith(("standby ", "replica lag ")):
        return "standby"
    if wait.startswith(("replication slot ", "mover's own replication slot ")):
        return "replication_slot"
    if wait.startswith("archiving "):
        return "archiving"
    return "other"


def wal_rate(samples: Sequence[tuple[float, int]]) -> float | None:
    """Bytes of WAL per second over (monotonic seconds, LSN as bytes) samples, oldest first."""
    if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
        return None
    return max(0.0, (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0]))


def human_bytes(n: float) -> str:
    for unit, size in (("TB", 1024**4), ("GB", 1024**3), ("MB", 1024**2), ("kB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
