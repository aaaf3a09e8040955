"""What one run of a migration works with: the database, the migration row, the lease owner,
a stop flag, and a progress reporter. Small on purpose: engines take what they need from it."""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg

from mover.catalog import conversion, introspect, shape
from mover.db import Database
from mover.engines.partitioning import partitions
from mover.errors import Interrupted, LeaseLost
from mover.names import QualifiedName
from mover.plan import Plan, plan_from_canonical
from mover.sql.mapping import Mapping
from mover.state import control

log = logging.getLogger("mover")


class Reporter(Protocol):
    def __call__(self, kind: str, **fields: Any) -> None: ...


def log_reporter(kind: str, **fields: Any) -> None:
    log.info("%s %s", kind, " ".join(f"{k}={v}" for k, v in fields.items()))


@dataclass
class Context:
    db: Database
    migration: control.Migration
    owner: str
    report: Reporter = log_reporter
    stop: threading.Event = field(default_factory=threading.Event)
    lease_lost: threading.Event = field(default_factory=threading.Event)
    workers: set[str] = field(default_factory=set)  # ids of this process's workers, for the heartbeat
    # The migration's throttle in this process while an engine's bulk work runs (throttle.governing).
    # (Its type is the governor's own: read through throttle.of(ctx), set by throttle.governing.)
    governor: object | None = None
    _mappings: dict[tuple[bool, bool, str], Mapping] = field(default_factory=dict, repr=False)
    _family: dict[int, Context] = field(default_factory=dict, repr=False)
    # ((digest of the catalog rows the shape is read from, swapped), verify()'s result): check_shape
    _verified_shape: tuple[tuple[str, bool], str] | None = field(default=None, repr=False)
    # (the row's plan document, the Plan parsed from it): `plan` parses again only when the row's
    # document is another one, i.e. when use() or refresh() installed a row a `mover set` changed.
    _parsed_plan: tuple[dict[str, Any], Plan] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Every transaction of this migration runs with the conversion settings it was registered
        # with, whatever this process's PGTZ or PGOPTIONS (mover/db.py CONVERSION_SETTINGS).
        self.db.pin(self._settings())

    def _settings(self) -> dict[str, str]:
        settings = dict(self.migration.settings)
        if "search_path" not in settings and self.migration.id > 0:
            # Registered before mover recorded a search_path: its shape was described under the
            # session's own, which format_type and pg_get_expr qualify names by; keep that one.
            settings["search_path"] = self.db.startup_search_path()
        return settings

    @property
    def plan(self) -> Plan:
        """The migration row's plan, parsed once per document: the row read again (refresh, use,
        the family's rows) keeps the parse while its plan is equal, and the plan of a row whose
        document changed is parsed afresh. (A row's document is never changed in place.)"""
        doc = self.migration.plan
        parsed = self._parsed_plan
        if parsed is not None and parsed[0] is doc:
            return parsed[1]
        if parsed is not None and parsed[0] == doc:
            plan = parsed[1]  # the same plan in a row read again: known by identity from now on
        else:
            plan = plan_from_canonical(doc)
        self._parsed_plan = (doc, plan)
        return plan

    @property
    def mid(self) -> int:
        return self.migration.id

    def refresh(self) -> control.Migration:
        self.use(self.db.transaction(lambda cur: control.get_by_id(cur, self.mid)))
        return self.migration

    def use(self, migration: control.Migration) -> None:
        """Work from `migration`, the row as a transaction has just read it."""
        self.migration = migration
        self.db.pin(self._settings())

    def family(self, cur: psycopg.Cursor) -> list[Context]:
        """The contexts of the tables this migration moves together (issue 27), in the plan's order
        and as the caller's transaction reads their rows now: [self] for a migration of one table.
        They share this one's database, lease owner, stop flag, reporter and worker registry, and
        each keeps its own mappings."""
        if self.migration.family_id is None:
            return [self]
        return self._members(self.rows_of_family(cur))

    def rows_of_family(self, cur: psycopg.Cursor) -> list[control.Migration]:
        return control.family(cur, self.migration)

    def _members(self, rows: list[control.Migration]) -> list[Context]:
        out = []
        for row in rows:
            if row.id == self.mid:
                out.append(self)
                continue
            member = self._family.get(row.id)
            if member is None:
                member = self._family[row.id] = self.member(row)
            member.migration = row
            out.append(member)
        return out

    def tables(self) -> list[Context]:
        """Every table this migration moves (family(), in a transaction of its own): its rows as
        they read now, the head first; [self] for one table (no transaction: nothing to read)."""
        if self.migration.family_id is None:
            return [self]
        return self.db.transaction(self.family, label="tables")

    def member(self, row: control.Migration) -> Context:
        """Another table's context: this one's database, lease owner, stop flag, reporter and
        worker registry, its own row and mappings."""
        return Context(db=self.db, migration=row, owner=self.owner, report=self.report, stop=self.stop,
                       lease_lost=self.lease_lost, workers=self.workers)

    def checkpoint(self) -> None:
        """Called between transactions: the only places a run stops on request."""
        if self.lease_lost.is_set():
            raise LeaseLost(f"lost the lease on migration {self.migration.name!r}",
                            hint="another process took over; this one stopped without writing")
        if self.stop.is_set():
            raise Interrupted(f"stopped at a safe point; migration {self.migration.name!r} is resumable",
                              hint=f"run `mover run {self.migration.name}` to continue")

    # Which physical table is which. Before cutover the original carries the source's name and
    # the new table the target's; after cutover the new table carries the source's name and the
    # original the old name.
    @property
    def swapped(self) -> bool:
        return self.migration.cutover_at is not None

    @property
    def original(self) -> QualifiedName:
        return self.migration.old if self.swapped else self.migration.source

    @property
    def new(self) -> QualifiedName:
        return self.migration.source if self.swapped else self.migration.target

    def mapping(self, cur: psycopg.Cursor, reverse: bool = False) -> Mapping:
        """Cached per direction, side of the swap and recorded shape. Every call checks, in the
        caller's transaction, that both tables still have the shape mover recorded (ShapeChanged
        otherwise): a mapping is never used across a change, and one built before `mover adopt`
        recorded a new shape is rebuilt."""
        recorded = self.check_shape(cur)
        cache_key = (self.swapped, reverse, recorded)
        if cache_key not in self._mappings:
            self._mappings[cache_key] = self._describe_mapping(cur, reverse)
        return self._mappings[cache_key]

    def described_mapping(self, cur: psycopg.Cursor, reverse: bool = False) -> Mapping | None:
        """The mapping a step's describe() prints from: the one the step will run with once the
        target exists, else None (plan check's context, runner/register.py Planned, builds it
        over the rehearsed target instead)."""
        if introspect.exists(cur, self.new):
            return self.mapping(cur, reverse)
        return None

    def check_shape(self, cur: psycopg.Cursor) -> str:
        """ShapeChanged unless both tables have their recorded shape; the recorded fingerprints.

        In full (the catalog description of both tables, compared with the recorded one) when the
        digest of the catalog rows it is read from changed since the last full check that passed
        here; else that check's result. The digest is read first: a change committed between it and
        the full check changes the next digest, so it is checked in full then (invariant 7)."""
        digest = shape.inputs_digest(cur, self.mid)
        verified = self._verified_shape
        if verified is not None and verified[0] == (digest, self.swapped):
            return verified[1]
        recorded = shape.verify(cur, self.mid, self.migration.name, self.swapped)
        self._verified_shape = ((digest, self.swapped), recorded)
        return recorded

    def _describe_mapping(self, cur: psycopg.Cursor, reverse: bool) -> Mapping:
        original = introspect.describe(cur, self.original)
        m = self.map_tables(cur, original, introspect.describe(cur, self.new), reverse)
        dst_columns = partitions.partition_columns(cur, m.dst)
        extra = tuple(c for c in dst_columns if c not in m.key)
        partitioned = bool(dst_columns) or bool(partitions.partition_columns(cur, m.src))
        return dataclasses.replace(m, dst_partition=extra, partitioned=partitioned) if partitioned else m

    def map_tables(self, cur: psycopg.Cursor, original: introspect.TableInfo, new: introspect.TableInfo,
             reverse: bool) -> Mapping:
        key = tuple(self.migration.key_columns)
        if reverse:
            # The rollback window's direction: how the server converts each changed column back
            # (assignment, CAST, or not at all) decides how the replay writes it (invariant 9).
            back = conversion.probe(cur, conversion.changed(new, original))
            return conversion.mapping(new, original, key, reverse=back)
        return conversion.mapping(original, new, key)
