"""Plan settings declared once (mover/plan/settings.py): what is derived from the declarations
holds for every setting, and a section's declarations serve a repeated table section too."""

from __future__ import annotations

import pytest

from mover.errors import PlanError
from mover.names import QualifiedName
from mover.plan import (
    KEYS,
    RENAMED_KEYS,
    SECTIONS,
    SETTABLE,
    SETTINGS,
    TAKES_EFFECT,
    AlsoTable,
    Setting,
    parse_plan,
    plan_from_canonical,
    to_document,
)
from mover.plan.declare import (
    Choice,
    Count,
    Duration,
    Flag,
    Percent,
    Problems,
    Size,
    read_section,
    section_of,
)

BASE = {"migration": {"name": "m", "source": "orders"}, "rollback": {"window": "1h"}}


def another(s: Setting):
    """A valid value of `s` other than its default, as a plan file writes it, and as the plan holds it."""
    kind = s.kind
    if isinstance(kind, Flag):
        return (not s.default,) * 2
    if isinstance(kind, Count) and s.default is not None:
        value = s.default + 1 if s.default < kind.hi else s.default - 1
        return value, value
    if isinstance(kind, Duration):
        ms = 1_000 if s.default != 1_000 else 2_000
        return "1s" if ms == 1_000 else "2s", ms
    if isinstance(kind, Choice):
        value = next(o for o in kind.options if o != s.default)
        return value, value
    if isinstance(kind, Percent):
        value = "off" if kind.off else ("25%" if s.default != "25%" else "30%")
        return value, value
    if isinstance(kind, Size):
        return ("512MB", 512 * 1024**2) if s.default != 512 * 1024**2 else ("1GB", 1024**3)
    return None


# [partitions] needs a partitioned target: tests/unit/test_partition_plan.py reads it.
TUNABLES = [s for s in SETTINGS.values() if another(s) is not None and s.section != "partitions"]


def test_settable_is_derived_from_the_declarations():
    assert SETTABLE == {section: {s.key for s in SETTINGS.values() if s.section == section and s.settable}
                        for section in ("backfill", "cutover", "reconcile", "throttle")}
    assert RENAMED_KEYS == {("backfill", "chunk_rows"): "range_rows",
                            ("backfill", "target_chunk_ms"): "target_range_ms"}
    # A fixed setting (the migration's identity) is never settable nor given a time to take effect.
    for s in SETTINGS.values():
        assert not (s.fixed and (s.settable or s.path in TAKES_EFFECT)), s


@pytest.mark.parametrize("s", [s for s in TUNABLES if s.settable], ids=lambda s: f"{s.section}.{s.key}")
def test_mover_set_changes_each_settable_key(s):
    """`mover set` rewrites the stored plan's document and parses it again (api.set_settings)."""
    written, held = another(s)
    plan = plan_from_canonical(parse_plan(BASE).canonical())
    doc = to_document(plan)
    doc.setdefault(s.section, {})[s.key] = written  # as api.set_settings: a section at its defaults is left out
    changed = parse_plan(doc, origin="mover set")
    assert getattr(getattr(changed, s.section), s.attr) == held
    assert plan_from_canonical(changed.canonical()) == changed
    assert changed.shape_hash() == plan.shape_hash()


@pytest.mark.parametrize("s", TUNABLES, ids=lambda s: f"{s.section}.{s.key}")
def test_each_tunable_is_read_stored_and_written_back(s):
    written, held = another(s)
    plan = parse_plan({**BASE, s.section: {**BASE.get(s.section, {}), s.key: written}})
    assert getattr(getattr(plan, s.section), s.attr) == held
    assert plan_from_canonical(plan.canonical()) == plan
    assert parse_plan(to_document(plan)) == plan


@pytest.mark.parametrize("s", [s for s in SETTINGS.values() if isinstance(s.kind, Count)],
                         ids=lambda s: f"{s.section}.{s.key}")
def test_each_bound_is_enforced_naming_the_key(s):
    with pytest.raises(PlanError) as info:
        parse_plan({**BASE, s.section: {**BASE.get(s.section, {}), s.key: s.kind.hi + 1}})
    assert f"[{s.section}] {s.key} must be between {s.kind.lo} and {s.kind.hi}" in str(info.value)


def test_sections_list_their_keys_in_the_files_order():
    assert list(KEYS) == ["migration", "target", "backfill", "cutover", "rollback", "reconcile", "throttle",
                          "partitions", "capture", "hooks", "also"]
    assert [p.holder for p in SECTIONS] == [None, None, "backfill", "cutover", "rollback", "reconcile", "throttle",
                                            "upkeep", "capture", None, None]


# [[also]] (issue 27) takes [target]'s keys: a subclass declared under its own name, read by the
# same declarations and check.
Also = AlsoTable


def test_a_section_declared_once_reads_a_repeated_table():
    part = section_of(Also)
    assert part.keys() == ("name", "columns", "accept_lossy", "drop_foreign_keys", "partition", "source")
    problems = Problems("plan")
    tables = [{"source": "public.invoices", "columns": {"customer_id": "bigint"}},
              {"source": "orders", "columns": {"x": 5}, "accept_lossy": ["y"], "colour": 1},
              {"columns": {}}]
    read = [read_section(part, t, problems) for t in tables]
    for r in read:
        part.check(r, {}, problems)
    first = Also(**read[0].values)
    assert first.source == QualifiedName("public", "invoices") and first.columns == {"customer_id": "bigint"}
    assert first.target is None and first.drop_foreign_keys == ()
    messages = [p.message for p in problems.found]
    assert messages == [
        "plan: unknown key [also] colour",
        "plan: [also] columns: the type of column 'x' must be a non-empty string such as \"bigint\"",
        "plan: missing required key [also] source",
        "plan: [also] accept_lossy: 'y' is not a column of [also] columns",
    ]
