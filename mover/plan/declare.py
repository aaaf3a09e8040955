"""How a plan setting is declared: once, as a field of a section's dataclass (spirit's struct tags).

A section of the plan file is a frozen dataclass registered with `@section(name)`; each field is
declared with `setting(kind, default, ...)`: the kind of value (what TOML type the file holds, how
the value is checked and converted, stored in the canonical form and written back), whether
`mover set` may change it while the migration runs, when an edit takes effect. The Plan holds the
sections, nested (`plan.backfill`) or as its own fields (`[migration]`, `[target]`). Everything
else is derived from these declarations (mover/plan/forms.py): the keys and types the parser
accepts, the parsing with every problem named `[section] key`, the canonical form stored with a
migration, the document `mover set` edits, the settable keys, docs/plan.md's check, and the
commented defaults of a plan `mover plan new` writes (mover/plan/writer.py).

A section class can be declared under another name by a subclass (`@section("also") class
Also(TargetKeys)`): a repeated table section reads the same keys with the same rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, TypeVar

from mover.errors import PlanError
from mover.names import QualifiedName, parse_qualified

T = TypeVar("T")
META = "mover.plan"  # the key of a declaration in a dataclass field's metadata

# ---------------------------------------------------------------------------------------------
# Durations

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "sec": 1000, "min": 60_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """'200ms', '30s', '5min', '24h', '2d' (and '0') -> milliseconds."""
    if text.strip() == "0":
        return 0
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration; write e.g. \"200ms\", \"30s\", \"5min\", \"24h\"")
    return int(float(m.group(1)) * _UNIT_MS[m.group(2)])


def duration_text(ms: int) -> str:
    """Milliseconds as the plan writes them: the largest unit that divides them ("2h", "90s", "0")."""
    for unit in ("d", "h", "min", "s"):
        if ms and ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms" if ms else "0"


# ---------------------------------------------------------------------------------------------
# Problems: every one of a plan is reported, each naming its key


class Problems:
    def __init__(self, origin: str):
        self.origin = origin
        self.found: list[PlanError] = []

    def fail(self, message: str, hint: str | None = None) -> PlanError:
        return PlanError(f"{self.origin}: {message}", hint=hint)

    def add(self, message: str, hint: str | None = None) -> None:
        self.found.append(self.fail(message, hint))

    def keep(self, error: PlanError) -> None:
        self.found.append(error)


@dataclass(frozen=True)
class At:
    """Where a value is read (`[section] key`), the default it falls back to, the problem list."""
    section: str
    key: str
    default: Any
    problems: Problems

    def problem(self, tail: str, hint: str | None = None) -> None:
        self.problems.add(f"[{self.section}] {self.key}{tail}", hint)


# ---------------------------------------------------------------------------------------------
# Kinds of value


class Kind:
    """A kind of value: the TOML type the file must hold (`toml`, checked before `read`), how a
    value is checked and converted (`read`: a problem is reported and the default taken), stored
    in the canonical form (`store`, `load`), written back as the file would say it (`write`), and
    shown in docs/plan.md's Default column. `keys`: the setting is a whole section whose keys
    these are, each holding a `toml` value ([hooks])."""
    toml: type | tuple[type, ...] = str
    keys: tuple[str, ...] = ()
    repeated = False  # the setting is a whole array of tables ([[also]]), each of `keys`, read whole

    def read(self, value: Any, at: At) -> Any:
        return value

    def store(self, value: Any) -> Any:
        return value

    def load(self, stored: Any) -> Any:
        return stored

    def write(self, value: Any) -> Any:
        return value

    def text(self, value: Any) -> str:
        """A value as the plan file writes it (TOML text): `mover plan new`'s commented defaults
        and docs/plan.md's Default column (`shown`) both read it."""
        return json.dumps(list(value) if isinstance(value, tuple) else value)

    def shown(self, default: Any) -> str:
        if default is None:
            return "none"
        return f"`{self.text(default)}`"


class Text(Kind):
    """A string, taken as written (checks that need other settings are the section's)."""


class Flag(Kind):
    toml = bool


