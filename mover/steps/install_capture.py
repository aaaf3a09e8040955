from __future__ import annotations

import psycopg
from psycopg import sql

from mover.engines.capture import changelog, integrity, logical
from mover.engines.context import Context
from mover.engines.swap import lockwatch
from mover.state import control
from mover.steps.base import EachTable

INSTALL_LOCK = "SHARE ROW EXCLUSIVE"  # what CREATE TRIGGER takes


class InstallCapture(EachTable):
    name = "install_capture"

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        m = ctx.migration
        from_wal = logical.enabled(ctx)
        out: list[sql.Composable | str] = []
        if from_wal:
            out += ["-- logical capture: mover's publication of the source, then its replication slot, each"
                    " committed before the capture's transaction (mover/engines/capture/logical.py)",
                    *logical.prepare_sql(ctx, cur, m.source), "-- then, one transaction:"]
        return [*out, *(s for _, s in lockwatch.lock_statements(cur, [m.source], INSTALL_LOCK)),
                *changelog.install_sql(cur, m.id, m.source, tuple(m.key_columns), m.name, logical_capture=from_wal)]

    def run_table(self, ctx: Context) -> None:
        m = ctx.migration
        from_wal = logical.enabled(ctx)
        if from_wal:
            # Invariant 12: the slot exists before the backfill's first range takes its snapshot.
            logical.prepare(ctx, m.source)

        def install(cur: psycopg.Cursor) -> None:
            control.guard(cur, m.id, self.name, ctx.owner)
            lockwatch.lock_all(cur, [m.source], INSTALL_LOCK)  # named if it waits
            changelog.install(cur, m.id, m.source, tuple(m.key_columns), m.name, logical_capture=from_wal)
            integrity.mark(cur, ctx, reverse=False)  # invariant 14: what every drain verifies from now on
            control.finish_step(cur, m, self.name, ctx.owner, message=f"capturing changes to {m.source}"
                                + (" from the WAL (logical)" if from_wal else ""))

        # CREATE TRIGGER takes a SHARE ROW EXCLUSIVE lock on the live table: wait briefly and
        # retry rather than queue the application's writes behind us.
        lockwatch.run_locked(ctx, install, tables=[m.source, m.target], what="install the capture trigger of",
                             retry=f"mover run {m.name}", label="install_capture")
