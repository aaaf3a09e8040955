from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from mover import names
from mover.catalog import introspect
from mover.engines.bulk import reconcile
from mover.engines.capture import integrity
from mover.engines.context import Context
from mover.engines.swap import keys
from mover.errors import Waiting
from mover.sql import compare
from mover.state import control, ranges
from mover.steps.base import EachTable


class Reconcile(EachTable):
    name = "reconcile"

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        m = ctx.migration
        s = ctx.plan.reconcile
        out: list[sql.Composable | str]
        out = [f"-- compare {m.source} with {m.target} in ranges of about {s.range_rows} keys ({s.workers} workers),"
               " each range of both tables and the change log read by one statement; a key that differs"
               f" while a change to it is pending is re-checked after the applier caught up (up to"
               f" {s.settle_rounds} rounds)"]
        if introspect.exists(cur, m.target):
            spec = reconcile.spec_for(cur, ctx.mapping(cur), fingerprints=s.fingerprints)
            out += ranges.bound_statements(spec.mapping)  # cut as the backfill's (mover/state/ranges.py)
            out.append(compare.compare_range(spec, names.change_log(m.id), names.applied_notes(m.id),
                                             None, ["<hi>"])[0])
        return out

    def describe_together(self, ctx: Context, tables: Sequence[Context],
                          cur: psycopg.Cursor) -> list[sql.Composable | str]:
        found: list[sql.Composable | str] = [*keys.link_sql(cur, tables, missing_only=False)]
        return ["-- once every table is copied, before the first reconcile pass, in one transaction: every change "
                "log replayed by one statement, then the foreign keys between the tables added to the targets "
                "(validated: only mover writes them); the swap renames the tables and the keys stay with them",
                *(found or ["-- (no foreign key between these tables)"])]

    def run(self, ctx: Context, tables: Sequence[Context], *, give_up_rows: bool = False) -> None:
        """Before the first pass, the keys between the tables on the targets (once every table is
        copied: every table is at this step or past it); every table compared before the step
        waits for divergences (one Waiting naming them all); then those keys checked on the
        targets with plain queries."""
        keys.link(ctx, tables)
        waiting = None
        try:
            super().run(ctx, tables)
        except Waiting as exc:
            waiting = exc
        keys.check_keys(ctx, tables)
        if waiting is not None:
            raise waiting

    def run_table(self, ctx: Context) -> None:
        conclude(ctx, reconcile.run(ctx))


def last_check(ctx: Context) -> int:
    """The cutover's last check (cutover.LastCheck): the same pass this step runs, over what changed
    since; returns the divergences open after it."""
    return reconcile.run(ctx).open


def conclude(ctx: Context, result: reconcile.PassResult) -> None:
    """After a pass at the reconcile step: wait for the operator, or move on to the cutover gate."""
    m = ctx.migration
    if result.open:
        ctx.db.transaction(lambda cur: control.wait_for_divergences(cur, m, ctx.owner, result.open))
        note = ctx.db.transaction(lambda cur: integrity.bypassed_note(cur, m.id))  # a recorded gap explains them
        raise Waiting(f"reconcile found {result.open} rows that differ between {m.source} and {m.target}{note}",
                      hint=f"see them with `mover divergences {m.name}`; `mover repair {m.name}` re-syncs them"
                           f" from the source, `mover accept {m.name} --reason TEXT` accepts them; cutover is"
                           f" refused until none remain")
    ctx.db.transaction(lambda cur: control.finish_step(
        cur, m, "reconcile", ctx.owner, state="waiting", message="tables are equal",
        detail=result.as_dict()))