@dataclass(frozen=True)
class Count(Kind):
    """An integer within lo..hi."""
    lo: int
    hi: int
    hint: str | None = None  # None: name the bounds and the default
    toml = int

    def read(self, value: int, at: At) -> Any:
        if self.lo <= value <= self.hi:
            return value
        at.problem(f" must be between {self.lo} and {self.hi}, got {value}",
                   self.hint or f"set {at.key} within those bounds, or leave it out for the default ({at.default})")
        return at.default


@dataclass(frozen=True)
class Duration(Kind):
    """A duration such as "30s": milliseconds in the plan (the attribute's name ends in _ms, the
    file's key is the same without it), within lo..hi when bounded (`within` names the bounds)."""
    lo: int | None = None
    hi: int | None = None
    within: str = ""
    hint: str | None = None
    toml = str

    def read(self, value: str, at: At) -> Any:
        try:
            ms = parse_duration_ms(value)
        except ValueError as exc:
            at.problem(f": {exc}", f'e.g. {at.key} = "30s"')
            return at.default
        if (self.lo is not None and ms < self.lo) or (self.hi is not None and ms > self.hi):
            at.problem(f" must be between {self.within}, got {value!r}", self.hint)
            return at.default
        return ms

    def write(self, value: int) -> str:
        return f"{value}ms"

    def text(self, value: int) -> str:
        return f'"{duration_text(value)}"'


@dataclass(frozen=True)
class Percent(Kind):
    """A share written as "50%" (or "off" where `off` allows it), kept as the file writes it,
    normalised ("50 %" -> "50%", "OFF" -> "off"); within lo..hi percent. `percent()` reads it."""
    lo: int = 0
    hi: int = 100
    off: bool = False
    hint: str | None = None
    toml = str

    def read(self, value: str, at: At) -> Any:
        text = value.strip().lower()
        if self.off and text == "off":
            return "off"
        m = re.match(r"^(\d+(?:\.\d+)?)\s*%$", text)
        if not m or not self.lo <= float(m.group(1)) <= self.hi:
            off = ' or "off"' if self.off else ""
            at.problem(f" must be a percentage between {self.lo}% and {self.hi}%{off}, got {value!r}",
                       self.hint or f'e.g. {at.key} = "{at.default}"')
            return at.default
        return f"{float(m.group(1)):g}%"

    def text(self, value: str) -> str:
        return f'"{value}"'


def percent(text: str) -> float | None:
    """A Percent setting as a fraction (0.5 for "50%"); None for "off"."""
    return None if text == "off" else float(text.rstrip("%")) / 100


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|tb)?\s*$", re.I)
_UNIT_BYTES = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}


def size_text(n: int) -> str:
    """Bytes as the plan writes them: the largest unit that divides them ("10GB", "0")."""
    for unit in ("TB", "GB", "MB", "kB"):
        if n and n % _UNIT_BYTES[unit.lower()] == 0:
            return f"{n // _UNIT_BYTES[unit.lower()]}{unit}"
    return str(n)


@dataclass(frozen=True)
class Size(Kind):
    """An amount of bytes written "10GB", "512MB", "64kB" (PostgreSQL's units, 1024-based), "0"
    or "off" (0: not checked). Kept in bytes."""
    hint: str | None = None
    toml = str

    def read(self, value: str, at: At) -> Any:
        if value.strip().lower() == "off":
            return 0
        m = _SIZE.match(value)
        if not m:
            at.problem(f" must be a size such as \"10GB\", \"512MB\" or \"off\", got {value!r}",
                       self.hint or f'e.g. {at.key} = "{size_text(at.default) if at.default else "1GB"}"')
            return at.default
        return int(float(m.group(1)) * _UNIT_BYTES[(m.group(2) or "b").lower()])

    def write(self, value: int) -> str:
        return size_text(value)

    def text(self, value: int) -> str:
        return f'"{size_text(value) if value else "off"}"'


