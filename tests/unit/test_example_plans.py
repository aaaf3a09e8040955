"""The example plans in plans/ load with the real parser and say what their comments say;
docs/plan.md documents exactly the plan keys the parser accepts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from mover.names import QualifiedName
from mover.plan import _SCHEMA, SETTABLE, Plan, load_plan, plan_from_canonical

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "plans"


def check_int_to_bigint(plan: Plan) -> None:
    assert plan.name == "orders-id-bigint"
    assert plan.source == QualifiedName("public", "orders")
    assert plan.target is None  # default: orders_new in the source's schema
    assert plan.columns == {"id": "bigint"}
    assert plan.cutover.auto is False
    assert plan.rollback.window_ms == 24 * 3_600_000
    assert plan.rollback.old_name is None
    assert plan.rollback.keep_old is False


def check_rebuild(plan: Plan) -> None:
    assert plan.name == "events-rebuild"
    assert plan.source == QualifiedName("public", "events")
    assert plan.target is None
    assert plan.columns == {}  # same shape: no type changes
    assert plan.cutover.auto is False
    assert plan.cutover.lock_timeout_ms == 100
    assert plan.cutover.attempts == 100
    assert plan.rollback.window_ms == 2 * 3_600_000
    assert plan.rollback.keep_old is True


def check_mixed_case(plan: Plan) -> None:
    assert plan.name == "invoice-lines-v2"
    # Quoted parts keep their case; the schema is not public.
    assert plan.source == QualifiedName("Billing", "InvoiceLines")
    assert plan.target == QualifiedName("Billing", "InvoiceLines_v2")
    assert plan.rollback.old_name == QualifiedName("Billing", "InvoiceLines_before")
    assert plan.columns == {"LineId": "bigint"}  # column names are exact, not folded
    assert len({plan.source, plan.target, plan.rollback.old_name}) == 3


def check_partition_monthly(plan: Plan) -> None:
    p = plan.partition
    assert p is not None and (p.by, p.columns, p.interval, p.premake, p.default) == (
        "range", ("created_at",), "month", 3, True)
    assert p.accept_key_change and p.name == "{table}_p{YYYY}_{MM}"
    assert (plan.upkeep.premake, plan.upkeep.retention, plan.upkeep.drop_detached) == (3, "24 months", False)


def check_partition_daily(plan: Plan) -> None:
    p = plan.partition
    assert p is not None and (p.by, p.columns, p.interval, p.premake, p.default) == (
        "range", ("logged_at",), "day", 7, False)
    assert (plan.upkeep.premake, plan.upkeep.retention, plan.upkeep.drop_detached) == (7, "30 days", True)


def check_partition_hash(plan: Plan) -> None:
    p = plan.partition
    assert p is not None and (p.by, p.columns, p.modulus, p.default) == ("hash", ("tenant_id",), 16, False)


def check_partition_list(plan: Plan) -> None:
    p = plan.partition
    assert p is not None and p.by == "list" and p.default
    assert dict(p.values) == {"eu": ("de", "fr", "nl"), "us": ("us",), "apac": ("jp", "sg")}


EXPECTED: dict[str, Callable[[Plan], None]] = {
    "partition-monthly.toml": check_partition_monthly,
    "partition-daily-retention.toml": check_partition_daily,
    "partition-hash-tenant.toml": check_partition_hash,
    "partition-list-region.toml": check_partition_list,
    "int_to_bigint.toml": check_int_to_bigint,
    "rebuild.toml": check_rebuild,
    "mixed_case.toml": check_mixed_case,
}


def test_every_example_plan_is_checked():
    assert sorted(p.name for p in PLANS.glob("*.toml")) == sorted(EXPECTED)


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_example_plan_loads_and_says_what_it_should(file):
    plan = load_plan(PLANS / file)
    EXPECTED[file](plan)
    # What is stored with a migration reads back as the same plan.
    again = plan_from_canonical(plan.canonical())
    assert again == plan
    assert again.shape_hash() == plan.shape_hash()


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_example_plan_comments_every_key(file):
    """A user copies these files: each one mentions every key of every section it uses."""
    text = (PLANS / file).read_text()
    plan = load_plan(PLANS / file)
    for section in plan.document:
        for key in _SCHEMA[section]:
            assert re.search(rf"(^|[\s#]){re.escape(key)}\b", text, re.M), f"{file}: [{section}] {key} not explained"


def test_docs_document_exactly_the_plan_keys():
    """docs/plan.md's reference table lists every key the parser accepts, and no other."""
    doc = (ROOT / "docs" / "plan.md").read_text()
    documented = set(re.findall(r"^\| `\[(\w+)\]` \| `(\w+)` \|", doc, re.M))
    schema = {(section, key) for section, keys in _SCHEMA.items() for key in keys}
    assert schema - documented == set(), "keys the parser accepts that docs/plan.md does not document"
    assert documented - schema == set(), "keys docs/plan.md documents that the parser does not accept"


def test_docs_say_which_keys_mover_set_changes():
    """The "May change?" column mentions `mover set` exactly for the keys `mover set` accepts."""
    doc = (ROOT / "docs" / "plan.md").read_text()
    rows = re.findall(r"^\| `\[(\w+)\]` \| `(\w+)` \|.*\| ([^|]*) \|$", doc, re.M)
    assert len(rows) == sum(len(keys) for keys in _SCHEMA.values())
    for section, key, may_change in rows:
        assert ("`mover set`" in may_change) == (key in SETTABLE.get(section, ())), f"[{section}] {key}"


# Commented-out keys that show an example value rather than the default.
EXAMPLES = {"name", "old_name", "drop_foreign_keys", "accept_lossy"}


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_example_plan_comments_show_the_parsers_defaults(file):
    """"Defaults are shown": each commented-out `# key = value` line, uncommented, changes nothing."""
    import tomllib

    from mover.plan import parse_plan
    lines = (PLANS / file).read_text().splitlines()
    base = load_plan(PLANS / file)
    for i, line in enumerate(lines):
        m = re.match(r"^# (\w+) = (.+)$", line)
        if not m or m.group(1) in EXAMPLES:
            continue
        uncommented = [*lines[:i], line[2:], *lines[i + 1:]]
        assert parse_plan(tomllib.loads("\n".join(uncommented))) == base, f"{file}: {line!r} is not the default"


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_example_plan_comments_agree_with_the_docs(file):
    """What the docs and plan check say, the example plans' comments say too (claims once contradicted)."""
    text = (PLANS / file).read_text()
    doc = (ROOT / "docs" / "plan.md").read_text()
    # Index builds: plain CREATE INDEX, several at once (docs/plan.md's index_builds row).
    assert "plain `CREATE INDEX`" in doc and "CONCURRENTLY sessions" not in text, file
    if "index_builds" in text:
        assert "plain CREATE INDEX" in text, file
    # What the swap carries (the README's exceptions): nothing of it is to be re-created by hand.
    assert not re.search(r"re-create[^.]*(extended statistics|replica identity|publication)", text, re.S), file
