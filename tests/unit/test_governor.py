"""The governor's arithmetic without a database (mover/engines/governor/pacing.py): the budget, the duty's
controller over a run of readings, the floor, the guards' verdicts over readings of standbys,
slots and the archiver, and how a loop applies a duty (mover/engines/governor/throttle.py Throttle)."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from mover.engines.capture.logical import SlotHealth
from mover.engines.governor import pacing, signals, throttle
from mover.engines.governor.pacing import Archiver, Decision, Limits, Slot, Standby, decide
from mover.plan import parse_plan, plan_from_canonical, to_document

GB, MB = 1024**3, 1024**2


# ---------------------------------------------------------------------------------------------
# The budget


def test_the_budget_is_the_baseline_raised_by_the_increase_at_least_a_millisecond_over_it():
    assert pacing.budget_ms(2.0, 0.5, 0) == pytest.approx(3.0)
    assert pacing.budget_ms(10.0, 0.5, 0) == pytest.approx(15.0)
    # A local server's sub-millisecond commit: 50 % of it is noise, not a signal.
    assert pacing.budget_ms(0.3, 0.5, 0) == pytest.approx(1.3)


def test_an_absolute_budget_wins_and_off_means_none():
    assert pacing.budget_ms(2.0, 0.5, 5) == 5
    assert pacing.budget_ms(2.0, None, 0) is None  # "off"
    assert pacing.budget_ms(None, 0.5, 0) is None  # no baseline yet
    assert pacing.budget_ms(None, None, 7) == 7


def test_the_plan_says_what_the_governor_holds_to():
    base = {"migration": {"name": "m", "source": "t"}, "rollback": {"window": "1h"}}
    default = throttle.limits_of(parse_plan(base), baseline_ms=2.0)
    assert (default.latency_ms, default.floor, default.max_slot_wal, default.max_archive_backlog,
            default.max_wal_per_second, default.max_replica_lag_ms) == (3.0, 0.1, 10 * GB, 1 * GB, 0, 30_000)
    off = throttle.limits_of(parse_plan({**base, "throttle": {"max_latency_increase": "off"}}), baseline_ms=2.0)
    assert off.latency_ms is None and not off.governed
    capped = throttle.limits_of(parse_plan({**base, "throttle": {"max_latency_increase": "off",
                                                                  "max_wal_per_second": "20MB"}}), 2.0)
    assert capped.governed and capped.max_wal_per_second == 20 * MB


def test_the_copy_has_its_own_wider_budget_and_off_governs_nothing_by_latency():
    base = {"migration": {"name": "m", "source": "t"}, "rollback": {"window": "1h"}}
    assert throttle.limits_of(parse_plan(base), 2.0, throttle.COPY_PHASE).latency_ms == 3.0  # both 50 % by default
    plan = parse_plan({**base, "throttle": {"copy_latency_increase": "150%"}})
    copy, builds = (throttle.limits_of(plan, 2.0, phase) for phase in (throttle.COPY_PHASE, "index builds"))
    assert (copy.latency_ms, copy.budget_setting) == (5.0, "copy_latency_increase")  # 150 % over 2 ms
    assert (builds.latency_ms, builds.budget_setting) == (3.0, "max_latency_increase")
    assert throttle.limits_of(plan, 2.0, "reconcile").latency_ms == 3.0
    # The copy unheld by latency, the builds still held; "off" on max_latency_increase: nothing held.
    free_copy = parse_plan({**base, "throttle": {"copy_latency_increase": "off"}})
    assert throttle.limits_of(free_copy, 2.0, throttle.COPY_PHASE).latency_ms is None
    assert throttle.limits_of(free_copy, 2.0, "index builds").latency_ms == 3.0
    off = parse_plan({**base, "throttle": {"max_latency_increase": "off", "copy_latency_increase": "300%"}})
    assert throttle.limits_of(off, 2.0, throttle.COPY_PHASE).latency_ms is None
    # An absolute budget replaces both.
    absolute = throttle.limits_of(parse_plan({**base, "throttle": {"probe_latency": "7ms"}}), 2.0, throttle.COPY_PHASE)
    assert (absolute.latency_ms, absolute.budget_setting) == (7, "probe_latency")
    # The floor's event names the setting to raise in that phase.
    at_floor = Decision(state="throttled", duty=0.1, throttled_since=1.0, decreased_at=1.0, floor_since=1.0)
    _, events = decide(at_floor, 20.0, latency_ms=50.0, wal_per_second=None, wait=None, limits=copy)
    assert any("[throttle] copy_latency_increase" in e.message for e in events if e.kind == "throttle_floor"), events
    assert decide(Decision(), 1.0, latency_ms=None, wal_per_second=None, wait=None,
                  limits=throttle.limits_of(free_copy, 2.0, throttle.COPY_PHASE))[0].reason == \
        '[throttle] copy_latency_increase = "off"'


def test_a_limit_turned_off_is_kept_through_the_stored_plan_and_mover_set():
    # [throttle] is stored only away from its defaults; a limit set to "off" (0 bytes) is away from
    # its default (10GB, 1GB) and must read back as off, not as the default it would be if left out.
    base = {"migration": {"name": "m", "source": "t"}, "rollback": {"window": "1h"}}
    plan = parse_plan({**base, "throttle": {"max_slot_wal": "off", "max_archive_backlog": "0", "floor": "0%"}})
    for again in (plan_from_canonical(plan.canonical()), parse_plan(to_document(plan), origin="mover set")):
        t = again.throttle
        assert (t.max_slot_wal, t.max_archive_backlog, t.floor) == (0, 0, "0%"), t
    # At its defaults the section is left out of both, so plans registered before it read the same.
    assert "throttle" not in parse_plan(base).canonical() and "throttle" not in to_document(parse_plan(base))


# ---------------------------------------------------------------------------------------------
# The duty


def test_over_the_budget_the_duty_is_cut_in_proportion_at_most_by_half_at_least_by_a_tenth():
    assert pacing.next_duty(1.0, 2.0, now=10, decreased_at=0, floor=0.1) == (0.5, 10)  # twice the budget: half
    assert pacing.next_duty(1.0, 1.05, now=10, decreased_at=0, floor=0.1) == (0.9, 10)  # barely over: a tenth
    assert pacing.next_duty(1.0, 50.0, now=10, decreased_at=0, floor=0.1) == (0.5, 10)  # never more than half
    assert pacing.next_duty(0.12, 3.0, now=10, decreased_at=0, floor=0.1) == (0.1, 10)  # never under the floor


def test_the_duty_is_cut_at_most_every_half_second():
    assert pacing.next_duty(0.8, 3.0, now=10.3, decreased_at=10.0, floor=0.1) == (0.8, 10.0)
    assert pacing.next_duty(0.8, 3.0, now=10.5, decreased_at=10.0, floor=0.1) == (0.4, 10.5)


def test_under_the_budget_it_grows_back_a_step_a_reading_and_holds_close_to_the_budget():
    assert pacing.next_duty(0.5, 0.5, now=10, decreased_at=0, floor=0.1) == (pytest.approx(0.55), 0)
    assert pacing.next_duty(0.98, 0.2, now=10, decreased_at=0, floor=0.1) == (1.0, 0)
    assert pacing.next_duty(0.5, 0.95, now=10, decreased_at=0, floor=0.1) == (0.5, 0)  # no hunting at the edge


def run(readings, limits, start=None, step=pacing.PROBE_SECONDS, wait=None):
    """decide() over a sequence of probe medians, a reading every `step` seconds; the decisions
    and every event with the time it came."""
    d, now, out, events = start or Decision(), 0.0, [], []
    for latency in readings:
        now += step
        d, got = decide(d, now, latency_ms=latency, wal_per_second=None, wait=wait, limits=limits)
        out.append(d)
        events += [(round(now, 2), e) for e in got]
    return out, events


BUDGET = Limits(latency_ms=3.0, floor=0.1)


def test_a_burst_throttles_smoothly_and_releases_after_it_with_one_event_each():
    quiet, burst = [2.0] * 8, [9.0] * 8  # 3x the budget for two seconds
    decisions, events = run(quiet + burst + quiet * 4, BUDGET)
    assert [e.kind for _, e in events] == ["throttled", "released"]
    first = events[0][1]
    assert first.message == "throttled: probe latency 9.0 ms > 3.0 ms budget"
    assert first.detail["budget_ms"] == 3.0 and first.detail["latency_ms"] == 9.0
    # It backs off at the first reading over the budget (within the burst's first 250 ms)...
    assert events[0][0] == pytest.approx(2.25)
    duties = [d.duty for d in decisions]
    assert min(duties) == pytest.approx(0.1)
    # ...smoothly: no reading moves the duty by more than half down, or a step up.
    for a, b in itertools.pairwise(duties):
        assert b >= a * 0.5 - 1e-9 and b - a <= pacing.INCREASE_STEP + 1e-9
    # Released once back at full duty for RELEASE_SECONDS; "released" says how long it lasted.
    assert duties[-1] == 1.0 and decisions[-1].state == "ok"
    assert events[1][1].detail["seconds"] > 4


def test_noise_under_the_budget_and_a_hold_between_ninety_percent_and_the_budget_make_no_event():
    _, events = run([2.0, 2.9, 2.5, 2.95, 1.5] * 10, BUDGET)
    assert events == []


def test_below_the_floor_it_says_so_once_and_keeps_working_at_the_floor():
    decisions, events = run([20.0] * 80, BUDGET)  # 20 s, 6.7x the budget throughout
    kinds = [e.kind for _, e in events]
    assert kinds == ["throttled", "throttle_floor"]
    at, floor = events[1]
    assert "at the floor: mover works 10% of its time" in floor.message
    # The duty reached the floor within a couple of seconds; the notice came 10 s after that.
    reached = next(i for i, d in enumerate(decisions) if d.duty <= 0.1 + 1e-9) * pacing.PROBE_SECONDS
    assert at - reached == pytest.approx(pacing.FLOOR_NOTICE_SECONDS, abs=pacing.PROBE_SECONDS * 1.5)
    assert decisions[-1].state == "floor" and decisions[-1].duty == pytest.approx(0.1)
    assert pacing.wait_after(0.05, decisions[-1].duty) == pytest.approx(0.45)  # still working, a tenth


def test_a_zero_floor_lets_mover_stop_entirely_and_the_loop_waits():
    decisions, _ = run([20.0] * 40, Limits(latency_ms=3.0, floor=0.0))
    assert decisions[-1].duty < pacing.MIN_DUTY
    assert pacing.wait_after(0.1, decisions[-1].duty) == 30.0


def test_without_a_budget_nothing_is_throttled_and_a_throttle_in_course_is_released():
    decisions, events = run([50.0] * 4, Limits(latency_ms=None))
    assert {d.state for d in decisions} == {"off"} and events == []
    throttled, _ = run([9.0] * 4, BUDGET)
    d, got = decide(throttled[-1], 5.0, latency_ms=9.0, wal_per_second=None, wait=None, limits=Limits())
    assert (d.state, d.duty, [e.kind for e in got]) == ("off", 1.0, ["released"])


def test_the_wal_rate_cap_is_pressure_like_the_latency():
    limits = Limits(latency_ms=3.0, max_wal_per_second=10 * MB)
    d, events = decide(Decision(), 1.0, latency_ms=2.0, wal_per_second=30 * MB, wait=None, limits=limits)
    assert d.duty == pytest.approx(0.5)  # 3x the cap: the biggest cut, half
    assert events[0].message == "throttled: WAL 30.0 MB/s > 10.0 MB/s ([throttle] max_wal_per_second)"


def test_a_guard_is_a_wait_with_one_event_when_it_comes_and_one_when_it_goes():
    d, e1 = decide(Decision(), 1.0, latency_ms=2.0, wal_per_second=None, wait="replica lag 40.0s above 30s",
                   limits=BUDGET)
    d, e2 = decide(d, 2.0, latency_ms=2.0, wal_per_second=None, wait="replica lag 41.0s above 30s", limits=BUDGET)
    assert d.state == "waiting" and d.wait == "replica lag 41.0s above 30s"
    d, e3 = decide(d, 4.5, latency_ms=2.0, wal_per_second=None, wait=None, limits=BUDGET)
    assert d.state == "ok" and d.wait is None
    assert [e.kind for e in e1 + e2 + e3] == ["throttle_waiting", "throttle_resumed"]
    assert e3[0].detail["seconds"] == 3.5


def test_a_phase_that_starts_under_a_guard_is_waiting_from_the_start_and_says_so():
    assert pacing.first(1.0, wait=None, limits=BUDGET) == (Decision(state="ok"), [])
    assert pacing.first(1.0, wait=None, limits=Limits())[0].state == "off"
    d, events = pacing.first(1.0, wait="replication slot sub1 holds back 11.0 GB", limits=BUDGET)
    assert d.state == "waiting" and d.wait == "replication slot sub1 holds back 11.0 GB" and d.duty == 1.0
    assert [e.kind for e in events] == ["throttle_waiting"]
    d, events = decide(d, 3.0, latency_ms=2.0, wal_per_second=None, wait=None, limits=BUDGET)
    assert d.state == "ok" and [e.kind for e in events] == ["throttle_resumed"] and events[0].detail["seconds"] == 2.0


QUIET = "no application session has run a statement for 12 s (quiet over 10 s: [throttle] idle_after)"


def test_with_nothing_to_protect_the_duty_is_full_whatever_the_probe_reads_and_a_throttle_is_released():
    # mover's own commits slow the probe far over its budget; with no application busy, nothing is paced.
    d, now, kinds = Decision(), 0.0, []
    for _ in range(12):
        now += pacing.PROBE_SECONDS
        d, got = decide(d, now, latency_ms=30.0, wal_per_second=None, wait=None, limits=BUDGET, quiet=QUIET)
        kinds += [e.kind for e in got]
        assert (d.state, d.duty, d.reason) == ("quiet", 1.0, QUIET)
    assert kinds == ["throttle_quiet"]  # a change of state, said once
    # Throttled when the application goes quiet: released at once, then quiet.
    throttled, _ = run([9.0] * 8, BUDGET)
    assert throttled[-1].duty < 1
    d, got = decide(throttled[-1], 3.0, latency_ms=9.0, wal_per_second=None, wait=None, limits=BUDGET, quiet=QUIET)
    assert (d.state, d.duty) == ("quiet", 1.0) and [e.kind for e in got] == ["released", "throttle_quiet"]


def test_the_first_busy_reading_after_quiet_governs_again_and_cuts_at_once_if_over():
    quiet, _ = decide(Decision(), 0.25, latency_ms=9.0, wal_per_second=None, wait=None, limits=BUDGET, quiet=QUIET)
    d, got = decide(quiet, 0.5, latency_ms=9.0, wal_per_second=None, wait=None, limits=BUDGET)
    assert [e.kind for e in got] == ["throttle_busy", "throttled"]
    assert d.state == "throttled" and d.duty == pytest.approx(0.5)  # 3x the budget: the biggest cut, at once
    # Within the budget when it comes back: governed, nothing cut, no throttle event.
    d, got = decide(quiet, 0.5, latency_ms=2.0, wal_per_second=None, wait=None, limits=BUDGET)
    assert (d.state, d.duty, [e.kind for e in got]) == ("ok", 1.0, ["throttle_busy"])


def test_a_guard_holds_a_quiet_server_too_and_off_stays_off():
    d, got = decide(Decision(state="quiet"), 1.0, latency_ms=2.0, wal_per_second=None,
                    wait="archiving fails", limits=BUDGET, quiet=QUIET)
    assert d.state == "waiting" and [e.kind for e in got] == ["throttle_waiting"]
    assert pacing.first(1.0, wait=None, limits=Limits(), quiet=QUIET) == (Decision(state="off"), [])
    d, got = pacing.first(1.0, wait=None, limits=BUDGET, quiet=QUIET)
    assert d.state == "quiet" and [e.kind for e in got] == ["throttle_quiet"]


def test_the_application_is_busy_while_a_session_runs_or_ran_a_statement_within_the_window():
    app = signals.Application
    assert app().busy(10) is None  # no session at all
    assert app(quiet_for=12.0).busy(10) is None
    assert app(quiet_for=3.0, busiest=("orders-api",)).busy(10) == \
        "the application ran a statement 3.0 s ago (orders-api)"
    assert app(active=2, quiet_for=30.0).busy(10) == "2 application session(s) running a statement"
    # Sessions of other roles this role cannot read: failing closed, and saying how to see them.
    assert "GRANT pg_read_all_stats" in (app(hidden=1, quiet_for=600.0).busy(10) or "")
    # idle_after = "0s": governed whatever the application does.
    assert app(quiet_for=600.0).busy(0) is not None
    assert app(quiet_for=12.0).quiet(10) == QUIET


# ---------------------------------------------------------------------------------------------
# How a loop applies the duty


def test_a_duty_shortens_both_the_ranges_and_the_work_between_rests():
    assert pacing.scaled_rows(200_000, 1.0) == 200_000
    assert pacing.scaled_rows(200_000, 0.25) == 50_000
    assert pacing.scaled_rows(3, 0.1) == 1  # never an empty range
    assert pacing.wait_after(0.2, 1.0) == 0.0
    assert pacing.wait_after(0.2, 0.25) == pytest.approx(0.6)  # a quarter of the time working
    assert pacing.wait_after(100.0, 0.1) == 30.0  # asked again after at most this


def test_index_builds_at_once_follow_the_duty_never_under_one():
    assert [pacing.sessions_allowed(4, d) for d in (1.0, 0.76, 0.5, 0.26, 0.1, 0.0)] == [4, 4, 2, 2, 1, 1]


class FakeGovernor:
    """What a loop's Throttle asks of the governor, with a fixed decision."""

    measuring = False

    def __init__(self, duty=1.0, wait=None, reason="probe latency 6.0 ms > 3.0 ms budget"):
        self.duty, self._wait, self._reason = duty, wait, reason

    def reason(self, consumer=False):
        return self._wait

    def rest(self, elapsed):
        return pacing.wait_after(elapsed, self.duty)

    def throttled(self):
        return f"throttled: {self._reason}"


