"""Fleets (issue 38): one plan over databases on three PostgreSQL servers (the suite's and two more
started here) and over the tenant schemas of one database, a canary first, then waves.

Every member has its application writer and the writer's mirror; each member is judged by its
mirror (EXCEPT ALL both ways, tests/workload.py), never by mover's reconcile. The runner is killed
and a server stopped at moments the runner announces on stderr (awaited, never slept for)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from mover import api
from mover.demo.embedded import EmbeddedPostgres
from tests.conftest import connect, dsn_with_dbname
from tests.workload import Spawned, Writer, assert_oracle, create_orders, mover, plan_text, toml_value

ROWS = 300
# One plan for every member: the key widened, and `note` narrowed, so that one long note planted
# in a member is a divergence there (invariant 8) and nowhere else.
PLAN = plan_text("orders_fleet", columns={"id": "bigint", "note": "varchar(40)"},
                 target={"accept_lossy": ["note"]}, throttle={"max_latency_increase": "off"},
                 backfill={"range_rows": 50, "min_rows": 50, "max_rows": 100, "max_rows_per_second": 150})


@pytest.fixture(scope="module")
def servers(pg_dsn):
    """The suite's server and two more, each stopped at the end."""
    extra = [EmbeddedPostgres(fast=True) for _ in range(2)]
    try:
        dsns = [pg_dsn] + [s.start() for s in extra]
        yield dsns, [None, *extra]
    finally:
        for s in extra:
            s.stop()


