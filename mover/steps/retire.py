"""The retire step: the old tables dropped (or kept inert, [rollback] keep_old) and the reverse
capture removed, for every table in one transaction."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from mover.engines.context import Context
from mover.engines.swap import cutover, lockwatch
from mover.steps.base import Step


class Retire(Step):
    name = "retire"
    hooks = "retire"

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        return [*(s for _, s in lockwatch.lock_statements(cur, cutover.retire_locks(ctx))),
                *(cutover.render(cur, s) for s in cutover.retire_sql(cur, ctx))]

    def run_all(self, ctx: Context, tables: Sequence[Context], *, give_up_rows: bool = False) -> None:
        cutover.retire(ctx, tables, give_up_rows)  # every table in one transaction
