"""Plan files: TOML -> validated dataclasses, a canonical form and its hash.

Every setting is declared once, in mover/plan/settings.py (how a declaration reads:
mover/plan/declare.py); the parsing, the canonical form, the document `mover set` edits and the
list of what it may change are derived from the declarations (mover/plan/forms.py). The
sub-tables [target.partition] and [hooks.<event>] have their own readers (mover/plan/tables.py).
Validation here needs no database (shape, types, names); the checks against the live catalog
(`mover plan check`, and again at registration) are the registry in mover/checks/. Every error
names the key as `[section] key`. A plan written for the operator (`mover plan new`) is
mover/plan/writer.py's text, its defaults read from the same declarations.
"""

from mover.plan.declare import Setting, duration_text, parse_duration_ms, percent, size_text
from mover.plan.forms import (
    KEYS,
    RENAMED_KEYS,
    SECTIONS,
    SETTABLE,
    SETTINGS,
    TAKES_EFFECT,
    Edit,
    edits,
    load_plan,
    parse_plan,
    plan_from_canonical,
    read_toml,
    renamed,
    to_document,
)
from mover.plan.settings import (
    AlsoTable,
    BackfillSettings,
    CutoverSettings,
    MigrationKeys,
    PartitionUpkeep,
    Plan,
    ReconcileSettings,
    RollbackSettings,
    TargetKeys,
    ThrottleSettings,
    member_name,
)
from mover.plan.tables import DEFAULT_NAMES, HOOK_EVENTS, HOOK_TIMEOUT_MS, RANGE_INTERVALS, Hook, PartitionSpec
from mover.plan.writer import AlsoDraft, Draft

__all__ = [
    "AlsoDraft", "AlsoTable", "DEFAULT_NAMES", "HOOK_EVENTS", "HOOK_TIMEOUT_MS", "KEYS", "RANGE_INTERVALS",
    "RENAMED_KEYS",
    "SECTIONS", "SETTABLE", "SETTINGS", "TAKES_EFFECT", "BackfillSettings", "CutoverSettings", "Draft", "Edit", "Hook",
    "MigrationKeys", "PartitionSpec", "PartitionUpkeep", "Plan", "ReconcileSettings", "RollbackSettings", "Setting",
    "TargetKeys", "ThrottleSettings", "duration_text", "edits", "load_plan", "member_name", "parse_duration_ms",
    "parse_plan", "percent", "plan_from_canonical", "read_toml", "renamed", "size_text", "to_document",
]
