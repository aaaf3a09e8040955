from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from mover import names
from mover.catalog import conversion, introspect, shape
from mover.engines.bulk import backfill, builds
from mover.engines.capture import changelog
from mover.engines.context import Context
from mover.engines.governor import throttle
from mover.engines.partitioning import partitions
from mover.errors import Failed
from mover.sql import copy as copy_sql
from mover.state import control, ranges
from mover.steps.base import EachTable


class Backfill(EachTable):
    name = "backfill"

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        m = ctx.migration
        out: list[Any] = [f"-- each range of {ctx.plan.backfill.range_rows} keys in its own transaction"
                     " (synchronous_commit = off): find the upper bound, copy, mark done; the last is open-ended"]
        mapping = ctx.described_mapping(cur)
        if mapping is not None:
            # The copy converts each value as this statement does (invariant 8): printed by plan check
            # too, from the same mapping over the rehearsed target.
            out += [*ranges.bound_statements(mapping), copy_sql.copy_range(mapping, None, ["<hi>"])[0]]
        elif introspect.exists(cur, ctx.original):
            # Before create_target (plan check): the bounds are cut on the source alone, its key says how.
            source = introspect.describe(cur, ctx.original)
            out += ranges.bound_statements(conversion.mapping(source, source, tuple(m.key_columns)))
        indexes = builds.deferred_indexes(cur, ctx)
        if indexes:
            governed = ctx.plan.throttle.governed
            at_once = ctx.plan.backfill.index_sessions(governed)
            out.append(f"-- deferred indexes: up to {at_once} CREATE INDEX at once ([backfill] index_builds"
                       + (", the next beside another once the governor has read the first running, each without"
                          " parallel workers, while the application is busy; up to "
                          f"{ctx.plan.backfill.index_sessions(False)} with parallel workers while it is quiet"
                          if governed else "") +
                       "), each in its own transaction (only mover writes the new table before the cutover); a"
                       " partitioned target builds each partition's, then attaches them to its parent's index ON"
                       " ONLY")
        out += builds.index_statements(ctx, indexes, self._partitions(ctx, cur))
        out += ["-- beside the index builds, in a session of its own out of a transaction block (one partition"
                " locked at a time; under the governor it takes one of the builds' turns), unless a deferred index"
                " has expressions, an exclusion constraint is built or a pooler stands in the way: then after them,"
                " in a transaction", builds.Analyze(ctx).statement()]
        return out

    @staticmethod
    def _partitions(ctx: Context, cur: psycopg.Cursor) -> list[names.QualifiedName] | None:
        """The new table's partitions: those it has, or before create_target those it will get."""
        spec = ctx.plan.new_layout
        if spec is None:
            return None
        if introspect.exists(cur, ctx.new):
            return partitions.live_partitions(cur, ctx.new)
        schema = ctx.new.schema
        assert schema is not None  # the control tables hold schema-qualified names
        planned = partitions.layout(cur, spec, ctx.original, ctx.migration.source.name, schema).partitions
        return [names.QualifiedName(schema, p.name) for p in planned]

    def run_table(self, ctx: Context) -> None:
        builds.stop_orphaned_builders(ctx)  # a crashed run's, which would hold up the drain
        # One governor for the step: the baseline is the probe's before the step's work (the copy,
        # then the index builds and ANALYZE under it).
        with throttle.governing(ctx, "backfill"):
            self._run(ctx)

    def _run(self, ctx: Context) -> None:
        m = ctx.migration
        backfill.copy_all(ctx)
        # Workers check range ownership, not the orchestrator's lease: check it before going on.
        ctx.db.transaction(lambda cur: control.guard(cur, m.id, self.name, ctx.owner))
        started = time.monotonic()
        applied = changelog.drain(ctx, reverse=False, backfill_done=True)
        ms = (time.monotonic() - started) * 1000
        ctx.db.transaction(lambda cur: control.event(cur, m.id, ctx.owner, self.name, "drained",
                                                     f"applied {applied.claimed} logged changes after the copy",
                                                     {"applied": applied.claimed}, ms))
        analyze, ms = builds.build_and_analyze(ctx)  # under the governor, as the copy
        ctx.db.transaction(lambda cur: control.event(cur, m.id, ctx.owner, self.name, "analyzed",
                                                     f"analyzed {m.target}", {"beside_builds": analyze.beside}, ms))

        def finish(cur: psycopg.Cursor) -> None:
            invalid = [ix.name for ix in introspect.describe(cur, m.target).indexes if not ix.is_valid]
            if invalid:
                raise Failed(f"indexes {invalid} on {m.target} are invalid", hint=f"run `mover run {m.name}` again")
            rows, ranges, _ = control.range_totals(cur, m.id, "backfill")
            # mover has finished building the new table (deferred indexes included): from here
            # on its shape is fixed too (mover/catalog/shape.py).
            ctx.check_shape(cur)
            shape.record(cur, m.id, target=m.target)
            control.finish_step(cur, m, self.name, ctx.owner,
                                message=f"copied {rows} rows in {ranges} ranges",
                                detail={"rows": rows, "ranges": ranges})

        ctx.db.transaction(finish, label="backfill done")