def _database(server_dsn: str, *, orders: bool = True, init: bool = True) -> str:
    """A fresh database on the server, with mover's control schema and Orders and its mirror
    (unless told)."""
    name = f"f_{uuid.uuid4().hex[:10]}"
    with connect(server_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = dsn_with_dbname(server_dsn, name)
    if init:
        api.init(dsn)
    if orders:
        create_orders(dsn, ROWS)
    return dsn


def _fleet_file(tmp_path: Path, members: dict[str, str] | None = None, *, tenants: dict | None = None,
                **rollout) -> str:
    (tmp_path / "plan.toml").write_text(PLAN)
    lines = ["[fleet]", 'name = "orders"', 'plan = "plan.toml"', ""]
    for name, dsn in (members or {}).items():
        lines += ["[[members]]", f"name = {toml_value(name)}", f"dsn = {toml_value(dsn)}", ""]
    if tenants is not None:
        lines += ["[tenants]"] + [f"{k} = {toml_value(v)}" for k, v in tenants.items()] + [""]
    lines += ["[rollout]"] + [f"{k} = {toml_value(v)}" for k, v in rollout.items()]
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def fleet(*args: str, **kw):
    return mover("", "fleet", *args, **kw)


def _status(path: str) -> dict:
    r = fleet("status", path, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _states(path: str) -> dict[str, str]:
    return {m["name"]: m["fleet_state"] for m in _status(path)["members"]}


def _registered(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM mover.migrations ORDER BY id")]


def _writers(dsns: list[str]) -> list[Writer]:
    return [Writer(dsn, seed=i, delay=0.02).start() for i, dsn in enumerate(dsns)]


def _halt(writers: list[Writer], *, server_stopped: tuple[Writer, ...] = ()) -> None:
    """Every writer stopped; none met an error (but losing its connection, where its server was
    stopped: the application's own business, not mover's)."""
    for w in writers:
        w.halt()
    for w in writers:
        lost = ("OperationalError", "AdminShutdown")
        errors = [e for e in w.errors if not (w in server_stopped and e.startswith(lost))]
        assert errors == [], w.errors
        assert w.ops > 0


def test_a_canary_with_a_divergence_stops_the_rollout_before_the_first_wave(servers, tmp_path):
    (a, b, c), _ = servers
    dsns = {"a1": _database(a), "b1": _database(b), "c1": _database(c)}
    # The canary's one row the new type can't hold, under a key the writer never picks (it picks 1..max).
    with psycopg.connect(dsns["a1"], autocommit=True) as conn:
        for table in ("Orders", "Orders_mirror"):
            conn.execute(sql.SQL("INSERT INTO {} (id, \"Account\", note, created_at) VALUES (-1, 1, repeat('x', 50),"
                                 " '2026-01-01')").format(sql.Identifier(table)))
    path = _fleet_file(tmp_path, dsns, canary=["a1"], wave_size=2)
    writers = _writers(list(dsns.values()))
    try:
        r = fleet("run", path)
    finally:
        _halt(writers)
    assert r.returncode == 3, r.stderr
    assert "a1" in r.stderr and "divergence" in r.stderr
    st = _status(path)
    assert st["stopped"]["reason"] == "divergence" and st["stopped"]["member"] == "a1"
    assert st["run_wave"] == 0
    assert _states(path) == {"a1": "failed", "b1": "checked", "c1": "checked"}
    # Nothing started beyond the canary; the canary's source is the application's, untouched.
    assert _registered(dsns["b1"]) == [] and _registered(dsns["c1"]) == []
    for dsn in dsns.values():
        assert_oracle(dsn, "Orders")
    r = fleet("cutover", path)  # the wave after the canary was never reached: no cutover anywhere
    assert r.returncode == 3, r.stderr
    assert "not at their gate" in r.stderr
    r = fleet("abort", path)
    assert r.returncode == 0, r.stderr
    assert set(_states(path).values()) == {"aborted"}


def test_kill_resume_cutover_in_waves_rollback_of_a_wave_retire(servers, tmp_path):
    (a, b, c), _ = servers
    dsns = {"a1": _database(a), "a2": _database(a), "b1": _database(b), "b2": _database(b), "c1": _database(c)}
    path = _fleet_file(tmp_path, dsns, canary=["a1"], wave_size=2, concurrency=3, per_server=1)
    writers = _writers(list(dsns.values()))
    try:
        runner = Spawned("", "fleet", "run", path, env={})
        assert runner.wait_for("wave 1 started", timeout=120), "".join(runner.err)
        assert runner.kill(), "the runner ended before the kill"
        # A cutover now stops at the first wave not wholly at its gate: the canary may be swapped, no
        # member of a later wave is.
        r = fleet("cutover", path)
        assert r.returncode == 3 and "not" in r.stderr, r.stderr
        states = _states(path)
        assert all(states[n] != "cut_over" for n in ("a2", "b1", "b2", "c1")), states

        r = fleet("run", path)  # resumes: the dead runner's lease and its members' are taken over
        assert r.returncode == 3, r.stderr
        assert {n: s for n, s in _states(path).items() if n != "a1"} == dict.fromkeys(("a2", "b1", "b2", "c1"),
                                                                                      "at_gate")
        for dsn in dsns.values():  # each member's migration registered once, never started twice
            assert _registered(dsn) == ["orders_fleet"]
        home_events = [e["kind"] for e in _status(path)["events"]]
        assert "wave_done" in home_events

        r = fleet("cutover", path, "--wave", "1")
        assert r.returncode == 0, r.stderr
        states = _states(path)
        assert [states[n] for n in ("a1", "a2", "b1")] == ["cut_over"] * 3
        assert [states[n] for n in ("b2", "c1")] == ["at_gate"] * 2
        r = fleet("rollback", path, "--wave", "1")
        assert r.returncode == 0, r.stderr
        states = _states(path)
        assert states["a1"] == "cut_over" and states["a2"] == states["b1"] == "rolled_back"
        assert api.status(dsns["a2"], "orders_fleet")["step"] in ("reconcile", "cutover")  # the same story there

        assert fleet("run", path).returncode == 3  # the rolled back members to their gate again
        r = fleet("cutover", path)
        assert r.returncode == 0, r.stderr
        assert set(_states(path).values()) == {"cut_over"}
    finally:
        _halt(writers)
    r = fleet("retire", path, "--force")
    assert r.returncode == 0, r.stderr
    assert set(_states(path).values()) == {"retired"}
    r = fleet("watch", path, "--interval", "0.2")  # off a terminal: a line per reading; ends, all retired
    assert r.returncode == 0 and "5 retired" in r.stdout, r.stdout + r.stderr
    for dsn in dsns.values():
        assert api.status(dsn, "orders_fleet")["state"] == "done"
        assert_oracle(dsn, "Orders")


def test_a_server_stopped_mid_rollout_then_started_again(servers, tmp_path):
    (a, b, c), (_, _, server_c) = servers
    dsns = {"a1": _database(a), "c1": _database(c), "c2": _database(c), "b1": _database(b)}
    path = _fleet_file(tmp_path, dsns, canary=["a1"], wave_size=3, per_server=2)
    writers = _writers(list(dsns.values()))
    try:
        runner = Spawned("", "fleet", "run", path, env={})
        assert runner.wait_for("c1: run to its gate", timeout=120), "".join(runner.err)
        server_c.shut_down()
        code = runner.wait(120)
        assert code == 1, "".join(runner.err)
        st = _status(path)
        assert st["stopped"]["reason"] == "unreachable", st["stopped"]
        assert {_states(path)[n] for n in ("c1", "c2")} == {"unreachable"}
        assert _status(path)["totals"]["unreachable"] >= 2
        r = fleet("run", path)  # a member down at the start: named, nothing started
        assert r.returncode == 2 and "'c1'" in r.stderr and "'c2'" in r.stderr, r.stderr
        server_c.start()
        r = fleet("run", path)
        assert r.returncode == 3, r.stderr
        assert set(_states(path).values()) == {"at_gate"}
        assert fleet("cutover", path).returncode == 0
    finally:
        _halt(writers, server_stopped=(writers[1], writers[2]))
    assert fleet("retire", path, "--force").returncode == 0
    for dsn in dsns.values():
        assert _registered(dsn) == ["orders_fleet"]
        assert_oracle(dsn, "Orders")


def test_tenant_schemas_of_one_database(servers, tmp_path):
    (_, b, _), _ = servers
    dsn = _database(b, orders=False, init=False)
    tenant_dsns = []
    for schema in ("tenant_1", "tenant_2"):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        tenant = f"{dsn}?options=-csearch_path%3D{schema}"
        create_orders(tenant, ROWS)
        tenant_dsns.append(tenant)
    path = _fleet_file(tmp_path, tenants={"dsn": dsn, "schemas": "tenant_%"}, wave_size=1)
    r = fleet("init", path)
    assert r.returncode == 0 and "tenant_2: control schema at revision 0012" in r.stdout, r.stderr
    writers = _writers(tenant_dsns)
    try:
        assert fleet("check", path).returncode == 0
        r = fleet("run", path)
        assert r.returncode == 3, r.stderr
        assert sorted(_registered(dsn)) == ["orders_fleet.tenant_1", "orders_fleet.tenant_2"]
        assert fleet("cutover", path).returncode == 0
    finally:
        _halt(writers)
    assert fleet("retire", path, "--force").returncode == 0
    assert _states(path) == {"tenant_1": "retired", "tenant_2": "retired"}
    for tenant in tenant_dsns:
        assert_oracle(tenant, "Orders")


def test_bad_input_names_each_member_and_starts_nothing(servers, tmp_path):
    (a, b, _), _ = servers
    good, missing = _database(a), _database(b, orders=False)  # `missing` has no Orders table: plan check refuses
    path = _fleet_file(tmp_path, {"good": good, "missing": missing})
    r = fleet("run", path)
    assert r.returncode == 2, r.stderr
    assert "'missing'" in r.stderr and "'good'" not in r.stderr
    assert _registered(good) == [] and _registered(missing) == []
    r = fleet("check", path)
    assert r.returncode == 2 and "'missing'" in r.stderr

    path = _fleet_file(tmp_path, {"good": good, "missing": missing}, skip_refused=True)
    assert fleet("check", path).returncode == 0
    assert _states(path) == {"good": "checked", "missing": "skipped"}

    down = "postgresql://postgres@127.0.0.1:1/nowhere"
    path = _fleet_file(tmp_path, {"good": good, "down": down}, canary=["good"])
    r = fleet("run", path)
    assert r.returncode == 2 and "'down'" in r.stderr, r.stderr
    assert _registered(good) == []

    (tmp_path / "bad.toml").write_text('[fleet]\nname = "x"\nplan = "plan.toml"\n[[members]]\nname = "m"\n'
                                       'dsn = "host=h password=sekrit"\n[[members]]\nname = "m"\ndsn = "host=h"\n'
                                       '[rollout]\ncanary = ["nobody"]\nwave_size = 0\n')
    r = fleet("run", str(tmp_path / "bad.toml"))
    assert r.returncode == 2
    for part in ("holds a password", "named twice", "'nobody'", "wave_size"):
        assert part in r.stderr, r.stderr
    assert "sekrit" not in r.stderr + r.stdout
