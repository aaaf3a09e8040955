"""Prometheus metrics of every migration in the database: `mover metrics` and the endpoint `mover
follow` and `mover worker` serve when asked (mover/views/exporter.py serves them).

Read from mover's control schema, not from the process that serves them: whichever hosts run the
orchestrator and the workers, one exporter anywhere reports every migration, as `mover status`
does. Each scrape is one short read-only transaction under a statement_timeout (`read`), turned
into metric families by a pure function (`families`); a failed read is a scrape that says so
(`mover_up 0`, `mover_scrape_errors_total`), never an error page. The names follow Prometheus'
conventions (base units, `_total` for counters) and are declared once, in METRICS, which
docs/metrics.md lists and tests/unit/test_metrics.py holds together with it.

Each figure means what the same figure of `mover status --json` means, read by the same rules (the
liveness of workers and of the governor, the backfill's speed over its last 30 s, the ETA, the
state of a migration whose process died); tests/e2e/test_metrics.py compares the two during a run.
What is summed over a family's tables in the status is per table here (label `table`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from mover import errors
from mover.catalog import introspect
from mover.db import Database
from mover.engines.capture import changelog
from mover.engines.governor import pacing
from mover.state import control
from mover.state import throttle as throttle_row
from mover.views import status as status_view

log = logging.getLogger("mover.metrics")


@dataclass(frozen=True)
class Declared:
    """One metric as it is served: its name (a counter's with `_total`, an info's with `_info`),
    its type, its labels in order, and what it means."""

    name: str
    kind: str  # gauge | counter | info
    labels: tuple[str, ...]
    help: str


M, T = ("migration",), ("migration", "table")
STATES = ("pending", "running", "waiting", "interrupted", "failed", "done", "aborted")
GOVERNOR_STATES = ("idle", "measuring", "ok", "quiet", "throttled", "floor", "waiting", "off")
DIVERGENCE_KINDS = ("missing_in_target", "extra_in_target", "different", "apply_error")
RANGE_KINDS = ("backfill", "reconcile")
RANGE_STATUSES = ("pending", "running", "done", "failed")
DIRECTIONS = ("forward", "reverse")
# The event kinds of an outcome recorded as failed (mover/runner/lease.py): "failed", or the
# error's own kind. A Waiting error is recorded as waiting, whatever its kind.
FAILURE_KINDS = ("failed", *sorted({c.event_kind for c in vars(errors).values()
                                    if isinstance(c, type) and issubclass(c, errors.MoverError)
                                    and not issubclass(c, errors.Waiting) and hasattr(c, "event_kind")}))

METRICS = {d.name: d for d in (
    # The exporter itself.
    Declared("mover_up", "gauge", (), "1 when the last read of mover's control schema succeeded, 0 when the "
             "database could not be read (unreachable, no control schema, no privilege)"),
    Declared("mover_scrape_errors_total", "counter", (), "Reads of the control schema that failed since the "
             "exporter started"),
    Declared("mover_scrape_duration_seconds", "gauge", (), "How long the last read of the control schema took"),
    # The migration, as the operator names it (a family's head).
    Declared("mover_migration_info", "info", ("migration", "source", "target", "capture_method"),
             "A migration: its source and target tables (a family's head) and how it captures changes"),
    Declared("mover_migration_step", "gauge", (*M, "step"), "1 for the step the migration is at (a family's: its "
             "earliest table's), 0 for the others; as `mover status` shows it"),
    Declared("mover_migration_state", "gauge", (*M, "state"), "1 for the migration's state, 0 for the others; "
             "as `mover status` shows it (failed when the process running it died)"),
    Declared("mover_migration_paused", "gauge", M, "1 while `mover pause` holds the range workers"),
    Declared("mover_failures_total", "counter", (*M, "kind"), "Attempts that ended failed (exit 1), by the kind "
             "their event records"),
    Declared("mover_lock_attempts_total", "counter", (*M, "outcome"), "Attempts at a lock under [cutover] "
             "lock_timeout: granted (a swap, cutover or rollback, that got its lock), timed_out (before a swap got "
             "it, or in a cutover, rollback, retire or abort that gave up)"),
    Declared("mover_rollback_window_end_timestamp_seconds", "gauge", M, "When the rollback window ends (Unix "
             "time), while it is open"),
    # Each table of the migration (one, or a family's).
    Declared("mover_table_step", "gauge", (*T, "step"), "1 for the step the table is at, 0 for the others"),
    Declared("mover_backfill_rows_copied_total", "counter", T, "Rows the backfill's finished ranges copied"),
    Declared("mover_backfill_rows_estimate", "gauge", T, "The source's estimated rows (pg_class.reltuples), "
             "until the backfill is done"),
    Declared("mover_backfill_rows_per_second", "gauge", T, "The backfill's speed over its last 30 s of "
             "finished ranges, while range workers run"),
    Declared("mover_backfill_eta_seconds", "gauge", T, "The backfill's estimated time left at that speed"),
    Declared("mover_ranges", "gauge", (*T, "kind", "status"), "Ranges of the backfill and of the current "
             "reconcile pass, by status"),
    Declared("mover_range_workers", "gauge", T, "Live range workers (backfill or reconcile), on any host"),
    Declared("mover_reconcile_rows_compared", "gauge", T, "Source rows the current reconcile pass compared"),
    Declared("mover_reconcile_rows_estimate", "gauge", T, "The source's estimated rows, while reconcile passes "
             "run (the reconcile step and the cutover gate)"),
    Declared("mover_capture_pending_changes", "gauge", (*T, "direction"), "Captured changes not replayed yet "
             "(the change log's backlog): forward before the cutover, reverse in the rollback window"),
    Declared("mover_capture_lag_seconds", "gauge", (*T, "direction"), "Age of the oldest change not replayed "
             "yet, while there is one"),
    Declared("mover_capture_applied_changes_total", "counter", (*T, "direction"), "Captured changes replayed"),
    Declared("mover_capture_gaps_open", "gauge", T, "Gaps in the capture (a trigger switched off, a lost "
             "slot) not yet covered by a comparison after it was restored"),
    Declared("mover_divergences_open", "gauge", (*T, "kind"), "Rows recorded as differing and not resolved; "
             "the cutover refuses while any is open"),
    Declared("mover_divergences_resolved_total", "counter", (*T, "how"), "Divergences resolved, by how"),
    Declared("mover_cutover_lock_hold_seconds", "gauge", T, "How long the cutover's swap held its lock, while "
             "the migration is swapped (in the window and after it)"),
    Declared("mover_governor_state", "gauge", (*T, "state"), "1 for the governor's state, 0 for the others "
             "(idle when nobody probes)"),
    Declared("mover_governor_duty_ratio", "gauge", T, "The share of their time the bulk engines may work "
             "(1: full speed)"),
    Declared("mover_governor_probe_latency_seconds", "gauge", T, "The probe's latency now (median of the "
             "last probes): what the application pays for a write and commit"),
    Declared("mover_governor_probe_baseline_seconds", "gauge", T, "The probe's latency measured before the "
             "phase's bulk work, mover idle"),
    Declared("mover_governor_latency_budget_seconds", "gauge", T, "What the probe's latency may reach "
             "([throttle] max_latency_increase over the baseline, or probe_latency)"),
    Declared("mover_governor_throttled_seconds_total", "counter", T, "Time the governor held the engines "
             "under full speed"),
    Declared("mover_guard_waiting", "gauge", (*T, "reason"), "1 while a guard holds every engine: a standby's "
             "lag, a replication slot near its limit, archiving behind"),
    Declared("mover_guard_wait_seconds_total", "counter", (*T, "reason"), "Time each guard held every engine "
             "(a wait is counted under the guard that started it)"),
)}


# ---------------------------------------------------------------------------------------------
# The reading: what one scrape read, plain data


@dataclass(frozen=True, kw_only=True)
class GovernorReading:
    state: str
    duty: float
    latency_ms: float | None
    baseline_ms: float | None
    budget_ms: float | None
    throttled_seconds: float
    waiting_on: str | None  # the guard holding the engines now (pacing.GUARDS), or None
    waited: dict[str, float]  # seconds by guard


@dataclass(frozen=True, kw_only=True)
class TableReading:
    table: str
    step: str
    ranges: dict[tuple[str, str], int]  # (kind, status) -> ranges
    rows_copied: int
    rows_estimate: int | None
    rows_per_second: float | None
    eta_seconds: float | None
    workers: int
    rows_compared: int
    compare_estimate: int | None
    pending: dict[str, int]  # by direction; a direction whose log this role cannot read is left out
    lag_seconds: dict[str, float]
    applied: dict[str, int]
    gaps_open: int
    divergences_open: dict[str, int]
    divergences_resolved: dict[str, int]
    lock_hold_ms: float | None
    governor: GovernorReading | None


@dataclass(frozen=True, kw_only=True)
class MigrationReading:
    name: str
    source: str
    target: str
    capture_method: str
    step: str
    state: str
    paused: bool
    window_ends_at: float | None  # Unix time
    failures: dict[str, int]
    lock_attempts: dict[str, int]  # granted, timed_out
    tables: list[TableReading] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class _Control:
    """What the set-based reads found, for every migration row at once."""

    ranges: dict[tuple[int, str], dict[str, int]]
    exhausted: dict[tuple[int, str], bool]
    rates: dict[int, float]
    workers: dict[int, int]
    divergences: dict[tuple[int, bool], dict[str, int]]
    applied: dict[int, dict[str, int]]
    gaps: dict[int, int]
    governors: dict[int, dict[str, Any]]
    governor_events: dict[int, list[tuple[str, float, str | None]]]
    now: float


def read(cur: psycopg.Cursor) -> list[MigrationReading]:
    """Every migration in the database, in one read-only transaction (the caller's): set-based
    reads of the control tables for all of them, then the few per-table reads of those not
    finished (their change logs' backlog, the source's row estimate)."""
    cur.execute("SET TRANSACTION READ ONLY")
    rows = control.list_all(cur)
    heads = {m.id: m for m in rows if m.head}
    ranges, exhausted, rates = _ranges(cur)
    c = _Control(ranges=ranges, exhausted=exhausted, rates=rates, workers=_workers(cur),
                 divergences=_divergences(cur), applied=_applied(cur), gaps=_gaps(cur),
                 governors=_governors(cur), governor_events=_governor_events(cur), now=_epoch(cur))
    failures, lock_attempts = _outcomes(cur, list(heads))
    unreadable: set[str] = set()
    family = {h: [heads[h], *others] for h, others in control.other_tables(rows).items()}
    tables = {h: [_table_reading(cur, m, c, unreadable) for m in family[h]] for h in heads}
    if unreadable:
        log.warning("this role cannot read the change logs %s: their backlog is left out",
                    ", ".join(sorted(unreadable)),
                    extra={"next": "GRANT SELECT ON them (or ALTER DEFAULT PRIVILEGES FOR ROLE <mover's role> IN "
                                   "SCHEMA mover GRANT SELECT ON TABLES TO <this role>): docs/metrics.md"})
    out = []
    for head in heads.values():
        # As status: a migration whose process died is failed; a family is at its earliest table's step.
        state = "failed" if status_view.holder_gone(cur, head) is not None else head.state
        out.append(MigrationReading(
            name=head.name, source=str(head.source), target=str(head.target),
            capture_method=(head.plan.get("capture") or {}).get("method", "trigger"),
            step=control.shown_step(control.step_of(family[head.id])), state=state, paused=head.paused,
            window_ends_at=head.window_ends_at.timestamp()
            if head.window_ends_at is not None and head.step == "rollback_window" else None,
            failures=failures.get(head.id, {}), lock_attempts=lock_attempts.get(head.id, {}),
            tables=tables[head.id]))
    return out


def _table_reading(cur: psycopg.Cursor, m: control.Migration, c: _Control, unreadable: set[str]) -> TableReading:
    """One table of a migration (its row), by the rules `mover status` reads it with."""
    finished = m.state in control.TERMINAL  # its change logs are gone, nothing is pending
    pending: dict[str, int] = {}
    lag: dict[str, float] = {}
    for direction in DIRECTIONS:
        found = (0, None) if finished else _pending(cur, m, direction, unreadable)
        if found is not None:
            pending[direction], seconds = found
            if seconds is not None:
                lag[direction] = seconds
    copied = c.ranges.get((m.id, "backfill"), {})
    workers = c.workers.get(m.id, 0)
    estimate = introspect.estimate_rows(cur, m.source) if m.step in control.BUILDING and not finished else None
    # The speed of copies that stopped is no speed now; an ETA while the backfill has ranges left.
    rate = c.rates.get(m.id) if workers else None
    done = c.exhausted.get((m.id, "backfill"), False) and not copied.get("open") and not copied.get("failed")
    eta = max(estimate - copied.get("rows", 0), 0) / rate if rate and estimate and not done else None
    return TableReading(
        table=str(m.source), step=control.shown_step(m.step),
        ranges={(kind, status): c.ranges.get((m.id, kind), {}).get(status, 0)
                for kind in RANGE_KINDS for status in RANGE_STATUSES},
        rows_copied=copied.get("rows", 0), rows_estimate=estimate, rows_per_second=rate, eta_seconds=eta,
        workers=workers, rows_compared=c.ranges.get((m.id, "reconcile"), {}).get("compared", 0),
        compare_estimate=introspect.estimate_rows(cur, m.source)
        if m.step in control.COMPARING and not finished else None,
        pending=pending, lag_seconds=lag, applied=c.applied.get(m.id, {}),
        gaps_open=0 if finished else c.gaps.get(m.id, 0),
        divergences_open=c.divergences.get((m.id, True), {}),
        divergences_resolved=c.divergences.get((m.id, False), {}), lock_hold_ms=m.cutover_lock_ms,
        governor=_governor(c.governors.get(m.id), c.governor_events.get(m.id, []), c.now))


def _epoch(cur: psycopg.Cursor) -> float:
    cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
    row = cur.fetchone()
    return float(row[0]) if row else time.time()


def _ranges(cur: psycopg.Cursor) -> tuple[dict[tuple[int, str], dict[str, int]], dict[tuple[int, str], bool],
                                          dict[int, float]]:
    """Ranges by (migration row, kind): counts by status, "open" (pending or running), the rows the
    backfill's done ones copied and the source rows the reconcile's done ones compared; the
    frontiers' `exhausted`; the backfill's rows/s over its last 30 s of done ranges (as status)."""
    cur.execute("SELECT migration_id, kind, status, count(*), coalesce(sum(rows) FILTER (WHERE status = 'done'), 0),"
                " coalesce(sum(src_rows) FILTER (WHERE status = 'done'), 0) FROM mover.ranges GROUP BY 1, 2, 3")
    ranges: dict[tuple[int, str], dict[str, int]] = defaultdict(dict)
    for mid, kind, status, n, rows, compared in cur.fetchall():
        r = ranges[(mid, kind)]
        r[status] = int(n)
        r["open"] = r.get("open", 0) + (int(n) if status in ("pending", "running") else 0)
        r["rows"] = r.get("rows", 0) + int(rows)
        r["compared"] = r.get("compared", 0) + int(compared)
    cur.execute("SELECT migration_id, kind, exhausted FROM mover.frontiers")
    frontiers = {(mid, kind): bool(exhausted) for mid, kind, exhausted in cur.fetchall()}
    cur.execute("SELECT migration_id, sum(rows) / nullif(extract(epoch FROM now() - min(finished_at)), 0)"
                " FROM mover.ranges WHERE kind = 'backfill' AND status = 'done'"
                " AND finished_at > now() - interval '30 seconds' GROUP BY 1")
    rates = {mid: float(rate) for mid, rate in cur.fetchall() if rate is not None}
    return ranges, frontiers, rates


def _workers(cur: psycopg.Cursor) -> dict[int, int]:
    """Live range workers by migration row (fresh heartbeats, and a live process on this host)."""
    cur.execute("SELECT migration_id, host, pid FROM mover.workers"
                " WHERE heartbeat_at > now() - make_interval(secs => %s)", (control.LEASE_SECONDS,))
    out: dict[int, int] = defaultdict(int)
    for mid, host, pid in cur.fetchall():
        if status_view.worker_alive(host, pid):
            out[mid] += 1
    return out


def _divergences(cur: psycopg.Cursor) -> dict[tuple[int, bool], dict[str, int]]:
    """(migration row, open) -> the open ones by kind, or the resolved ones by how."""
    cur.execute("SELECT migration_id, resolved_at IS NULL, CASE WHEN resolved_at IS NULL THEN kind"
                " ELSE coalesce(resolved_how, 'superseded') END, count(*) FROM mover.divergences GROUP BY 1, 2, 3")
    out: dict[tuple[int, bool], dict[str, int]] = defaultdict(dict)
    for mid, is_open, what, n in cur.fetchall():
        out[(mid, bool(is_open))][what] = int(n)
    return out


def _applied(cur: psycopg.Cursor) -> dict[int, dict[str, int]]:
    cur.execute("SELECT migration_id, direction, applied FROM mover.capture_stats")
    out: dict[int, dict[str, int]] = defaultdict(dict)
    for mid, direction, n in cur.fetchall():
        out[mid][direction] = int(n)
    return out


def _gaps(cur: psycopg.Cursor) -> dict[int, int]:
    """Capture gaps not yet covered by a comparison after capture was back (state/gaps.py open_gaps)."""
    cur.execute("SELECT migration_id, count(*) FROM mover.capture_gaps WHERE compared_at IS NULL GROUP BY 1")
    return {mid: int(n) for mid, n in cur.fetchall()}


def _governors(cur: psycopg.Cursor) -> dict[int, dict[str, Any]]:
    """The governor's row of each migration row that has one (state/throttle.py), with its age and
    its last probe as Unix time."""
    cur.execute("SELECT migration_id, prober, state, duty, latency_ms, baseline_ms, budget_ms, throttled_seconds, wait,"
                " extract(epoch FROM clock_timestamp() - probed_at)::float8 AS age,"
                " extract(epoch FROM probed_at)::float8 AS probed_at FROM mover.throttle")
    names = [d.name for d in cur.description or ()]
    return {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}


def _outcomes(cur: psycopg.Cursor, heads: list[int]) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, int]]]:
    """From the events of each migration's head row (a family records its outcomes and swaps on every
    table's row, the head's among them): the failed attempts by kind, and the attempts at a lock.
    A swap's event says at which attempt it got the lock (the ones before timed out); a refusal's
    outcome how many attempts timed out (mover/engines/swap/lockwatch.py LockBlocked)."""
    cur.execute("SELECT migration_id, kind, count(*) FROM mover.events WHERE migration_id = ANY(%s)"
                " AND kind = ANY(%s) GROUP BY 1, 2", (heads, list(FAILURE_KINDS)))
    failures: dict[int, dict[str, int]] = defaultdict(dict)
    for mid, kind, n in cur.fetchall():
        failures[mid][kind] = int(n)
    cur.execute(
        """
        SELECT migration_id,
               count(*) FILTER (WHERE kind <> 'waiting'),
               coalesce(sum(CASE WHEN kind = 'waiting' THEN (detail->>'lock_attempts')::int
                                 ELSE greatest(coalesce((detail->>'attempt')::int, 1) - 1, 0) END), 0)
        FROM mover.events
        WHERE migration_id = ANY(%s)
          AND ((kind = 'step_done' AND step = 'cutover') OR kind = 'rolled_back'
               OR (kind = 'waiting' AND detail ? 'lock_attempts'))
        GROUP BY 1
        """, (heads,))
    locks = {mid: {"granted": int(granted), "timed_out": int(timed_out)} for mid, granted, timed_out in cur.fetchall()}
    return failures, locks


def _governor_events(cur: psycopg.Cursor) -> dict[int, list[tuple[str, float, str | None]]]:
    """The governor's waits and phases by migration row, oldest first: (kind, Unix time, the wait)."""
    cur.execute("SELECT migration_id, kind, extract(epoch FROM at)::float8, detail->>'wait' FROM mover.events"
                " WHERE kind IN ('throttle_waiting', 'throttle_resumed', 'throttle_baseline') ORDER BY id")
    out: dict[int, list[tuple[str, float, str | None]]] = defaultdict(list)
    for mid, kind, at, wait in cur.fetchall():
        out[mid].append((kind, float(at), wait))
    return out


