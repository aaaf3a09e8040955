"""The rollback window, for every table at once: each run applies the reverse change logs to the
old tables and waits (exit 3) until the window ends; then it closes. `mover rollback` swaps back
within it (mover/steps/cutover.py swap_back, the cutover's sequence the other way)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

    def run_all(self, ctx: Context, tables: Sequence[Context], *, give_up_rows: bool = False) -> None:
        """A run in the window: what the swap added NOT VALID validated, every reverse log applied
        to the old tables; exit 3 until the window ends, then it closes."""
        for t in tables:
            carry.validate(t)  # what the swap added NOT VALID, if a crash came before it was validated
            integrity.resync_reverse(t)  # invariant 14: after a reverse capture gap, every key re-synced (drained next)
        if close(ctx, tables, force=False):
            return
        m = ctx.migration
        # Say so while rows the old tables rejected exist only in the new ones (replayed once more:
        # the application may have fixed them): a rollback would refuse.
        stuck: list[dict[str, Any]] = []
        for t in tables:
            stuck += ctx.db.transaction(bind(cutover.retry_unapplied, t, reverse=True))
        sources = ", ".join(str(t.migration.source) for t in tables)
        rejected = (f"; {len({tuple(d['key']) for d in stuck})} rows exist only in {sources}, the old "
                    f"{'table' if len(tables) == 1 else 'tables'} rejected them: {cutover.describe_rows(stuck)}"
                    if stuck else "")
        # With such rows a plain rollback would refuse: the hint names what does move on.
        hint = (f"fix those rows in the application (each `mover run {m.name}` replays them again; `mover "
                f"divergences {m.name}` lists them), or `mover rollback {m.name} {cutover.GIVE_UP_FLAG}` swaps "
                f"back without them; `mover retire {m.name} --force` ends the window now, keeping them"
                if stuck else
                f"`mover rollback {m.name}` swaps back; `mover retire {m.name} --force` ends it now")
        gap = "".join(integrity.window_note(t) for t in tables)  # a reverse capture gap: a rollback would refuse
        raise Waiting(f"the rollback window of {m.name!r} is open until"
                      f" {ctx.refresh().window_ends_at:%Y-%m-%d %H:%M:%S %Z}{rejected}{gap}", hint=hint)


def still_open(m: control.Migration) -> Waiting:
    """What `mover retire` without --force says while the window of `m` (the head's row) is still open."""
    ends = f" until {m.window_ends_at:%Y-%m-%d %H:%M:%S %Z}".rstrip() if m.window_ends_at else ""
    return Waiting(f"the rollback window of {m.name!r} is still open{ends}",
                   hint=f"wait, or `mover retire {m.name} --force`")


def close(ctx: Context, tables: Sequence[Context], *, force: bool) -> bool:
    """Every reverse log applied to the old tables (one statement a batch), then the window ended
    for every table if it is over (or now, with force). False while it is open."""
    changelog.drain(ctx, reverse=True, backfill_done=True)

    def go(cur: psycopg.Cursor) -> bool:
        return all([control.close_window(cur, t.migration, t.owner, force=force) for t in tables])

    closed = ctx.db.transaction(go, label="close rollback window")
    for t in tables:
        t.refresh()
    return closed
