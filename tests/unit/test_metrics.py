"""The pure parts of `mover metrics` (mover/views/metrics.py, mover/views/exporter.py): the names
follow Prometheus' conventions and docs/metrics.md lists exactly those served; the families built
from a reading, parsed back with prometheus_client's own parser; each guard's wait found from its
words and timed from the governor's events; the --listen address; the dashboard's expressions use
only declared names (tests/e2e/test_metrics.py checks that a run serves each)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from mover.engines.governor import pacing
from mover.errors import BadInput
from mover.state import control
from mover.views import metrics
from mover.views.exporter import parse_listen
from mover.views.metrics import METRICS, GovernorReading, MigrationReading, TableReading, guard_waits

ROOT = Path(__file__).resolve().parents[2]
UNITS = ("seconds", "bytes", "ratio")


@pytest.mark.parametrize("d", list(METRICS.values()), ids=lambda d: d.name)
def test_each_name_follows_prometheus_conventions(d):
    assert re.fullmatch(r"mover_[a-z][a-z_]*[a-z]", d.name), d.name
    assert d.name.endswith("_total") == (d.kind == "counter"), d.name
    assert d.name.endswith("_info") == (d.kind == "info"), d.name
    base = d.name.removesuffix("_total")
    # A unit, when there is one, is a base unit at the end of the name (before _total).
    for word in ("ms", "milliseconds", "minutes", "hours", "kb", "mb", "percent"):
        assert f"_{word}_" not in f"{base}_", d.name
    for unit in UNITS:
        if f"_{unit}_" in f"{base}_":
            assert base.endswith(f"_{unit}") or base.endswith(f"_{unit}_estimate"), d.name
    assert d.help and (d.help[0].isupper() or d.help[0].isdigit()) and "  " not in d.help, d.name
    assert "le" not in d.labels and "quantile" not in d.labels


def test_docs_list_every_metric_and_no_other():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(mover_[a-z_]+)`", doc, re.M))
    assert listed == set(METRICS), (sorted(set(METRICS) - listed), sorted(listed - set(METRICS)))
    for d in METRICS.values():  # each with its labels
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{d.name}`"))
        for label in d.labels:
            assert f"`{label}`" in row, (d.name, label)
    mentioned = set(re.findall(r"\bmover_[a-z_]+", doc)) - {"mover_"}
    assert mentioned <= set(METRICS), mentioned - set(METRICS)


def test_the_dashboards_expressions_use_only_declared_names():
    doc = json.loads((ROOT / "docs" / "grafana" / "mover.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = {n for e in exprs for n in re.findall(r"\bmover_[a-z_]+", e)}
    assert used <= set(METRICS), used - set(METRICS)
    for e in exprs:  # counters only through rate() or increase()
        for name in re.findall(r"\bmover_[a-z_]+_total\b", e):
            if name != "mover_backfill_rows_copied_total":
                assert re.search(rf"(rate|increase)\({name}\b", e), e
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))


def table(**over) -> TableReading:
    base = dict(table='"public"."t"', step="backfill",
                ranges={(k, s): 0 for k in metrics.RANGE_KINDS for s in metrics.RANGE_STATUSES} | {
                    ("backfill", "done"): 3, ("backfill", "running"): 1},
                rows_copied=3000, rows_estimate=10_000, rows_per_second=1500.0, eta_seconds=4.6, workers=1,
                rows_compared=0, compare_estimate=None, pending={"forward": 7, "reverse": 0},
                lag_seconds={"forward": 0.5}, applied={"forward": 40}, gaps_open=0,
                divergences_open={"different": 2}, divergences_resolved={"repaired": 1}, lock_hold_ms=None,
                governor=GovernorReading(state="waiting", duty=0.5, latency_ms=2.5, baseline_ms=1.0, budget_ms=None,
                                         throttled_seconds=3.0, waiting_on="replication_slot",
                                         waited={"replication_slot": 1.5}))
    return TableReading(**{**base, **over})


def exposition(migrations, **kw) -> dict:
    class Fixed(Collector):
        def collect(self):
            return metrics.families(migrations, errors=kw.get("errors", 0), seconds=0.01)

    reg = CollectorRegistry()
    reg.register(Fixed())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_latest(reg).decode()) for s in f.samples}


def at(out: dict, name: str, **labels: str) -> float | None:
    return out.get((name, tuple(sorted(labels.items()))))


def test_families_of_a_reading_parse_back_with_their_labels():
    m = MigrationReading(name="orders", source='"public"."t"', target='"public"."t_new"', capture_method="trigger",
                         step="backfill", state="running", paused=False, window_ends_at=None,
                         failures={"failed": 2}, lock_attempts={}, tables=[table()])
    out = exposition([m])
    mig = {"migration": "orders"}
    tab = {**mig, "table": '"public"."t"'}
    assert at(out, "mover_up") == 1
    assert at(out, "mover_migration_info", **mig, capture_method="trigger", source='"public"."t"',
              target='"public"."t_new"') == 1
    steps = {dict(k[1])["step"]: v for k, v in out.items() if k[0] == "mover_migration_step"}
    assert steps == {s: float(s == "backfill") for s in control.STEPS}
    assert sum(v for k, v in out.items() if k[0] == "mover_migration_state") == 1
    assert at(out, "mover_failures_total", **mig, kind="failed") == 2
    assert at(out, "mover_failures_total", **mig, kind="shape_changed") == 0
    assert at(out, "mover_lock_attempts_total", **mig, outcome="timed_out") == 0
    assert at(out, "mover_backfill_eta_seconds", **tab) == 4.6
    assert at(out, "mover_ranges", **tab, kind="backfill", status="done") == 3
    assert at(out, "mover_ranges", **tab, kind="reconcile", status="failed") == 0
    assert at(out, "mover_capture_pending_changes", **tab, direction="forward") == 7
    assert at(out, "mover_capture_lag_seconds", **tab, direction="reverse") is None  # nothing pending
    assert at(out, "mover_divergences_open", **tab, kind="different") == 2
    assert at(out, "mover_divergences_open", **tab, kind="apply_error") == 0
    assert at(out, "mover_divergences_resolved_total", **tab, how="repaired") == 1
    assert at(out, "mover_governor_probe_latency_seconds", **tab) == 0.0025
    assert at(out, "mover_governor_latency_budget_seconds", **tab) is None  # no budget: absent, not 0
    assert at(out, "mover_cutover_lock_hold_seconds", **tab) is None
    assert at(out, "mover_reconcile_rows_estimate", **tab) is None
    assert at(out, "mover_guard_waiting", **tab, reason="replication_slot") == 1
    assert at(out, "mover_guard_waiting", **tab, reason="standby") == 0
    assert at(out, "mover_guard_wait_seconds_total", **tab, reason="replication_slot") == 1.5
    assert {n for n, _ in out} <= set(METRICS)


def test_a_failed_read_serves_the_exporters_own_metrics_only():
    out = exposition(None, errors=3)
    assert out == {("mover_up", ()): 0, ("mover_scrape_errors_total", ()): 3,
                   ("mover_scrape_duration_seconds", ()): 0.01}


def test_a_family_is_one_migration_with_each_table_labelled():
    tables = [table(table='"public"."a"', governor=None), table(table='"public"."b"', step="cutover",
                                                                   governor=None)]
    m = MigrationReading(name="fam", source='"public"."a"', target='"public"."a_new"', capture_method="logical",
                         step="backfill", state="running", paused=True, window_ends_at=None, failures={},
                         lock_attempts={"granted": 1}, tables=tables)
    out = exposition([m])
    assert at(out, "mover_migration_paused", migration="fam") == 1
    assert {dict(k[1])["table"] for k in out if k[0] == "mover_table_step"} == {'"public"."a"', '"public"."b"'}
    assert at(out, "mover_table_step", migration="fam", table='"public"."b"', step="cutover") == 1
    assert at(out, "mover_lock_attempts_total", migration="fam", outcome="granted") == 1
    assert not any(k[0].startswith("mover_governor_") for k in out)


@pytest.mark.parametrize(("wait", "guard"), [
    (pacing.standby_wait([pacing.Standby("s1", "streaming", 9.0)], frozenset(), 1000)[0], "standby"),
    (pacing.standby_wait([], frozenset({"s1"}), 1000)[0], "standby"),
    (pacing.slot_wait([pacing.Slot("x", "logical", False, "unreserved", 10, None)], 100, 0, 0.0), "replication_slot"),
    (pacing.slot_wait([pacing.Slot("x", "logical", False, "extended", 10, 1)], 100, 0, 0.0), "replication_slot"),
    (pacing.slot_wait([pacing.Slot("x", "physical", True, "reserved", 2048, None)], -1, 1024, 0.0),
     "replication_slot"),
    (pacing.slot_wait([pacing.Slot("m", "logical", True, "reserved", 2048, None)], -1, 1024, 0.0,
                      own=frozenset({"m"})), "replication_slot"),
    (pacing.archive_wait(pacing.Archiver("on", "000000010000000000000009", 16 << 20, "000000010000000000000001",
                                         None, "000000010000000000000002", datetime(2026, 1, 1)), 0), "archiving"),
    (pacing.archive_wait(pacing.Archiver("on", "000000010000000000000009", 16 << 20, "000000010000000000000001",
                                         None, None, None), 1), "archiving"),
    ("something else", "other"),
])
def test_each_guards_wait_is_named_by_its_guard(wait, guard):
    assert wait is not None
    assert pacing.guard_of(wait) == guard


def test_a_guards_waits_are_timed_from_the_governors_events():
    events = [("throttle_baseline", 0.0, None),
              ("throttle_waiting", 10.0, "replica lag 40.0s above 30s (standby s1)"),
              ("throttle_resumed", 14.0, None),
              ("throttle_waiting", 20.0, "archiving fails (x failed at 10:00:00, pg_stat_archiver); ..."),
              ("throttle_baseline", 21.5, None),  # a new phase: that wait ended with the last one
              ("throttle_waiting", 30.0, "replication slot s holds back 2 MB of WAL, over 1 MB"),
              ("throttle_waiting", 31.0, "replication slot s holds back 3 MB of WAL, over 1 MB")]  # a takeover
    assert guard_waits(events, until=33.0) == {"standby": 4.0, "archiving": 1.5, "replication_slot": 3.0}
    assert guard_waits(events[:2], until=5.0) == {"standby": 0.0}  # never before it started
    assert guard_waits([], until=1.0) == {}


@pytest.mark.parametrize(("text", "expected"), [
    (":9187", ("0.0.0.0", 9187)), ("127.0.0.1:9187", ("127.0.0.1", 9187)), ("localhost:0", ("localhost", 0)),
    ("[::1]:9187", ("::1", 9187)), ("[::]:80", ("::", 80)),
])
def test_listen_addresses(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9187", "host", "host:", "host:port", ":70000", "[nope]:1"])
def test_a_bad_listen_address_is_bad_input(text):
    with pytest.raises(BadInput):
        parse_listen(text)


def test_failure_kinds_are_those_an_outcome_records_as_failed():
    assert metrics.FAILURE_KINDS[0] == "failed"
    assert {"shape_changed", "capture_slot_lost", "constraint_build_failed"} <= set(metrics.FAILURE_KINDS)
    assert "catalog_moved" not in metrics.FAILURE_KINDS  # a Waiting: recorded as waiting