def _pending(cur: psycopg.Cursor, m: control.Migration, direction: str,
             unreadable: set[str]) -> tuple[int, float | None] | None:
    """A change log's backlog and lag (changelog.pending), or None when this role may not read it."""
    try:
        return changelog.pending(cur, m.id, reverse=direction == "reverse")
    except psycopg.errors.InsufficientPrivilege:  # its savepoint rolled back: the transaction goes on
        unreadable.add(f"mover.m{m.id}_{'reverse_' if direction == 'reverse' else ''}changes")
        return None


def _governor(row: dict[str, Any] | None, events: Sequence[tuple[str, float, str | None]],
              now: float) -> GovernorReading | None:
    """The governor of one table as status reads it (a row nobody probes is idle at full duty),
    with each guard's time from its events."""
    if row is None:
        return None
    live = throttle_row.live(row)
    state = row["state"] if live else "idle"
    wait = row["wait"] if live and state == "waiting" else None
    # An open wait ends now if the governor still waits, else at its last probe (it stopped).
    until = now if wait is not None else (row["probed_at"] or 0.0)
    return GovernorReading(
        state=state, duty=float(row["duty"]) if live else 1.0, latency_ms=row["latency_ms"],
        baseline_ms=row["baseline_ms"], budget_ms=row["budget_ms"],
        throttled_seconds=float(row["throttled_seconds"] or 0.0),
        waiting_on=None if wait is None else pacing.guard_of(wait), waited=guard_waits(events, until))


