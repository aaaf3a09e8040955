"""`mover metrics` (issue 39): the Prometheus exporter, scraped over HTTP during a real migration
under a writer and parsed with prometheus_client's own parser, compared field by field with `mover
status --json` read around the same scrape; every expression of the Grafana dashboard
(docs/grafana/mover.json) checked against the names served in that run; a guard's wait; every state
a migration can be in, a family among them, read by a role that may only read schema mover; a
database that goes away and comes back; the textfile mode."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from mover import api
from mover.db import Database
from mover.engines.governor import pacing
from mover.names import parse_qualified
from mover.plan import load_plan
from mover.runner import register
from mover.views.metrics import METRICS
from tests.conftest import connect
from tests.workload import Spawned, Writer, app_execute, create_orders, mover, plan_file, write_plan

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "mover.json"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, by (name, labels), through prometheus_client's own parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return parse(response.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of the samples of `name` whose labels include `labels`; None when there is none."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    return sum(found) if found else None


def same_ms(samples: Samples, name: str, shown: float | None, **labels: str) -> bool:
    """A seconds figure is the milliseconds status prints (rounded to 0.01), or both are absent."""
    got = value(samples, name, **labels)
    return got is shown is None or (got is not None and shown is not None and abs(got * 1000 - shown) <= 0.006)


def chosen(samples: Samples, name: str, label: str, **labels: str) -> str:
    """The one value of `label` a state-set gauge marks 1."""
    ones = [dict(ls)[label] for (n, ls), v in samples.items()
            if n == name and v == 1 and set(labels.items()) <= set(ls)]
    assert len(ones) == 1, (name, labels, ones)
    return ones[0]


class Exporter:
    """`mover metrics --listen 127.0.0.1:0` as its own process, started at once; `url` waits for the
    line that says where it serves. SIGTERM ends it, exit 0."""

    def __init__(self, dsn: str):
        self.proc = Spawned(dsn, "metrics", "--listen", "127.0.0.1:0", env={})
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            assert self.proc.wait_for("serving metrics on", timeout=60), "".join(self.proc.err)
            self._url = re.search(r"serving metrics on (\S+)", "".join(self.proc.err)).group(1)
        return self._url

    def stop(self) -> None:
        self.proc.proc.terminate()
        assert self.proc.wait(30) == 0, "".join(self.proc.err)


def status(dsn: str, name: str) -> dict:
    r = mover(dsn, "status", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def between(low: float, got: float | None, high: float, slack: float = 0.0) -> bool:
    return got is not None and min(low, high) - slack <= got <= max(low, high) + slack


def dashboard_names() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
              for v in doc.get("templating", {}).get("list", []) if v.get("type") == "query"]
    assert len(exprs) >= 15, exprs
    return {n for e in exprs for n in re.findall(r"\bmover_[a-z_]+", e)}


def compare_running(s1: dict, m: Samples, s2: dict, name: str, table: str) -> None:
    """A scrape taken between two status reads of a migration under way: whatever did not change
    between them is what the scrape says; a count that grows is between the two."""
    mig, tab = {"migration": name}, {"migration": name, "table": table}
    assert (s1["step"], s1["state"]) == (s2["step"], s2["state"]), (s1["step"], s2["step"])
    assert chosen(m, "mover_migration_step", "step", **mig) == s1["step"]
    assert chosen(m, "mover_table_step", "step", **tab) == s1["step"]
    assert chosen(m, "mover_migration_state", "state", **mig) == s1["state"]
    b1, b2 = s1["backfill"], s2["backfill"]
    assert between(b1["rows_copied"], value(m, "mover_backfill_rows_copied_total", **tab), b2["rows_copied"])
    assert between(b1["ranges_done"], value(m, "mover_ranges", **tab, kind="backfill", status="done"),
                   b2["ranges_done"])
    assert between(b1["ranges_total"], value(m, "mover_ranges", **tab, kind="backfill"), b2["ranges_total"])
    assert value(m, "mover_ranges", **tab, kind="backfill", status="failed") == b1["ranges_failed"] == 0
    assert value(m, "mover_backfill_rows_estimate", **tab) == b1["rows_estimate"] == b2["rows_estimate"]
    assert value(m, "mover_range_workers", **tab) == b1["workers"] == b2["workers"] == 1
    # rows/s over the last 30 s falls while nothing finishes, the ETA grows (status rounds both)
    assert between(b1["rows_per_second"], value(m, "mover_backfill_rows_per_second", **tab), b2["rows_per_second"],
                   slack=0.5)
    assert between(b1["eta_seconds"], value(m, "mover_backfill_eta_seconds", **tab), b2["eta_seconds"], slack=0.5)
    assert between(s1["capture"]["applied"], value(m, "mover_capture_applied_changes_total", **tab),
                   s2["capture"]["applied"])
    assert value(m, "mover_divergences_open", **tab) == s1["divergences"] == s2["divergences"] == 0
    t1, t2 = s1["throttle"], s2["throttle"]
    assert chosen(m, "mover_governor_state", "state", **tab) in (t1["state"], t2["state"])
    assert between(t1["duty"], value(m, "mover_governor_duty_ratio", **tab), t2["duty"], slack=0.001)
    assert t1["baseline_ms"] == t2["baseline_ms"] and t1["budget_ms"] == t2["budget_ms"]
    assert same_ms(m, "mover_governor_probe_baseline_seconds", t1["baseline_ms"], **tab)
    assert same_ms(m, "mover_governor_latency_budget_seconds", t1["budget_ms"], **tab)
    assert value(m, "mover_governor_probe_latency_seconds", **tab) > 0
    assert between(t1["throttled_seconds"], value(m, "mover_governor_throttled_seconds_total", **tab),
                   t2["throttled_seconds"], slack=0.05)


def compare_still(s: dict, m: Samples, name: str, table: str) -> None:
    """A scrape of a migration nobody runs (writer paused): every figure is the status's."""
    mig, tab = {"migration": name}, {"migration": name, "table": table}
    assert chosen(m, "mover_migration_step", "step", **mig) == s["step"]
    assert chosen(m, "mover_migration_state", "state", **mig) == s["state"]
    assert value(m, "mover_migration_paused", **mig) == float(s["backfill"]["paused"])
    b, r, c = s["backfill"], s["reconcile"], s["capture"]
    assert value(m, "mover_backfill_rows_copied_total", **tab) == b["rows_copied"]
    assert value(m, "mover_ranges", **tab, kind="backfill", status="done") == b["ranges_done"]
    assert value(m, "mover_ranges", **tab, kind="backfill") == b["ranges_total"]
    assert value(m, "mover_backfill_rows_estimate", **tab) is b["rows_estimate"] is None  # copied
    assert value(m, "mover_range_workers", **tab) == b["workers"] == 0
    assert value(m, "mover_backfill_rows_per_second", **tab) is b["rows_per_second"] is None
    assert value(m, "mover_ranges", **tab, kind="reconcile", status="done") == r["ranges_done"]
    assert value(m, "mover_ranges", **tab, kind="reconcile") == r["ranges_total"]
    assert value(m, "mover_reconcile_rows_compared", **tab) == r["rows_compared"]
    assert value(m, "mover_reconcile_rows_estimate", **tab) == r["rows_estimate"]
    assert value(m, "mover_capture_pending_changes", **tab) == c["pending"] > 0
    assert value(m, "mover_capture_pending_changes", **tab, direction="forward") == c["pending"]
    assert value(m, "mover_capture_applied_changes_total", **tab) == c["applied"]
    assert value(m, "mover_capture_lag_seconds", **tab, direction="forward") >= c["lag_seconds"] > 0
    assert value(m, "mover_capture_gaps_open", **tab) == len(c["gaps"]) == 0
    assert value(m, "mover_divergences_open", **tab) == s["divergences"] == 0
    for kind, n in r["divergences"]["open"].items():
        assert value(m, "mover_divergences_open", **tab, kind=kind) == n
    t = s["throttle"]
    assert chosen(m, "mover_governor_state", "state", **tab) == t["state"] == "idle"  # nobody probes
    assert value(m, "mover_governor_duty_ratio", **tab) == t["duty"] == 1.0
    assert same_ms(m, "mover_governor_probe_latency_seconds", t["latency_ms"], **tab)
    assert same_ms(m, "mover_governor_probe_baseline_seconds", t["baseline_ms"], **tab)
    assert same_ms(m, "mover_governor_latency_budget_seconds", t["budget_ms"], **tab)
    assert round(value(m, "mover_governor_throttled_seconds_total", **tab), 1) == t["throttled_seconds"]
    assert value(m, "mover_guard_waiting", **tab) == 0


