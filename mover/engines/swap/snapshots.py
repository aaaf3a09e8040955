"""Old snapshots across the swap (invariant 16): before each attempt at the swap's lock (the cutover's,
the rollback's, a family's), wait for the transactions whose snapshot could not see the table that
takes the name complete.

Why: a name is resolved with a fresh catalog snapshot, but the rows are read with the transaction's
own snapshot. A REPEATABLE READ or SERIALIZABLE transaction (or an open cursor, a long statement)
whose snapshot was taken before mover's last write to the new table, and which first touches the
table after the swap, reads the new table with that snapshot: the rows written since are invisible
to it (a snapshot from before the backfill reads 0 rows, and its UPDATE changes nothing). PostgreSQL
has the same caveat for a rewriting ALTER TABLE and TRUNCATE.

Invariants:
- Right after the last drain before an attempt (cutover.drain_before_lock, cutover.drain_before_swap_back)
  the next transaction id X is read. Every write of mover to the table that takes the name, outside
  the swap's own transaction, committed before X. A snapshot whose xmin is X or later sees all of
  them; one whose xmin precedes X (pg_stat_activity.backend_xmin, compared with age(), which holds
  across xid wraparound) may not.
- Only the transactions holding such a snapshot when X is read are waited for, each until it lets
  the snapshot go (ends, or, in READ COMMITTED, ends its statement): a snapshot taken later sees every
  write committed before X, as CREATE INDEX CONCURRENTLY waits only for the transactions that existed
  when it began. New transactions cannot keep the swap waiting.
- Client sessions of this database only, and none of mover's own (application_name "mover..."): a
  session of another database never reads this table; a walsender or autovacuum reads no name.
- Bounded by [cutover] snapshot_wait for each transaction, counted from when the swap first waited
  for it (across the lock's attempts). Then the swap is refused before its lock (Waiting, exit 3,
  nothing changed, the sessions named), or, with [cutover] terminate_blockers, they are cancelled and
  terminated after blocker_grace as lock blockers are (lockwatch.terminate_blockers, recorded in a
  blockers_cancelled event) and the wait goes on.
- What remains (docs/operating.md, "Long REPEATABLE READ and SERIALIZABLE readers across the swap"): a
  snapshot taken after X and before the swap commits does not see what the swap's own transaction
  drains under its lock (the changes committed since the drain before the lock).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import psycopg

from mover.db import bind, one
from mover.engines.context import Context
from mover.engines.swap import lockwatch
from mover.errors import Waiting
from mover.state import control

log = logging.getLogger("mover.snapshots")

POLL_S = 0.05  # between two looks at pg_stat_activity while waiting
REPORT_AFTER_S = 0.5  # a transaction kept waited for this long is named (output, event)
ROUNDS = 3  # wait, drain what came meanwhile, wait for the snapshots older than that drain, ...
XID_SPAN = 1 << 32

# Client sessions of this database, not ours, whose snapshot's xmin precedes X. age() of both in one
# statement: the same reference point, so the comparison holds across xid wraparound.
_HOLDERS = """
SELECT a.pid, a.usename, a.application_name, a.state,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8,
       to_char(a.query_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS UTC'), a.backend_type,
       a.xact_start::text, extract(epoch FROM clock_timestamp() - a.query_start)::float8, a.backend_xmin::text
FROM pg_stat_activity a
-- Without pg_read_all_stats another role's session shows its backend_xmin but no backend_type nor
-- state: still waited for (a session with a role is no autovacuum worker), never read as "none".
WHERE (a.backend_type = 'client backend' OR (a.backend_type IS NULL AND a.usesysid IS NOT NULL))
  AND a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.backend_xmin IS NOT NULL AND age(a.backend_xmin) > age(%(x)s::text::xid)
  AND NOT coalesce(a.application_name, '') LIKE 'mover%%'
ORDER BY a.xact_start, a.pid
"""


@dataclass(frozen=True)
class SnapshotHolder(lockwatch.Blocker):
    """A session whose snapshot may not see the new table complete (a lockwatch.Blocker, so that
    terminate_blockers treats it as one)."""

    xact_start: str | None = None
    statement_age_s: float | None = None
    xmin: str = ""

    @property
    def hidden(self) -> bool:
        """A session of another role that this role may not look into (pg_read_all_stats)."""
        return self.backend_type is None

    @property
    def key(self) -> tuple[int, str]:
        """The transaction (a pid's next transaction has another start); where the start is hidden,
        the snapshot (the oldest it holds: another xmin, it let that one go)."""
        return self.pid, self.xact_start if self.xact_start is not None else f"xmin {self.xmin}"

    @property
    def holds(self) -> str:
        if self.hidden:
            return (f"a snapshot with xmin {self.xmin}; its state is not visible to this role "
                    f"(GRANT pg_read_all_stats to see it)")
        if (self.state or "").startswith("idle in transaction"):
            # Between statements only a REPEATABLE READ / SERIALIZABLE transaction or an open
            # cursor keeps a snapshot (READ COMMITTED lets it go at each statement's end).
            return "idle in transaction holding a snapshot (REPEATABLE READ, SERIALIZABLE or an open cursor)"
        age = f" for {self.statement_age_s:.1f} s" if self.statement_age_s is not None else ""
        return f"{self.state or 'running'}: a statement running{age}"

    def describe(self) -> str:
        if self.hidden:
            return f"pid {self.pid} (user {self.user}, application {self.application_name!r}, {self.holds})"
        age = f"transaction open {self.xact_age_s:.1f} s" if self.xact_age_s is not None else "no transaction"
        return (f"pid {self.pid} (user {self.user}, application {self.application_name!r}, {self.holds}, {age}, "
                f"query started {self.query_start or '-'})")


@dataclass
class Waits:
    """One swap's waits, across its lock attempts: when each transaction was first waited for."""

    first: dict[tuple[int, str], float] = field(default_factory=dict)
    reported: set[tuple[int, str]] = field(default_factory=set)
    terminated: set[tuple[int, str]] = field(default_factory=set)


class SnapshotsHeld(Waiting):
    """The bound ran out while transactions with older snapshots were still open."""

    def __init__(self, message: str, hint: str, found: list[SnapshotHolder]):
        super().__init__(message, hint=hint)
        self.detail = {"snapshots": [asdict(h) for h in found]}


def next_xid(cur: psycopg.Cursor) -> int:
    """X: the next transaction id (its 32 bits, as backend_xmin has them)."""
    cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::numeric")
    x = int(one(cur)[0]) % XID_SPAN
    return max(x, 3)  # 0..2 are special ids that no transaction has


def holders(cur: psycopg.Cursor, x: int) -> list[SnapshotHolder]:
    """The sessions whose snapshot's xmin precedes `x`, oldest transaction first."""
    cur.execute(_HOLDERS, {"x": str(x)})
    # By keyword: lockwatch.Blocker's fields grow (build), and a positional tail would shift.
    return [SnapshotHolder(pid=r[0], user=r[1], application_name=r[2], state=r[3], xact_age_s=r[4], query_start=r[5],
                           backend_type=r[6], tables=(), xact_start=r[7], statement_age_s=r[8], xmin=r[9])
            for r in cur.fetchall()]


def describe_all(found: list[SnapshotHolder]) -> str:
    shown = "; ".join(h.describe() for h in found[:lockwatch.SHOWN])
    return shown + (f"; and {len(found) - lockwatch.SHOWN} more" if len(found) > lockwatch.SHOWN else "")


def settle(ctx: Context, waits: Waits, drain: Callable[[], object], *, what: str, retry: str) -> None:
    """Right after the last drain before a lock attempt: wait for the transactions whose snapshot
    predates it; if there were any, what committed while waiting is drained too, and the snapshots
    older than that drain are waited for in turn, for at most ROUNDS rounds. Each round waits only
    for transactions that began during the one before (short under an OLTP load); what the last
    drain did not apply is left to the lock's (module docstring: what remains)."""
    for _ in range(ROUNDS):
        if not wait(ctx, waits, what=what, retry=retry):
            return
        drain()


def wait(ctx: Context, waits: Waits, *, what: str, retry: str) -> bool:
    """Right after the last drain before a lock attempt: wait for every transaction whose snapshot
    predates it (module docstring). Returns whether it waited for any (the caller drains again: what
    committed meanwhile is then not left to the lock)."""
    x = ctx.db.transaction(next_xid, label="next transaction id")
    found = ctx.db.transaction(bind(holders, x), label="older snapshots")
    if not found:
        return False
    keys = {h.key for h in found}
    now = time.monotonic()
    for h in found:
        waits.first.setdefault(h.key, now)
    bound = ctx.plan.cutover.snapshot_wait_ms / 1000
    still = found
    while True:
        now = time.monotonic()
        # Named once each, when it has kept the swap waiting a while (an OLTP transaction in
        # REPEATABLE READ ends in milliseconds: no line for each).
        new = [h for h in still if h.key not in waits.reported and now - waits.first[h.key] >= REPORT_AFTER_S]
        if new:
            waits.reported.update(h.key for h in new)
            _report(ctx, new, what, bound)
        over = [h for h in still if now - waits.first[h.key] >= bound]
        if over:
            if not ctx.plan.cutover.terminate_blockers or any(h.key in waits.terminated for h in over):
                raise _refused(ctx, over, what, retry, bound)
            waits.terminated.update(h.key for h in over)
            # As lock blockers: cancelled, terminated after blocker_grace, recorded (blockers_cancelled).
            lockwatch.terminate_blockers(ctx, [], list(over), held=lambda cur: [
                h for h in holders(cur, x) if h.key in keys])
        else:
            ctx.stop.wait(POLL_S)
        ctx.checkpoint()  # interrupted, or the lease lost: stops here, before the lock, nothing changed
        still = [h for h in ctx.db.transaction(bind(holders, x), label="older snapshots") if h.key in keys]
        if not still:
            return True


def _report(ctx: Context, found: list[SnapshotHolder], what: str, bound: float) -> None:
    message = (f"waiting up to {bound:g} s ([cutover] snapshot_wait) to {what}: {len(found)} transaction(s) hold a "
               f"snapshot older than mover's last write to the table that takes the name, which they would "
               f"not see: {describe_all(found)}")
    log.info("%s", message)
    ctx.db.transaction(lambda cur: control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "snapshot_wait", message,
                                                 {"sessions": [asdict(h) for h in found]}), label="record")
    ctx.report("snapshot_wait", what=what, bound=f"{bound:g}s", sessions=describe_all(found))


def _refused(ctx: Context, over: list[SnapshotHolder], what: str, retry: str, bound: float) -> SnapshotsHeld:
    name = ctx.migration.name
    pids = ", ".join(str(h.pid) for h in over)
    return SnapshotsHeld(
        f"could not {what} migration {name!r}: {len(over)} transaction(s) kept a snapshot older than mover's last "
        f"write to the table that takes the name for longer than [cutover] snapshot_wait ({bound:g} s); after the "
        f"swap they would read that table by its name without those rows; nothing was changed; {describe_all(over)}",
        hint=f"end them (COMMIT or ROLLBACK in that session, or `SELECT pg_terminate_backend(pid)` for pid {pids}), "
             f"then retry `{retry}`; or raise [cutover] snapshot_wait (`mover set {name} cutover.snapshot_wait=60s`), "
             f"or set `[cutover] terminate_blockers = true` to have them terminated",
        found=over)