def guard_waits(events: Sequence[tuple[str, float, str | None]], until: float) -> dict[str, float]:
    """Seconds each guard held the engines, from one governor's events oldest first ((kind, Unix
    time, wait)): a wait starts at its throttle_waiting and ends at the governor's next event (its
    throttle_resumed; a new phase's throttle_baseline; another throttle_waiting after a takeover);
    one still open at the end ends at `until` (never before it started)."""
    out: dict[str, float] = {}
    started: tuple[float, str] | None = None
    for kind, at, wait in [*events, ("end", until, None)]:
        if started is not None:
            at_start, guard = started
            out[guard] = out.get(guard, 0.0) + max(at - at_start, 0.0)
            started = None
        if kind == "throttle_waiting":
            started = (at, pacing.guard_of(wait or ""))
    return out


# ---------------------------------------------------------------------------------------------
# The metric families: pure


class _Families:
    """The families of one scrape, built sample by sample against their declarations."""

    def __init__(self) -> None:
        self.made: dict[str, GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily] = {}

    def add(self, name: str, value: float, **labels: str) -> None:
        d = METRICS[name]
        if tuple(labels) != d.labels:
            raise AssertionError(f"{name}: labels {tuple(labels)}, declared {d.labels}")
        family = self.made.get(name)
        if family is None:
            family = self.made[name] = _family(d)
        if isinstance(family, InfoMetricFamily):
            family.add_metric([], {k: v for k, v in labels.items()})
        else:
            family.add_metric(list(labels.values()), value)

    def each(self, name: str, chosen: str | None, values: Sequence[str], label: str, **labels: str) -> None:
        """One sample per value of `label`: 1 for `chosen`, 0 for the others (a state set)."""
        for v in values:
            self.add(name, 1.0 if v == chosen else 0.0, **labels, **{label: v})


