"""What a step is. Every step takes the migration's tables (one, or several moved together): the
steps up to reconcile run for each table in turn (EachTable), from the cutover gate on the tables
move as one (the step's run takes them all)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import psycopg
from psycopg import sql

from mover import faults
from mover.db import bind
from mover.engines.context import Context
from mover.errors import Waiting
from mover.state import control


class Step:
    name: str = ""
    # A gate: `mover run` stops before it unless the operator (or the plan) says go.
    gate: bool = False
    # The plan's hooks run around it (`[hooks.before_<hooks>]`, `[hooks.after_<hooks>]`), by the
    # runner (mover/runner/lifecycle.py), the one place hooks are called.
    hooks: str | None = None

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        """The SQL this step will run for one table, for `mover plan check`."""
        return []

    def describe_together(self, ctx: Context, tables: Sequence[Context],
                          cur: psycopg.Cursor) -> list[sql.Composable | str]:
        """What this step runs for several tables at once, besides each table's (`plan check`)."""
        return []

    def run(self, ctx: Context, tables: Sequence[Context], *, give_up_rows: bool = False) -> None:
        """Run the step for `tables` (ctx, the head, first), each at this step or past it. Marks
        every table started (control.start_step), then does the work. `give_up_rows`: the
        operator's `--give-up-rows` (retire)."""
        def start(cur: psycopg.Cursor) -> None:
            for t in tables:
                if t.migration.step == self.name:
                    control.start_step(cur, t.migration, self.name, t.owner)
        ctx.db.transaction(start)
        self.run_all(ctx, tables, give_up_rows=give_up_rows)

    def run_all(self, ctx: Context, tables: Sequence[Context], *, give_up_rows: bool = False) -> None:
        raise NotImplementedError

    def wait(self, ctx: Context, tables: Sequence[Context]) -> NoReturn:
        """A gate's work while it waits for the operator, instead of run: raises Waiting."""
        raise NotImplementedError


class EachTable(Step):
    """A step each table runs on its own, in the plan's order, exactly as for a migration of one
    table: each table's effect commits with its own transition, so a crash in any table's step
    resumes there. One table's bulk work runs at a time, so the plan's workers, rows/s caps and
    the governor's budget hold for the migration, not once per table. A table that waits (exit 3,
    divergences) does not hold up the others; the step then waits once, naming them all."""

    def run(self, ctx: Context, tables: Sequence[Context], *, give_up_rows: bool = False) -> None:
        waiting: list[Waiting] = []
        for t in tables:
            if t.migration.step != self.name:
                continue  # ahead of the others (done with this step already)
            ctx.checkpoint()
            t.db.transaction(bind(control.start_step, t.migration, self.name, t.owner))
            try:
                self.run_table(t)
            except Waiting as exc:
                waiting.append(exc)
            faults.point(f"after:{self.name}:{t.migration.family_position or 0}")  # this table's done, the next's not
            t.refresh()
        if len(waiting) == 1:
            raise waiting[0]
        if waiting:
            raise Waiting("; ".join(str(w) for w in waiting), hint=waiting[0].hint)

    def run_table(self, t: Context) -> None:
        raise NotImplementedError
