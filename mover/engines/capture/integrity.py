"""Capture integrity (invariant 14): capture is verified, not assumed.

mover's capture works only while its catalog objects are in force: the row trigger and the
TRUNCATE trigger ENABLE ALWAYS (tgenabled 'A') on the table they capture (the source before the
swap, the live table in the rollback window), and with logical capture its publication, publishing
every action of the whole table. Any role that owns the table can take that away behind mover's
back: `ALTER TABLE t DISABLE TRIGGER USER` for a bulk load (and `ENABLE TRIGGER USER` after it
leaves tgenabled 'O': writes under session_replication_role = replica then skip the trigger),
DISABLE TRIGGER ALL, ENABLE REPLICA, a DROP and CREATE, ALTER PUBLICATION.

How a change is seen, even one undone before mover looked: mover marks each object's catalog row
(its oid and raw xmin, mover.capture_marks) when it installs it or verifies it restored. Every
ALTER of the row writes a new row version with a new xmin (and DROP/CREATE a new oid); freezing
and VACUUM FULL keep the raw xmin; a no-op ENABLE ALWAYS writes nothing (PostgreSQL 15, verified).
So "in force, same oid and xmin as marked" means "continuously in force since marked", and
anything else is a gap: recorded (mover/state/gaps.py, with an event), named in `mover status`.

Where it is checked: in every drain transaction (check(), one catalog query, under the applier
lock), and inside the locked transactions of the swap and the swap back (require(), which
refuses). What a gap holds up: the swap in that direction, until capture is back in force AND a
comparison that covers every row ran after that: forward, a reconcile pass over every range
(the transition `mover recapture` uses: the ranges forgotten, back to reconcile); reverse, a
re-sync of every key of both tables through the reverse log (resync_reverse). mover does not put
the trigger back itself: whoever switched it off may still be loading; the refusal names the
statement that does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from mover import names
from mover.catalog import partition_tree
from mover.db import one
from mover.engines.capture import logical
from mover.engines.context import Context
from mover.errors import Waiting
from mover.names import QualifiedName
from mover.sql import capture as q
from mover.state import control, gaps, ranges

log = logging.getLogger("mover.integrity")

WHOLE_RANGE_MIN = 10  # rows that must differ in a range equal at its last pass to call it a bypass
PUBLICATION = "publication:"  # the objects of logical capture's publication are named apart from triggers

# What each tgenabled means for mover's capture.
TRIGGER_STATES = {
    "O": "ENABLE TRIGGER without ALWAYS (e.g. DISABLE then ENABLE TRIGGER USER): writes made under "
         "session_replication_role = replica (pg_restore, loaders, logical replication appliers) skip it",
    "D": "disabled (DISABLE TRIGGER): no write is captured",
    "R": "ENABLE REPLICA TRIGGER: only writes made under session_replication_role = replica are captured",
}


@dataclass(frozen=True)
class Seen:
    """One capture object as the catalog holds it now, and as mover last verified it."""
    object: str
    oid: int | None
    xmin: str | None
    state: str | None
    in_force: bool
    mark_oid: int | None
    mark_xmin: str | None
    mark_state: str | None

    @property
    def continuous(self) -> bool:
        """In force and the very row mover verified: nothing touched it since."""
        return self.in_force and self.oid == self.mark_oid and self.xmin == self.mark_xmin


class Bypassed(Waiting):
    """Capture was not continuously in force: raised under the swap's lock (its transaction rolls
    back, so refused() records the gap again in a transaction of its own)."""

    def __init__(self, message: str, *, ctx: Context, reverse: bool, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.ctx, self.reverse = ctx, reverse  # the table whose capture it is (a family's member, maybe)


def objects(ctx: Context, reverse: bool) -> list[str]:
    """The capture objects of one direction: the triggers (the row trigger only without logical
    capture), and logical capture's publication and the table's membership of it."""
    trigger = names.capture_trigger(ctx.mid, reverse)
    if logical.enabled(ctx) and not reverse:
        pub = PUBLICATION + names.capture_publication(ctx.mid)
        return [q.truncate_trigger(trigger), pub, pub + ":table"]
    return [trigger, q.truncate_trigger(trigger)]


def captured_table(ctx: Context, reverse: bool) -> QualifiedName:
    """The table a direction's capture is on: the original before the swap, the new one after."""
    return ctx.new if reverse else ctx.original


