"""The plan's sub-tables, each read whole by its own function: `[target.partition]` (its keys
depend on each other: `by` decides which others apply) and `[hooks.<event>]`. Their kinds
(PartitionTable, HookTables) plug them into the declarations of mover/plan/settings.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mover.errors import PlanError
from mover.plan.declare import At, Kind, parse_duration_ms, type_word

RANGE_INTERVALS = {"1 day": "day", "1 week": "week", "1 month": "month", "1 year": "year"}
# Default partition names per interval ({table} is the target table's final name).
DEFAULT_NAMES = {"day": "{table}_p{YYYY}_{MM}_{DD}", "week": "{table}_p{YYYY}_{MM}_{DD}",
                 "month": "{table}_p{YYYY}_{MM}", "year": "{table}_p{YYYY}", None: "{table}_p{N}"}
_NAME_FIELDS = {"table", "YYYY", "MM", "DD", "N"}
# How many partitions a range layout read from the rows may have unless the plan says more: a
# wrong interval or an outlier row (a date in 1970) would otherwise make thousands.
MAX_PARTITIONS = 1000
MAX_PARTITIONS_LIMIT = 10_000


@dataclass(frozen=True)
class PartitionSpec:
    """`[target.partition]`: how the new table is partitioned (mover/engines/partitioning/partitions.py creates it)."""
    by: str  # range | list | hash, or none: a partitioned source becomes one ordinary table
    columns: tuple[str, ...]
    interval: str | None = None  # range over time: day | week | month | year
    step: int | None = None  # range over an integer column: the width of a partition
    premake: int = 3
    default: bool = False
    name: str = ""
    values: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # list: partition suffix -> values
    modulus: int = 0  # hash
    accept_key_change: bool = False
    max_partitions: int = MAX_PARTITIONS  # range: the most a layout read from the rows may have

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.max_partitions == MAX_PARTITIONS:
            del d["max_partitions"]  # the stored form of plans registered before the key existed
        d["columns"] = list(self.columns)
        d["values"] = {k: list(v) for k, v in self.values}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PartitionSpec:
        return cls(**{**d, "columns": tuple(d["columns"]),
                      "values": tuple((k, tuple(v)) for k, v in d.get("values", {}).items())})

    def as_document(self) -> dict[str, Any]:
        """As a plan file writes it (to_document, for `mover set`)."""
        part: dict[str, Any] = {"by": self.by, "columns": list(self.columns), "premake": self.premake,
                                "default": self.default, "name": self.name, "accept_key_change": self.accept_key_change}
        if self.by == "range":
            by_word = {v: k for k, v in RANGE_INTERVALS.items()}
            part["interval"] = by_word[self.interval] if self.interval else self.step
        if self.values:
            part["values"] = {k: [list(x) if isinstance(x, tuple) else x for x in v] for k, v in self.values}
        if self.modulus:
            part["modulus"] = self.modulus
        if self.max_partitions != MAX_PARTITIONS:
            part["max_partitions"] = self.max_partitions
        return part


_PARTITION_KEYS: dict[str, type | tuple[type, ...]] = {
    "by": str, "column": str, "columns": list, "interval": (str, int), "premake": int, "default": bool,
    "name": str, "values": dict, "modulus": int, "accept_key_change": bool, "max_partitions": int}


class PartitionTable(Kind):
    """[target.partition]: a PartitionSpec, or None."""
    toml = dict

    def read(self, value: dict[str, Any], at: At) -> Any:
        try:
            return partition_spec(value, lambda msg, hint=None: at.problems.fail(
                msg, hint or "see docs/partitioning.md for the keys"))
        except PlanError as exc:
            at.problems.keep(exc)
            return None

    def store(self, value: PartitionSpec | None) -> Any:
        return value.as_dict() if value else None

    def load(self, stored: Any) -> Any:
        return PartitionSpec.from_dict(stored) if stored else None

    def write(self, value: PartitionSpec) -> Any:
        return value.as_document()


def check_partman_spec(partition: PartitionSpec | None, p: dict[str, Any], fail: Callable[..., PlanError]) -> None:
    """pg_partman takes over only a layout it would have made itself: one range column, its own
    child names (it skips a partition whose name exists and would collide with one named otherwise)."""
    where = '[partitions] manager = "pg_partman"'
    assert partition is not None  # [partitions] without [target.partition] is refused before
    if partition.by != "range":
        raise fail(f"{where}: pg_partman manages range partitioning only, not by = \"{partition.by}\"",
                   'use manager = "mover" (the default)')
    if partition.interval == "week":
        raise fail(f"{where}: pg_partman names weekly partitions by ISO week (IYYYwIW), mover by date",
                   'use interval = "1 day" or "1 month", or manager = "mover"')
    if partition.name != DEFAULT_NAMES[partition.interval]:
        raise fail(f"{where}: pg_partman names the partitions it creates {DEFAULT_NAMES[partition.interval]!r}; "
                   f"[target.partition] name {partition.name!r} would differ",
                   "remove [target.partition] name")
    if p.get("premake", partition.premake) < 1:
        raise fail(f"{where}: pg_partman needs premake of 1 or more", "e.g. premake = 3")


def partition_spec(d: dict[str, Any], fail: Callable[..., PlanError]) -> PartitionSpec:
    """[target.partition], checked without the database (resolve_plan checks it against the source)."""
    where = "[target.partition]"
    for key, item in d.items():
        if key not in _PARTITION_KEYS:
            raise fail(f"unknown key {where} {key}", f"known keys: {', '.join(_PARTITION_KEYS)}")
        expected = _PARTITION_KEYS[key]
        if not isinstance(item, expected) or (isinstance(item, bool) and expected is not bool):
            raise fail(f"{where} {key} must be {type_word(expected)}, got {type_word(type(item))} {item!r}")
    by = d.get("by")
    if by == "none":
        # The undo of a conversion: the new table is one ordinary table (its source partitioned).
        if set(d) != {"by"}:
            raise fail(f"{where} by = \"none\" takes no other key, got {', '.join(sorted(set(d) - {'by'}))}",
                       "remove the other keys: the new table is one ordinary table")
        return PartitionSpec(by="none", columns=())
    if by not in ("range", "list", "hash"):
        raise fail(f"{where} by must be \"range\", \"list\", \"hash\" or \"none\", got {by!r}")
    if ("column" in d) == ("columns" in d):
        raise fail(f"{where} needs exactly one of column = \"...\" or columns = [...]")
    columns = (d["column"],) if "column" in d else tuple(d["columns"])
    if not columns or not all(isinstance(c, str) and c for c in columns) or len(set(columns)) != len(columns):
        raise fail(f"{where} columns must list distinct column names")
    if by == "range" and len(columns) != 1:
        raise fail(f"{where} columns: range partitioning by mover takes one column, got {len(columns)}")
    premake = d.get("premake", 3)
    if not 0 <= premake <= 1000:
        raise fail(f"{where} premake must be between 0 and 1000, got {premake}")
    for key, kinds in (("interval", ("range",)), ("values", ("list",)), ("modulus", ("hash",)),
                       ("max_partitions", ("range",))):
        if key in d and by not in kinds:
            raise fail(f"{where} {key} applies to by = \"{kinds[0]}\" only, not by = \"{by}\"")
    max_partitions = d.get("max_partitions", MAX_PARTITIONS)
    if not 1 <= max_partitions <= MAX_PARTITIONS_LIMIT:
        raise fail(f"{where} max_partitions must be between 1 and {MAX_PARTITIONS_LIMIT}, got {max_partitions}")
    interval = step = None
    values: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    modulus = 0
    if by == "range":
        if "interval" not in d:
            raise fail(f"{where} interval is required for by = \"range\"",
                       'e.g. interval = "1 month" (timestamps and dates) or interval = 100000 (integers)')
        raw = d["interval"]
        if isinstance(raw, int):
            if raw <= 0:
                raise fail(f"{where} interval must be a positive number, got {raw}")
            step = raw
        else:
            text = " ".join(raw.split()).lower()
            if text not in RANGE_INTERVALS:
                raise fail(f"{where} interval must be one of {', '.join(map(repr, RANGE_INTERVALS))} or a number, "
                           f"got {raw!r}")
            interval = RANGE_INTERVALS[text]
    elif by == "list":
        raw_values = d.get("values")
        if not raw_values:
            raise fail(f"{where} values is required for by = \"list\"", 'e.g. values = { eu = ["de", "fr"] }')
        seen: set[Any] = set()
        out = []
        for suffix, vals in raw_values.items():
            if not isinstance(vals, list) or not vals:
                raise fail(f"{where} values: {suffix!r} must list one value or more")
            if len(columns) > 1 and not all(isinstance(v, list) and len(v) == len(columns) for v in vals):
                raise fail(f"{where} values: with {len(columns)} columns, each value of {suffix!r} is an array of "
                           f"{len(columns)}")
            for v in vals:
                marker = json.dumps(v, sort_keys=True)
                if marker in seen:
                    raise fail(f"{where} values: {v!r} is listed twice")
                seen.add(marker)
            out.append((suffix, tuple(tuple(v) if isinstance(v, list) else v for v in vals)))
        values = tuple(out)
    else:
        modulus = d.get("modulus", 0)
        if not 2 <= modulus <= 1024:
            raise fail(f"{where} modulus must be between 2 and 1024, got {modulus}")
        if d.get("default"):
            raise fail(f"{where} default: a hash-partitioned table cannot have a default partition")
    name = d.get("name", DEFAULT_NAMES[interval] if by == "range" else "{table}_{N}")
    fields = set(re.findall(r"{(\w+)}", name))
    if not fields <= _NAME_FIELDS or "{table}" not in name:
        raise fail(f"{where} name {name!r} must contain {{table}} and only the fields "
                   f"{', '.join('{' + f + '}' for f in sorted(_NAME_FIELDS))}")
    if by == "range" and interval is not None:
        needed = {"year": {"YYYY"}, "month": {"YYYY", "MM"}, "week": {"YYYY", "MM", "DD"},
                  "day": {"YYYY", "MM", "DD"}}[interval]
        if not needed <= fields and "N" not in fields:
            raise fail(f"{where} name {name!r} would give two partitions the same name; with interval "
                       f"{d['interval']!r} it needs {', '.join('{' + f + '}' for f in sorted(needed))}")
    elif "N" not in fields:
        raise fail(f"{where} name {name!r} needs {{N}} (the partition's number or list name)")
    return PartitionSpec(by=by, columns=columns, interval=interval, step=step, premake=premake,
                         default=d.get("default", False), name=name, values=values, modulus=modulus,
                         accept_key_change=d.get("accept_key_change", False), max_partitions=max_partitions)


# ---------------------------------------------------------------------------------------------
# [hooks.<event>]

HOOK_EVENTS = ("before_cutover", "after_cutover", "before_rollback", "after_rollback", "before_retire",
               "after_retire")
HOOK_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class Hook:
    """[hooks.<event>]: a shell command or SQL (exactly one), run by mover/engines/hooks.py."""
    sql: str | None = None
    command: str | None = None
    timeout_ms: int = HOOK_TIMEOUT_MS

    def describe(self) -> str:
        what = f"sql = {self.sql!r}" if self.sql is not None else f"command = {self.command!r}"
        return f"{what}, timeout {self.timeout_ms} ms"

    def as_document(self) -> dict[str, Any]:
        return {**({"sql": self.sql} if self.sql is not None else {"command": self.command}),
                "timeout": f"{self.timeout_ms}ms"}


class HookTables(Kind):
    """[hooks]: a table per event, each read by read_hook."""
    keys = HOOK_EVENTS
    toml = dict

    def read(self, value: dict[str, Any], at: At) -> Any:
        hooks = {}
        for event, spec in value.items():
            try:
                hooks[event] = read_hook(event, spec, at.problems.fail)
            except PlanError as exc:
                at.problems.keep(exc)
        return hooks

    def store(self, value: dict[str, Hook]) -> Any:
        return {event: asdict(h) for event, h in sorted(value.items())}

    def load(self, stored: Any) -> Any:
        return {event: Hook(**h) for event, h in stored.items()}

    def write(self, value: dict[str, Hook]) -> Any:
        return {event: h.as_document() for event, h in value.items()}

    def shown(self, default: Any) -> str:
        return "none"  # per event: no hook


def read_hook(event: str, spec: dict[str, Any], fail: Callable[..., PlanError]) -> Hook:
    where = f"[hooks.{event}]"
    for key, value in spec.items():
        if key not in ("sql", "command", "timeout"):
            raise fail(f"unknown key {where} {key}", "known keys: sql, command, timeout")
        if not isinstance(value, str) or not value.strip():
            raise fail(f"{where} {key} must be a non-empty string, got {value!r}")
    if ("sql" in spec) == ("command" in spec):
        raise fail(f"{where} needs exactly one of sql or command",
                   'e.g. command = "curl -fsS -X POST https://deploys.example/pause" or sql = "SELECT pg_notify(...)"')
    timeout = HOOK_TIMEOUT_MS
    if "timeout" in spec:
        try:
            timeout = parse_duration_ms(spec["timeout"])
        except ValueError as exc:
            raise fail(f"{where} timeout: {exc}") from None
        if not 1 <= timeout <= 3_600_000:
            raise fail(f"{where} timeout must be between 1ms and 1h, got {spec['timeout']!r}")
    return Hook(sql=spec.get("sql"), command=spec.get("command"), timeout_ms=timeout)