def test_the_loops_gate_sizes_ranges_by_the_duty_and_waits_on_a_guard():
    t = throttle.Throttle(throttle.Limits(max_rows=100_000), governor=FakeGovernor(duty=0.5))
    assert t.gate(paused=False, hint=40_000).rows == 20_000
    held = throttle.Throttle(throttle.Limits(), governor=FakeGovernor(wait="replica lag 40.0s above 30s"))
    g = held.gate(paused=False, hint=40_000)
    assert (g.wait, g.rows) == ("replica lag 40.0s above 30s", 0)
    assert held.gate(paused=True, hint=40_000).wait == "paused (mover unpause)"  # the pause first


def test_the_rest_after_a_range_is_the_duty_or_the_cap_whichever_asks_more():
    t = throttle.Throttle(throttle.Limits(max_rows_per_second=1_000), governor=FakeGovernor(duty=0.25))
    assert t.pace(100, 0.4) == (pytest.approx(1.2), "throttled: probe latency 6.0 ms > 3.0 ms budget")
    assert t.pace(1_000, 0.1) == (pytest.approx(0.9), "rows/s cap 1000")


# ---------------------------------------------------------------------------------------------
# Guards


def test_a_standby_lagging_over_the_limit_holds_mover_and_names_it():
    s = [Standby("walreceiver (10.0.0.5)", "streaming", 0.2), Standby("s2 (10.0.0.6)", "streaming", 45.0)]
    why, seen = pacing.standby_wait(s, frozenset(), 30_000)
    assert why == "replica lag 45.0s above 30s (standby s2 (10.0.0.6))"
    assert seen == {"walreceiver (10.0.0.5)", "s2 (10.0.0.6)"}
    assert pacing.standby_wait(s[:1], frozenset(), 30_000)[0] is None