def test_the_exporter_says_what_status_says_through_a_migration(db_dsn, tmp_path):
    """A migration under a writer, scraped mid-backfill (held inside its fourth range), at the gate,
    after a cutover that could not get its lock, after the swap and after retire: each scrape
    against the status read around it; every name the dashboard uses is served."""
    create_orders(db_dsn, 12_000)
    name, table = "orders_bigint", str(parse_qualified('public."Orders"'))  # as status names it
    plan = plan_file(tmp_path, name, columns={"id": "bigint"},
                     backfill={"range_rows": 2000, "min_rows": 2000, "max_rows": 2000})
    release = tmp_path / "release"
    served: set[str] = set()
    writer = Writer(db_dsn).start()
    exporter = Exporter(db_dsn)  # starting beside the run

    def take() -> Samples:
        m = scrape(exporter.url)
        served.update(n for n, _ in m)
        assert (value(m, "mover_up"), value(m, "mover_scrape_errors_total")) == (1, 0), m
        return m

    try:
        run = Spawned(db_dsn, "run", plan, env={"MOVER_FAULT": "hang@range_copied:4",
                                                "MOVER_FAULT_RELEASE": str(release)})
        assert run.wait_for("hanging at range_copied:4"), "".join(run.err)
        # The governor goes on probing while the range is held: its first reading after the
        # baseline comes within two probes (a scrape before it has no latency to serve).
        deadline = time.monotonic() + 30
        while api.status(db_dsn, name)["throttle"]["latency_ms"] is None:
            assert time.monotonic() < deadline, "no probe reading 30 s into the backfill"
            time.sleep(pacing.PROBE_SECONDS)
        s1 = status(db_dsn, name)
        m = take()
        s2 = status(db_dsn, name)
        compare_running(s1, m, s2, name, table)
        assert value(m, "mover_ranges", migration=name, kind="backfill", status="done") == 3
        release.touch()
        assert run.wait(120) == 3, "".join(run.err)  # at the gate

        writer.pause()  # still: the scrape and the status read the same rows
        with psycopg.connect(db_dsn, autocommit=True) as conn:  # a change mover has not replayed yet
            app_execute(conn, 'UPDATE {t} SET note = \'pending\' WHERE id = (SELECT min(id) FROM {t})')
        s = status(db_dsn, name)
        compare_still(s, take(), name, table)
        writer.resume()

        # A cutover that never gets its lock: each attempt's lock_timeout counted as timed out.
        assert mover(db_dsn, "set", name, "cutover.lock_timeout=100ms", "cutover.attempts=2").returncode == 0
        with psycopg.connect(db_dsn) as blocker:
            blocker.execute('LOCK TABLE "Orders" IN ACCESS SHARE MODE')
            r = mover(db_dsn, "cutover", name)
            assert r.returncode == 3 and "could not lock" in r.stderr, r.stderr
        m = take()
        assert value(m, "mover_lock_attempts_total", migration=name, outcome="timed_out") == 2
        assert value(m, "mover_lock_attempts_total", migration=name, outcome="granted") == 0
        assert chosen(m, "mover_migration_state", "state", migration=name) == "waiting"

        assert mover(db_dsn, "set", name, "cutover.attempts=30").returncode == 0
        r = mover(db_dsn, "cutover", name)
        assert r.returncode == 0, r.stderr
        with psycopg.connect(db_dsn, autocommit=True) as conn:  # the attempt at which the swap got it
            (attempt,) = conn.execute("SELECT (detail->>'attempt')::int FROM mover.events"
                                      " WHERE kind = 'step_done' AND step = 'cutover'").fetchone()
        s = status(db_dsn, name)
        m = take()
        assert chosen(m, "mover_migration_step", "step", migration=name) == s["step"] == "rollback_window"
        assert value(m, "mover_cutover_lock_hold_seconds", migration=name) == s["cutover"]["lock_ms"] / 1000
        assert value(m, "mover_rollback_window_end_timestamp_seconds", migration=name) == pytest.approx(
            datetime.fromisoformat(s["rollback_window_ends_at"]).timestamp())
        assert value(m, "mover_lock_attempts_total", migration=name, outcome="granted") == 1
        assert value(m, "mover_lock_attempts_total", migration=name, outcome="timed_out") == 2 + attempt - 1

        r = mover(db_dsn, "retire", name, "--force")
        assert r.returncode == 0, r.stderr
        m = take()
        assert chosen(m, "mover_migration_step", "step", migration=name) == "retire"
        assert chosen(m, "mover_migration_state", "state", migration=name) == "done"
        assert value(m, "mover_capture_pending_changes", migration=name) == 0
        assert value(m, "mover_failures_total", migration=name) == 0
    finally:
        writer.halt()
        exporter.stop()
    assert writer.errors == []
    # Every name served is declared (docs/metrics.md lists them), and every name the dashboard's
    # expressions use was served in this run.
    assert served <= set(METRICS), served - set(METRICS)
    assert dashboard_names() <= served, dashboard_names() - served