def _family(d: Declared) -> GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily:
    if d.kind == "counter":
        return CounterMetricFamily(d.name, d.help, labels=d.labels)
    if d.kind == "info":
        return InfoMetricFamily(d.name.removesuffix("_info"), d.help, labels=())
    return GaugeMetricFamily(d.name, d.help, labels=d.labels)


def families(migrations: Sequence[MigrationReading] | None, *, errors: int, seconds: float) -> list[Metric]:
    """The metric families of one scrape; `migrations` None: the read failed (mover_up 0, nothing else
    but the exporter's own)."""
    f = _Families()
    f.add("mover_up", 0.0 if migrations is None else 1.0)
    f.add("mover_scrape_errors_total", float(errors))
    f.add("mover_scrape_duration_seconds", seconds)
    for m in migrations or ():
        mig = {"migration": m.name}
        f.add("mover_migration_info", 1.0, migration=m.name, source=m.source, target=m.target,
              capture_method=m.capture_method)
        f.each("mover_migration_step", m.step, control.STEPS, "step", **mig)
        f.each("mover_migration_state", m.state, STATES, "state", **mig)
        f.add("mover_migration_paused", float(m.paused), **mig)
        for kind in FAILURE_KINDS:
            f.add("mover_failures_total", float(m.failures.get(kind, 0)), **mig, kind=kind)
        for outcome in ("granted", "timed_out"):
            f.add("mover_lock_attempts_total", float(m.lock_attempts.get(outcome, 0)), **mig, outcome=outcome)
        if m.window_ends_at is not None:
            f.add("mover_rollback_window_end_timestamp_seconds", m.window_ends_at, **mig)
        for t in m.tables:
            _table(f, {**mig, "table": t.table}, t)
    return list(f.made.values())


