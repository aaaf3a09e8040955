"""`mover rehearse NAME`: the query rehearsal of a migration (mover/engines/swap/query_rehearsal.py)
before its cutover, at the steps control.COMMANDS allows it (reconcile and the gate: the target
is complete, its indexes built). Holds no lease: it moves nothing (it ANALYZEs the target, which
only mover writes before the swap, and plans statements in transactions it rolls back)."""

from __future__ import annotations

from typing import Any

from mover.db import Database
from mover.engines.context import Context
from mover.engines.swap import query_rehearsal
from mover.state import control


def rehearse(db: Database, name: str, *, top: int | None = None) -> dict[str, Any]:
    """The rehearsal as plain data (query_rehearsal.summary); the caller decides the exit code."""
    # A family's table names its family; the family's step (its tables' earliest) decides, and
    # every table is rehearsed.
    m = db.transaction(lambda cur: control.head_of(cur, control.get(cur, name)), label="rehearse")
    # The migration's recorded session settings pinned, as for any of its commands.
    ctx = Context(db=db, migration=m, owner="rehearse")
    control.require_command(control.as_one([t.migration for t in ctx.tables()]), "rehearse")
    return query_rehearsal.of_migration(ctx, top=top)
