"""What moves a family (issue 27), under the lease its head holds on every table's row
(mover/runner/lease.py): the step loop, and the operator's moves, for several tables at once.

The family's step is the earliest of its tables'. Up to reconcile each step runs for every table
at that step, one table after another, exactly as for a migration of one table (mover/steps/):
each table's effect commits with its own transition, so a crash in any table's step resumes
there. The tables' range steps run one table at a time: the plan's workers and caps hold for the
family, not once per table, and the governor holds the one table working to the application's
budget (`_range_step`, the one place a family's range work starts). Before the first
reconcile pass the keys between the tables are added to the targets (mover/engines/swap/keys.py);
from the cutover gate on, the family moves as one (mover/steps/family.py): one gate, one swap
for every table, one rollback window, one rollback, one retire, one abort.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import psycopg

from mover import faults, steps
from mover.catalog import shape
from mover.db import bind
from mover.engines import hooks
from mover.engines.context import Context
from mover.engines.swap import keys as family_engine
from mover.errors import Waiting
from mover.state import control
from mover.steps import family as family_step
from mover.steps import rollback_window

# Steps each table runs on its own; from the gate on the family moves as one.
PER_TABLE = control.RANGE_STEPS


def step_of(members: Sequence[Context]) -> str:
    """The family's step: the earliest of its tables' (each table's own row says where it is)."""
    order = [*control.STEPS, control.FINISHED]
    return min((t.migration.step for t in members), key=order.index)


def as_family(members: Sequence[Context]) -> control.Migration:
    """The head's row with the family's step: what the operator's commands are checked against."""
    head = members[0].migration
    step = step_of(members)
    return head if step == head.step else replace(head, step=step)


def require_command(ctx: Context, command: str) -> list[Context]:
    """The family's tables, once the command is legal at the family's step."""
    members = family_engine.tables(ctx)
    control.require_command(as_family(members), command)
    return members


def advance(ctx: Context, *, one_step: bool = False, through_cutover: bool = False) -> control.Migration:
    """Run the family's steps until it is done, reaches the gate, or (one_step) one step ran."""
    while True:
        ctx.checkpoint()
        head = ctx.refresh()
        members = family_engine.tables(ctx)
        step = step_of(members)
        if head.state in control.TERMINAL or step == control.FINISHED:
            return head
        for t in members:  # every table from its recorded shapes (ShapeChanged otherwise)
            ctx.db.transaction(bind(shape.verify_at_step, t.migration, t.swapped), label="shape check")
        if step in PER_TABLE:
            _per_table(ctx, members, step)
            faults.point(f"after:{step}")
            if one_step:
                return ctx.refresh()
            continue
        if step == "cutover":
            if not (through_cutover or ctx.plan.cutover.auto):
                family_step.wait(ctx, members)  # raises Waiting: the operator decides
            _start(ctx, members, step)
            hooks.run(ctx, "before_cutover")
            family_step.swap_in(ctx, members)
            hooks.run(ctx, "after_cutover")
        elif step == "rollback_window":
            _start(ctx, members, step)
            family_step.window(ctx, members)
        elif step == "retire":
            _start(ctx, members, step)
            hooks.run(ctx, "before_retire")
            family_engine.retire(ctx, members, ctx.give_up_rows)
            hooks.run(ctx, "after_retire")
        faults.point(f"after:{step}")
        if one_step or (through_cutover and step == "cutover"):
            return ctx.refresh()


def _start(ctx: Context, members: Sequence[Context], step: str) -> None:
    def go(cur: psycopg.Cursor) -> None:
        for t in members:
            control.start_step(cur, t.migration, step, t.owner)
    ctx.db.transaction(go)


def _per_table(ctx: Context, members: Sequence[Context], step: str) -> None:
    """One of the steps up to reconcile, for each table at it, in the plan's order. At reconcile,
    first the keys between the tables on the targets; every table is compared before the family
    waits for divergences (one Waiting naming them all); then the keys of the targets checked."""
    if step == "reconcile":
        family_step.link(ctx, members)
    waiting: list[Waiting] = []
    for t in members:
        if t.migration.step != step:
            continue  # ahead of the others (done with this step already)
        ctx.checkpoint()
        t.db.transaction(bind(control.start_step, t.migration, step, t.owner))
        try:
            _range_step(t, step)
        except Waiting as exc:
            waiting.append(exc)
        faults.point(f"after:{step}:{t.migration.family_position}")  # one table's step done, the next's not
        t.refresh()
    if step == "reconcile":
        family_step.check_keys(ctx, members)
    if waiting:
        raise Waiting("; ".join(str(w) for w in waiting), hint=waiting[0].hint)


def _range_step(t: Context, step: str) -> None:
    """One table's step, as for a migration of one table. The family's tables take their turns
    here, so the plan's workers, rows/s caps and the governor's budget are the family's: one
    table's bulk work runs at a time, governed as a single table's is (mover/engines/governor/throttle.py)."""
    steps.BY_NAME[step].run(t)


def cutover(ctx: Context) -> control.Migration:
    """`mover cutover` of a family: pass the gate and swap every table; the open window is success."""
    require_command(ctx, "cutover")
    advance(ctx, through_cutover=True)
    try:
        return advance(ctx)
    except Waiting:
        members = family_engine.tables(ctx)
        if step_of(members) != "rollback_window":
            raise
        def wait(cur: psycopg.Cursor) -> None:
            for t in members:
                control.wait_in_window(cur, t.migration, t.owner)
        ctx.db.transaction(wait, label="window open")
        return ctx.refresh()


def rollback(ctx: Context, *, give_up_rows: bool = False) -> control.Migration:
    """`mover rollback` of a family: every table swapped back in one transaction."""
    members = require_command(ctx, "rollback")
    hooks.run(ctx, "before_rollback")
    family_step.swap_back(ctx, members, give_up_rows)
    hooks.run(ctx, "after_rollback")
    return ctx.refresh()


def retire(ctx: Context, *, force: bool = False, give_up_rows: bool = False) -> control.Migration:
    """`mover retire` of a family: close the window of every table (early, with force), retire."""
    members = require_command(ctx, "retire")
    m = ctx.refresh()
    if step_of(members) == "rollback_window" and not family_step.close(ctx, members, force=force):
        raise rollback_window.still_open(m)
    ctx.give_up_rows = give_up_rows
    return advance(ctx)


def abort(ctx: Context, *, give_up_rows: bool = False) -> control.Migration:
    """`mover abort` of a family: what mover built for every table removed, in one transaction."""
    members = require_command(ctx, "abort")
    family_engine.abort(ctx, members, give_up_rows)
    return ctx.refresh()