ON = " on "  # '<trigger> on <partition>': a trigger on one of a partitioned table's partitions


def on_partitions(cur: psycopg.Cursor, ctx: Context, reverse: bool, table: QualifiedName) -> list[str]:
    """The capture's triggers on each partition of a partitioned `table`: the clones of the row
    trigger PostgreSQL makes, each switched on and off by itself, and the TRUNCATE trigger mover
    puts on each (a TRUNCATE of a partition fires no trigger of its parent)."""
    cur.execute("SELECT to_regclass(%s)::oid", (str(table),))
    oid = one(cur)[0]
    if oid is None:
        return []
    trigger = names.capture_trigger(ctx.mid, reverse)
    mine = [q.truncate_trigger(trigger)] if logical.enabled(ctx) and not reverse else \
        [trigger, q.truncate_trigger(trigger)]
    return [f"{t}{ON}{p}" for p in partition_tree.relations(cur, oid) for t in mine]


def split(obj: str) -> tuple[str, str | None]:
    """(trigger, partition or None) of a trigger object."""
    trigger, _, partition = obj.partition(ON)
    return trigger, partition or None


def probe(cur: psycopg.Cursor, ctx: Context, reverse: bool, table: QualifiedName | None = None) -> list[Seen]:
    table = table or captured_table(ctx, reverse)
    everything = objects(ctx, reverse) + on_partitions(cur, ctx, reverse, table)
    cur.execute(q.capture_probe(), {"objects": everything, "table": str(table),
                                    "publication": names.capture_publication(ctx.mid), "mid": ctx.mid,
                                    "direction": gaps.direction(reverse)})
    return [Seen(*r) for r in cur.fetchall()]


def mark(cur: psycopg.Cursor, ctx: Context, reverse: bool, table: QualifiedName | None = None) -> None:
    """mover installed this direction's capture in the caller's transaction: its rows are the marks
    (the install's own xid is their xmin). `table`: where it was installed, when the migration row
    does not say it yet (the swap, before its transition)."""
    seen = probe(cur, ctx, reverse, table)
    gaps.mark(cur, ctx.mid, reverse,
              [(s.object, s.oid, s.xmin or "", s.state or "") for s in seen if s.oid is not None])


def handed_over(cur: psycopg.Cursor, ctx: Context, forward: bool) -> None:
    """In the swap's transaction, after its statements: the capture it removed forgotten, the one
    it installed (on the table that now bears the source's name) marked."""
    gaps.forget_marks(cur, ctx.mid, reverse=not forward)
    mark(cur, ctx, reverse=forward, table=ctx.migration.source)


def _kind(obj: str) -> str:
    if not obj.startswith(PUBLICATION):
        return "trigger"
    return "membership" if obj.endswith(":table") else "publication"


