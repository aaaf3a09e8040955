"""Every plan setting, declared once: its section, key, kind of value (checks and conversion),
default, whether `mover set` may change it, when an edit takes effect (mover/plan/declare.py
says how to read a declaration). A new tunable is one `setting(...)` line here and its row in
docs/plan.md (tests/unit/test_example_plans.py holds the two together).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from mover.errors import PlanError
from mover.names import QualifiedName
from mover.plan.declare import (
    At,
    Choice,
    Columns,
    Count,
    Duration,
    Flag,
    Kind,
    Name,
    Pattern,
    Percent,
    Problems,
    Read,
    Size,
    Strings,
    Text,
    nested,
    percent,
    read_section,
    section,
    section_of,
    setting,
    store,
)
from mover.plan.tables import Hook, HookTables, PartitionSpec, PartitionTable, check_partman_spec


@section("migration")
@dataclass(frozen=True)
class MigrationKeys:
    name: str = setting(Pattern(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}$",
                                "must be 1-63 characters of letters, digits, '_', '.', '-'",
                                'e.g. name = "orders_bigint"'), required=True, fixed=True)
    source: QualifiedName = setting(Name(), required=True, fixed=True)


def _lossy_columns_are_planned(s: Read, plan: dict[str, Read], problems: Problems) -> None:
    for col in s.raw.get("accept_lossy", []):
        if not isinstance(col, str) or col not in s.values["columns"]:
            problems.add(f"[{s.name}] accept_lossy: {col!r} is not a column of [{s.name}] columns",
                         "list the columns whose type change plan check reported as lossy")


@section("target", check=_lossy_columns_are_planned)
@dataclass(frozen=True)
class TargetKeys:
    """[target]'s keys. A table section that takes the same keys declares a subclass under its
    own name (`@section("also")`), with _lossy_columns_are_planned as its check. `stored`: where
    the canonical form has always kept a key (plans registered before must read the same)."""
    target: QualifiedName | None = setting(Name(), None, key="name", stored="target.name", fixed=True,
                                           shown="`<source>_new`")
    columns: dict[str, str] = setting(Columns(), {}, fixed=True)
    # Columns whose type change can lose information (plan check names them), acknowledged.
    accept_lossy: tuple[str, ...] = setting(Strings(sort=True), (), registration_only=True)
    # Outbound foreign keys the operator accepts the new table will lack after the swap.
    drop_foreign_keys: tuple[str, ...] = setting(
        Strings("must list distinct constraint names", 'e.g. drop_foreign_keys = ["invoices_customer_id_fkey"]',
                distinct=True), (),
        stored="drop_foreign_keys", effect="at the next cutover (the swap leaves these on the old table)")
    partition: PartitionSpec | None = setting(PartitionTable(), None, stored="partition", fixed=True)


def _min_rows_below_max(s: Read, plan: dict[str, Read], problems: Problems) -> None:
    lo, hi = s.values["min_rows"], s.values["max_rows"]
    if lo > hi:
        problems.add(f"[backfill] min_rows ({lo}) is above max_rows ({hi})", "lower min_rows or raise max_rows")


@section("backfill", effect="at each backfill worker's next range", check=_min_rows_below_max)
@dataclass(frozen=True)
class BackfillSettings:
    # The first range's size; later ones adapt toward target_range_ms.
    range_rows: int = setting(Count(1, 10_000_000), 10_000, settable=True, was=("chunk_rows",))
    target_range_ms: int = setting(Count(10, 600_000), 500, settable=True, was=("target_chunk_ms",))
    min_rows: int = setting(Count(1, 10_000_000), 1_000, settable=True)
    max_rows: int = setting(Count(1, 10_000_000), 200_000, settable=True,
                            default_from=lambda default, got: max(default, got["range_rows"]),
                            shown="`max(200000, range_rows)`")
    workers: int = setting(Count(1, 64), 1, settable=True)
    max_rows_per_second: int = setting(Count(0, 10**9), 0, settable=True)  # 0: no cap
    max_replica_lag_ms: int = setting(Duration(), 30_000, settable=True)  # 0: do not check
    max_attempts: int = setting(Count(1, 100), 5, settable=True)  # a range failing this often is marked failed
    synchronous_commit: bool = setting(Flag(), False)
    # CREATE INDEX sessions at once after the copy: a plain table's indexes, or a partitioned
    # target's per-partition builds, side by side. 0: one at a time under the governor (a build
    # cannot be paced, and two side by side took every core of a 2-core server from the
    # application: docs/design.md, "What cannot be paced inside a statement"); ungoverned, as many
    # as workers and at least 2 (the copy workers are idle by then, only mover reads the new table).
    index_builds: int = setting(Count(0, 64), 0, settable=True)
    DEFAULT_MIN_INDEX_BUILDS = 2

    def index_sessions(self, governed: bool) -> int:
        if self.index_builds:
            return self.index_builds
        return 1 if governed else max(self.workers, self.DEFAULT_MIN_INDEX_BUILDS)


@section("cutover", effect="at the next lock mover takes and the next cutover")
@dataclass(frozen=True)
class CutoverSettings:
    auto: bool = setting(Flag(), False, settable=True)
    lock_timeout_ms: int = setting(
        Duration(1, 60_000, "1ms and 60s", "the application waits up to this long for each attempt; keep it short"),
        200, settable=True)
    attempts: int = setting(Count(1, 1000, "e.g. attempts = 30"), 30, settable=True)
    # Sessions still holding a lock on the tables once the attempts are spent: cancelled, then
    # terminated after blocker_grace, and the lock tried once more (mover/engines/swap/lockwatch.py). Off by default.
    terminate_blockers: bool = setting(Flag(), False, settable=True)
    blocker_grace_ms: int = setting(Duration(0, 600_000, "0 and 10 minutes", 'e.g. blocker_grace = "5s"'), 5000,
                                    settable=True)
    # Before each attempt at the swap's lock: how long it waits for a transaction whose snapshot is older
    # than the new table's last rows (mover/engines/swap/snapshots.py, invariant 16); then refused, or with
    # terminate_blockers that session ended. Stored only when set: plans registered before read the same.
    snapshot_wait_ms: int = setting(Duration(0, 3_600_000, "0 and 1 hour", 'e.g. snapshot_wait = "30s"'), 30_000,
                                    settable=True, only_set=True)
    # Metadata differences the operator lets through the swap's parity check (mover/engines/swap/parity.py):
    # "kind:item" keys as `mover parity NAME` prints them, or a bare kind.
    accept_parity: tuple[str, ...] = setting(
        Strings("must list the differences `mover parity NAME` names",
                'e.g. accept_parity = ["grant:SELECT TO reporting"]'), (), only_set=True)
    # The query rehearsal (mover/engines/swap/query_rehearsal.py, `mover rehearse NAME`): with rehearse,
    # the cutover's preflight refuses the swap while a statement pg_stat_statements recorded on the
    # source plans markedly worse on the target. Stored only when set: plans registered before read the same.
    rehearse: bool = setting(Flag(), False, settable=True, only_set=True)
    rehearse_statements: int = setting(Count(1, 1000, 'e.g. rehearse_statements = 50'), 20, settable=True,
                                       only_set=True)
    rehearse_cost_factor: int = setting(Count(2, 1_000_000, 'e.g. rehearse_cost_factor = 4'), 2, settable=True,
                                        only_set=True)


@section("rollback")
@dataclass(frozen=True)
class RollbackSettings:
    window_ms: int = setting(Duration(), 24 * 3_600_000, required=True,
                             missing='e.g. window = "24h" (how long `mover rollback` stays possible after the cutover)',
                             effect="at the cutover (the window's end is fixed when the swap commits)")
    old_name: QualifiedName | None = setting(Name(), None, fixed=True, shown="`<source>_old`")
    keep_old: bool = setting(Flag(), False, effect="at retire")


@section("reconcile", effect="at the next reconcile range")
@dataclass(frozen=True)
class ReconcileSettings:
    workers: int = setting(Count(1, 64), 1, settable=True)  # threads comparing ranges in the orchestrating process
    # Keys per range (bench/reconcile.py: 50k-250k perform alike).
    range_rows: int = setting(Count(100, 10_000_000), 100_000, settable=True)
    # Re-verify the ranges changed since the last pass, just before the lock.
    before_cutover: bool = setting(Flag(), True, settable=True)
    # Store each range's fingerprint (row count and a 64-bit hash sum of its rows), for comparing a
    # copy elsewhere later: a hash of every source row, most of what a pass costs over the typed
    # comparison (bench/reconcile.py); no reconcile decision reads it. Read when a pass starts.
    fingerprints: bool = setting(Flag(), False, settable=True, only_set=True)
    # Re-checks of a key that differs while a change to it is pending.
    settle_rounds: int = setting(Count(1, 1000), 10, settable=True)
    max_attempts: int = setting(Count(1, 100), 5, settable=True)  # a range failing this often is marked failed
    # Source rows compared per second, shared by the workers; 0: no cap.
    max_rows_per_second: int = setting(Count(0, 10**9), 0, settable=True)


@section("throttle", effect="within a second (the governor reads the plan again)",
         written=lambda plan: plan.throttle != ThrottleSettings())
@dataclass(frozen=True)
class ThrottleSettings:
    """The governor every bulk engine shares (mover/engines/governor/throttle.py): what the application may
    pay for the migration, and the WAL and replication guards. Stored only when not the default,
    so plans registered before [throttle] existed read the same."""
    # The probe's latency may rise this much over its latency before the step started; "off": no
    # latency budget (the guards below still hold).
    max_latency_increase: str = setting(
        Percent(0, 10_000, off=True, hint='e.g. max_latency_increase = "50%", or "off"'), "50%",
        settable=True, only_set=True)
    # The copy's own budget (it yields between ranges, so what it costs ends with each range; what
    # cannot be paced once started keeps the one above). The same by default: wider ran the copy
    # faster at a higher median latency for the writers during it (bench/README.md, "Copy budget
    # and index-build rests"). Read only while max_latency_increase is not "off".
    copy_latency_increase: str = setting(
        Percent(0, 10_000, off=True, hint='e.g. copy_latency_increase = "100%", or "off"'), "50%",
        settable=True, only_set=True)
    # An absolute budget for the probe instead (0: the increase above decides).
    probe_latency_ms: int = setting(Duration(0, 60_000, "0 and 60s", 'e.g. probe_latency = "5ms"'), 0,
                                    settable=True, only_set=True)
    # Nothing to protect: while no application session has run a statement for this long (or is
    # running one), the engines work at full speed; "0s": govern even an idle server.
    idle_after_ms: int = setting(Duration(0, 3_600_000, "0s and 1h",
                                          'e.g. idle_after = "10s", or "0s" to govern even an idle server'),
                                 10_000, settable=True, only_set=True)
    # The least share of its time mover keeps working while over the budget; below it status says so.
    floor: str = setting(Percent(0, 100, hint='e.g. floor = "10%"'), "10%", settable=True, only_set=True)
    # WAL a replication slot may hold back before mover waits ("off": only the risk of invalidation).
    max_slot_wal: int = setting(Size(), 10 * 1024**3, settable=True, only_set=True)
    # WAL waiting to be archived before mover waits ("off": only a failing archiver).
    max_archive_backlog: int = setting(Size(), 1024**3, settable=True, only_set=True)
    # The server's WAL rate mover keeps under (bytes per second; "off": none).
    max_wal_per_second: int = setting(Size(), 0, settable=True, only_set=True)

    @property
    def governed(self) -> bool:
        """Whether the governor sets a duty (a latency budget or a WAL rate cap), as
        engines/pacing.Limits.governed says of the limits it reads from this."""
        return percent(self.max_latency_increase) is not None or self.probe_latency_ms > 0 \
            or self.max_wal_per_second > 0


@section("capture", effect="at the next replication slot mover creates",
         written=lambda plan: plan.capture != CaptureSettings())
@dataclass(frozen=True)
class CaptureSettings:
    # How the source's changes reach the change log: a row trigger in the application's
    # transactions, or mover reading the WAL through a replication slot (mover/engines/capture/logical.py;
    # docs/operating.md "Choosing a capture method"). Decided at registration.
    method: str = setting(Choice(("trigger", "logical"), 'e.g. method = "logical"'), "trigger",
                          registration_only=True, only_set=True)
    # How long creating the slot may wait for the transactions running when it starts to end.
    slot_wait_ms: int = setting(Duration(1000, 3_600_000, "1s and 1h", 'e.g. slot_wait = "60s"'), 60_000,
                                only_set=True)

    @property
    def logical(self) -> bool:
        return self.method == "logical"


def _upkeep_fits_the_partitioning(s: Read, plan: dict[str, Read], problems: Problems) -> None:
    target = plan["target"]
    partition: PartitionSpec | None = target.values["partition"]
    if s.raw and ((partition is None and "partition" not in target.raw) or (partition and partition.by == "none")):
        problems.add("[partitions] applies to a partitioned target only", "add [target.partition] or remove it")
    if "retention" in s.raw:
        if partition is None or partition.by == "none" or partition.interval is None:
            problems.add("[partitions] retention needs a range partitioning over time ([target.partition] interval "
                         "= \"1 month\" etc.)", "add the interval, or remove retention")
        elif not re.match(r"^\s*[1-9]\d*\s+(day|week|month|year)s?\s*$", retention := s.raw["retention"]):
            problems.add(f"[partitions] retention must read like \"12 months\" or \"30 days\", got {retention!r}",
                         'e.g. retention = "12 months"')
    if s.values["manager"] == "pg_partman" and partition is not None and partition.by != "none":
        try:
            check_partman_spec(partition, s.raw, problems.fail)
        except PlanError as exc:
            problems.keep(exc)


@section("partitions", effect="at the next `mover partitions maintain`", check=_upkeep_fits_the_partitioning,
         written=lambda plan: plan.new_layout is not None)
@dataclass(frozen=True)
class PartitionUpkeep:
    """`[partitions]`: the policy `mover partitions maintain` applies after the cutover."""
    premake: int | None = setting(Count(0, 1000, "e.g. premake = 3"), None, shown="`[target.partition] premake`")
    retention: str | None = setting(Text(), None)  # e.g. "12 months": partitions wholly older are detached
    drop_detached: bool = setting(Flag(), False)
    # Or "pg_partman": handed over once retired (mover/engines/partitioning/partitions.py).
    manager: str = setting(Choice(("mover", "pg_partman"),
                                  'e.g. manager = "pg_partman", or leave it out for mover\'s own upkeep'), "mover")


# ---------------------------------------------------------------------------------------------
# [[also]]: more tables that move with the source, in the same migration (a family: one cutover
# for all of them, docs/design.md "Families")


@section("also", check=_lossy_columns_are_planned)
@dataclass(frozen=True, kw_only=True)
class AlsoTable(TargetKeys):
    """One `[[also]]` table: [target]'s keys, read by the same declarations and check, and its own
    source. The rest of the plan ([backfill], [cutover], [rollback] window and keep_old,
    [reconcile]) is the family's."""
    source: QualifiedName = setting(Name(), required=True, fixed=True)


