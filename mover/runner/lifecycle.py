"""What moves one migration, under a lease already held (mover/runner/lease.py): the step loop
and the operator's moves through the same steps and transitions.

advance() runs the recorded step, then the next, until the migration is done, reaches the
cutover gate (the cutover step's wait: exit 3 until the operator says go), or (one_step) one
step ran. Each step starts from the recorded shapes (invariant 7) and marks itself done in the
transaction of its effect (mover/steps/). The operator's moves (cutover, rollback, retire, abort)
check the transition table (control.COMMANDS) under the lease, then go through the same steps;
a family of tables (issue 27) is moved by mover/runner/family.py, the same way for all of them;
their sequences read top to bottom in mover/steps/cutover.py (the swap and the swap back) and
mover/engines/swap/cutover.py (retire, abort).
"""

from __future__ import annotations

from mover import faults, steps
from mover.catalog import shape
from mover.db import bind
from mover.engines import hooks
from mover.engines.context import Context
from mover.engines.swap import cutover as cutover_engine
from mover.errors import Waiting
from mover.runner import family
from mover.state import control
from mover.steps import cutover as cutover_step
from mover.steps import rollback_window


def advance(ctx: Context, *, one_step: bool = False, through_cutover: bool = False) -> control.Migration:
    """Run steps until the migration is done, reaches a gate, or (one_step) one step ran."""
    if ctx.migration.family_id is not None:
        return family.advance(ctx, one_step=one_step, through_cutover=through_cutover)
    while True:
        ctx.checkpoint()
        m = ctx.refresh()
        if m.state in control.TERMINAL or m.step == control.FINISHED:
            return m
        # Every step starts from the recorded shapes (ShapeChanged otherwise), the gate included.
        ctx.db.transaction(bind(shape.verify_at_step, m, ctx.swapped), label="shape check")
        step = steps.BY_NAME[m.step]
        if step.gate and not (through_cutover or ctx.plan.cutover.auto):
            step.wait(ctx)  # raises Waiting: the operator decides
        ctx.db.transaction(bind(control.start_step, m, step.name, ctx.owner))
        step.run(ctx)
        faults.point(f"after:{step.name}")
        if one_step or (through_cutover and step.name == "cutover"):
            return ctx.refresh()


def cutover(ctx: Context) -> control.Migration:
    """`mover cutover`: pass the gate and swap; a zero-length window retires at once, otherwise
    the open window is success (the migration waits in it)."""
    if ctx.migration.family_id is not None:
        return family.cutover(ctx)
    control.require_command(ctx.refresh(), "cutover")
    advance(ctx, through_cutover=True)
    try:
        return advance(ctx)
    except Waiting:
        m = ctx.refresh()
        if m.step != "rollback_window":
            raise  # not the window: a zero-length one ended, and the retire after it waits for a lock
        ctx.db.transaction(bind(control.wait_in_window, m, ctx.owner), label="window open")
        return ctx.refresh()


def rollback(ctx: Context, *, give_up_rows: bool = False) -> control.Migration:
    """`mover rollback`: swap back within the window; the migration returns to reconcile."""
    if ctx.migration.family_id is not None:
        return family.rollback(ctx, give_up_rows=give_up_rows)
    control.require_command(ctx.refresh(), "rollback")
    hooks.run(ctx, "before_rollback")
    cutover_step.swap_back(ctx, give_up_rows)
    hooks.run(ctx, "after_rollback")
    return ctx.migration


def retire(ctx: Context, *, force: bool = False, give_up_rows: bool = False) -> control.Migration:
    """`mover retire`: close the window (early, with force), then the retire step."""
    if ctx.migration.family_id is not None:
        return family.retire(ctx, force=force, give_up_rows=give_up_rows)
    m = ctx.refresh()
    control.require_command(m, "retire")
    if m.step == "rollback_window" and not rollback_window.close(ctx, force=force):
        raise rollback_window.still_open(m)
    ctx.give_up_rows = give_up_rows
    return advance(ctx)


def abort(ctx: Context, *, give_up_rows: bool = False) -> control.Migration:
    """`mover abort`: remove what mover built (before the cutover, or after a rollback)."""
    if ctx.migration.family_id is not None:
        return family.abort(ctx, give_up_rows=give_up_rows)
    control.require_command(ctx.refresh(), "abort")
    cutover_engine.abort(ctx, give_up_rows)
    return ctx.migration
