"""Plan checks against the live database: a registry of small checks, one concern per file.

`run` checks a plan the way registration will use it and returns what the checks resolved
(names, key, the source's description, the lossy type changes accepted). It changes nothing:
the rehearsals of DDL run in savepoints that are rolled back.

Every problem is reported in one run, not only the first: each check that fails adds its
PlanError, and the run goes on. Two kinds of checks stop it instead:
- a `fatal` check finds what the later ones read (the source, its description, the names);
  without it they would only report noise;
- a `clean` check (a DDL rehearsal) runs only when no problem was found before it: a rehearsal
  of a plan already known to be wrong would fail for the same reason, in worse words.

A new check (partitioning, metadata parity) is a new module here and one line in CHECKS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from mover.checks.subject import Subject
from mover.errors import PlanError, combined
from mover.plan import Plan


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[[Subject], None]
    fatal: bool = False  # a problem here stops the run: later checks need what it finds
    clean: bool = False  # runs only when no problem was found before it


def _registry() -> list[Check]:
    # Imported here: each module's checks import this package for Subject.
    from mover.checks import (
        carried,
        foreign_keys,
        identity,
        key,
        logical,
        metadata,
        names,
        partitioning,
        privileges,
        refused_objects,
        rehearsal,
        row_security,
        search_path,
        source,
        types,
        versions,
    )
    return [
        Check("source exists", source.exists, fatal=True),
        Check("source is a user table", source.is_user_table, fatal=True),
        Check("source is an ordinary table", source.is_ordinary, fatal=True),
        Check("source's partitions are movable", partitioning.movable, fatal=True),
        Check("source has a key", source.describe, fatal=True),
        Check("source's table access method", source.heap),
        Check("names", names.resolve, fatal=True),
        Check("row-level security", row_security.policies),
        Check("writable schemas on the search path", search_path.writable_by_others),
        Check("key operators", search_path.key_operators),
        Check("source is not being moved", names.not_being_moved),
        Check("names are free", names.free),
        Check("column types", types.columns),
        Check("key collations", key.deterministic_collations),
        Check("key is not deferrable", key.immediate),
        Check("partitioned source", partitioning.source),
        Check("partitioning", partitioning.plan),
        Check("exclusion constraints on a partitioned target", refused_objects.exclusion_constraints),
        Check("NOT NULL NO INHERIT to a partitioned table (PostgreSQL 18)", versions.no_inherit_not_null),
        Check("outbound foreign keys", foreign_keys.outbound),
        Check("NOT VALID foreign keys to a partitioned table", foreign_keys.not_valid_to_partitioned),
        Check("typed table, partition", refused_objects.table_properties),
        Check("objects bound to the source's identity", identity.bound),
        Check("dependents the swap moves are owned", carried.owned),
        Check("privileges", privileges.setup),
        Check("publications", metadata.publications),
        Check("subscribers", metadata.subscribers_in_step),
        Check("logical capture", logical.prerequisites),
        Check("metadata carried", metadata.carried),
        Check("target DDL", rehearsal.create_target, clean=True),
        Check("lossy type changes", types.lossy, clean=True),
        Check("capture path", privileges.capture_path, clean=True),
    ]


def run(cur: psycopg.Cursor, plan: Plan) -> Subject:
    """Run every check; raise one PlanError naming every problem found, else return the subject."""
    s = Subject(cur, plan)
    for check in _registry():
        if check.clean and s.problems:
            continue
        before = len(s.problems)
        try:
            check.fn(s)
        except PlanError as exc:
            s.report(exc)
        if check.fatal and len(s.problems) > before:
            break
    if s.problems:
        raise combined(s.problems)
    return s


def resolved(s: Subject) -> dict[str, Any]:
    """The checked plan's resolved names and key, as registration stores them."""
    return {"source": s.src, "target": s.new, "old": s.old, "key": list(s.table.key), "info": s.table,
            "rehearsed": s.rehearsed, "lossy": s.lossy, "carried_back": s.carried_back, "partitioning": s.partitioning,
            "metadata": s.metadata, "warnings": s.warnings,
            "operator_schemas": s.operator_schemas}


__all__ = ["Check", "Subject", "combined", "resolved", "run"]