class AlsoTables(Kind):
    """`[[also]]`: an array of tables, each an AlsoTable. Stored in the canonical form by file key,
    only when there is one (a single-table plan stores and hashes as it always did)."""
    toml = list
    repeated = True
    keys = section_of(AlsoTable).keys()

    def read(self, value: list[Any], at: At) -> Any:
        part = section_of(AlsoTable)
        out = []
        for table in value:
            if not isinstance(table, dict):
                at.problems.add("[[also]] must be an array of tables: one [[also]] line above each table's keys",
                                'e.g. [[also]] then source = "public.orders" and columns = { customer_id = "bigint" }')
                continue
            read = read_section(part, table, at.problems)
            if part.check:
                part.check(read, {}, at.problems)
            if read.values["source"] is not None:
                out.append(AlsoTable(**read.values))
        return tuple(out)

    def store(self, value: tuple[AlsoTable, ...]) -> list[dict[str, Any]]:
        settings = section_of(AlsoTable).settings
        return [{s.key: s.kind.store(getattr(t, s.attr)) for s in settings} for t in value]

    def load(self, stored: Any) -> Any:
        settings = section_of(AlsoTable).settings
        return tuple(AlsoTable(**{s.attr: s.kind.load(d[s.key]) if s.key in d else s.fresh_default()
                                  for s in settings}) for d in stored)

    def write(self, value: tuple[AlsoTable, ...]) -> list[dict[str, Any]]:
        settings = section_of(AlsoTable).settings
        return [{s.key: s.kind.write(v) for s in settings if (v := getattr(t, s.attr)) not in (None, (), {})}
                for t in value]

    def shown(self, default: Any) -> str:
        return "none"  # no [[also]] table: one table moves


