"""Partition upkeep (`mover partitions maintain`) of the tables mover converted to partitioned
ones: create the partitions `premake` ahead, report the rows in the default partition, detach
(and with drop_detached, drop) partitions past the retention; or, for a retired conversion whose
plan says manager = "pg_partman", hand the table to pg_partman and defer to its run_maintenance.

Invariants:
- Idempotent: safe from cron. What exists is read first (engines/partitioning/partitions.py maintain_plan);
  each partition is created, detached or dropped in a transaction of its own.
- The application waits at most the plan's [cutover] lock_timeout behind a partition being
  created or detached (invariant 3); a busy table is retried whole (db.transaction, invariant 6).
  Without a default partition a detach is CONCURRENTLY (writers go on).
- A partition whose range the default partition holds rows of is carved out of it under the
  parent's lock, the rows moved in the same transaction: none is lost or seen twice (invariant 1).
- The pg_partman hand-over and its run_maintenance each run as one transaction, rolled back whole
  on failure: the table is as it was, handed over or not.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from mover.db import Database, bind, one
from mover.engines.partitioning import partitions
from mover.errors import Failed
from mover.names import QualifiedName
from mover.plan import Plan, plan_from_canonical
from mover.sql import ddl
from mover.sql import partitions as partition_sql
from mover.state import control

log = logging.getLogger("mover.upkeep")


def conversions(cur: psycopg.Cursor, table: str | None) -> list[tuple[control.Migration, Plan, QualifiedName]]:
    """The partitioned conversions (not aborted) whose table exists, each with its plan and the
    partitioned table's current name; `table`: only those of this migration name or source table."""
    out = []
    for m in control.list_all(cur):
        plan = plan_from_canonical(m.plan)
        if plan.new_layout is None or m.state == "aborted":
            continue
        if table is not None and table not in (m.name, m.source.name, str(m.source)):
            continue
        live = partitions.live_table(cur, m.source, m.target)
        if live is not None:
            out.append((m, plan, live))
    return out


def maintain(db: Database, m: control.Migration, plan: Plan, live: QualifiedName, *,
             dry_run: bool) -> dict[str, Any]:
    """One conversion's upkeep; returns what it found and did (with dry_run: would do)."""
    spec = plan.new_layout
    assert spec is not None and live.schema is not None
    premake = spec.premake if plan.upkeep.premake is None else plan.upkeep.premake
    # The plan's cutover lock_timeout: the application waits at most this long behind a
    # partition being created or detached; a busy table is retried (db.transaction).
    lock = f"{plan.cutover.lock_timeout_ms}ms"
    if plan.upkeep.manager == "pg_partman" and m.state == "done":
        return _partman_maintain(db, m, plan, premake, live, lock, dry_run)
    todo = db.transaction(bind(partitions.maintain_plan, spec, premake, plan.upkeep.retention, live,
                               m.source.name), label="partitions")
    report: dict[str, Any] = {"migration": m.name, "table": todo["table"], "partitions": todo["partitions"],
                              "default_rows": todo["default_rows"], "dry_run": dry_run,
                              "create": [p.describe() for p in todo["create"]], "created": [],
                              "blocked": [], "detach": todo["detach"], "detached": [], "dropped": []}
    if todo["default_rows"]:
        log.warning("%s: %d rows are in the default partition; partitions covering them cannot be created "
                    "until they are moved out", live, todo["default_rows"])
    if not dry_run:
        for p in todo["create"]:
            stmt = partition_sql.create_partition(QualifiedName(live.schema, p.name), live, p.bound)
            try:
                db.transaction(bind(psycopg.Cursor.execute, stmt), lock_timeout=lock, label="create partition")
                report["created"].append(p.name)
            except psycopg.errors.CheckViolation:
                # The default partition holds rows of this range: PostgreSQL refuses.
                # Carve them out under the parent's lock instead.
                try:
                    moved = db.transaction(bind(partitions.carve_from_default, live, p, spec.columns[0]),
                                           lock_timeout=lock, statement_timeout="30s",
                                           label="partition from default")
                    report["created"].append(p.name)
                    report["moved_from_default"] = report.get("moved_from_default", 0) + moved
                except psycopg.errors.QueryCanceled as exc:
                    report["blocked"].append({"name": p.name, "error": str(exc).splitlines()[0]})
        for name in todo["detach"]:
            child = QualifiedName(live.schema, name)
            if name in todo["pending"]:
                db.autocommit(partition_sql.detach_finalize(live, child), lock_timeout="1min")
            elif todo["has_default"]:
                db.transaction(bind(psycopg.Cursor.execute, partition_sql.detach(live, child)),
                               lock_timeout=lock, label="detach partition")
            else:
                # SHARE UPDATE EXCLUSIVE only: writers go on; the wait is for older snapshots.
                db.autocommit(partition_sql.detach_concurrently(live, child), lock_timeout="1min")
            report["detached"].append(name)
            if plan.upkeep.drop_detached:
                db.transaction(bind(psycopg.Cursor.execute, ddl.drop_table(child)), lock_timeout=lock,
                               label="drop partition")
                report["dropped"].append(name)
    if plan.upkeep.manager == "pg_partman":
        report["manager"] = "mover (pg_partman takes over once the migration is retired)"
    return report


