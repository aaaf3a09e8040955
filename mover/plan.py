"""Plan files: TOML -> validated dataclasses, a canonical form and its hash.

Validation here needs no database (shape, types, names); the checks against the live catalog
(`mover plan check`, and again at registration) are the registry in mover/checks/. Every error
names the key as `[section] key`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mover.errors import PlanError, combined
from mover.names import QualifiedName, parse_qualified

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "sec": 1000, "min": 60_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}$")


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


@dataclass(frozen=True)
class BackfillSettings:
    range_rows: int = 10_000  # the first range's size; later ones adapt toward target_range_ms
    target_range_ms: int = 500
    min_rows: int = 1_000
    max_rows: int = 200_000
    workers: int = 1
    max_rows_per_second: int = 0  # 0: no cap
    max_replica_lag_ms: int = 30_000  # 0: do not check
    max_attempts: int = 5  # a range failing this often is marked failed
    synchronous_commit: bool = False
    # CREATE INDEX sessions at once after the copy (0: as many as workers, at least 2): a plain
    # table's indexes, or a partitioned target's per-partition builds, side by side. At least 2:
    # the copy workers are idle by then, and only mover reads the new table.
    index_builds: int = 0
    DEFAULT_MIN_INDEX_BUILDS = 2

    def index_sessions(self) -> int:
        return self.index_builds or max(self.workers, self.DEFAULT_MIN_INDEX_BUILDS)


@dataclass(frozen=True)
class ReconcileSettings:
    workers: int = 1  # threads comparing ranges in the orchestrating process
    range_rows: int = 100_000  # keys per range (bench/reconcile.py: 50k-250k perform alike)
    before_cutover: bool = True  # re-verify the ranges changed since the last pass, just before the lock
    settle_rounds: int = 10  # re-checks of a key that differs while a change to it is pending
    max_attempts: int = 5  # a range failing this often is marked failed
    max_rows_per_second: int = 0  # source rows compared per second, shared by the workers; 0: no cap


@dataclass(frozen=True)
class CutoverSettings:
    auto: bool = False
    lock_timeout_ms: int = 200
    attempts: int = 30
    # Sessions still holding a lock on the tables once the attempts are spent: cancelled, then
    # terminated after blocker_grace, and the lock tried once more (mover/engines/lockwatch.py). Off by default.
    terminate_blockers: bool = False
    blocker_grace_ms: int = 5000
    # Metadata differences the operator lets through the swap's parity check (mover/engines/parity.py):
    # "kind:item" keys as `mover parity NAME` prints them, or a bare kind.
    accept_parity: tuple[str, ...] = ()


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


@dataclass(frozen=True)
class RollbackSettings:
    window_ms: int = 24 * 3_600_000
    old_name: QualifiedName | None = None
    keep_old: bool = False


RANGE_INTERVALS = {"1 day": "day", "1 week": "week", "1 month": "month", "1 year": "year"}
# Default partition names per interval ({table} is the target table's final name).
DEFAULT_NAMES = {"day": "{table}_p{YYYY}_{MM}_{DD}", "week": "{table}_p{YYYY}_{MM}_{DD}",
                 "month": "{table}_p{YYYY}_{MM}", "year": "{table}_p{YYYY}", None: "{table}_p{N}"}
_NAME_FIELDS = {"table", "YYYY", "MM", "DD", "N"}


@dataclass(frozen=True)
class PartitionSpec:
    """`[target.partition]`: how the new table is partitioned (mover/engines/partitions.py creates it)."""
    by: str  # range | list | hash
    columns: tuple[str, ...]
    interval: str | None = None  # range over time: day | week | month | year
    step: int | None = None  # range over an integer column: the width of a partition
    premake: int = 3
    default: bool = False
    name: str = ""
    values: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # list: partition suffix -> values
    modulus: int = 0  # hash
    accept_key_change: bool = False

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["columns"] = list(self.columns)
        d["values"] = {k: list(v) for k, v in self.values}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PartitionSpec:
        return cls(**{**d, "columns": tuple(d["columns"]),
                      "values": tuple((k, tuple(v)) for k, v in d.get("values", {}).items())})


@dataclass(frozen=True)
class PartitionUpkeep:
    """`[partitions]`: the policy `mover partitions maintain` applies after the cutover."""
    premake: int | None = None  # None: [target.partition] premake
    retention: str | None = None  # e.g. "12 months": partitions wholly older are detached
    drop_detached: bool = False
    manager: str = "mover"  # or "pg_partman": handed over once retired (mover/engines/partitions.py)


@dataclass(frozen=True)
class Plan:
    name: str
    source: QualifiedName
    target: QualifiedName | None = None
    columns: dict[str, str] = field(default_factory=dict)
    # Columns whose type change can lose information (plan check names them), acknowledged
    accept_lossy: tuple[str, ...] = ()
    backfill: BackfillSettings = BackfillSettings()
    cutover: CutoverSettings = CutoverSettings()
    rollback: RollbackSettings = RollbackSettings()
    reconcile: ReconcileSettings = ReconcileSettings()
    document: dict[str, Any] = field(default_factory=dict, compare=False)
    # Outbound foreign keys the operator accepts the new table will lack after the swap.
    drop_foreign_keys: tuple[str, ...] = ()
    partition: PartitionSpec | None = None
    upkeep: PartitionUpkeep = PartitionUpkeep()
    hooks: dict[str, Hook] = field(default_factory=dict)

    def canonical(self) -> dict[str, Any]:
        """The plan as data: stored with the migration and hashed (tunables excluded from the hash)."""
        return {
            "migration": {"name": self.name, "source": _qn(self.source)},
            "target": {"name": _qn(self.target), "columns": dict(sorted(self.columns.items())),
                       "accept_lossy": sorted(self.accept_lossy)},
            "backfill": asdict(self.backfill),
            "cutover": {
                "auto": self.cutover.auto,
                "lock_timeout_ms": self.cutover.lock_timeout_ms,
                "attempts": self.cutover.attempts,
                "terminate_blockers": self.cutover.terminate_blockers,
                "blocker_grace_ms": self.cutover.blocker_grace_ms,
                # Only when set: the canonical form of plans registered before stays the same.
                **({"accept_parity": list(self.cutover.accept_parity)} if self.cutover.accept_parity else {}),
            },
            "rollback": {
                "window_ms": self.rollback.window_ms,
                "old_name": _qn(self.rollback.old_name),
                "keep_old": self.rollback.keep_old,
            },
            "reconcile": asdict(self.reconcile),
            "drop_foreign_keys": list(self.drop_foreign_keys),
            "partition": self.partition.as_dict() if self.partition else None,
            "partitions": asdict(self.upkeep),
            "hooks": {event: asdict(h) for event, h in sorted(self.hooks.items())},
        }

    def shape_hash(self, schema: str | None = None) -> str:
        """Hash of what defines the migration: source, target, columns and the old table's name.
        Tunables (backfill, cutover and window settings) may change between runs. Unqualified
        names count as in `schema` (the source's), so `orders` and `public.orders` agree."""
        def qualified(name: QualifiedName | None) -> list[str | None] | None:
            if name is None:
                return None
            return [name.schema or schema or self.source.schema, name.name]
        shape = {"source": qualified(self.source), "target": qualified(self.target),
                 "old": qualified(self.rollback.old_name), "columns": dict(sorted(self.columns.items()))}
        if self.partition is not None:  # only when set: hashes of plans registered before stay the same
            shape["partition"] = self.partition.as_dict()
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def to_document(plan: Plan) -> dict[str, Any]:
    """The plan as a TOML-shaped document (what a plan file would say), for `mover set`."""
    b = plan.backfill
    doc: dict[str, Any] = {
        "migration": {"name": plan.name, "source": str(plan.source)},
        "target": {"columns": dict(plan.columns)},
        "backfill": {"range_rows": b.range_rows, "target_range_ms": b.target_range_ms, "min_rows": b.min_rows,
                     "max_rows": b.max_rows, "workers": b.workers, "max_rows_per_second": b.max_rows_per_second,
                     "max_replica_lag": f"{b.max_replica_lag_ms}ms", "max_attempts": b.max_attempts,
                     "synchronous_commit": b.synchronous_commit, "index_builds": b.index_builds},
        "cutover": {"auto": plan.cutover.auto, "lock_timeout": f"{plan.cutover.lock_timeout_ms}ms",
                    "attempts": plan.cutover.attempts, "terminate_blockers": plan.cutover.terminate_blockers,
                    "blocker_grace": f"{plan.cutover.blocker_grace_ms}ms",
                    **({"accept_parity": list(plan.cutover.accept_parity)} if plan.cutover.accept_parity else {})},
        "rollback": {"window": f"{plan.rollback.window_ms}ms", "keep_old": plan.rollback.keep_old},
        "reconcile": asdict(plan.reconcile),
    }
    if plan.target is not None:
        doc["target"]["name"] = str(plan.target)
    if plan.accept_lossy:
        doc["target"]["accept_lossy"] = list(plan.accept_lossy)
    if plan.rollback.old_name is not None:
        doc["rollback"]["old_name"] = str(plan.rollback.old_name)
    if plan.drop_foreign_keys:
        doc["target"]["drop_foreign_keys"] = list(plan.drop_foreign_keys)
    if plan.partition is not None:
        p = plan.partition
        part: dict[str, Any] = {"by": p.by, "columns": list(p.columns), "premake": p.premake, "default": p.default,
                                "name": p.name, "accept_key_change": p.accept_key_change}
        if p.by == "range":
            by_word = {v: k for k, v in RANGE_INTERVALS.items()}
            part["interval"] = by_word[p.interval] if p.interval else p.step
        if p.values:
            part["values"] = {k: [list(x) if isinstance(x, tuple) else x for x in v] for k, v in p.values}
        if p.modulus:
            part["modulus"] = p.modulus
        doc["target"]["partition"] = part
        upkeep = {k: v for k, v in asdict(plan.upkeep).items() if v is not None}
        doc["partitions"] = upkeep
    if plan.hooks:
        doc["hooks"] = {event: {**({"sql": h.sql} if h.sql is not None else {"command": h.command}),
                                "timeout": f"{h.timeout_ms}ms"} for event, h in plan.hooks.items()}
    return doc


# Keys renamed when "chunk" became "range"; the old spellings are read for one release (docs/plan.md).
RENAMED_KEYS = {("backfill", "chunk_rows"): "range_rows", ("backfill", "target_chunk_ms"): "target_range_ms"}


def renamed(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with old key spellings replaced by the current ones (a current one wins)."""
    out = {RENAMED_KEYS.get((section, k), k): v for k, v in values.items() if (section, k) not in RENAMED_KEYS}
    for (sec, old), new in RENAMED_KEYS.items():
        if sec == section and old in values and new not in values:
            log.warning("[%s] %s is now called %s; the old name is read until the next release", sec, old, new)
            out[new] = values[old]
    return out


# Settings `mover set NAME section.key=value` may change while a migration runs.
SETTABLE = {
    "backfill": {"target_range_ms", "min_rows", "max_rows", "max_rows_per_second", "max_replica_lag",
                 "max_attempts", "workers", "range_rows", "index_builds"},
    "cutover": {"auto", "lock_timeout", "attempts", "terminate_blockers", "blocker_grace"},
    "reconcile": {"workers", "range_rows", "before_cutover", "settle_rounds", "max_attempts",
                  "max_rows_per_second"},
}


# An edit of a registered plan (its shape hash unchanged): when each changeable setting takes
# effect, by its place in the canonical form (`section.key`, or a whole section). None: read only
# when the plan is registered, so an edit is refused rather than stored without effect. `mover run
# PLAN` and `plan check PLAN` check an edit against the catalog as registration would (api.py,
# _check_update) and name these; docs/plan.md's "May change?" column says the same.
TAKES_EFFECT: dict[str, str | None] = {
    "target.accept_lossy": None,  # acknowledges the type changes of [target] columns, which are fixed
    "drop_foreign_keys": "at the next cutover (the swap leaves these on the old table)",
    "backfill": "at each backfill worker's next range",
    "cutover": "at the next lock mover takes and the next cutover",
    "reconcile": "at the next reconcile range",
    "rollback.window_ms": "at the cutover (the window's end is fixed when the swap commits)",
    "rollback.keep_old": "at retire",
    "partitions": "at the next `mover partitions maintain`",
    "hooks": "at the hook's next run",
}
# The plan file's spelling of canonical keys that hold milliseconds.
_FILE_KEYS = {"lock_timeout_ms": "lock_timeout", "blocker_grace_ms": "blocker_grace", "window_ms": "window",
              "max_replica_lag_ms": "max_replica_lag"}


@dataclass(frozen=True)
class Edit:
    path: str  # "section.key" in the canonical form, or a section without keys
    effect: str | None  # TAKES_EFFECT's; None: not changeable after registration

    @property
    def key(self) -> str:
        """As the plan file names it: `[cutover] lock_timeout`, `[target] drop_foreign_keys`."""
        section, _, key = self.path.partition(".")
        if section == "drop_foreign_keys":
            return "[target] drop_foreign_keys"
        return f"[{section}] {_FILE_KEYS.get(key, key)}" if key else f"[{section}]"

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
        if isinstance(a, dict) and isinstance(b, dict) and section != "hooks":
            paths = [f"{section}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            paths = [section]
        for path in paths:
            effect = TAKES_EFFECT.get(path, TAKES_EFFECT.get(section, "?"))
            out.append(Edit(path, effect))
    return out


def _qn(name: QualifiedName | None) -> list[str | None] | None:
    return None if name is None else [name.schema, name.name]


def plan_from_canonical(doc: dict[str, Any]) -> Plan:
    def qn(v: Any) -> Any:  # a QualifiedName, or None where the document has none
        return None if v is None else QualifiedName(v[0], v[1])

    return Plan(
        name=doc["migration"]["name"],
        source=qn(doc["migration"]["source"]),
        target=qn(doc["target"]["name"]),
        columns=dict(doc["target"]["columns"]),
        accept_lossy=tuple(doc["target"].get("accept_lossy", ())),
        backfill=BackfillSettings(**{**asdict(BackfillSettings()), **renamed("backfill", doc["backfill"])}),
        cutover=CutoverSettings(**{**doc["cutover"],
                                   "accept_parity": tuple(doc["cutover"].get("accept_parity", ()))}),
        rollback=RollbackSettings(
            window_ms=doc["rollback"]["window_ms"],
            old_name=qn(doc["rollback"]["old_name"]),
            keep_old=doc["rollback"]["keep_old"],
        ),
        # Migrations registered before [reconcile] existed have none stored: the defaults.
        reconcile=ReconcileSettings(**{**asdict(ReconcileSettings()), **doc.get("reconcile", {})}),
        document=doc,
        drop_foreign_keys=tuple(doc.get("drop_foreign_keys", ())),
        partition=PartitionSpec.from_dict(doc["partition"]) if doc.get("partition") else None,
        upkeep=PartitionUpkeep(**doc.get("partitions", {})),
        hooks={event: Hook(**h) for event, h in doc.get("hooks", {}).items()},
    )


# ---------------------------------------------------------------------------------------------
# Loading and shape validation

_SCHEMA: dict[str, dict[str, tuple[type | tuple[type, ...], bool]]] = {
    # section -> key -> (python type, required)
    "migration": {"name": (str, True), "source": (str, True)},
    "target": {"name": (str, False), "columns": (dict, False), "accept_lossy": (list, False)},
    "backfill": {"range_rows": (int, False), "target_range_ms": (int, False), "min_rows": (int, False),
                 "max_rows": (int, False), "workers": (int, False), "max_rows_per_second": (int, False),
                 "max_replica_lag": (str, False), "max_attempts": (int, False),
                 "synchronous_commit": (bool, False), "index_builds": (int, False)},
    "cutover": {"auto": (bool, False), "lock_timeout": (str, False), "attempts": (int, False),
                "terminate_blockers": (bool, False), "blocker_grace": (str, False),
                "accept_parity": (list, False)},
    "rollback": {"window": (str, True), "old_name": (str, False), "keep_old": (bool, False)},
    "reconcile": {"workers": (int, False), "range_rows": (int, False), "before_cutover": (bool, False),
                  "settle_rounds": (int, False), "max_attempts": (int, False),
                  "max_rows_per_second": (int, False)},
    "partitions": {"premake": (int, False), "retention": (str, False), "drop_detached": (bool, False),
                   "manager": (str, False)},
    "hooks": {event: (dict, False) for event in HOOK_EVENTS},  # each [hooks.<event>], checked by _hook
}
_REQUIRED_SECTIONS = {"migration", "rollback"}
_SCHEMA["target"]["drop_foreign_keys"] = (list, False)  # names of outbound foreign keys (resolve_plan checks them)
_SCHEMA["target"]["partition"] = (dict, False)  # [target.partition], checked by _partition_spec
_PARTITION_KEYS: dict[str, type | tuple[type, ...]] = {
    "by": str, "column": str, "columns": list, "interval": (str, int), "premake": int, "default": bool,
    "name": str, "values": dict, "modulus": int, "accept_key_change": bool}


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanError(f"cannot read plan file {str(path)!r}: {exc.strerror}", hint="check the path") from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"plan {str(path)!r} is not valid TOML: {exc}", hint="fix the syntax") from exc
    return parse_plan(doc, origin=str(path))


def parse_plan(doc: dict[str, Any], origin: str = "plan") -> Plan:
    """Every problem of the plan in one PlanError (a numbered list), not only the first: a key
    that is unknown or of the wrong type is reported and left out, and checking goes on with
    its default so that the problems behind it show too."""
    problems: list[PlanError] = []

    def fail(msg: str, hint: str | None = None) -> PlanError:
        return PlanError(f"{origin}: {msg}", hint=hint)

    def problem(msg: str, hint: str | None = None) -> None:
        problems.append(fail(msg, hint))

    doc = {section: renamed(section, value) if isinstance(value, dict) else value for section, value in doc.items()}
    clean: dict[str, dict[str, Any]] = {}
    for section, value in doc.items():
        if section not in _SCHEMA:
            problem(f"unknown section [{section}]", f"known sections: {', '.join('[' + s + ']' for s in _SCHEMA)}")
            continue
        if not isinstance(value, dict):
            problem(f"[{section}] must be a table, not a {type(value).__name__}")
            continue
        clean[section] = {}
        for key, item in value.items():
            if key not in _SCHEMA[section]:
                problem(f"unknown key [{section}] {key}", f"known keys: {', '.join(_SCHEMA[section])}")
                continue
            expected, _ = _SCHEMA[section][key]
            # TOML booleans are not integers here, although Python says bool is an int.
            if not isinstance(item, expected) or (expected is int and isinstance(item, bool)):
                problem(f"[{section}] {key} must be {_type_word(expected)}, got {_type_word(type(item))} {item!r}",
                        f"write e.g. {key} = {_example(expected)}")
                continue
            clean[section][key] = item
    for section in _SCHEMA:
        for key, (_, required) in _SCHEMA[section].items():
            if required and key not in doc.get(section, {}):
                hint = 'e.g. window = "24h" (how long `mover rollback` stays possible after the cutover)' \
                    if (section, key) == ("rollback", "window") else f"add {key} = ... under [{section}]"
                problem(f"missing required key [{section}] {key}", hint)

    m, t, b, c, r = (clean.get(s, {}) for s in ("migration", "target", "backfill", "cutover", "rollback"))

    name = m.get("name", "")
    if "name" in m and not _NAME.match(name):
        problem(f"[migration] name {name!r} must be 1-63 characters of letters, digits, '_', '.', '-'",
                'e.g. name = "orders_bigint"')

    def qname(section: str, key: str, text: str) -> QualifiedName | None:
        try:
            return parse_qualified(text)
        except ValueError as exc:
            problem(f"[{section}] {key}: {exc}", 'write a table as name or schema.name, e.g. "public.orders"')
            return None

    source = qname("migration", "source", m["source"]) if "source" in m else None
    target = qname("target", "name", t["name"]) if "name" in t else None
    old = qname("rollback", "old_name", r["old_name"]) if "old_name" in r else None

    columns: dict[str, str] = {}
    for col, typ in t.get("columns", {}).items():
        if not isinstance(typ, str) or not typ.strip():
            problem(f"[target] columns: the type of column {col!r} must be a non-empty string such as \"bigint\"",
                    f'e.g. columns = {{ {col} = "bigint" }}')
            continue
        columns[col] = typ.strip()
    accept_lossy = t.get("accept_lossy", [])
    for col in accept_lossy:
        if not isinstance(col, str) or col not in columns:
            problem(f"[target] accept_lossy: {col!r} is not a column of [target] columns",
                    "list the columns whose type change plan check reported as lossy")

    def bounded(section: str, key: str, default: int, lo: int, hi: int) -> int:
        value: int = clean.get(section, {}).get(key, default)
        if not lo <= value <= hi:
            problem(f"[{section}] {key} must be between {lo} and {hi}, got {value}",
                    f"set {key} within those bounds, or leave it out for the default ({default})")
            return default
        return value

    range_rows = bounded("backfill", "range_rows", BackfillSettings.range_rows, 1, 10_000_000)
    min_rows = bounded("backfill", "min_rows", BackfillSettings.min_rows, 1, 10_000_000)
    max_rows = bounded("backfill", "max_rows", max(BackfillSettings.max_rows, range_rows), 1, 10_000_000)
    if min_rows > max_rows:
        problem(f"[backfill] min_rows ({min_rows}) is above max_rows ({max_rows})", "lower min_rows or raise max_rows")

    def duration(section: str, key: str, default: int) -> int:
        if key not in clean.get(section, {}):
            return default
        try:
            return parse_duration_ms(clean[section][key])
        except ValueError as exc:
            problem(f"[{section}] {key}: {exc}", f'e.g. {key} = "30s"')
            return default

    lock_timeout_ms = duration("cutover", "lock_timeout", CutoverSettings.lock_timeout_ms)
    if not 1 <= lock_timeout_ms <= 60_000:
        problem(f"[cutover] lock_timeout must be between 1ms and 60s, got {c['lock_timeout']!r}",
                "the application waits up to this long for each attempt; keep it short")
    accept_parity = c.get("accept_parity", [])
    if not all(isinstance(k, str) and k for k in accept_parity):
        problem("[cutover] accept_parity must list the differences `mover parity NAME` names",
                'e.g. accept_parity = ["grant:SELECT TO reporting"]')
    attempts = c.get("attempts", CutoverSettings.attempts)
    if not 1 <= attempts <= 1000:
        problem(f"[cutover] attempts must be between 1 and 1000, got {attempts}", "e.g. attempts = 30")
    blocker_grace_ms = duration("cutover", "blocker_grace", CutoverSettings.blocker_grace_ms)
    if not 0 <= blocker_grace_ms <= 600_000:
        problem(f"[cutover] blocker_grace must be between 0 and 10 minutes, got {c['blocker_grace']!r}",
                'e.g. blocker_grace = "5s"')
        blocker_grace_ms = CutoverSettings.blocker_grace_ms
    window_ms = duration("rollback", "window", RollbackSettings.window_ms)
    backfill = BackfillSettings(
        range_rows=range_rows,
        target_range_ms=bounded("backfill", "target_range_ms", BackfillSettings.target_range_ms, 10, 600_000),
        min_rows=min_rows,
        max_rows=max_rows,
        workers=bounded("backfill", "workers", BackfillSettings.workers, 1, 64),
        max_rows_per_second=bounded("backfill", "max_rows_per_second", 0, 0, 10**9),
        max_replica_lag_ms=duration("backfill", "max_replica_lag", BackfillSettings.max_replica_lag_ms),
        max_attempts=bounded("backfill", "max_attempts", BackfillSettings.max_attempts, 1, 100),
        synchronous_commit=b.get("synchronous_commit", False),
        index_builds=bounded("backfill", "index_builds", BackfillSettings.index_builds, 0, 64),
    )

    drop_fks = t.get("drop_foreign_keys", [])
    if not all(isinstance(n, str) and n for n in drop_fks) or len(set(drop_fks)) != len(drop_fks):
        problem("[target] drop_foreign_keys must list distinct constraint names",
                'e.g. drop_foreign_keys = ["invoices_customer_id_fkey"]')
        drop_fks = []

    partition = None
    if "partition" in t:
        try:
            partition = _partition_spec(
                t["partition"], lambda msg, hint=None: fail(msg, hint or "see docs/partitioning.md for the keys"))
        except PlanError as exc:
            problems.append(exc)
    p = clean.get("partitions", {})
    if p and partition is None and "partition" not in t:
        problem("[partitions] applies to a partitioned target only", "add [target.partition] or remove it")
    if "premake" in p and not 0 <= p["premake"] <= 1000:
        problem(f"[partitions] premake must be between 0 and 1000, got {p['premake']}", "e.g. premake = 3")
    if "retention" in p:
        if partition is None or partition.interval is None:
            problem("[partitions] retention needs a range partitioning over time ([target.partition] interval "
                    "= \"1 month\" etc.)", "add the interval, or remove retention")
        elif not re.match(r"^\s*[1-9]\d*\s+(day|week|month|year)s?\s*$", p["retention"]):
            problem(f"[partitions] retention must read like \"12 months\" or \"30 days\", got {p['retention']!r}",
                    'e.g. retention = "12 months"')
    manager = p.get("manager", "mover")
    if manager not in ("mover", "pg_partman"):
        problem(f"[partitions] manager must be \"mover\" or \"pg_partman\", got {manager!r}",
                'e.g. manager = "pg_partman", or leave it out for mover\'s own upkeep')
        manager = "mover"
    elif manager == "pg_partman" and partition is not None:
        try:
            _check_partman_spec(partition, p, fail)
        except PlanError as exc:
            problems.append(exc)
    upkeep = PartitionUpkeep(premake=p.get("premake"), retention=p.get("retention"),
                             drop_detached=p.get("drop_detached", False), manager=manager)
    hooks = {}
    for event, spec in clean.get("hooks", {}).items():
        try:
            hooks[event] = _hook(event, spec, fail)
        except PlanError as exc:
            problems.append(exc)
    reconcile = ReconcileSettings(
        workers=bounded("reconcile", "workers", ReconcileSettings.workers, 1, 64),
        range_rows=bounded("reconcile", "range_rows", ReconcileSettings.range_rows, 100, 10_000_000),
        before_cutover=clean.get("reconcile", {}).get("before_cutover", ReconcileSettings.before_cutover),
        settle_rounds=bounded("reconcile", "settle_rounds", ReconcileSettings.settle_rounds, 1, 1000),
        max_attempts=bounded("reconcile", "max_attempts", ReconcileSettings.max_attempts, 1, 100),
        max_rows_per_second=bounded("reconcile", "max_rows_per_second", 0, 0, 10**9),
    )
    if problems or source is None:
        raise combined(problems, hint="fix each of them, then `mover plan check PLAN` again")

    return Plan(
        partition=partition,
        upkeep=upkeep,
        hooks=hooks,
        drop_foreign_keys=tuple(drop_fks),
        name=name,
        source=source,
        target=target,
        columns=columns,
        accept_lossy=tuple(dict.fromkeys(accept_lossy)),
        backfill=backfill,
        cutover=CutoverSettings(auto=c.get("auto", False), lock_timeout_ms=lock_timeout_ms, attempts=attempts,
                                terminate_blockers=c.get("terminate_blockers", False),
                                blocker_grace_ms=blocker_grace_ms,
                                accept_parity=tuple(dict.fromkeys(accept_parity))),
        rollback=RollbackSettings(window_ms=window_ms, old_name=old, keep_old=r.get("keep_old", False)),
        reconcile=reconcile,
        document=doc,
    )


def _example(t: type | tuple[type, ...]) -> str:
    examples: dict[type, str] = {str: '"..."', int: "100", bool: "true", dict: "{ ... }", list: "[ ... ]"}
    return examples.get(t, "...") if isinstance(t, type) else "..."


def _check_partman_spec(partition: PartitionSpec | None, p: dict[str, Any], fail: Callable[..., PlanError]) -> None:
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


def _partition_spec(d: dict[str, Any], fail: Callable[..., PlanError]) -> PartitionSpec:
    """[target.partition], checked without the database (resolve_plan checks it against the source)."""
    where = "[target.partition]"
    for key, item in d.items():
        if key not in _PARTITION_KEYS:
            raise fail(f"unknown key {where} {key}", f"known keys: {', '.join(_PARTITION_KEYS)}")
        expected = _PARTITION_KEYS[key]
        if not isinstance(item, expected) or (isinstance(item, bool) and expected is not bool):
            raise fail(f"{where} {key} must be {_type_word(expected)}, got {_type_word(type(item))} {item!r}")
    by = d.get("by")
    if by not in ("range", "list", "hash"):
        raise fail(f"{where} by must be \"range\", \"list\" or \"hash\", got {by!r}")
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
    for key, kinds in (("interval", ("range",)), ("values", ("list",)), ("modulus", ("hash",))):
        if key in d and by not in kinds:
            raise fail(f"{where} {key} applies to by = \"{kinds[0]}\" only, not by = \"{by}\"")
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
                         accept_key_change=d.get("accept_key_change", False))


def _type_word(t: Any) -> str:
    words = {str: "a string", int: "an integer", bool: "a boolean (true or false)", dict: "a table { ... }",
             float: "a number", list: "an array"}
    return words.get(t) or (t.__name__ if isinstance(t, type) else str(t))



def _hook(event: str, spec: dict[str, Any], fail: Callable[..., PlanError]) -> Hook:
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