def test_a_guards_wait_is_labelled_with_its_guard_and_counted(db_dsn, tmp_path):
    """A replication slot holding back more WAL than [throttle] max_slot_wal holds the backfill from
    its start: the scrape says which guard waits, as status does; once the slot is gone the wait
    is counted under that guard."""
    create_orders(db_dsn, 4_000)
    name, tab = "slot_wait", {"migration": "slot_wait", "table": str(parse_qualified('public."Orders"'))}
    slot = f"metrics_{uuid.uuid4().hex[:8]}"
    plan = plan_file(tmp_path, name, columns={"id": "bigint"}, backfill={"range_rows": 1000},
                     throttle={"max_slot_wal": "1kB"})
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
        conn.execute("SELECT pg_switch_wal()")  # the slot now holds back a whole segment
    try:
        with api.serve_metrics(db_dsn, "127.0.0.1:0") as url:
            run = Spawned(db_dsn, "run", plan, env={})
            assert run.wait_for("waiting: replication slot"), "".join(run.err)
            # The governor says so as it decides; its row says so at its next probe (250 ms).
            for _ in range(100):
                m = scrape(url)
                if value(m, "mover_guard_waiting", **tab, reason="replication_slot") == 1:
                    break
                threading.Event().wait(0.05)
            st = status(db_dsn, name)
            assert st["throttle"]["state"] == "waiting", st["throttle"]
            assert pacing.guard_of(st["throttle"]["wait"]) == "replication_slot", st["throttle"]["wait"]
            assert chosen(m, "mover_governor_state", "state", **tab) == "waiting"
            assert value(m, "mover_guard_waiting", **tab) == 1
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            assert run.wait(120) == 3, "".join(run.err)
            m = scrape(url)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE slot_name = %s", (slot,))
    assert value(m, "mover_guard_waiting", **tab) == 0
    waited = value(m, "mover_guard_wait_seconds_total", **tab, reason="replication_slot")
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # from the governor's own events
        (recorded,) = conn.execute("SELECT (detail->>'seconds')::float8 FROM mover.events"
                                   " WHERE kind = 'throttle_resumed'").fetchone()
    assert waited == pytest.approx(recorded, abs=0.15) and waited > 0
    assert value(m, "mover_guard_wait_seconds_total", **tab, reason="standby") == 0


