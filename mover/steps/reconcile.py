from __future__ import annotations

from mover import control, introspect, names, reconcile
from mover.context import Context
from mover.errors import Waiting
from mover.sql import compare
from mover.steps.base import Step


class Reconcile(Step):
    name = "reconcile"

    def describe(self, ctx: Context, cur):
        m = ctx.migration
        out = [f"-- compare {m.source} with {m.target} in ranges of {reconcile.RANGE_ROWS} keys, each range"
               " (and the change log) read by one statement"]
        if introspect.exists(cur, m.target):
            out.append(compare.compare_range(ctx.mapping(cur), names.change_log(m.id), None, None)[0])
        return out

    def run(self, ctx: Context) -> None:
        m = ctx.migration
        open_count = reconcile.run(ctx)
        if open_count:
            ctx.db.transaction(lambda cur: control.set_state(cur, m.id, "waiting", owner=ctx.owner,
                                                             error=f"{open_count} divergences"))
            raise Waiting(f"reconcile found {open_count} rows that differ between {m.source} and {m.target}",
                          hint=f"see them with `mover divergences {m.name}`; cutover is refused until none remain")
        ctx.db.transaction(lambda cur: control.finish_step(
            cur, m, self.name, "cutover", ctx.owner, state="waiting", message="tables are equal"))