def describe(s: Seen, ctx: Context) -> str:
    """What was seen, in the operator's words."""
    kind = _kind(s.object)
    if kind == "trigger":
        if s.oid is None:
            return "dropped: no trigger of that name on the table" + (" (it was there)" if s.mark_oid else "")
        if s.state != "A" and split(s.object)[0].endswith("_truncate"):
            return (f"tgenabled {s.state} (was A): a TRUNCATE of the table "
                    + ("is not refused" if s.state == "D" else "under session_replication_role = "
                       + ("origin" if s.state == "R" else "replica") + " is not refused")
                    + ", and it would empty the table without a trace in the change log")
        if s.state != "A":
            return f"tgenabled {s.state} (was A): {TRIGGER_STATES.get(s.state or '', 'not ENABLE ALWAYS')}"
        if s.mark_oid is not None and s.oid != s.mark_oid:
            return (f"dropped and created again (pg_trigger oid {s.oid}, was {s.mark_oid}): writes in between were "
                    f"not captured")
        return (f"in force again, but its pg_trigger row was rewritten since mover verified it (xmin {s.xmin}, was "
                f"{s.mark_xmin}): it was switched off and on again (e.g. DISABLE then ENABLE ALWAYS TRIGGER), and "
                f"writes in between may not have been captured")
    if kind == "publication":
        if s.oid is None:
            return "the publication was dropped: the slot's changes can no longer be decoded"
        if not s.in_force:
            return f"publishes only {s.state or 'nothing'} (ALTER PUBLICATION ... SET (publish = ...)): other " \
                   f"changes are not in the stream"
        return (f"altered since mover verified it (pg_publication xmin {s.xmin}, was {s.mark_xmin}, oid {s.oid}, was "
                f"{s.mark_oid}): changes in between may not be in the stream")
    if s.oid is None:
        return "the table was removed from mover's publication (ALTER PUBLICATION ... DROP TABLE or SET TABLE)"
    if not s.in_force:
        return "the table is published with a row filter or a column list: other changes are not in the stream"
    return ("the table was removed from mover's publication and added again (pg_publication_rel oid "
            f"{s.oid}, was {s.mark_oid}): changes in between are not in the stream")


def fix(cur: psycopg.Cursor, s: Seen, ctx: Context, table: QualifiedName) -> str:
    """The statement (or command) that puts the object back in force."""
    if _kind(s.object) != "trigger":
        return f"mover recapture {ctx.migration.name}"
    trigger, partition = split(s.object)
    if s.oid is not None:
        return q.enable_always(trigger, table, partition).as_string(cur)
    if partition is not None and not trigger.endswith("_truncate"):
        # A partition's clone of the row trigger comes back only with the parent's.
        return f"mover recapture {ctx.migration.name}"
    reverse = trigger.startswith(names.capture_trigger(ctx.mid, True))
    on = table if partition is None else q.relation(partition)
    wanted = q.create_trigger(names.capture_trigger(ctx.mid, reverse), on, names.capture_function(ctx.mid, reverse),
                              rows=not trigger.endswith("_truncate"))
    keep = [stmt.as_string(cur) for stmt in wanted if sql.Identifier(trigger).as_string(cur) in stmt.as_string(cur)]
    return "; ".join(keep)


def check(cur: psycopg.Cursor, ctx: Context, reverse: bool) -> list[Seen]:
    """In the caller's transaction (every drain's, after its applier lock): one catalog query;
    each object not continuously in force since marked is recorded as a gap (a new one with an
    event, or the open one updated); one in force again is marked anew and its gap restored.
    Returns what was not continuous."""
    table = captured_table(ctx, reverse)
    seen = probe(cur, ctx, reverse, table)
    if all(s.mark_oid is None and not s.in_force for s in seen):
        return []  # nothing of it installed yet, nor ever verified: nothing to compare with
    out = []
    for s in seen:
        if s.continuous:
            continue
        if s.mark_oid is None and s.in_force:
            # Never marked (installed by an older mover, or marked rows lost with a restored control
            # schema): in force now is all that can be known; verified from here on.
            gaps.remark(cur, ctx.mid, reverse, s.object, s.oid or 0, s.xmin or "", s.state or "")
            continue
        out.append(s)
        what, statement = describe(s, ctx), fix(cur, s, ctx, table)
        gap, new = gaps.record(cur, ctx.mid, reverse, s.object, str(table), what, statement, restored=s.in_force)
        if s.in_force:
            gaps.remark(cur, ctx.mid, reverse, s.object, s.oid or 0, s.xmin or "", s.state or "")
        if new:
            control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "capture_gap",
                          f"{gaps.direction(reverse)} capture not continuously in force: {name_of(gap)}: {what}"
                          + ("" if s.in_force else f"; fix: {statement}"), gap.as_dict())
        if s.in_force:
            control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "capture_restored",
                          f"{gaps.direction(reverse)} capture in force again: {name_of(gap)}; a full comparison "
                          f"must run before a swap", gap.as_dict())
    return out