FAMILY = """
CREATE TABLE fam_parent (id serial PRIMARY KEY, note text);
CREATE TABLE fam_child (id serial PRIMARY KEY, parent_id int NOT NULL REFERENCES fam_parent, note text);
INSERT INTO fam_parent (note) SELECT 'p' || g FROM generate_series(1, 300) g;
INSERT INTO fam_child (parent_id) SELECT 1 + g % 300 FROM generate_series(1, 600) g;
"""

FAMILY_PLAN = """
[migration]
name = "fam"
source = "public.fam_parent"
[target]
columns = { id = "bigint" }
[[also]]
source = "public.fam_child"
columns = { parent_id = "bigint" }
[rollback]
window = "1h"
"""


def small_table(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id serial PRIMARY KEY, v text)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("INSERT INTO {} (v) SELECT g::text FROM generate_series(1, 300) g").format(
            sql.Identifier(name)))


@pytest.fixture
def reader(db_dsn) -> Iterator[str]:
    """A role that may read schema mover and nothing more: USAGE on it, SELECT on its tables
    (granted by the test once its tables exist). Its DSN."""
    role = f"monitor_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    parts = urllib.parse.urlsplit(db_dsn)
    try:
        yield urllib.parse.urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_every_state_and_a_family_read_by_a_role_that_may_only_read(db_dsn, tmp_path, reader):
    """Migrations registered only, failed, aborted, retired, at the gate, and a family, in one
    database, scraped as a role with USAGE on schema mover and SELECT on its tables: nothing fails,
    each says its state as status does, and the role sees what a superuser sees. A change log it
    may not read leaves that backlog out, nothing else."""
    for t in ("t_registered", "t_failed", "t_aborted", "t_retired", "t_gate"):
        small_table(db_dsn, t)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(FAMILY)

    def plan(t: str, **sections) -> str:
        return plan_file(tmp_path, t, f"public.{t}", columns={"id": "bigint"}, **sections)

    db = Database(db_dsn)
    register.register_or_load(db, load_plan(plan("t_registered")), "test")
    db.close()
    r = mover(db_dsn, "run", plan("t_failed", backfill={"max_attempts": 1}), env={"MOVER_FAULT": "error@claimed"})
    assert r.returncode == 1, r.stderr
    assert mover(db_dsn, "step", plan("t_aborted")).returncode == 0
    assert mover(db_dsn, "abort", "t_aborted").returncode == 0
    assert mover(db_dsn, "run", plan("t_retired", window="0s")).returncode == 3
    assert mover(db_dsn, "cutover", "t_retired").returncode == 0
    assert mover(db_dsn, "run", plan("t_gate")).returncode == 3
    assert mover(db_dsn, "run", write_plan(tmp_path / "fam.toml", FAMILY_PLAN)).returncode == 3

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        who = sql.Identifier(urllib.parse.urlsplit(reader).username)
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA mover TO {}").format(who))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA mover TO {}").format(who))
    expected = {"t_registered": ("create_target", "pending"), "t_failed": ("backfill", "failed"),
                "t_aborted": ("install_capture", "aborted"),
                "t_retired": ("retire", "done"), "t_gate": ("cutover", "waiting"), "fam": ("cutover", "waiting")}
    every = {s["name"]: s for s in json.loads(mover(db_dsn, "status", "--json").stdout)}
    with api.serve_metrics(reader, "127.0.0.1:0") as as_reader, api.serve_metrics(db_dsn, "127.0.0.1:0") as as_su:
        m, su = scrape(as_reader), scrape(as_su)
        assert (value(m, "mover_up"), value(m, "mover_scrape_errors_total")) == (1, 0)
        for name, (step, state) in expected.items():
            assert (every[name]["step"], every[name]["state"]) == (step, state), name
            assert chosen(m, "mover_migration_step", "step", migration=name) == step, name
            assert chosen(m, "mover_migration_state", "state", migration=name) == state, name
        assert value(m, "mover_failures_total", migration="t_failed", kind="failed") == 1
        assert value(m, "mover_ranges", migration="t_failed", kind="backfill", status="failed") == \
            every["t_failed"]["backfill"]["ranges_failed"]
        # A family: its step and state once, each table's own figures
        child = str(parse_qualified("public.fam_child"))
        assert {dict(ls)["table"] for (n, ls) in m if n == "mover_table_step" and dict(ls)["migration"] == "fam"} \
            == {str(parse_qualified("public.fam_parent")), child}
        assert value(m, "mover_backfill_rows_copied_total", migration="fam") == every["fam"]["backfill"]["rows_copied"]
        assert value(m, "mover_backfill_rows_copied_total", migration="fam", table=child) == 600
        # What the role reads is what a superuser reads.
        assert {k: v for k, v in m.items() if k[0] != "mover_scrape_duration_seconds"} == \
            {k: v for k, v in su.items() if k[0] != "mover_scrape_duration_seconds"}

        # One change log it may not read: that backlog is left out, nothing else.
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            (mid,) = conn.execute("SELECT id FROM mover.migrations WHERE name = 't_gate'").fetchone()
            conn.execute(sql.SQL("REVOKE SELECT ON {} FROM {}").format(
                sql.Identifier("mover", f"m{mid}_changes"), who))
        m = scrape(as_reader)
        assert value(m, "mover_up") == 1
        assert value(m, "mover_capture_pending_changes", migration="t_gate", direction="forward") is None
        assert value(m, "mover_capture_pending_changes", migration="t_gate", direction="reverse") == 0
        assert chosen(m, "mover_migration_state", "state", migration="t_gate") == "waiting"
        assert value(m, "mover_capture_pending_changes", migration="fam", direction="forward") == 0


