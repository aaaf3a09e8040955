"""A conversion to a partitioned table: the key that changes, the partitions to create, and the
values no partition would take (mover/engines/partitioning/partitions.py)."""

from __future__ import annotations

from mover.checks.subject import Subject
from mover.engines.partitioning import partitions


def plan(s: Subject) -> None:
    if s.plan.partition is not None:
        s.partitioning = partitions.check_plan(s.cur, s.plan.partition, s.src, s.table, s.new, s.plan.columns)
        if s.plan.upkeep.manager == "pg_partman":
            # Refused now, not after the cutover: the upkeep the plan asks for must be possible.
            s.partitioning["manager"] = f"pg_partman (schema {partitions.check_partman(s.cur, s.src)})"
