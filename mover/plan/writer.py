"""A plan file written for the operator (`mover plan new`): TOML text from a Draft, the values it
was asked for written out and every other setting at its default as a comment, read from the
declarations (mover/plan/settings.py) as the parser and docs/plan.md read them. Also the TOML
spellings `plan check` uses for the [[also]] lines it prints (mover/catalog/family.py advice), so
that the lines it prints and the blocks `plan new` writes are the same text.

No database here: mover/runner/draft.py reads the catalog and builds the Draft.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

from mover.names import QualifiedName
from mover.plan.declare import Section, Setting, duration_text
from mover.plan.forms import SECTIONS
from mover.plan.tables import HOOK_EVENTS, HOOK_TIMEOUT_MS, PartitionTable

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
_SIMPLE = re.compile(r"^[a-z_][a-z0-9_]*$")


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for characters outside the BMP (JSON
    writes surrogate pairs, TOML refuses them: kept as they are) and DEL (TOML wants it escaped)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_key(key: str) -> str:
    """A key as TOML writes it: bare where it may be, else a quoted string (a column "Order Id")."""
    return key if _BARE.match(key) else toml_string(key)


def toml_value(value: Any) -> str:
    """A value (string, integer, boolean, array, table) as TOML text; a table inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return f"{{ {toml_pairs(value)} }}" if value else "{}"
    raise TypeError(f"no TOML for {value!r}")


def toml_pairs(table: dict[str, Any]) -> str:
    """An inline table's inside: `a = "bigint", "Line No" = "bigint"`."""
    return ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items())


def toml_name(name: QualifiedName) -> str:
    """A table as a plan's TOML string names it: SQL syntax, its parts quoted where they need it
    (`"public.orders"`, `"\\"Sales\\".\\"Order Items\\""`)."""
    if name.schema is not None and _SIMPLE.match(name.schema) and _SIMPLE.match(name.name):
        return toml_string(f"{name.schema}.{name.name}")
    return toml_string(str(name))


def also_block(source: QualifiedName, columns: dict[str, str], why: str) -> list[str]:
    """One [[also]] table: why it is there (a comment), its source and its columns."""
    return [f"# {why}", "[[also]]", f"source = {toml_name(source)}", f"columns = {toml_value(columns)}"]


@dataclass(frozen=True, kw_only=True)
class AlsoDraft:
    """A table the plan moves with its source: its new column types, and why (for the reader)."""
    source: QualifiedName
    columns: dict[str, str]
    why: str


@dataclass(frozen=True, kw_only=True)
class Draft:
    """What `mover plan new` writes: the migration's name and source, the source's new column types
    and partitioning ([target.partition]'s keys as the file holds them), the [[also]] tables, and
    the lines of the header (what the plan does, how to go on)."""
    name: str
    source: QualifiedName
    columns: dict[str, str] = field(default_factory=dict)
    partition: dict[str, Any] | None = None
    also: tuple[AlsoDraft, ...] = ()
    header: tuple[str, ...] = ()

    def text(self) -> str:
        return plan_text(self)


def plan_text(draft: Draft) -> str:
    """The plan file: the header as comments, [migration], [target] (with [target.partition]), the
    [[also]] tables, then every other section with its keys at their defaults commented out (a
    required one, [rollback] window, written at its default), in the order the plan's sections
    are declared. Uncommenting a default line changes nothing until its value is edited."""
    lines = [f"# {part}".rstrip() for line in draft.header for part in textwrap.wrap(line, 96) or [""]]
    for part in SECTIONS:
        if part.name == "migration":
            lines += ["", "[migration]", f"name = {toml_string(draft.name)}", f"source = {toml_name(draft.source)}"]
        elif part.name == "target":
            lines += ["", *_target(part, draft)]
            for table in draft.also:  # the family's tables next to the source's
                lines += ["", *also_block(table.source, table.columns, table.why)]
        elif part.name == "also" or (part.name == "partitions" and draft.partition is None):
            continue  # [partitions] is the upkeep of a partitioned target only: plan check refuses it otherwise
        elif part.name == "hooks":
            lines += ["", *_hooks()]
        else:
            lines += ["", *_defaults(part)]
    return "\n".join(lines).lstrip("\n") + "\n"


def _target(part: Section, draft: Draft) -> list[str]:
    lines = ["[target]"]
    if draft.columns:
        lines.append(f"columns = {toml_value(draft.columns)}")
    for s in part.settings:
        if s.key == "columns" and draft.columns:
            continue
        if isinstance(s.kind, PartitionTable):
            if draft.partition is None:
                lines.append("# [target.partition]: none, the new table is not partitioned (docs/partitioning.md)")
            continue
        lines.append(_commented(s))
    if draft.partition is not None:
        lines += ["", "[target.partition]", *(f"{toml_key(k)} = {toml_value(v)}" for k, v in draft.partition.items())]
    return lines


def _defaults(part: Section) -> list[str]:
    lines = [f"# An edit of [{part.name}] takes effect {part.effect}."] if part.effect else []
    lines.append(f"[{part.name}]")
    for s in part.settings:
        lines.append(f"{s.key} = {s.kind.text(s.default)}  # required" if s.required else _commented(s))
    return lines


def _commented(s: Setting) -> str:
    """`# key = default`; where the default is no value of its own (none, or derived from another
    setting) a placeholder, or the value it mostly is, and what the default is."""
    notes = [f"default: {s.shown_default().strip('`')}"] if s.default is None or s.shown is not None else []
    notes += ["read only at registration"] if s.registration_only else []
    value = "..." if s.default is None else s.kind.text(s.default)
    return f"# {s.key} = {value}" + (f"  # {'; '.join(notes)}" if notes else "")


def _hooks() -> list[str]:
    timeout = duration_text(HOOK_TIMEOUT_MS)
    text = (f"[hooks.<event>]: none. The events: {', '.join(HOOK_EVENTS)}; each a table of exactly one of "
            f"command (a shell command) or sql, and timeout (default \"{timeout}\"), e.g. "
            f"[hooks.after_cutover] command = \"...\" (docs/operating.md, \"Hooks\").")
    return [f"# {line}" for line in textwrap.wrap(text, 96)]