def _table(f: _Families, labels: dict[str, str], t: TableReading) -> None:
    def optional(name: str, value: float | None, **more: str) -> None:
        if value is not None:
            f.add(name, float(value), **labels, **more)

    f.each("mover_table_step", t.step, control.STEPS, "step", **labels)
    f.add("mover_backfill_rows_copied_total", float(t.rows_copied), **labels)
    optional("mover_backfill_rows_estimate", t.rows_estimate)
    optional("mover_backfill_rows_per_second", t.rows_per_second)
    optional("mover_backfill_eta_seconds", t.eta_seconds)
    for (kind, status), n in t.ranges.items():
        f.add("mover_ranges", float(n), **labels, kind=kind, status=status)
    f.add("mover_range_workers", float(t.workers), **labels)
    f.add("mover_reconcile_rows_compared", float(t.rows_compared), **labels)
    optional("mover_reconcile_rows_estimate", t.compare_estimate)
    for direction in DIRECTIONS:
        optional("mover_capture_pending_changes", t.pending.get(direction), direction=direction)
        optional("mover_capture_lag_seconds", t.lag_seconds.get(direction), direction=direction)
        f.add("mover_capture_applied_changes_total", float(t.applied.get(direction, 0)), **labels,
              direction=direction)
    f.add("mover_capture_gaps_open", float(t.gaps_open), **labels)
    for kind in DIVERGENCE_KINDS:
        f.add("mover_divergences_open", float(t.divergences_open.get(kind, 0)), **labels, kind=kind)
    for how, n in sorted(t.divergences_resolved.items()):
        f.add("mover_divergences_resolved_total", float(n), **labels, how=how)
    optional("mover_cutover_lock_hold_seconds", None if t.lock_hold_ms is None else t.lock_hold_ms / 1000)
    g = t.governor
    if g is None:
        return
    f.each("mover_governor_state", g.state, GOVERNOR_STATES, "state", **labels)
    f.add("mover_governor_duty_ratio", g.duty, **labels)
    optional("mover_governor_probe_latency_seconds", None if g.latency_ms is None else g.latency_ms / 1000)
    optional("mover_governor_probe_baseline_seconds", None if g.baseline_ms is None else g.baseline_ms / 1000)
    optional("mover_governor_latency_budget_seconds", None if g.budget_ms is None else g.budget_ms / 1000)
    f.add("mover_governor_throttled_seconds_total", g.throttled_seconds, **labels)
    for guard in (*pacing.GUARDS, *(k for k in g.waited if k not in pacing.GUARDS)):
        f.add("mover_guard_waiting", 1.0 if g.waiting_on == guard else 0.0, **labels, reason=guard)
        f.add("mover_guard_wait_seconds_total", g.waited.get(guard, 0.0), **labels, reason=guard)


