"""The example plans in plans/ load with the real parser and say what their comments say;
docs/plan.md documents exactly the plan keys the parser accepts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from mover.names import QualifiedName
from mover.plan import KEYS, SETTABLE, SETTINGS, Plan, load_plan, plan_from_canonical
from mover.plan.declare import Count

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
        for key in KEYS[section]:
            assert re.search(rf"(^|[\s#]){re.escape(key)}\b", text, re.M), f"{file}: [{section}] {key} not explained"


def documented() -> dict[tuple[str, str], dict[str, str]]:
    """docs/plan.md's "Every key" table: (section, key) -> its cells."""
    doc = (ROOT / "docs" / "plan.md").read_text()
    rows = {}
    for line in re.findall(r"^\| `\[\w+\]` \| `\w+` \|.*\|$", doc, re.M):
        section, key, type_, default, meaning, may_change = (c.strip() for c in line.strip("|").split(" | "))
        rows[(section.strip("`[]"), key.strip("`"))] = {"type": type_, "default": default, "may_change": may_change}
    return rows


def test_docs_document_exactly_the_plan_keys():
    """docs/plan.md's reference table lists every key the parser accepts, and no other."""
    documented_keys = set(documented())
    schema = {(section, key) for section, keys in KEYS.items() for key in keys}
    assert schema - documented_keys == set(), "keys the parser accepts that docs/plan.md does not document"
    assert documented_keys - schema == set(), "keys docs/plan.md documents that the parser does not accept"
    assert set(SETTINGS) == schema


def test_docs_say_which_keys_mover_set_changes():
    """The "May change?" column mentions `mover set` exactly for the keys `mover set` accepts."""
    for (section, key), row in documented().items():
        assert ("`mover set`" in row["may_change"]) == (key in SETTABLE.get(section, ())), f"[{section}] {key}"
        assert SETTINGS[(section, key)].settable == (key in SETTABLE.get(section, ()))


def test_docs_say_what_the_declarations_say():
    """Each documented default is the declared one, a key documented as never changing is fixed
    or read only at registration, and an integer's documented bounds are the parser's."""
    for (section, key), row in documented().items():
        s = SETTINGS[(section, key)]
        shown = s.shown_default()
        assert row["default"] == shown or row["default"].startswith(shown + " "), \
            f"[{section}] {key}: docs/plan.md says the default is {row['default']}, the declaration {shown}"
        never = s.fixed or s.registration_only
        assert row["may_change"].startswith("no") == never, f"[{section}] {key}: {row['may_change']}"
        if isinstance(s.kind, Count):
            bounds = [int(n) for n in re.findall(r"\d+", row["type"].replace(",", ""))]
            unbounded = "≥" in row["type"] and s.kind.hi >= 10**9  # no cap worth writing
            assert bounds == ([s.kind.lo] if unbounded else [s.kind.lo, s.kind.hi]), f"[{section}] {key}: {row['type']}"


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
