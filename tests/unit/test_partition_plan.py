"""[target.partition] and [partitions]: parsing, errors naming the key, the stored form; the
partition layout math (no database)."""

from __future__ import annotations

import datetime as dt

import pytest

from mover.engines.partitioning import partitions
from mover.errors import PlanError
from mover.plan import parse_plan, plan_from_canonical, to_document

BASE = {"migration": {"name": "x", "source": "events"}, "rollback": {"window": "1h"}}


def plan_with(partition: dict, **sections):
    return parse_plan({**BASE, "target": {"partition": partition}, **sections})


@pytest.mark.parametrize("partition", [
    {"by": "range", "column": "created_at", "interval": "1 month", "accept_key_change": True},
    {"by": "range", "column": "id", "interval": 100_000},
    {"by": "hash", "columns": ["tenant_id"], "modulus": 8},
    {"by": "list", "column": "region", "values": {"eu": ["de", "fr"], "us": ["us"]}, "default": True},
])
def test_valid_partition_plans_round_trip(partition):
    plan = plan_with(partition)
    assert plan.partition is not None
    assert plan_from_canonical(plan.canonical()) == plan
    assert parse_plan(to_document(plan)).partition == plan.partition
    # Partitioning is part of the migration's identity; its absence leaves old hashes alone.
    assert plan.shape_hash() != parse_plan({**BASE}).shape_hash()


@pytest.mark.parametrize("partition, words", [
    ({"by": "tree", "column": "a"}, '[target.partition] by must be "range", "list", "hash" or "none"'),
    ({"by": "range", "column": "a", "columns": ["a"]}, "exactly one of column"),
    ({"by": "range", "column": "a"}, "[target.partition] interval is required"),
    ({"by": "range", "column": "a", "interval": "2 days"}, "[target.partition] interval must be one of"),
    ({"by": "range", "column": "a", "interval": 0}, "positive number"),
    ({"by": "range", "columns": ["a", "b"], "interval": "1 day"}, "takes one column"),
    ({"by": "hash", "column": "a", "modulus": 1}, "[target.partition] modulus must be between 2 and 1024"),
    ({"by": "hash", "column": "a", "modulus": 4, "default": True}, "cannot have a default partition"),
    ({"by": "list", "column": "a"}, "[target.partition] values is required"),
    ({"by": "list", "column": "a", "values": {"x": ["a"], "y": ["a"]}}, "listed twice"),
    ({"by": "range", "column": "a", "interval": "1 month", "name": "{table}_{YYYY}"}, "the same name"),
    ({"by": "range", "column": "a", "interval": "1 month", "name": "p_{YYYY}_{MM}"}, "must contain {table}"),
    ({"by": "hash", "column": "a", "modulus": 4, "interval": "1 day"}, "interval applies to by = \"range\" only"),
    ({"by": "range", "column": "a", "interval": "1 day", "premake": -1}, "premake must be between"),
    ({"by": "range", "column": "a", "interval": "1 day", "max_partitions": 0}, "max_partitions must be between 1"),
    ({"by": "range", "column": "a", "interval": "1 day", "max_partitions": 10_001}, "and 10000, got 10001"),
    ({"by": "hash", "column": "a", "modulus": 4, "max_partitions": 10}, "max_partitions applies to by = \"range\""),
    ({"by": "range", "column": "a", "interval": "1 day", "bogus": 1}, "unknown key [target.partition] bogus"),
    ({"by": "range", "column": "a", "interval": "1 day", "default": "yes"}, "[target.partition] default must be"),
])
def test_invalid_partition_plans_name_the_key(partition, words):
    with pytest.raises(PlanError) as exc:
        plan_with(partition)
    assert words in str(exc.value)


def test_partitions_section_needs_a_partitioned_target_and_a_sane_retention():
    monthly = {"by": "range", "column": "c", "interval": "1 month"}
    with pytest.raises(PlanError, match=r"\[partitions\] applies to a partitioned target only"):
        parse_plan({**BASE, "partitions": {"premake": 2}})
    with pytest.raises(PlanError, match=r"\[partitions\] retention must read like"):
        plan_with(monthly, partitions={"retention": "soon"})
    plan = plan_with(monthly, partitions={"retention": "12 months", "drop_detached": True, "premake": 6})
    assert (plan.upkeep.retention, plan.upkeep.drop_detached, plan.upkeep.premake) == ("12 months", True, 6)