@dataclass(frozen=True)
class Choice(Kind):
    options: tuple[str, ...]
    hint: str | None = None
    toml = str

    def read(self, value: str, at: At) -> Any:
        if value in self.options:
            return value
        quoted = [json.dumps(o) for o in self.options]
        at.problem(f" must be {', '.join(quoted[:-1])} or {quoted[-1]}, got {value!r}", self.hint)
        return at.default


@dataclass(frozen=True)
class Pattern(Kind):
    """A string matching `regex`; `must` says what it must be."""
    regex: str
    must: str
    hint: str | None = None
    toml = str

    def read(self, value: str, at: At) -> Any:
        if not re.match(self.regex, value):
            at.problem(f" {value!r} {self.must}", self.hint)
        return value


class Name(Kind):
    """A table's SQL name (`orders`, `'Sales."Order Items"'`); unqualified stays unqualified."""
    toml = str

    def read(self, value: str, at: At) -> Any:
        try:
            return parse_qualified(value)
        except ValueError as exc:
            at.problem(f": {exc}", 'write a table as name or schema.name, e.g. "public.orders"')
            return None

    def store(self, value: QualifiedName | None) -> list[str | None] | None:
        return None if value is None else [value.schema, value.name]

    def load(self, stored: Any) -> Any:
        return None if stored is None else QualifiedName(stored[0], stored[1])

    def write(self, value: QualifiedName) -> str:
        return str(value)


@dataclass(frozen=True)
class Strings(Kind):
    """An array of non-empty strings, each kept once in its order. `invalid`: the problem when an
    item is not one (or repeats, with `distinct`); empty: the section's check names it."""
    invalid: str = ""
    hint: str | None = None
    distinct: bool = False
    sort: bool = False  # stored sorted
    toml = list

    def read(self, value: list[Any], at: At) -> Any:
        if not all(isinstance(v, str) and v for v in value) or (self.distinct and len(set(value)) != len(value)):
            if self.invalid:
                at.problem(f" {self.invalid}", self.hint)
            return at.default
        return tuple(dict.fromkeys(value))

    def store(self, value: tuple[str, ...]) -> list[str]:
        return sorted(value) if self.sort else list(value)

    def load(self, stored: Any) -> Any:
        return tuple(stored)

    def write(self, value: tuple[str, ...]) -> list[str]:
        return list(value)


class Columns(Kind):
    """column -> type text (trusted input, checked against the catalog by plan check)."""
    toml = dict

    def read(self, value: dict[str, Any], at: At) -> Any:
        out = {}
        for col, typ in value.items():
            if not isinstance(typ, str) or not typ.strip():
                at.problem(f": the type of column {col!r} must be a non-empty string such as \"bigint\"",
                           f'e.g. {at.key} = {{ {col} = "bigint" }}')
                continue
            out[col] = typ.strip()
        return out

    def store(self, value: dict[str, str]) -> dict[str, str]:
        return dict(sorted(value.items()))

    def load(self, stored: Any) -> Any:
        return dict(stored)

    def write(self, value: dict[str, str]) -> dict[str, str]:
        return dict(value)


# ---------------------------------------------------------------------------------------------
# Declarations


@dataclass(frozen=True)
class Setting:
    """One plan setting, as declared. `key`, `attr` and `section` are filled in where it is bound
    to a field (the file's key is the attribute's name unless given; a duration's drops `_ms`)."""
    kind: Kind
    default: Any = None
    required: bool = False  # the file must give it (the default is then the dataclass's only)
    settable: bool = False  # `mover set NAME section.key=value` may change it while the migration runs
    fixed: bool = False  # part of the migration's identity (shape hash, name): never changes
    registration_only: bool = False  # read only at registration: an edit is refused, not stored without effect
    effect: str | None = None  # when an edit takes effect; None: as the section says
    missing: str | None = None  # the hint when a required key is missing
    was: tuple[str, ...] = ()  # older spellings of the key, read with a warning
    stored: str = ""  # where the canonical form keeps it ("section.attr" unless given; forms registered before)
    # Stored (and written back) only when set away from its default, so that canonical forms registered
    # before it existed stay the same.
    only_set: bool = False
    default_from: Callable[[Any, dict[str, Any]], Any] | None = None  # (default, values read before) -> default
    shown: str | None = None  # docs/plan.md's Default cell, when not the default value itself
    key: str = ""
    attr: str = ""
    section: str = ""

    def left_unset(self, value: Any) -> bool:
        """An only_set setting at its default (or empty where its default is empty too): left out of the
        canonical form and the document. An empty value away from a non-empty default ("off", 0 bytes,
        where the default is a limit) is stored: leaving it out would read back as the default."""
        return self.only_set and (value == self.default or (not value and not self.default))

    def fresh_default(self) -> Any:
        return dict(self.default) if isinstance(self.default, dict) else self.default

    def shown_default(self) -> str:
        return "required" if self.required else self.shown or self.kind.shown(self.default)

    @property
    def path(self) -> str:
        """Its place in the canonical form."""
        return self.stored or (self.section if self.kind.keys else f"{self.section}.{self.attr}")