def test_the_exporter_serves_while_the_database_is_away_and_recovers(pg_dsn, db_dsn, template_db):
    """Started against a server that does not answer: it serves mover_up 0 and counts the failed
    reads. Against a database that is dropped under it and made again: up, down, up."""
    with socket_closed_port() as port:
        nowhere = f"postgresql://nobody@127.0.0.1:{port}/nothing"
        with api.serve_metrics(nowhere, "127.0.0.1:0", timeout=1) as url:
            m1, m2 = scrape(url), scrape(url)
    assert (value(m1, "mover_up"), value(m1, "mover_scrape_errors_total")) == (0, 1)
    assert (value(m2, "mover_up"), value(m2, "mover_scrape_errors_total")) == (0, 2)
    assert {n for n, _ in m2} == {"mover_up", "mover_scrape_errors_total", "mover_scrape_duration_seconds"}

    dbname = urllib.parse.urlsplit(db_dsn).path.lstrip("/")
    with api.serve_metrics(db_dsn, "127.0.0.1:0") as url:
        assert value(scrape(url), "mover_up") == 1
        with connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(dbname)))
        m = scrape(url)
        assert (value(m, "mover_up"), value(m, "mover_scrape_errors_total")) == (0, 1)
        with connect(pg_dsn) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(dbname),
                                                                          sql.Identifier(template_db)))
        m = scrape(url)
        assert (value(m, "mover_up"), value(m, "mover_scrape_errors_total")) == (1, 1)


