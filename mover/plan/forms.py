"""The plan's forms, all derived from the declarations of mover/plan/settings.py: a plan file
read and checked (`parse_plan`), the canonical form stored with a migration read back
(`plan_from_canonical`), the document `mover set` edits (`to_document`), what `mover set` may
change, and when each edit of a registered plan takes effect (`edits`)."""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mover.errors import PlanError, combined
from mover.plan.declare import Problems, Section, Setting, held, layout, read_section
from mover.plan.settings import Plan

log = logging.getLogger(__name__)

SECTIONS: tuple[Section, ...] = layout(Plan)
_SECTION = {part.name: part for part in SECTIONS}

# The sections written once (`[name]`), as against arrays of tables (`[[also]]`).
_SINGLE = tuple(part.name for part in SECTIONS if not any(s.kind.repeated for s in part.settings))

# The keys each section accepts, in the order the errors list them.
KEYS: dict[str, tuple[str, ...]] = {part.name: part.keys() for part in SECTIONS}

# Every setting by (section, key); a whole-section setting ([hooks]) under each of its keys.
SETTINGS: dict[tuple[str, str], Setting] = {
    (part.name, key): s for part in SECTIONS for s in part.settings for key in (s.kind.keys or (s.key,))}

# Settings `mover set NAME section.key=value` may change while a migration runs.
SETTABLE: dict[str, set[str]] = {part.name: {s.key for s in part.settings if s.settable}
                                  for part in SECTIONS if any(s.settable for s in part.settings)}

# Keys renamed when "chunk" became "range"; the old spellings are read for one release (docs/plan.md).
RENAMED_KEYS: dict[tuple[str, str], str] = {(s.section, old): s.key for s in SETTINGS.values() for old in s.was}


def renamed(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with old key spellings replaced by the current ones (a current one wins)."""
    out = {RENAMED_KEYS.get((section, k), k): v for k, v in values.items() if (section, k) not in RENAMED_KEYS}
    for (sec, old), new in RENAMED_KEYS.items():
        if sec == section and old in values and new not in values:
            log.warning("[%s] %s is now called %s; the old name is read until the next release", sec, old, new)
            out[new] = values[old]
    return out


# ---------------------------------------------------------------------------------------------
# A plan file


def read_toml(path: Path, *, unreadable: str, invalid: str, hint: str = "check the path") -> dict[str, Any]:
    """The TOML document in `path` (a plan, a fleet file); a PlanError that starts with
    `unreadable` when the file cannot be read, with `invalid` when it is not TOML."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanError(f"{unreadable}: {exc.strerror}", hint=hint) from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{invalid}: {exc}", hint="fix the syntax") from exc


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    doc = read_toml(path, unreadable=f"cannot read plan file {str(path)!r}",
                    invalid=f"plan {str(path)!r} is not valid TOML")
    return parse_plan(doc, origin=str(path))


def parse_plan(doc: dict[str, Any], origin: str = "plan") -> Plan:
    """Every problem of the plan in one PlanError (a numbered list), not only the first: a key
    that is unknown or of the wrong type is reported and left out, and checking goes on with
    its default so that the problems behind it show too."""
    problems = Problems(origin)
    doc = {name: renamed(name, value) if isinstance(value, dict) else value for name, value in doc.items()}
    for name, value in doc.items():
        if name not in _SECTION:
            problems.add(f"unknown section [{name}]", f"known sections: {', '.join('[' + s + ']' for s in _SINGLE)}")
        elif name not in _SINGLE:
            if not isinstance(value, list):
                problems.add(f"[{name}] must be an array of tables: write [[{name}]] above each table's keys",
                             f"e.g. [[{name}]] then source = \"public.orders\" on the next line")
        elif not isinstance(value, dict):
            problems.add(f"[{name}] must be a table, not a {type(value).__name__}")
    read = {part.name: read_section(part, doc.get(part.name), problems) for part in SECTIONS}
    for part in SECTIONS:
        if part.check:
            part.check(read[part.name], read, problems)
    if problems.found:
        raise combined(problems.found, hint="fix each of them, then `mover plan check PLAN` again")
    return _plan({part.name: read[part.name].values for part in SECTIONS}, doc)