def name_of(g: gaps.Gap) -> str:
    if g.relation is None:
        return g.object  # found by a comparison, not by the catalog
    if g.object.startswith("slot:"):
        return f"replication slot {names.display_ident(g.object.removeprefix('slot:'))}"
    kind = _kind(g.object)
    if kind == "trigger":
        trigger, partition = split(g.object)
        return f"trigger {names.display_ident(trigger)} on {partition or g.relation}"
    pub = names.display_ident(g.object.removeprefix(PUBLICATION).removesuffix(":table"))
    return f"publication {pub}" if kind == "publication" else f"the membership of {g.relation} in publication {pub}"


def explain(g: gaps.Gap) -> str:
    """One gap as a refusal names it."""
    text = f"{name_of(g)}: {g.seen} (found {g.detected_at:%Y-%m-%d %H:%M:%S %Z})"
    if g.restored_at is not None:
        text += f"; in force again since {g.restored_at:%H:%M:%S}"
    if g.compared_at is not None:
        text += f"; covered by {g.resolution or 'a full comparison'}"
    return text


def require(cur: psycopg.Cursor, ctx: Context, reverse: bool) -> None:
    """Inside the swap's (or swap back's) locked transaction: the capture whose log the swap drains
    last was continuously in force since last verified, and no gap of it is uncovered; Bypassed
    otherwise (nothing is swapped)."""
    changed = [s for s in probe(cur, ctx, reverse) if not s.continuous and not (s.mark_oid is None and s.in_force)]
    open_ = gaps.open_gaps(cur, ctx.mid, reverse)
    if changed or open_:
        what = "; ".join([f"{s.object}: {describe(s, ctx)}" for s in changed] + [explain(g) for g in open_])
        raise Bypassed(f"the {gaps.direction(reverse)} capture of {ctx.migration.name!r} was not continuously in "
                       f"force ({what}); nothing was swapped", ctx=ctx, reverse=reverse)


def refused(exc: Bypassed, command: str) -> Waiting:
    """After a swap rolled back on Bypassed: the gap recorded in a transaction of its own, and the
    refusal that names it."""
    ctx = exc.ctx
    ctx.db.transaction(lambda cur: check(cur, ctx, exc.reverse), label="capture check")
    open_ = ctx.db.transaction(lambda cur: gaps.open_gaps(cur, ctx.mid, exc.reverse))
    if not open_:
        return exc
    return refusal(ctx, open_, exc.reverse, command)


def refusal(ctx: Context, open_: list[gaps.Gap], reverse: bool, command: str) -> Waiting:
    """The refusal of `command` (cutover, rollback) over uncovered gaps: which object, how it
    changed, the fix, and what must run after it."""
    m = ctx.migration
    off = [g for g in open_ if g.restored_at is None]
    what = "; ".join(explain(g) for g in open_)
    if off:
        fixes = "; ".join(g.fix or "" for g in off)
        after = (f"then `mover run {m.name}` (a reconcile pass over every range finds what was not captured)"
                 if not reverse else f"then `mover run {m.name}` (re-syncs every row of {m.source} into {m.old})")
        return Waiting(f"{command} of {m.name!r} refused: the {gaps.direction(reverse)} capture was bypassed and is "
                       f"not in force: {what}", hint=f"put it back: {fixes}; {after}")
    if not reverse:
        return Waiting(f"{command} of {m.name!r} refused: the capture was bypassed ({what}); the writes made "
                       f"meanwhile may be missing from {m.target}: every range must be compared again",
                       hint=f"`mover run {m.name}` compares every range (then `mover repair {m.name}` what it finds)")
    return Waiting(f"{command} of {m.name!r} refused: the reverse capture was bypassed ({what}); the writes made to "
                   f"{m.source} meanwhile may be missing from {m.old}, which a rollback would make live",
                   hint=f"`mover run {m.name}` re-syncs every row of {m.source} into {m.old}, then `mover {command} "
                        f"{m.name}`; or `mover {command} {m.name} --give-up-rows` gives up those writes (recorded)")


