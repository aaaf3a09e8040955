from __future__ import annotations

import psycopg
from psycopg import sql

from mover.engines import hooks
from mover.engines.context import Context
from mover.engines.swap import cutover, lockwatch
from mover.steps.base import Step


class Retire(Step):
    name = "retire"

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        return [*(s for _, s in lockwatch.lock_statements(cur, cutover.retire_locks(ctx))),
                *(cutover.render(cur, s) for s in cutover.retire_sql(cur, ctx))]

    def run(self, ctx: Context) -> None:
        hooks.run(ctx, "before_retire")
        cutover.retire(ctx, ctx.give_up_rows)
        hooks.run(ctx, "after_retire")
