from __future__ import annotations

import psycopg
from psycopg import sql

from mover import cutover, introspect
from mover.context import Context
from mover.sql import ddl
from mover.steps.base import Step
from mover.steps.create_target import target_ddl
from mover.steps.reconcile import last_check


class Cutover(Step):
    name = "cutover"
    gate = True

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        m = ctx.migration
        out: list[sql.Composable | str] = [
            f"-- one transaction, lock_timeout {ctx.plan.cutover.lock_timeout_ms}ms, up to "
            f"{ctx.plan.cutover.attempts} attempts:",
            ddl.lock_tables([m.source, m.target]),
            "-- apply the last logged changes, then:",
        ]
        if introspect.exists(cur, m.target):
            out += [cutover.render(cur, s) for s in cutover.swap_sql(cur, ctx, forward=True)]
        else:
            # Not created yet (`plan check`): the swap's statements are read from a rehearsed
            # target, rolled back with its savepoint.
            cur.execute("SAVEPOINT mover_describe_cutover")
            try:
                for stmt in target_ddl(cur, ctx.plan, m.source, m.target):
                    cur.execute(stmt)
                out += [cutover.render(cur, s) for s in cutover.swap_sql(cur, ctx, forward=True)]
            finally:
                cur.execute("ROLLBACK TO SAVEPOINT mover_describe_cutover")
        out.append(sql.SQL("COMMIT"))
        if ctx.plan.drop_foreign_keys:
            out.append(f"-- foreign keys not carried over (acknowledged in [target] drop_foreign_keys): "
                       f"{', '.join(ctx.plan.drop_foreign_keys)}")
        return out

    def run(self, ctx: Context) -> None:
        cutover.swap_in(ctx, last_check=last_check)