def setting(kind: Kind, default: Any = MISSING, **declared: Any) -> Any:
    """A dataclass field declaring a plan setting (Setting's fields are the arguments). Without
    a default the field is required in the dataclass too."""
    s = Setting(kind, None if default is MISSING else default, **declared)
    if default is MISSING:
        return field(metadata={META: s})
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={META: s})
    return field(default=default, metadata={META: s})


def nested(cls: type[T]) -> T:
    """A Plan field holding a section's dataclass (`plan.backfill`)."""
    holder: T = field(default_factory=cls, metadata={META: cls})
    return holder


Check = Callable[["Read", dict[str, "Read"], Problems], None]


@dataclass(frozen=True)
class Section:
    """A section of the plan file: its settings, when an edit of them takes effect, the checks
    between its keys (or with other sections), and whether to_document writes it."""
    name: str
    settings: tuple[Setting, ...]
    effect: str | None = None
    check: Check | None = None
    written: Callable[[Any], bool] | None = None  # (plan) -> bool; None: always
    holder: str | None = None  # the Plan's attribute holding the section's dataclass; None: the Plan's own fields
    cls: type | None = None

    def keys(self) -> tuple[str, ...]:
        return tuple(k for s in self.settings for k in (s.kind.keys or (s.key,)))

    def setting(self, key: str) -> Setting | None:
        return next((s for s in self.settings if key in (s.kind.keys or (s.key,))), None)


_SECTIONS: dict[type, Section] = {}
_LAYOUTS: dict[type, tuple[Section, ...]] = {}


def _bind(s: Setting, attr: str, section: str) -> Setting:
    key = s.key or (attr.removesuffix("_ms") if isinstance(s.kind, Duration) else attr)
    return replace(s, attr=attr, key=key, section=s.section or section)


def section(name: str, *, effect: str | None = None, check: Check | None = None,
            written: Callable[[Any], bool] | None = None) -> Callable[[type[T]], type[T]]:
    """Registers a dataclass as the plan file's section `name` (put it above @dataclass)."""
    def register(cls: type[T]) -> type[T]:
        settings = tuple(_bind(f.metadata[META], f.name, name) for f in fields(cls)  # type: ignore[arg-type]
                         if isinstance(f.metadata.get(META), Setting))
        _SECTIONS[cls] = Section(name, settings, effect, check, written, cls=cls)
        return cls
    return register


def layout(root: type) -> tuple[Section, ...]:
    """The sections of the plan file in order, as `root` (the Plan) holds them: the fields of its
    @section base classes, the nested section dataclasses, and its own declared fields."""
    if root in _LAYOUTS:
        return _LAYOUTS[root]
    own = {s.attr: sec for base in root.__mro__[1:] if (sec := _SECTIONS.get(base)) for s in sec.settings}
    parts: dict[str, Section] = {}
    for f in fields(root):
        meta = f.metadata.get(META)
        if f.name in own:
            sec = own[f.name]
            s = next(s for s in sec.settings if s.attr == f.name)
            part = parts.setdefault(sec.name, replace(sec, settings=()))
            parts[sec.name] = replace(part, settings=(*part.settings, s))
        elif isinstance(meta, type) and meta in _SECTIONS:
            parts[_SECTIONS[meta].name] = replace(_SECTIONS[meta], holder=f.name)
        elif isinstance(meta, Setting):
            s = _bind(meta, f.name, meta.section)
            part = parts.setdefault(s.section, Section(s.section, ()))
            parts[s.section] = replace(part, settings=(*part.settings, s))
    _LAYOUTS[root] = tuple(parts.values())
    return _LAYOUTS[root]


