"""The fleet file's parser (mover/fleet/file.py) and the wave assignment: no database."""

from __future__ import annotations

import pytest

from mover.errors import PlanError
from mover.fleet.file import STOP_ON, load_fleet
from mover.fleet.members import assign_waves, tenant_plan


def write(tmp_path, text: str):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def problems(tmp_path, text: str) -> str:
    with pytest.raises(PlanError) as exc:
        load_fleet(write(tmp_path, text))
    return str(exc.value)


def test_members_and_rollout(tmp_path):
    f = load_fleet(write(tmp_path, """
[fleet]
name = "orders"
plan = "plans/x.toml"
[[members]]
name = "eu-1"
dsn = "service=eu-1"
[[members]]
name = "us-1"
dsn = "host=db1 port=5433 dbname=shop"
[rollout]
canary = ["us-1"]
wave_size = 5
concurrency = 8
per_server = 2
bake = "10min"
stop_on = ["failure", "divergence"]
skip_refused = true
"""))
    assert f.name == "orders" and f.plan == tmp_path / "plans/x.toml"
    assert [m.name for m in f.members] == ["eu-1", "us-1"]
    r = f.rollout
    assert (r.canary, r.wave_size, r.concurrency, r.per_server, r.bake_ms, r.stop_on, r.skip_refused) == (
        ("us-1",), 5, 8, 2, 600_000, ("failure", "divergence"), True)


def test_defaults(tmp_path):
    f = load_fleet(write(tmp_path, '[fleet]\nname = "f"\nplan = "p.toml"\n[tenants]\ndsn = "dbname=app"\n'
                                   'schemas = "tenant_%"\n'))
    assert f.tenants is not None and f.tenants.schemas == "tenant_%"
    assert f.rollout.stop_on == STOP_ON and not f.rollout.skip_refused and f.rollout.canary == ()


def test_every_problem_at_once_and_no_password_printed(tmp_path):
    text = problems(tmp_path, """
[fleet]
name = "has space"
[[members]]
name = "a"
dsn = "postgresql://u:sekrit@h/db"
[[members]]
name = "a"
dsn = "host=h"
[[members]]
name = "b"
dsn = "not a dsn ="
[rollout]
canary = ["zz"]
concurrency = 0
bake = "soon"
stop_on = ["never"]
colour = "red"
""")
    for part in ("[fleet] name must be", "[fleet] plan is missing", "holds a password", "named twice",
                 "[members #3] dsn is malformed", "'zz'", "concurrency", "bake", "stop_on",
                 "unknown key [rollout] colour"):
        assert part in text, text
    assert "sekrit" not in text


def test_one_way_of_naming_members(tmp_path):
    text = problems(tmp_path, '[fleet]\nname = "f"\nplan = "p"\n[tenants]\ndsn = "dbname=a"\nschemas = "t%"\n'
                              '[discover]\ndsn = "dbname=c"\nquery = "SELECT name, dsn FROM shards"\n')
    assert "name the members one way" in text
    assert "name the members one way" in problems(tmp_path, '[fleet]\nname = "f"\nplan = "p"\n')


def test_not_toml(tmp_path):
    assert "not valid TOML" in problems(tmp_path, "[fleet\n")


def test_waves():
    names = ["a", "b", "c", "d", "e"]
    assert assign_waves(names, ("c",), 2) == {"c": 0, "a": 1, "b": 1, "d": 2, "e": 2}
    assert assign_waves(names, (), 10) == {"a": 0, "b": 1, "c": 1, "d": 1, "e": 1}


def test_tenant_plan_moves_every_table_into_the_schema():
    doc = {"migration": {"name": "orders_bigint", "source": 'public."Orders"'},
           "target": {"columns": {"id": "bigint"}}, "rollback": {"window": "1h"},
           "also": [{"source": "order_lines", "columns": {"order_id": "bigint"}}]}
    plan = tenant_plan(doc, "tenant_7", "p.toml")
    assert plan.name == "orders_bigint.tenant_7"
    assert (plan.source.schema, plan.source.name) == ("tenant_7", "Orders")
    assert plan.also[0].source.schema == "tenant_7"
    assert doc["migration"]["source"] == 'public."Orders"'  # the fleet's plan itself unchanged


def test_the_example_fleet_files_load_with_their_plans():
    from pathlib import Path

    from mover.fleet.members import plan_document

    examples = sorted((Path(__file__).resolve().parents[2] / "plans" / "fleets").glob("*.toml"))
    assert examples
    for path in examples:
        f = load_fleet(path)
        assert f.rollout.canary and f.members
        plan_document(f)  # the plan it names parses