# ---------------------------------------------------------------------------------------------
# Where the swaps refuse, outside their locks


def refuse_forward(ctx: Context, command: str = "cutover") -> None:
    """Before the cutover (the gate, the preflight): checked in a transaction of its own; a gap not
    in force refuses with its fix; one restored but not yet compared sends the migration back to
    reconcile for a pass over every range (recapture's transition) and refuses until it ran."""
    ctx.db.transaction(lambda cur: check(cur, ctx, False), label="capture check")
    open_ = ctx.db.transaction(lambda cur: gaps.open_gaps(cur, ctx.mid, False))
    if not open_:
        return
    if all(g.restored_at is not None for g in open_) and ctx.migration.family_id is not None:
        if ctx.plan.reconcile.before_cutover:
            return  # a family's tables move together: the preflight's last check is the full pass (needs_full)
        raise Waiting(refusal(ctx, open_, False, command).message,
                      hint=f"`mover reconcile {ctx.migration.name} --full` compares every range")
    if all(g.restored_at is not None for g in open_):
        def rewind(cur: psycopg.Cursor) -> None:
            ranges.reset(cur, ctx.mid, "reconcile")  # the next pass compares every range
            control.mark_capture_restored(cur, ctx.migration, ctx.owner, [explain(g) for g in open_])
        ctx.db.transaction(rewind, label="capture restored")
        ctx.refresh()
    raise refusal(ctx, open_, False, command)


def covered_by_pass(cur: psycopg.Cursor, ctx: Context, started: object, summary: str) -> list[gaps.Gap]:
    """At the end of a reconcile pass over every range that started at `started`: the forward gaps
    restored before it are covered."""
    done = gaps.covered(cur, ctx.mid, False, started, summary)  # type: ignore[arg-type]
    for g in done:
        control.event(cur, ctx.mid, ctx.owner, "reconcile", "capture_gap_covered",
                      f"capture gap covered by {summary}: {explain(g)}", g.as_dict())
    return done


def needs_full(cur: psycopg.Cursor, mid: int) -> bool:
    """A forward gap restored but not compared: the next reconcile pass compares every range."""
    return any(g.restored_at is not None for g in gaps.open_gaps(cur, mid, False))


def bypassed_note(cur: psycopg.Cursor, mid: int) -> str:
    """What a refusal over divergences adds when a forward gap was recorded: that capture was
    bypassed, and where (item 4 of issue 34: not only "N unresolved divergences")."""
    recent = gaps.recent_gaps(cur, mid, False)
    if not recent:
        return ""
    return "; capture was bypassed, which explains rows that differ: " + "; ".join(explain(g) for g in recent)