def held(plan: Any, part: Section) -> Any:
    return getattr(plan, part.holder) if part.holder else plan


def store(plan: Any, order: tuple[str, ...] = ()) -> dict[str, Any]:
    """The plan as data (the canonical form), each setting at its path; top-level keys in
    `order` first (the order forms were always stored in), then any other."""
    out: dict[str, Any] = {}
    for part in layout(type(plan)):
        for s in part.settings:
            value = getattr(held(plan, part), s.attr)
            if s.left_unset(value):
                continue
            *parents, last = s.path.split(".")
            place = out
            for p in parents:
                place = place.setdefault(p, {})
            place[last] = s.kind.store(value)
    return {k: out[k] for k in sorted(out, key=lambda k: order.index(k) if k in order else len(order))}


@dataclass
class Read:
    """One section as read from a plan file: the values by attribute, the file's (type-checked)
    values by key."""
    name: str
    values: dict[str, Any]
    raw: dict[str, Any]


def type_word(t: Any) -> str:
    words = {str: "a string", int: "an integer", bool: "a boolean (true or false)", dict: "a table { ... }",
             float: "a number", list: "an array"}
    return words.get(t) or (t.__name__ if isinstance(t, type) else str(t))


def example(t: type | tuple[type, ...]) -> str:
    examples: dict[type, str] = {str: '"..."', int: "100", bool: "true", dict: "{ ... }", list: "[ ... ]"}
    return examples.get(t, "...") if isinstance(t, type) else "..."


def read_section(part: Section, table: Any, problems: Problems) -> Read:
    """One table of the plan file read by a section's declarations: unknown keys and values of
    the wrong type reported and left out, required keys asked for, every value checked and
    converted, defaults for the others. The section's own check (part.check) is the caller's,
    once every section is read. `table`: what the file holds (not a table: nothing given)."""
    whole = next((s for s in part.settings if s.kind.repeated), None)
    if whole is not None:  # an array of tables: its kind reads each ([[also]])
        given_list = table if isinstance(table, list) else []
        return Read(part.name, {whole.attr: whole.kind.read(given_list, At(part.name, whole.key, whole.fresh_default(),
                                                                             problems))}, {})
    given = table if isinstance(table, dict) else {}
    raw = {}
    for key, item in given.items():
        s = part.setting(key)
        if s is None:
            problems.add(f"unknown key [{part.name}] {key}", f"known keys: {', '.join(part.keys())}")
            continue
        expected = s.kind.toml
        # TOML booleans are not integers here, although Python says bool is an int.
        if not isinstance(item, expected) or (expected is int and isinstance(item, bool)):
            problems.add(f"[{part.name}] {key} must be {type_word(expected)}, got {type_word(type(item))} {item!r}",
                         f"write e.g. {key} = {example(expected)}")
            continue
        raw[key] = item
    values: dict[str, Any] = {}
    for s in part.settings:
        if s.required and s.key not in given:
            problems.add(f"missing required key [{part.name}] {s.key}",
                         s.missing or f"add {s.key} = ... under [{part.name}]")
        default = s.fresh_default() if s.default_from is None else s.default_from(s.fresh_default(), values)
        if s.kind.keys:  # the whole section is the setting's value
            values[s.attr] = s.kind.read(raw, At(part.name, s.key, default, problems))
        elif s.key in raw:
            values[s.attr] = s.kind.read(raw[s.key], At(part.name, s.key, default, problems))
        else:
            values[s.attr] = default
    return Read(part.name, values, raw)


def section_of(cls: type) -> Section:
    """The section a dataclass was registered as (with @section)."""
    return _SECTIONS[cls]