def test_a_standby_that_stops_streaming_fails_closed_until_it_is_back():
    both = [Standby("a (1)", "streaming", 0.1), Standby("b (2)", "streaming", 0.1)]
    _, seen = pacing.standby_wait(both, frozenset(), 30_000)
    why, seen = pacing.standby_wait(both[:1], seen, 30_000)  # b disconnected
    assert why is not None and why.startswith("standby b (2) stopped streaming; mover waits for it")
    why, _ = pacing.standby_wait([both[0], Standby("b (2)", "catchup", None)], seen, 30_000)
    assert why is not None  # reconnected, not streaming yet
    assert pacing.standby_wait(both, seen, 30_000)[0] is None  # back


def test_standbys_not_watched_are_forgotten():
    _, seen = pacing.standby_wait([Standby("a (1)", "streaming", 0.1)], frozenset(), 30_000)
    assert pacing.standby_wait([], seen, 0) == (None, frozenset())


def slot(name="sub1", retained=100 * MB, status="reserved", safe=None, kind="logical"):
    return Slot(name, kind, False, status, retained, safe)


def test_a_slot_over_the_plans_limit_holds_mover():
    why = pacing.slot_wait([slot(retained=11 * GB)], keep_size=-1, limit=10 * GB, wal_per_second=0)
    assert why == "replication slot sub1 holds back 11.0 GB of WAL, over 10.0 GB ([throttle] max_slot_wal)"
    assert pacing.slot_wait([slot(retained=9 * GB)], -1, 10 * GB, 0) is None
    assert pacing.slot_wait([slot(retained=11 * GB)], -1, 0, 0) is None  # "off"