# The canonical form's top-level keys in the order mover has always stored them (jsonb keeps no
# order, but the text stays as it was); a new section's key follows them.
STORED_ORDER = ("migration", "target", "backfill", "cutover", "rollback", "reconcile", "drop_foreign_keys",
                "partition", "partitions", "hooks", "also")


@dataclass(frozen=True)
class Plan(TargetKeys, MigrationKeys):
    """A plan: [migration]'s and [target]'s keys as its own fields, then the other sections."""
    backfill: BackfillSettings = nested(BackfillSettings)
    cutover: CutoverSettings = nested(CutoverSettings)
    rollback: RollbackSettings = nested(RollbackSettings)
    reconcile: ReconcileSettings = nested(ReconcileSettings)
    throttle: ThrottleSettings = nested(ThrottleSettings)
    upkeep: PartitionUpkeep = nested(PartitionUpkeep)
    capture: CaptureSettings = nested(CaptureSettings)
    hooks: dict[str, Hook] = setting(HookTables(), {}, section="hooks", effect="at the hook's next run")
    # Fixed: each [[also]] table is part of what defines the migration (its shape hash).
    also: tuple[AlsoTable, ...] = setting(AlsoTables(), (), section="also", stored="also", only_set=True, fixed=True)
    document: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def new_layout(self) -> PartitionSpec | None:
        """The partitioning [target.partition] gives the new table; None when the plan keeps the
        source's layout (a partitioned source's tree, or one table) or asks for one table."""
        return None if self.partition is None or self.partition.by == "none" else self.partition

    @property
    def one_table(self) -> bool:
        """[target.partition] by = "none": a partitioned source becomes one ordinary table."""
        return self.partition is not None and self.partition.by == "none"

    def canonical(self) -> dict[str, Any]:
        """The plan as data: stored with the migration and hashed (tunables excluded from the hash)."""
        return store(self, STORED_ORDER)

    def shape_hash(self, schema: str | None = None) -> str:
        """Hash of what defines the migration: source, target, columns and the old table's name.
        Tunables (backfill, cutover and window settings) may change between runs. Unqualified
        names count as in `schema` (the source's), so `orders` and `public.orders` agree."""
        def qualified(name: QualifiedName | None) -> list[str | None] | None:
            if name is None:
                return None
            return [name.schema or schema or self.source.schema, name.name]
        shape: dict[str, Any] = {"source": qualified(self.source), "target": qualified(self.target),
                                 "old": qualified(self.rollback.old_name),
                                 "columns": dict(sorted(self.columns.items()))}
        if self.partition is not None:  # only when set: hashes of plans registered before stay the same
            shape["partition"] = self.partition.as_dict()
        if self.also:  # likewise: a single-table plan hashes as it always did
            def in_its_schema(t: AlsoTable) -> dict[str, Any]:
                own = t.source.schema or schema or self.source.schema
                return {**AlsoTables().store((t,))[0], "source": [own, t.source.name],
                        "name": None if t.target is None else [t.target.schema or own, t.target.name]}
            shape["also"] = [in_its_schema(t) for t in self.also]
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()

    def tables(self) -> tuple[Plan, ...]:
        """The plan of each table the migration moves: this one first (the family's head, whose
        plan is the whole plan), then one per [[also]] table, named `<name>/<source>`, with its
        [target] keys and the family's other sections. Hooks run once, for the family (the head's);
        each table's old name is its own `<source>_old`."""
        return (self, *(replace(self, name=member_name(self.name, t.source), source=t.source, target=t.target,
                                columns=t.columns, accept_lossy=t.accept_lossy, drop_foreign_keys=t.drop_foreign_keys,
                                partition=t.partition, also=(), hooks={}, upkeep=PartitionUpkeep(),
                                rollback=replace(self.rollback, old_name=None), document={})
                        for t in self.also))


def member_name(family: str, source: QualifiedName) -> str:
    """The name of a family's [[also]] table's migration row: the family's name and the table (a
    `/` no migration name holds, so it never collides with one)."""
    return f"{family}/{source.name}" if source.schema is None else f"{family}/{source.schema}.{source.name}"