def _plan(values: dict[str, dict[str, Any]], document: dict[str, Any]) -> Plan:
    fields: dict[str, Any] = {}
    for part in SECTIONS:
        if part.holder and part.cls:
            fields[part.holder] = part.cls(**values[part.name])
        else:
            fields.update(values[part.name])
    return Plan(**fields, document=document)


# ---------------------------------------------------------------------------------------------
# The canonical form and the document


_ABSENT = object()


def plan_from_canonical(doc: dict[str, Any]) -> Plan:
    """The plan a migration was registered with; a setting its mover version did not store yet
    takes its default."""
    stored = {name: renamed(name, value) if isinstance(value, dict) else value for name, value in doc.items()}
    values: dict[str, dict[str, Any]] = {}
    for part in SECTIONS:
        values[part.name] = {}
        for s in part.settings:
            place: Any = stored
            for step in s.path.split("."):
                place = place.get(step, _ABSENT) if isinstance(place, dict) else _ABSENT
            values[part.name][s.attr] = s.fresh_default() if place is _ABSENT else s.kind.load(place)
    return _plan(values, doc)


def to_document(plan: Plan) -> dict[str, Any]:
    """The plan as a TOML-shaped document (what a plan file would say), for `mover set`: every
    setting but those unset (None, an empty list, an `only_set` one at its default)."""
    doc: dict[str, Any] = {}
    for part in SECTIONS:
        if part.written is not None and not part.written(plan):
            continue
        table: dict[str, Any] = {}
        if part.name not in _SINGLE:  # an array of tables, written when it has one
            tables = [s.kind.write(v) for s in part.settings if (v := getattr(held(plan, part), s.attr))]
            if tables:
                doc[part.name] = tables[0]
            continue
        for s in part.settings:
            value = getattr(held(plan, part), s.attr)
            if s.kind.keys:
                table.update(s.kind.write(value))
            elif value is not None and value != () and not s.left_unset(value):
                table[s.key] = s.kind.write(value)
        if table or not any(s.kind.keys for s in part.settings):
            doc[part.name] = table
    return doc


# ---------------------------------------------------------------------------------------------
# Edits of a registered plan

# When each changeable setting takes effect, by its place in the canonical form (`section.key`,
# or a whole section). None: read only when the plan is registered, so an edit is refused rather
# than stored without effect. `mover run PLAN` and `plan check PLAN` check an edit against the
# catalog as registration would (mover/checks/edits.py) and name these; docs/plan.md's "May
# change?" column says the same.
TAKES_EFFECT: dict[str, str | None] = {
    **{part.name: part.effect for part in SECTIONS if part.effect},
    **{s.path: None if s.registration_only else s.effect
       for part in SECTIONS for s in part.settings if s.registration_only or s.effect}}
_AT_PATH = {s.path: s for s in SETTINGS.values()}
_WHOLE = {s.path for s in SETTINGS.values() if s.kind.keys}  # compared whole: [hooks]


@dataclass(frozen=True)
class Edit:
    path: str  # "section.key" in the canonical form, or a section without keys
    effect: str | None  # TAKES_EFFECT's; None: not changeable after registration

    @property
    def key(self) -> str:
        """As the plan file names it: `[cutover] lock_timeout`, `[target] drop_foreign_keys`."""
        s = _AT_PATH.get(self.path)
        if s is not None:
            return f"[{s.section}]" if s.kind.keys else f"[{s.section}] {s.key}"
        section, _, key = self.path.partition(".")
        return f"[{section}] {key}" if key else f"[{section}]"

    def describe(self) -> str:
        return f"{self.key} {self.effect}" if self.effect else f"{self.key} (read only at registration)"


def edits(registered: dict[str, Any], plan: Plan) -> list[Edit]:
    """What `plan` changes in the registered canonical form (the fixed parts are the shape hash's,
    checked before this), each with when it takes effect."""
    new = plan.canonical()
    out = []
    for section in sorted(set(registered) | set(new)):
        a, b = registered.get(section), new.get(section)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict) and section not in _WHOLE:
            paths = [f"{section}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            paths = [section]
        for path in paths:
            effect = TAKES_EFFECT.get(path, TAKES_EFFECT.get(section, "?"))
            out.append(Edit(path, effect))
    return out