@contextmanager
def socket_closed_port() -> Iterator[int]:
    """A port on loopback where nothing listens (bound, never listening, so nobody takes it)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def test_the_textfile_mode_writes_atomically_once_or_at_each_interval(db_dsn, tmp_path):
    create_orders(db_dsn, 500)
    assert mover(db_dsn, "run", plan_file(tmp_path, "tf", columns={"id": "bigint"})).returncode == 3
    path = tmp_path / "mover.prom"
    r = mover(db_dsn, "metrics", "--textfile", str(path))
    assert r.returncode == 0, r.stderr
    m = parse(path.read_text())
    assert value(m, "mover_up") == 1 and chosen(m, "mover_migration_step", "step", migration="tf") == "cutover"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("mover.prom")] == ["mover.prom"]  # no temp left

    # The database unreachable: the file says so, and the command exits 1.
    with socket_closed_port() as port:
        r = mover(f"postgresql://nobody@127.0.0.1:{port}/nothing", "metrics", "--textfile", str(path),
                  "--timeout", "1")
    assert r.returncode == 1 and "mover_up 0" in r.stderr, r.stderr
    assert value(parse(path.read_text()), "mover_up") == 0

    # Every interval until stopped: written again while it runs.
    path.unlink()
    stop = threading.Event()
    t = threading.Thread(target=api.write_metrics, args=(db_dsn, path), kwargs={"interval": 0.2, "stop": stop})
    t.start()
    try:
        seen: set[float] = set()
        for _ in range(200):
            if path.exists():
                seen.add(path.stat().st_mtime_ns)
            if len(seen) >= 2:
                break
            stop.wait(0.05)
        assert len(seen) >= 2
    finally:
        stop.set()
        t.join(30)
    assert value(parse(path.read_text()), "mover_up") == 1

    r = mover(db_dsn, "metrics")
    assert r.returncode == 2 and "one of --listen ADDR and --textfile PATH" in r.stderr, r.stderr
    r = mover(db_dsn, "metrics", "--listen", "nowhere")
    assert r.returncode == 2 and "HOST:PORT" in r.stderr, r.stderr
