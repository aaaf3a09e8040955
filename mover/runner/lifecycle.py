"""What moves one migration, under a lease already held (mover/runner/lease.py): the step loop
and the operator's moves through the same steps and transitions, for one table or many.

A migration is a list of tables (one, or several moved together, `[[also]]`); its step is the
earliest of its tables' (control.step_of). advance() runs that step for the tables, then the
next, until the migration is done, reaches the cutover gate (the cutover step's wait: exit 3
until the operator says go), or (one_step) one step ran. Up to reconcile each table runs the
step in turn (mover/steps/base.py EachTable); from the gate on the tables move as one: one gate,
one swap, one window, one rollback, one retire, one abort. Each step starts from the recorded
shapes (invariant 7) and marks itself done in the transaction of its effect (mover/steps/). The
operator's moves (cutover, rollback, retire, abort) check the transition table
(control.COMMANDS) under the lease, then go through the same steps; their sequences read top to
bottom in mover/steps/cutover.py (the swap and the swap back) and mover/engines/swap/cutover.py
(retire, abort). The plan's hooks are run here, around the step or move they name (_hooked).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import psycopg

from mover import faults, steps
from mover.catalog import shape
from mover.db import bind
from mover.engines import hooks
from mover.engines.context import Context
from mover.engines.swap import cutover as cutover_engine
from mover.errors import Waiting
from mover.state import control
from mover.steps import cutover as cutover_step
from mover.steps import rollback_window


@contextlib.contextmanager
def _hooked(ctx: Context, name: str | None) -> Iterator[None]:
    """The plan's `before_<name>` hook, the step or move, then its `after_<name>` hook (none when
    the step or move raised: a failed swap is not followed by the after-hook)."""
    if name is not None:
        hooks.run(ctx, f"before_{name}")
    yield
    if name is not None:
        hooks.run(ctx, f"after_{name}")


def require_command(ctx: Context, command: str) -> list[Context]:
    """The migration's tables, once `command` is legal at its step (the earliest of its tables')."""
    tables = ctx.tables()
    control.require_command(control.as_one([t.migration for t in tables]), command)
    return tables


def advance(ctx: Context, *, one_step: bool = False, through_cutover: bool = False,
            give_up_rows: bool = False) -> control.Migration:
    """Run steps until the migration is done, reaches a gate, or (one_step) one step ran.
    `give_up_rows`: the operator's `--give-up-rows`, for the retire step."""
    while True:
        ctx.checkpoint()
        head = ctx.refresh()
        tables = ctx.tables()
        name = _step(tables)
        if head.state in control.TERMINAL or name == control.FINISHED:
            return head
        for t in tables:  # every table from its recorded shapes (ShapeChanged otherwise), the gate included
            ctx.db.transaction(bind(shape.verify_at_step, t.migration, t.swapped), label="shape check")
        step = steps.BY_NAME[name]
        if step.gate and not (through_cutover or ctx.plan.cutover.auto):
            step.wait(ctx, tables)  # raises Waiting: the operator decides
        with _hooked(ctx, step.hooks):
            step.run(ctx, tables, give_up_rows=give_up_rows)
        faults.point(f"after:{name}")
        if one_step or (through_cutover and name == "cutover"):
            return ctx.refresh()


def cutover(ctx: Context) -> control.Migration:
    """`mover cutover`: pass the gate and swap every table; a zero-length window retires at once,
    otherwise the open window is success (the migration waits in it)."""
    require_command(ctx, "cutover")
    advance(ctx, through_cutover=True)
    try:
        return advance(ctx)
    except Waiting:
        tables = ctx.tables()
        if _step(tables) != "rollback_window":
            raise  # not the window: a zero-length one ended, and the retire after it waits for a lock

        def wait(cur: psycopg.Cursor) -> None:
            for t in tables:
                control.wait_in_window(cur, t.migration, t.owner)
        ctx.db.transaction(wait, label="window open")
        return ctx.refresh()


def rollback(ctx: Context, *, give_up_rows: bool = False) -> control.Migration:
    """`mover rollback`: swap every table back within the window; the migration returns to reconcile."""
    tables = require_command(ctx, "rollback")
    with _hooked(ctx, "rollback"):
        cutover_step.swap_back(ctx, tables, give_up_rows)
    return ctx.refresh()


def retire(ctx: Context, *, force: bool = False, give_up_rows: bool = False) -> control.Migration:
    """`mover retire`: close the window of every table (early, with force), then the retire step."""
    tables = require_command(ctx, "retire")
    m = ctx.refresh()
    if _step(tables) == "rollback_window" and not rollback_window.close(ctx, tables, force=force):
        raise rollback_window.still_open(m)
    return advance(ctx, give_up_rows=give_up_rows)


def abort(ctx: Context, *, give_up_rows: bool = False) -> control.Migration:
    """`mover abort`: remove what mover built for every table, in one transaction (before the
    cutover, or after a rollback)."""
    tables = require_command(ctx, "abort")
    cutover_engine.abort(ctx, tables, give_up_rows)
    return ctx.refresh()


def _step(tables: Sequence[Context]) -> str:
    return control.step_of([t.migration for t in tables])
