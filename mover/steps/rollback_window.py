"""The rollback window: each run applies the reverse change log to the old table and waits
(exit 3) until the window ends; then it closes. `mover rollback` swaps back within it
(mover/steps/cutover.py swap_back, the cutover's sequence the other way)."""

from __future__ import annotations

import psycopg
from psycopg import sql

from mover.db import bind
from mover.engines.capture import changelog, integrity
from mover.engines.context import Context
from mover.engines.swap import carry, cutover
from mover.errors import Waiting
from mover.plan import duration_text
from mover.sql import trusted
from mover.sql.mapping import ASSIGN, source_value
from mover.state import control
from mover.steps.base import Step


class RollbackWindow(Step):
    name = "rollback_window"

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        out: list[sql.Composable | str] = [
            f"-- until the window ({duration_text(ctx.plan.rollback.window_ms)}) ends, apply the reverse change log "
            f"to {ctx.migration.old}; `mover rollback {ctx.migration.name}` swaps back"]
        mapping = ctx.described_mapping(cur, reverse=True)
        for c in mapping.columns if mapping is not None else ():
            if c.cast_to is not None and (c.convert != ASSIGN or c.checked is not None):
                # The replay's own expression (mover/sql/mapping.py source_values): what plan check
                # says about the way back is what the window runs.
                out.append(sql.SQL("-- {} goes back to {} as: {}").format(
                    sql.Identifier(c.name), trusted(c.cast_to, "format_type"), source_value("s", c)))
        return out

    def run(self, ctx: Context) -> None:
        m = ctx.migration
        carry.validate(ctx)  # what the swap added NOT VALID, if a crash came before it was validated
        integrity.resync_reverse(ctx)  # invariant 14: after a reverse capture gap, every key re-synced (drained next)
        if not close(ctx, force=False):
            # Say so while rows the old table rejected exist only in the new one (replayed once more:
            # the application may have fixed them): a rollback would refuse.
            stuck = ctx.db.transaction(lambda cur: cutover.retry_unapplied(cur, ctx, reverse=True))
            rejected = (f"; {len({tuple(d['key']) for d in stuck})} rows exist only in {m.source}, the old table "
                        f"rejected them: {cutover.describe_rows(stuck)}") if stuck else ""
            # With such rows a plain rollback would refuse: the hint names what does move on.
            hint = (f"fix those rows in the application (each `mover run {m.name}` replays them again; `mover "
                    f"divergences {m.name}` lists them), or `mover rollback {m.name} {cutover.GIVE_UP_FLAG}` swaps "
                    f"back without them; `mover retire {m.name} --force` ends the window now, keeping them"
                    if stuck else
                    f"`mover rollback {m.name}` swaps back; `mover retire {m.name} --force` ends it now")
            gap = integrity.window_note(ctx)  # a reverse capture gap: a rollback would refuse
            raise Waiting(f"the rollback window of {m.name!r} is open until"
                          f" {ctx.refresh().window_ends_at:%Y-%m-%d %H:%M:%S %Z}{rejected}{gap}", hint=hint)


def still_open(m: control.Migration) -> Waiting:
    """What `mover retire` without --force says while the window of `m` (one table's, or a family's
    head) is still open."""
    ends = f" until {m.window_ends_at:%Y-%m-%d %H:%M:%S %Z}".rstrip() if m.window_ends_at else ""
    return Waiting(f"the rollback window of {m.name!r} is still open{ends}",
                   hint=f"wait, or `mover retire {m.name} --force`")


def close(ctx: Context, *, force: bool) -> bool:
    """Apply the reverse log to the old table, then end the window if it is over (or now, with
    force). False while it is open."""
    changelog.drain(ctx, reverse=True, backfill_done=True)
    closed = ctx.db.transaction(bind(control.close_window, ctx.migration, ctx.owner, force=force),
                                label="close rollback window")
    ctx.refresh()
    return closed
