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


def check_partitioned_int_to_bigint(plan: Plan) -> None:
    assert plan.partition is None and plan.new_layout is None and not plan.one_table  # the source's layout kept
    assert plan.columns == {"id": "bigint"}


def check_partitioned_monthly_to_daily(plan: Plan) -> None:
    p = plan.new_layout
    assert p is not None and (p.by, p.columns, p.interval, p.premake, p.default) == (
        "range", ("created_at",), "day", 7, True)
    assert not p.accept_key_change  # (id, created_at) holds the partition column already
    assert (plan.upkeep.premake, plan.upkeep.retention) == (7, "90 days")


def check_partitioned_to_one_table(plan: Plan) -> None:
    assert plan.one_table and plan.new_layout is None and plan.columns == {}


EXPECTED: dict[str, Callable[[Plan], None]] = {
    "partitioned-int-to-bigint.toml": check_partitioned_int_to_bigint,
    "partitioned-monthly-to-daily.toml": check_partitioned_monthly_to_daily,
    "partitioned-to-one-table.toml": check_partitioned_to_one_table,
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


# ---------------------------------------------------------------------------------------------
# The example plans against docs/plan.md, for content (issue 35): what a user copies says what the
# reference says.


def mentions(file: str) -> list[tuple[str, str, bool, str]]:
    """Every key the plan sets or shows commented out (`# key = value`), in order: (section, key,
    set, the comment that explains it: the comment lines just above it and its line's own)."""
    out = []
    section, block = None, []
    for line in (PLANS / file).read_text().splitlines():
        header = re.match(r"^\[\[?([\w.]+)\]\]?", line)
        if header:
            name = header.group(1)
            section, key = (name.split(".", 1) if "." in name else (name, None))
            if key is not None:  # [target.partition]: the section's key, set as a table
                out.append((section, key, True, " ".join(block)))
            block = []
            continue
        key_line = re.match(r"^(# )?(\w+) = ([^#]*)(#.*)?$", line)
        if section and key_line and key_line.group(2) in KEYS.get(section, ()):
            out.append((section, key_line.group(2), key_line.group(1) is None,
                        " ".join([*block, (key_line.group(4) or "").lstrip("# ")])))
            block = []
        elif line.startswith("#"):
            block.append(line.lstrip("# "))
        else:
            block = []
    return out


def header(file: str) -> str:
    """The comment before the plan's first section, as one line."""
    lines = (PLANS / file).read_text().split("\n[", 1)[0].splitlines()
    return " ".join(ln.lstrip("# ") for ln in lines if ln.startswith("#"))


def changeable(section: str, key: str) -> bool:
    s = SETTINGS[(section, key)]
    return not (s.fixed or s.registration_only)


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_example_plan_defaults_and_meanings_are_the_docs(file):
    """Every key a plan sets or shows is documented; a "Default X" its comment states is the
    documented default; where docs/plan.md says what the default does (its parenthesis: index_builds
    "0 (one at a time under the governor; ...)"), the comment that explains the key says it too."""
    docs = documented()
    for section, key, _, comment in mentions(file):
        assert (section, key) in docs, f"{file}: [{section}] {key} is not in docs/plan.md"
        default = docs[(section, key)]["default"]
        value = default.split("`")[1] if default.startswith("`") else default
        # A name derived from the source's (`<source>_new`) is said as the example's own name.
        for said in [] if "<source>" in value else re.findall(r"\bDefault:? (\"[^\"]*\"|-?\d+\b|true\b|false\b|none\b)",
                                                           comment):
            assert said == value or (said == "none" and value in ("[]", "none")), \
                f"{file}: [{section}] {key}: the comment says default {said}, docs/plan.md {default}"
        meaning = re.search(r"` \((.+)\)$", default)
        if comment and meaning:
            words = {w for w in re.findall(r"[a-z_]{5,}", meaning.group(1).lower())}
            missing = {w for w in words if w not in comment.lower()}
            assert not missing, f"{file}: [{section}] {key}: docs/plan.md says its default means " \
                                f"{meaning.group(1)!r}; the comment lacks {sorted(missing)}: {comment!r}"


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_example_plan_says_what_mover_set_changes_and_what_may_change(file):
    """A comment naming `mover set NAME section.KEY=VALUE` excepts exactly the keys `mover set`
    refuses; "Identity of the migration: may not change" is said only of fixed keys, "May change"
    only of others."""
    for section, excepted in re.findall(r"`mover set NAME (\w+)\.KEY=VALUE`(?:, except ([\w, ]+))?",
                                        (PLANS / file).read_text().replace("\n# ", " ")):
        refused = {k for k in KEYS[section] if k not in SETTABLE.get(section, ())}
        assert set(re.findall(r"\w+", excepted)) == refused, f"{file}: [{section}] except {excepted!r}"
    for section, key, _, comment in mentions(file):
        if re.search(r"(may not change|Identity of the migration)", comment):
            assert not changeable(section, key), f"{file}: [{section}] {key} is said fixed: {comment!r}"
        if re.search(r"\bMay change\b", comment):
            assert changeable(section, key), f"{file}: [{section}] {key} is said to change: {comment!r}"


def header_may_change(text: str) -> set[tuple[str, str | None]]:
    """The header's "Once registered, only these may change: [backfill], [rollback] window and
    keep_old; ..." as (section, key or None for the whole section)."""
    found = re.search(r"only these may change: ([^;]+);", text)
    assert found, "the header does not say what may change once the migration is registered"
    out: set[tuple[str, str | None]] = set()
    section, whole = None, False
    for sec, word in re.findall(r"\[(\w+)\]|(\w+)", found.group(1)):
        if sec:
            if section is not None and whole:
                out.add((section, None))
            section, whole = sec, True
        elif section is not None and word in KEYS[section]:
            out.add((section, word))
            whole = False
    if section is not None and whole:
        out.add((section, None))
    return out


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_example_plan_header_says_what_it_changes_and_what_may_change(file):
    """Each plan's header says what the migration changes (each column's new type, the
    partitioning) and lists, derived from the plan's own keys, exactly what may change once it
    is registered: a whole section only when every key of it the plan names may change."""
    plan, text = load_plan(PLANS / file), header(file)
    for column, type_ in plan.columns.items():
        assert column in text and type_ in text, f"{file}: the header does not say {column} becomes {type_}"
    if plan.partition is not None:
        assert "partition" in text and all(c in text for c in plan.partition.columns), file
    listed = header_may_change(text)
    named = mentions(file)
    for section, key, _, _ in named:
        if changeable(section, key):
            assert (section, key) in listed or (section, None) in listed, \
                f"{file}: the header does not list [{section}] {key} among what may change"
    for section, key in listed:
        keys = [k for s, k, _, _ in named if s == section] if key is None else [key]
        assert keys and all(changeable(section, k) for k in keys), \
            f"{file}: the header lists [{section}] {key or ''} as changeable"


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_example_plan_widens_referencing_columns_with_also(file):
    """A referencing column widens in the same migration ([[also]]): no plan sends the user to a
    second migration for it, and the one widening a key says how."""
    text = (PLANS / file).read_text()
    assert "second migration" not in text, file
    if any(t in ("bigint", "int8") for t in load_plan(PLANS / file).columns.values()):
        assert "[[also]]" in text, f"{file}: widens a key without saying how its referencing columns widen"