def test_pg_partman_manager_takes_only_a_layout_pg_partman_would_make():
    monthly = {"by": "range", "column": "c", "interval": "1 month"}
    plan = plan_with(monthly, partitions={"manager": "pg_partman", "retention": "12 months"})
    assert plan.upkeep.manager == "pg_partman"
    assert plan_from_canonical(plan.canonical()) == plan
    assert parse_plan(to_document(plan)).upkeep == plan.upkeep
    assert plan_with(monthly).upkeep.manager == "mover"
    for partition, sections, words in [
        (monthly, {"manager": "cron"}, '[partitions] manager must be "mover" or "pg_partman"'),
        ({"by": "hash", "column": "c", "modulus": 4}, {"manager": "pg_partman"}, "range partitioning only"),
        ({**monthly, "interval": "1 week"}, {"manager": "pg_partman"}, "ISO week"),
        ({**monthly, "name": "{table}_m{YYYY}{MM}"}, {"manager": "pg_partman"}, "remove [target.partition] name"),
        (monthly, {"manager": "pg_partman", "premake": 0}, "premake of 1 or more"),
    ]:
        with pytest.raises(PlanError) as exc:
            plan_with(partition, partitions=sections)
        assert words in str(exc.value) + str(exc.value.hint), (sections, str(exc.value))
    # Integer ranges are pg_partman's id partitioning, named {table}_p<lower bound> by both.
    assert plan_with({"by": "range", "column": "id", "interval": 1000},
                     partitions={"manager": "pg_partman"}).upkeep.manager == "pg_partman"


NOW = dt.datetime(2026, 11, 30, 20, 0, tzinfo=dt.UTC)


def test_monthly_layout_runs_from_the_oldest_row_to_premake_past_now_without_gaps():
    spec = plan_with({"by": "range", "column": "c", "interval": "1 month", "premake": 3}).partition
    lo = dt.datetime(2024, 12, 31, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-2)))  # 2025-01-01 UTC
    parts = partitions.range_partitions(spec, "events", "timestamp with time zone", lo, NOW, NOW)
    assert parts[0].name == "events_p2025_01" and parts[-1].name == "events_p2027_02"
    assert len(parts) == 26
    assert all(a.hi == b.lo for a, b in zip(parts, parts[1:], strict=False))
    # A row far ahead does not stretch the layout: layout() routes it to the default (or refuses).
    far = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)
    assert partitions.range_partitions(spec, "events", "timestamp with time zone", lo, far, NOW) == parts


def test_weekly_daily_yearly_and_integer_layouts():
    def names(partition, type_text, lo, hi):
        spec = plan_with({"by": "range", "column": "c", **partition}).partition
        return [p.name for p in partitions.range_partitions(spec, "t", type_text, lo, hi, NOW)]
    assert names({"interval": "1 week", "premake": 1}, "date", dt.date(2026, 11, 20), None) == [
        "t_p2026_11_16", "t_p2026_11_23", "t_p2026_11_30", "t_p2026_12_07"]
    assert names({"interval": "1 day", "premake": 0}, "timestamp without time zone",
                 dt.datetime(2026, 11, 29, 5), None) == ["t_p2026_11_29", "t_p2026_11_30"]
    assert names({"interval": "1 year", "premake": 1}, "date", dt.date(2025, 3, 1), None) == [
        "t_p2025", "t_p2026", "t_p2027"]
    assert names({"interval": 1000, "premake": 2}, "bigint", 1500, 3999) == [
        "t_p1000", "t_p2000", "t_p3000", "t_p4000", "t_p5000"]


def test_max_partitions_is_stored_and_written_only_when_the_plan_says_it():
    daily = {"by": "range", "column": "c", "interval": "1 day"}
    plain = plan_with(daily)
    assert plain.partition.max_partitions == 1000
    # A plan registered before the key existed keeps its stored form, so its identity is unchanged.
    assert "max_partitions" not in plain.partition.as_dict()
    assert "max_partitions" not in to_document(plain)["target"]["partition"]
    wide = plan_with({**daily, "max_partitions": 1200})
    assert wide.partition.as_dict()["max_partitions"] == 1200
    assert plan_from_canonical(wide.canonical()) == wide and parse_plan(to_document(wide)).partition == wide.partition
