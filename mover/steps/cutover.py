from __future__ import annotations

from psycopg import sql

from mover import cutover
from mover.context import Context
from mover.sql import ddl
from mover.steps.base import Step


class Cutover(Step):
    name = "cutover"
    gate = True

    def describe(self, ctx: Context, cur):
        m = ctx.migration
        return [
            f"-- one transaction, lock_timeout {ctx.plan.cutover.lock_timeout_ms}ms, up to "
            f"{ctx.plan.cutover.attempts} attempts:",
            ddl.lock_tables([m.source, m.target]),
            "-- apply the last logged changes, drop the forward capture trigger",
            ddl.rename_table(m.source, m.old.name),
            ddl.rename_table(m.target, m.source.name),
            "-- hand over serial/identity sequences; install the reverse capture trigger on the new table",
            sql.SQL("COMMIT"),
        ]

    def run(self, ctx: Context) -> None:
        cutover.swap_in(ctx)