def _partman_maintain(db: Database, m: control.Migration, plan: Plan, premake: int, live: QualifiedName, lock: str,
                      dry_run: bool) -> dict[str, Any]:
    """maintain for a retired conversion with manager = "pg_partman": the first run hands the
    table over (create_parent), every run defers to pg_partman's run_maintenance. Reports the
    partitions it created and removed by comparing before and after."""
    spec = plan.new_layout
    assert spec is not None  # only partitioned conversions reach maintain

    def names_of(cur: psycopg.Cursor) -> set[str]:
        return {c.name for c, _, _, _ in partitions.children(cur, live)}

    def default_rows(cur: psycopg.Cursor) -> int | None:
        default = next((c for c, _, d, _ in partitions.children(cur, live) if d), None)
        if default is None:
            return None
        cur.execute(partition_sql.count_rows(default))
        rows: int = one(cur)[0]
        return rows

    def registered(cur: psycopg.Cursor) -> bool:
        return partitions.partman_config(cur, partitions.check_partman(cur, live), live) is not None

    before = db.transaction(names_of, label="partitions")
    handed = db.transaction(registered, label="partitions")
    report: dict[str, Any] = {"migration": m.name, "table": str(live), "manager": "pg_partman", "dry_run": dry_run,
                              "partitions": len(before), "handed_over": False, "registered": handed,
                              "create": [], "created": [], "blocked": [], "detach": [], "detached": [],
                              "dropped": [], "default_rows": None}
    if dry_run:
        return report
    # Under the parent's lock (hand-over) and pg_partman's DDL: bounded like a swap, retried whole.
    step = "create_parent"
    try:
        report["handed_over"] = db.transaction(
            bind(partitions.hand_over, spec, premake, plan.upkeep.retention, plan.upkeep.drop_detached, live),
            lock_timeout=lock, statement_timeout="60s", label="pg_partman create_parent")
        step = "run_maintenance"
        moved = db.transaction(bind(partitions.partman_maintain, spec, premake, live), lock_timeout=lock,
                               statement_timeout="60s", label="pg_partman run_maintenance")
    except psycopg.Error as exc:
        # Rolled back whole: the table is as it was (handed over or not).
        raise Failed(f"pg_partman {step} for {live} failed: {exc.diag.message_primary or exc}",
                     hint=f"fix the cause (pg_partman's part_config row for {partitions.partman_parent(live)}), "
                          f"then `mover partitions maintain {m.name}` again") from exc
    if moved:
        report["moved_from_default"] = moved
    after = db.transaction(names_of, label="partitions")
    report["registered"] = True
    report["partitions"] = len(after)
    report["default_rows"] = db.transaction(default_rows, label="partitions")
    report["created"] = sorted(after - before)
    report["detached"] = sorted(before - after)
    return report
