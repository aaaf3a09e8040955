from __future__ import annotations

from typing import NoReturn

import psycopg
from psycopg import sql

from mover.catalog import introspect
from mover.db import bind
from mover.engines import capture, carry, cutover, hooks, lockwatch
from mover.engines.context import Context
from mover.errors import Waiting
from mover.state import control
from mover.steps.base import Step
from mover.steps.create_target import target_ddl
from mover.steps.reconcile import last_check


class Cutover(Step):
    name = "cutover"
    gate = True

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        m = ctx.migration
        out: list[sql.Composable | str] = [
            "-- before: autovacuum paused on both tables (restored after), blocking sessions named"
            + (", cancelled after [cutover] blocker_grace" if ctx.plan.cutover.terminate_blockers else ""),
            f"-- one transaction, lock_timeout {ctx.plan.cutover.lock_timeout_ms}ms, up to "
            f"{ctx.plan.cutover.attempts} attempts:",
        ]

        def locks() -> list[sql.Composable | str]:
            return [s for _, s in lockwatch.lock_statements(cur, cutover.swap_locks(cur, ctx, m.source, m.target))]

        if introspect.exists(cur, m.target):
            out += locks()
            stmts, carried = cutover.swap_plan(cur, ctx, forward=True)
        else:
            # Not created yet (`plan check`): the swap's statements are read from a rehearsed
            # target, rolled back with its savepoint. (Its other indexes are built after the
            # backfill, so their renames are not listed here yet.)
            cur.execute("SAVEPOINT mover_describe_cutover")
            try:
                for stmt in target_ddl(cur, ctx.plan, m.source, m.target, m.id):
                    cur.execute(stmt)
                out += [*locks(), "-- and the migration's change log (created by install_capture)"]
                stmts, carried = cutover.swap_plan(cur, ctx, forward=True)
            finally:
                cur.execute("ROLLBACK TO SAVEPOINT mover_describe_cutover")
        out.append("-- apply the last logged changes, then:")
        out += [cutover.render(cur, s) for s in stmts]
        out.append(sql.SQL("COMMIT"))
        if carried.to_validate:
            out.append("-- after the lock, one transaction each (SHARE UPDATE EXCLUSIVE: writes go on):")
            out += [carry.validate_sql(schema, table, name) for schema, table, name in carried.to_validate]
        if carried.to_attach:
            out.append("-- then, on the partitioned table (attaches the partitions' validated copies, no scan):")
            out += [carry.attach_sql(*c) for c in carried.to_attach]
        out += [f"-- {note}" for note in carried.notes if "no partner" not in note or introspect.exists(cur, m.target)]
        source_oid = introspect.table_oid(cur, m.source)
        if source_oid is not None:
            out += [f"-- warning: {w}" for w in
                    introspect.narrower_referencing_columns(cur, source_oid, dict(ctx.plan.columns))]
        if ctx.plan.drop_foreign_keys:
            out.append(f"-- foreign keys not carried over (acknowledged in [target] drop_foreign_keys): "
                       f"{', '.join(ctx.plan.drop_foreign_keys)}; they stay on the old table, so after retire "
                       f"{m.source} has no such foreign key")
        return out

    def wait(self, ctx: Context) -> NoReturn:
        """The gate (`mover run` stops here until `mover cutover`, or [cutover] auto): keep the
        target in step with the source while waiting, and tell the truth about it."""
        m = ctx.migration
        capture.drain(ctx, reverse=False, backfill_done=True)
        # A replay that failed since reconcile left open divergences: replayed once more first (the
        # application may have fixed the row since).
        ctx.db.transaction(bind(cutover.retry_unapplied, ctx, reverse=False))
        counts = ctx.db.transaction(bind(control.divergence_counts, m.id))
        ctx.db.transaction(bind(control.wait_at_gate, m, ctx.owner, counts), label="wait at the gate")
        if counts["open"]:
            kinds = ", ".join(f"{n} {kind}" for kind, n in counts["open_by_kind"].items())
            raise Waiting(f"migration {m.name!r} is at the cutover gate, but {m.target} differs from {m.source}: "
                          f"{counts['open']} divergences ({kinds}) open; cutover refuses until they are resolved",
                          hint=f"see them with `mover divergences {m.name}`; `mover repair {m.name}` re-syncs "
                               f"them from the source, `mover accept {m.name} --reason TEXT` closes them")
        raise Waiting(f"migration {m.name!r} is ready for cutover: {m.target} equals {m.source}",
                      hint=f"run `mover cutover {m.name}` to swap it in")

    def run(self, ctx: Context) -> None:
        hooks.run(ctx, "before_cutover")
        cutover.swap_in(ctx, last_check=last_check)
        hooks.run(ctx, "after_cutover")