# ---------------------------------------------------------------------------------------------
# The collector


class MoverCollector(Collector):
    """A prometheus_client collector that reads the control schema at each scrape, on a connection
    of its own (one at a time: scrapes that come together wait for each other). A read that fails
    is counted and said once per outage in the log; the scrape then says mover_up 0."""

    def __init__(self, dsn: str, *, timeout: float = 5.0):
        # One attempt: a scrape that failed is answered now, and the next scrape is the retry.
        self.db = Database(dsn, role="mover-metrics", attempts=1, connect_timeout=max(1, round(timeout)))
        self.statement_timeout = f"{int(timeout * 1000)}ms"
        self.errors = 0
        self.failing = False
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            started = time.monotonic()
            migrations: list[MigrationReading] | None
            try:
                migrations = self.db.transaction(read, statement_timeout=self.statement_timeout,
                                                 lock_timeout=self.statement_timeout, label="metrics")
                if self.failing:
                    log.warning("the control schema can be read again")
                self.failing = False
            except Exception as exc:  # whatever it is, the exporter says so and keeps serving
                self.errors += 1
                migrations = None
                if not self.failing:
                    log.warning("could not read mover's control schema (%s: %s); serving mover_up 0 until it can",
                                type(exc).__name__, (str(exc).strip().splitlines() or [""])[0],
                                exc_info=not isinstance(exc, psycopg.Error),
                                extra={"next": "check the DSN and that the database is up; `mover init` if mover's "
                                               "schema is missing; the privileges in docs/metrics.md"})
                self.failing = True
            seconds = time.monotonic() - started
        yield from families(migrations, errors=self.errors, seconds=seconds)

    def close(self) -> None:
        self.db.close()