def whole_range_differs(cur: psycopg.Cursor, mid: int, actor: str, kind: str, range_no: int, differing: int,
                        rows: int) -> None:
    """In a reconcile range's transaction, before its fingerprints are stored again: when (nearly)
    every one of its rows differs (settled: nothing pending) though the range was equal when last verified,
    the comparison is what found a bypass the catalog did not show (before mover marked its
    trigger, say). Recorded as a gap already covered (the comparison found it), so a refusal over
    the divergences names it."""
    if differing < max(WHOLE_RANGE_MIN, rows // 2 + 1):
        return  # rows the application wrote since the bypass are replayed, and equal again: most, not all
    before = ranges.last_verified(cur, mid, kind, range_no)
    if before is None or before[0] != 0:
        return
    seen = (f"{differing} of the {rows} rows of reconcile range {range_no} differ, though the range was equal when "
            f"verified at {before[1]:%H:%M:%S}: writes reached the source without capture")
    gap = gaps.found_by_comparison(cur, mid, f"reconcile range {range_no}", seen)
    control.event(cur, mid, actor, "reconcile", "capture_gap", f"capture bypassed, seen by reconcile: {seen}",
                  gap.as_dict())


def refuse_reverse(ctx: Context, give_up_rows: bool, command: str) -> None:
    """Before the swap back: a reverse gap not in force refuses (its fix named); one restored but
    not yet re-synced refuses unless the operator gives up what it may have lost."""
    ctx.db.transaction(lambda cur: check(cur, ctx, True), label="capture check")
    open_ = ctx.db.transaction(lambda cur: gaps.open_gaps(cur, ctx.mid, True))
    if not open_:
        return
    if any(g.restored_at is None for g in open_) or not give_up_rows:
        raise refusal(ctx, open_, True, command)

    def give_up(cur: psycopg.Cursor) -> None:
        how = f"given up by `mover {command} {ctx.migration.name} --give-up-rows`"
        gaps.given_up(cur, ctx.mid, True, [g.id for g in open_], how)
        control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "capture_gap_given_up",
                      f"{command}: the writes the reverse capture may have missed are given up: "
                      + "; ".join(explain(g) for g in open_), {"gaps": [g.as_dict() for g in open_]})
    ctx.db.transaction(give_up, label="give up capture gap")


def resync_reverse(ctx: Context) -> list[gaps.Gap]:
    """In the rollback window (`mover run`): a reverse gap restored since is covered by a re-sync of
    every key: each key of the live table and of the old one into the reverse log (one statement,
    read after the capture was back in force, so every later write is logged by the trigger), which
    the window's drain then replays by state. No reverse comparison exists in the window; this
    re-sync is what makes the old table whole again. Returns the gaps it covered."""
    def go(cur: psycopg.Cursor) -> list[gaps.Gap]:
        check(cur, ctx, True)
        pending = [g for g in gaps.open_gaps(cur, ctx.mid, True) if g.restored_at is not None]
        if not pending:
            return []
        cur.execute("SELECT clock_timestamp()")
        since = cur.fetchone()[0]  # type: ignore[index]
        m = ctx.mapping(cur, reverse=True)
        cur.execute(q.resync_all_keys(names.change_log(ctx.mid, True), m.key, m.src_key_types, m.src, m.dst))
        keys = cur.rowcount
        done = gaps.covered(cur, ctx.mid, True, since, f"a re-sync of every key ({keys} log rows) of {m.src} into "
                                                        f"{m.dst}")
        control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "capture_resynced",
                      f"reverse capture gap: every key of {m.src} and {m.dst} queued for replay ({keys} log rows): "
                      + "; ".join(explain(g) for g in done), {"gaps": [g.as_dict() for g in done], "rows": keys})
        return done
    return ctx.db.transaction(go, statement_timeout="0", label="reverse re-sync")


def before_feed(ctx: Context) -> None:
    """Logical capture, before the slot is read: checked (and recorded) in a transaction of its
    own; a publication that is gone refuses by name (decoding would fail with pgoutput's error)."""
    if not logical.enabled(ctx) or ctx.swapped:
        return
    seen = ctx.db.transaction(lambda cur: check(cur, ctx, False), label="capture check")
    if any(_kind(s.object) == "publication" and s.oid is None for s in seen):
        open_ = ctx.db.transaction(lambda cur: gaps.open_gaps(cur, ctx.mid, False))
        raise refusal(ctx, open_, False, "the logical capture")


def window_note(ctx: Context) -> str:
    """What the rollback window's waiting message adds while a reverse gap is open."""
    open_ = ctx.db.transaction(lambda cur: gaps.open_gaps(cur, ctx.mid, True))
    if not open_:
        return ""
    fixes = "; ".join(g.fix or "" for g in open_ if g.restored_at is None)
    return (f"; the reverse capture was bypassed ({'; '.join(explain(g) for g in open_)}): a rollback is refused"
            + (f" until it is put back ({fixes}) and `mover run` re-synced the old table" if fixes else ""))