def test_a_slot_near_invalidation_holds_mover_whatever_the_limit():
    keep = 1 * GB
    # A fifth of the keep size must stay clear: 150 MB left is too close.
    assert "from invalidation" in pacing.slot_wait([slot(safe=150 * MB)], keep, 0, wal_per_second=0)
    assert pacing.slot_wait([slot(safe=300 * MB)], keep, 0, wal_per_second=0) is None
    # Ten seconds of WAL at the current rate, when that is more.
    assert "from invalidation" in pacing.slot_wait([slot(safe=300 * MB)], keep, 0, wal_per_second=40 * MB)
    assert "about to lose WAL" in pacing.slot_wait([slot(status="unreserved", safe=0)], keep, 0, 0)


def test_a_lost_slot_or_one_the_caller_consumes_holds_nothing():
    lost = Slot("gone", "logical", False, "lost", None, None)
    assert pacing.slot_wait([lost], 64 * MB, 1, 0) is None
    own = slot("mover_m1_d5", retained=11 * GB)
    assert pacing.slot_wait([own], -1, 10 * GB, 0) is not None
    assert pacing.slot_wait([own], -1, 10 * GB, 0, ignore=frozenset({"mover_m1_d5"})) is None


def test_movers_own_slot_holds_the_bulk_engines_named_as_movers_but_never_its_consumer():
    # Logical capture's slot, as logical.health reads it: over the limit, and near invalidation.
    health = SlotHealth("mover_m1_d5", True, "extended", 4242, 11 * GB, 2.0, 11 * GB, None, "0/5", "0/4", 10, 10)
    r = signals.Readings(at=0.0, lsn=0, slots=(slot("sub1", retained=1 * GB), slot("mover_m1_d5", retained=11 * GB)),
                         own=health)
    assert r.own_slots == frozenset({"mover_m1_d5"})
    limits = Limits(max_slot_wal=10 * GB)
    why, _ = throttle.guard_wait(r, limits, frozenset(), 0.0)
    assert why == ("mover's own replication slot mover_m1_d5 (its logical capture) holds back 11.0 GB of WAL, over "
                   "10.0 GB ([throttle] max_slot_wal); its feeder goes on reading it meanwhile"), why
    # The engine that consumes it (the applier) is not held by it; by another slot, it is.
    assert throttle.guard_wait(r, limits, frozenset(), 0.0, r.own_slots)[0] is None
    over = signals.Readings(at=0.0, lsn=0, own=health,
                            slots=(slot("sub1", retained=12 * GB), slot("mover_m1_d5", retained=11 * GB)))
    assert throttle.guard_wait(over, limits, frozenset(), 0.0, over.own_slots)[0].startswith("replication slot sub1")
    # wal_status unreserved: about to be invalidated, whatever the limit.
    unreserved = Slot("mover_m1_d5", "logical", True, "unreserved", 70 * MB, -1 * MB)
    why = pacing.slot_wait([unreserved], 64 * MB, 0, 0, own=frozenset({"mover_m1_d5"}))
    assert why is not None and why.startswith("mover's own replication slot mover_m1_d5 (its logical capture) is "
                                              "about to lose WAL it needs (wal_status unreserved"), why
    # A missing slot (dropped under mover) is nobody's to wait for: the feed stops the migration (SlotLost).
    gone = SlotHealth("mover_m1_d5", False, None, None, None, None, None, None, "0/5", None, 10, 10)
    assert signals.Readings(at=0.0, lsn=0, own=gone).own_slots == frozenset()
    assert r.as_dict()["own_slot"]["retained_bytes"] == 11 * GB


