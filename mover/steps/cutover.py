from __future__ import annotations

from psycopg import sql

from mover import cutover, introspect
from mover.context import Context
from mover.sql import ddl
from mover.steps.base import Step


def _not_valid_checks(ctx: Context, cur) -> list:
    """The source's NOT VALID checks, added to the new table after the copy (mover/cutover.py)."""
    oid = introspect.table_oid(cur, ctx.migration.source)
    if oid is None:
        return []
    return [ddl.add_constraint(ctx.migration.target, name, definition)
            for name, definition, _ in introspect.unvalidated_checks(cur, oid)]


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
            *_not_valid_checks(ctx, cur),
            ddl.rename_table(m.source, m.old.name),
            ddl.rename_table(m.target, m.source.name),
            "-- hand over serial/identity sequences (identity sequences swap names too); install the reverse"
            " capture trigger on the new table",
            sql.SQL("COMMIT"),
            *([f"-- foreign keys not carried over (acknowledged in [target] drop_foreign_keys): "
               f"{', '.join(ctx.plan.drop_foreign_keys)}"] if ctx.plan.drop_foreign_keys else []),
        ]

    def run(self, ctx: Context) -> None:
        cutover.swap_in(ctx)
