from __future__ import annotations

from mover import cutover, names
from mover.context import Context
from mover.sql import capture as capture_sql
from mover.sql import ddl
from mover.steps.base import Step


class Retire(Step):
    name = "retire"

    def describe(self, ctx: Context, cur):
        m = ctx.migration
        out = [capture_sql.drop_trigger(names.capture_trigger(m.id, True), m.source),
               capture_sql.drop_function(names.capture_function(m.id, True)),
               capture_sql.drop_table(names.change_log(m.id, True))]
        if not ctx.plan.rollback.keep_old:
            out.append(ddl.drop_table(m.old))
        return out

    def run(self, ctx: Context) -> None:
        cutover.retire(ctx, ctx.give_up_rows)