T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def archiver(archived="000000010000000000000010", current="000000010000000000000012", failed_at=None,
             archived_at=T0, mode="on"):
    return Archiver(mode, current, 16 * MB, archived, archived_at, "000000010000000000000011" if failed_at else None,
                    failed_at)


def test_the_archive_backlog_counts_whole_segments_across_log_files():
    assert pacing.archive_backlog(archiver()) == 16 * MB  # segment 11 waits; 12 is being written
    across = archiver(archived="0000000100000000000000FF", current="000000010000000100000002")
    assert pacing.archive_backlog(across) == 2 * 16 * MB
    assert pacing.archive_backlog(archiver(mode="off")) is None
    assert pacing.archive_backlog(archiver(archived="00000002.history")) is None


def test_archiving_that_fails_or_lags_holds_mover():
    assert pacing.archive_wait(archiver(), limit=1 * GB) is None
    failing = archiver(failed_at=T0 + timedelta(seconds=5))
    assert pacing.archive_wait(failing, limit=0).startswith("archiving fails (000000010000000000000011 failed at")
    assert pacing.archive_wait(archiver(failed_at=T0 - timedelta(seconds=5)), 1 * GB) is None  # recovered since
    assert pacing.archive_wait(archiver(current="000000010000000000000050"), 1 * GB) is None  # 63 segments
    assert pacing.archive_wait(archiver(current="000000010000000000000052"), 1 * GB) == \
        "archiving is 1.0 GB behind, over 1.0 GB ([throttle] max_archive_backlog)"  # 65 segments
    assert pacing.archive_wait(archiver(mode="off", failed_at=T0 + timedelta(1)), 1 * GB) is None


def test_the_wal_rate_is_read_over_the_window():
    assert pacing.wal_rate([(0.0, 0), (2.0, 40 * MB), (4.0, 100 * MB)]) == pytest.approx(25 * MB)
    assert pacing.wal_rate([(0.0, 0)]) is None


def test_statements_that_cannot_be_paced_start_one_at_a_time_then_a_probe_window_apart():
    ramp = throttle.Ramp()
    assert ramp.claim(True, 1) == 0
    assert ramp.claim(True, 1) == throttle.RECHECK_SECONDS  # one at once by default: the next waits
    ramp.release()
    assert ramp.claim(True, 1) == 0  # nothing runs: no window to wait for
    left = ramp.claim(True, 2)  # a second may run beside, once the governor has read the first
    assert 0 < left <= pacing.SETTLE_SECONDS, left
    ramp._last -= pacing.SETTLE_SECONDS
    assert ramp.claim(True, 2) == 0
    assert ramp.claim(True, 2) == throttle.RECHECK_SECONDS
    ramp.release()
    ramp.release()
    off = throttle.Ramp()  # ungoverned: together, as many as ask
    assert [off.claim(False, 1) for _ in range(3)] == [0, 0, 0]


def test_a_statement_waiting_for_its_turn_wakes_when_one_ends():
    ramp = throttle.Ramp()
    assert ramp.claim(True, 1) == 0
    ended = threading.Timer(0.05, ramp.release)
    ended.start()
    started = time.monotonic()
    ramp.wait(30)
    assert time.monotonic() - started < 10  # woken by the release, not by the timeout
    assert ramp.claim(True, 1) == 0
    ended.join()


def test_an_engine_asks_again_soon_while_the_baseline_is_measured_and_after_a_second_otherwise():
    # The baseline takes a quarter second: an engine that waited a whole second on it each phase
    # cost an idle server's backfill a tenth of its time.
    gov = throttle.Governor.__new__(throttle.Governor)  # its decision alone: no server needed
    gov.decision, gov.decided_at = Decision(state="measuring"), time.monotonic()
    gov._thread = type("NoThread", (), {"error": None})()
    pacer = throttle.Throttle(throttle.Limits(), governor=gov)
    gate = pacer.gate(False, 1_000)
    assert gate.wait == "measuring the probe's latency before the work starts"
    assert gate.seconds == throttle.MEASURING_RECHECK_SECONDS < pacing.PROBE_SECONDS
    gov.decision = Decision(state="throttled", duty=0.001, reason="probe latency 9.0 ms > 3.0 ms budget")
    assert pacer.gate(False, 1_000).seconds == throttle.RECHECK_SECONDS
    assert throttle.Throttle(throttle.Limits()).recheck_seconds() == throttle.RECHECK_SECONDS


def test_a_rest_between_builds_ends_once_the_probe_reads_the_application_recovered():
    """A build cannot be paced while it runs: the rest after it lets the application's queue
    drain, and ends as soon as the probe's median is back under the budget's release ratio (or
    the duty back to full), not when the duty has climbed back step by step."""
    from types import SimpleNamespace

    from mover.engines.bulk import builds

    gov = throttle.Governor.__new__(throttle.Governor)
    gov.leading, gov.decision = True, Decision(state="throttled", duty=0.2, throttled_since=0.0)
    stop = threading.Event()
    checkpoints: list[float] = []

    def checkpoint() -> None:  # as Context.checkpoint: the rest ends there once stopped
        if stop.is_set():
            raise InterruptedError
        checkpoints.append(time.monotonic())

    ctx = SimpleNamespace(governor=gov, stop=stop, checkpoint=checkpoint)
    gov._pressure = 0.5  # recovered: no rest at all, whatever the duty says (2 s x 0.8 / 0.2 = 8 s)
    builds.rest_after(ctx, 2.0)
    assert checkpoints == []
    gov._pressure = 1.4  # still over: the rest goes on, slice by slice, until stopped here
    timer = threading.Timer(0.6, stop.set)
    timer.start()
    with pytest.raises(InterruptedError):
        builds.rest_after(ctx, 2.0)
    timer.join()
    assert len(checkpoints) >= 2
    gov.leading = False  # a follower cannot read the probe: the duty alone decides
    gov._pressure = 0.5
    assert not gov.recovered


def test_an_application_session_without_a_name_is_left_out_of_the_busiest():
    # PostgreSQL 18 lists a client backend while it authenticates, before it has a role: the
    # governor's thread failed on joining its missing name into the status line.
    names = signals.session_names(["billing", None, "pid 4242", "billing"])
    assert names == ("billing", "pid 4242")
    assert signals.Application(active=1, busiest=names).busy(10) == \
        "1 application session(s) running a statement (billing, pid 4242)"
    assert signals.session_names(None) == ()
