"""Cutover engine: the swap, its mirror image (rollback), retire and abort, each one transaction
for every table of the migration (one table or many: a single table is a migration of one). The
swap's phases are here (preflight, prepare, the Swap transaction's lock / verify / drain / rebuild
/ execute / check_parity / record, finish); mover/steps/cutover.py calls them in order, top to
bottom, each phase for every table before the next.

Invariants:
- The swap is one short transaction under the plan's lock_timeout, retried with backoff on
  55P03: lock both tables, drain the last logged changes, rename, hand over sequences, and
  reverse the capture. A write that committed before the lock is in the log and drained; a
  write that waits for the lock runs after the commit against the table that then carries the
  name (PostgreSQL re-resolves the name after a lock wait), so no write falls between (race 4).
- The application's queries wait at most as long as one attempt holds or waits for the lock.
- Rollback is the same transaction in the other direction; afterwards the forward capture runs
  again and the migration is back before the cutover gate, with reconcile to do again.
- Several tables: a crash anywhere in the one transaction leaves every table swapped or none,
  and nothing is executed before every table's digest was verified (a table's statements were
  read from the catalog before any other table's ran). Locks are taken one relation at a time
  (swap_locks: the live tables, referenced ones first, the other side's in the same order, the
  other tables the swap changes, then mover's logs); a live table an attempt timed out on is
  locked first by the next (race 9). Retire and abort drop referencing tables first.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from mover import faults, names
from mover.catalog import identity, introspect, privileges, shape, subscribers
from mover.db import bind, one
from mover.engines.capture import changelog, integrity, logical
from mover.engines.context import Context
from mover.engines.partitioning import source_tree
from mover.engines.swap import carry, keys, lockwatch, metadata, parity, snapshots
from mover.errors import Failed, Waiting, combined
from mover.names import QualifiedName
from mover.sql import ddl
from mover.sql.mapping import Mapping
from mover.state import control, ranges

log = logging.getLogger("mover.cutover")

LOCK_STATEMENT_TIMEOUT = "30s"
DRAIN_BATCH = 50_000  # log rows per replay statement under the swap's lock
# Before each lock attempt: drain passes until one replays fewer log rows than this (what arrives
# during a pass is about proportional to what it replayed), at most this many passes.
PRE_LOCK_ENOUGH = 200
PRE_LOCK_PASSES = 4


# The last check before the lock: a verifying pass over what changed since reconcile, returning the
# divergences then open. Passed in by the cutover step (steps/cutover.py), so this engine does not
# call the reconcile engine: the two are siblings over capture and control.
LastCheck = Callable[[Context], int]


def preflight(ctx: Context, last_check: LastCheck | None = None) -> None:
    """Before anything of the swap: no open divergence (invariant 4), every index of the target
    valid, no publication whose subscribers the swap would break; the log drained outside the lock;
    then the last check (a reconcile pass over what changed since reconcile verified it)."""
    carry.validate(ctx)  # what a swap back left NOT VALID before a crash

    def check(cur: psycopg.Cursor) -> None:
        problems = []
        n = control.open_divergences(cur, ctx.mid)
        if n:
            raise Waiting(f"migration {ctx.migration.name!r} has {n} unresolved divergences; cutover refused"
                          + integrity.bypassed_note(cur, ctx.mid),
                          hint=f"see them with `mover divergences {ctx.migration.name}`")
        for ix in introspect.describe(cur, ctx.new).indexes:
            if not ix.is_valid:
                problems.append(f"index {ix.name!r} on {ctx.new} is invalid")
        if problems:
            raise Failed("; ".join(problems), hint=f"run `mover run {ctx.migration.name}` to rebuild it")
        # A publication made since registration (plan check refused those before it) whose
        # subscribers the swap would break (mover/catalog/subscribers.py).
        source = ctx.migration.source
        assert source.schema is not None
        cur.execute("SELECT to_regclass(%s)::oid", (str(source),))
        refused = subscribers.plan_refusals(cur, source.schema, int(one(cur)[0]), ctx.plan.new_layout is not None)
        if refused:
            raise combined(refused, hint=f"then `mover cutover {ctx.migration.name}` again")
    ctx.db.transaction(check)
    # Drain outside the lock so the locked transaction has little left to apply.
    changelog.drain(ctx, reverse=False, backfill_done=True)
    integrity.refuse_forward(ctx)  # invariant 14: capture bypassed, not in force or not compared since: refused
    if ctx.plan.reconcile.before_cutover and last_check is not None:
        # The last check, outside the lock: re-verify every range that received an applied change
        # since reconcile verified it (mover/engines/bulk/reconcile.py). What the lock's own drain applies after
        # this is the same state replay whose results this pass has just checked.
        still_open = last_check(ctx)
        if still_open:
            note = ctx.db.transaction(lambda cur: integrity.bypassed_note(cur, ctx.mid))
            raise Waiting(f"the last reconcile before the cutover of {ctx.migration.name!r} found {still_open}"
                          f" unresolved divergences; cutover refused{note}",
                          hint=f"see them with `mover divergences {ctx.migration.name}`")


# ---------------------------------------------------------------------------------------------
# Invariant 9: nothing is dropped while it holds the only copy of a write. A row the replay could
# not apply (an open apply_error) exists only on the side it was replayed from.

GIVE_UP_FLAG = "--give-up-rows"
SHOWN_ROWS = 20


def _direction(d: dict[str, Any]) -> str:
    columns = d.get("columns")
    if d["kind"] == "apply_error" and isinstance(columns, dict) and columns.get("direction") == "reverse":
        return "reverse"
    return "forward"


def rows_only_on(cur: psycopg.Cursor, ctx: Context, side: str) -> list[dict[str, Any]]:
    """Open divergences whose row exists only on `side`: "new" (the new table; reverse replays
    that failed) or "original" (the original; forward divergences, the new table lacks them)."""
    want = "reverse" if side == "new" else "forward"
    return [d for d in control.open_divergence_rows(cur, ctx.mid) if _direction(d) == want]


def describe_rows(rows: list[dict[str, Any]]) -> str:
    """Each key once (a key whose replay failed repeatedly has a divergence per failure), with why."""
    why: dict[tuple[Any, ...], str] = {}
    for d in rows:
        columns = d.get("columns")
        error = columns.get("error") if isinstance(columns, dict) else None
        why[tuple(d["key"])] = str(error) if error else d["kind"]
    shown = "; ".join(f"key {list(k)}: {w}" for k, w in list(why.items())[:SHOWN_ROWS])
    return shown + (f"; and {len(why) - SHOWN_ROWS} more" if len(why) > SHOWN_ROWS else "")


def retry_unapplied(cur: psycopg.Cursor, ctx: Context, *, reverse: bool) -> list[dict[str, Any]]:
    """Replay again the keys whose replay in this direction failed (the application may have fixed
    the row since); resolve those that now go through. Returns the divergences still open."""
    changelog.lock_applier(cur, ctx.mid, reverse)
    rows = rows_only_on(cur, ctx, "new" if reverse else "original")
    failed_keys = [d for d in rows if d["kind"] == "apply_error"]
    if not failed_keys:
        return rows
    still = changelog.replay_set(cur, ctx.mapping(cur, reverse), [tuple(d["key"]) for d in failed_keys])
    done = [d["id"] for d in failed_keys if tuple(d["key"]) not in still]
    control.resolve_divergences_as(cur, ctx.mid, done, "repaired", "replayed again and applied", ctx.owner)
    return [d for d in rows if d["id"] not in done]


def give_up(cur: psycopg.Cursor, ctx: Context, rows: list[dict[str, Any]], command: str) -> None:
    """The operator gave these rows up: close them as accepted, and record exactly which."""
    if not rows:
        return
    reason = f"given up by `mover {command} {ctx.migration.name} {GIVE_UP_FLAG}`"
    control.resolve_divergences_as(cur, ctx.mid, [d["id"] for d in rows], "accepted", reason, ctx.owner, reason)
    detail = [{"id": d["id"], "key": list(d["key"]), "kind": d["kind"], "columns": d.get("columns")} for d in rows]
    control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, "rows_given_up",
                  f"{command}: {len(rows)} rows given up: {describe_rows(rows)}", {"rows": detail})


def refuse_losing(ctx: Context, rows: list[dict[str, Any]], command: str, side: str) -> Waiting:
    m = ctx.migration
    where = {"new": f"the new table ({ctx.new})", "original": f"the original table ({ctx.original})"}[side]
    n = len({tuple(d["key"]) for d in rows})
    return Waiting(f"{command} of {m.name!r} refused: {n} rows exist only in {where}, which {command} would "
                   f"leave behind: {describe_rows(rows)}",
                   hint=f"fix the rows so they fit (`mover divergences {m.name}` lists them) and retry, or "
                        f"`mover {command} {m.name} {GIVE_UP_FLAG}` to give them up (recorded in the events)")


class Unapplied(Exception):
    """Changes that could not be applied under the swap's lock; the swap's transaction rolls back."""

    def __init__(self, failures: dict[str, Any], rows: list[dict[str, Any]] | None = None):
        super().__init__(f"{len(failures) + len(rows or [])} rows could not be applied")
        self.failures = failures
        self.rows = rows or []

    def describe(self) -> str:
        parts = [f"key {list(k)}: {e}" for k, e in list(self.failures.items())[:SHOWN_ROWS]]
        if self.rows:
            parts.append(describe_rows(self.rows))
        return "; ".join(parts)


# A statement of the swap: its SQL, or its SQL and the parameters it runs with.
Statement = sql.SQL | sql.Composed | tuple[sql.SQL | sql.Composed, tuple[Any, ...]]


def render(cur: psycopg.Cursor, stmt: Statement) -> sql.Composable | str:
    """A statement as `plan check` prints it: parameters (known when it runs) stay %s."""
    return stmt[0].as_string(cur) if isinstance(stmt, tuple) else stmt


def execute_all(cur: psycopg.Cursor, stmts: list[Statement]) -> None:
    for stmt in stmts:
        if isinstance(stmt, tuple):
            cur.execute(*stmt)
        else:
            cur.execute(stmt)


def execute_batched(cur: psycopg.Cursor, stmts: list[Statement]) -> int:
    """The same statements in as few round trips as psycopg allows: each run of statements
    without parameters is sent as one multi-statement query (psycopg permits several statements
    only without parameters); a statement with parameters is sent on its own. Any failure rolls
    the whole swap back, so none needs telling apart. Returns the round trips made."""
    trips = 0
    batch: list[sql.Composable] = []
    for stmt in [*stmts, None]:
        if stmt is not None and not isinstance(stmt, tuple):
            batch.append(stmt)
            continue
        if batch:
            cur.execute(sql.SQL("; ").join(batch))
            trips += 1
            batch = []
        if stmt is not None:
            cur.execute(*stmt)
            trips += 1
    return trips


def _hand_over_sequences(cur: psycopg.Cursor, from_table: names.QualifiedName, to_table: names.QualifiedName,
                         to_renamed: names.QualifiedName) -> list[Statement]:
    """Serial sequences change owner (so dropping the old table keeps them); identity columns
    have one sequence per table, so the receiving one continues where the other stands.
    `to_table` takes the name `to_renamed` earlier in the same swap."""
    from_oid = introspect.table_oid(cur, from_table)
    to_oid = introspect.table_oid(cur, to_table)
    assert from_oid is not None and to_oid is not None and to_renamed.schema is not None  # both exist
    to_identity = {s.column: s.sequence for s in introspect.owned_sequences(cur, to_oid) if s.identity}
    to_types = {c.name: c.type for c in introspect.describe(cur, to_table).columns}
    out: list[Statement] = []
    for seq in introspect.owned_sequences(cur, from_oid):
        if not seq.identity:
            out.append(sql.SQL("ALTER SEQUENCE {} OWNED BY {}").format(
                seq.sequence.ident, sql.Identifier(to_renamed.schema, to_renamed.name, seq.column)))
            # A serial widened to bigint needs a bigint sequence, or inserts stop at 2^31 - 1.
            # (Never narrowed back on rollback: the original column rejects what it cannot hold.)
            seq_type, _ = introspect.sequence_limits(cur, seq.sequence)
            new_type = to_types.get(seq.column, "")
            if introspect.INTEGER_MAX.get(new_type, 0) > introspect.INTEGER_MAX.get(seq_type, 0):
                out.append(ddl.sequence_as(seq.sequence, new_type))
        elif seq.column in to_identity:
            # Capped at the receiving sequence's maximum: after a rollback from a widened column,
            # values beyond the original's range cannot be issued there anyway (the rows that hold
            # them are apply_error divergences), and the swap back must not fail on them.
            target_seq = str(to_identity[seq.column])
            out.append((sql.SQL("SELECT setval(%s::regclass, least(s.last_value, (SELECT seqmax FROM pg_sequence"
                                " WHERE seqrelid = %s::regclass)), s.is_called) FROM {} s").format(seq.sequence.ident),
                        (target_seq, target_seq)))
            out += _copy_sequence_grants(cur, seq.sequence, to_identity[seq.column])
            out += _swap_sequence_names(seq.sequence, to_identity[seq.column])
    return out


def _copy_sequence_grants(cur: psycopg.Cursor, from_seq: names.QualifiedName,
                          to_seq: names.QualifiedName) -> list[Statement]:
    """With the name goes what the application may do with it (currval() needs USAGE or SELECT)."""
    cur.execute("SELECT CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END, a.privilege_type,"
                " a.is_grantable FROM pg_class c, aclexplode(c.relacl) a"
                " WHERE c.oid = %s::regclass AND a.grantee <> c.relowner", (str(from_seq),))
    return [ddl.grant_on_sequence(to_seq, privilege, role, grantable) for role, privilege, grantable in cur.fetchall()]


def _swap_sequence_names(a: names.QualifiedName, b: names.QualifiedName) -> list[Statement]:
    """The application names the identity sequence (currval('t_id_seq')): the table that takes the
    name takes the sequence's name too. Renames are catalog-only, inside the swap's lock."""
    if a == b or a.schema != b.schema:
        return []
    parking = names.derived(a.name, "_mover_swap")
    return [sql.SQL("ALTER SEQUENCE {} RENAME TO {}").format(a.ident, sql.Identifier(parking)),
            sql.SQL("ALTER SEQUENCE {} RENAME TO {}").format(b.ident, sql.Identifier(a.name)),
            sql.SQL("ALTER SEQUENCE {} RENAME TO {}").format(names.QualifiedName(a.schema, parking).ident,
                                                             sql.Identifier(b.name))]


def _carry_unvalidated_constraints(cur: psycopg.Cursor, from_table: names.QualifiedName,
                                   to_table: names.QualifiedName) -> list[Statement]:
    """CHECK constraints the source has NOT VALID (and, on PostgreSQL 18, NOT NULL constraints
    NOT VALID, and CHECKs NOT ENFORCED) were left off the new table so the backfill could copy the
    rows that break them (steps/create_target.py); they are added as they were now (NOT VALID: no
    scan, under the lock already held), so writes after the swap are checked as before."""
    from_oid, to_oid = introspect.table_oid(cur, from_table), introspect.table_oid(cur, to_table)
    assert from_oid is not None and to_oid is not None  # both locked by the swap
    cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s", (to_oid,))
    present = {r[0] for r in cur.fetchall()}
    out: list[Statement] = []
    for name, definition, comment in introspect.unvalidated_constraints(cur, from_oid):
        if name not in present:
            out.append(ddl.add_constraint(to_table, name, definition))
            if comment is not None:
                out.append(ddl.comment_on_constraint(to_table, name, comment))
    return out


def swap_plan(cur: psycopg.Cursor, ctx: Context, *, forward: bool) -> tuple[list[Statement], carry.Carried]:
    """The DDL of the swap (forward) or the swap back, all of it read from the catalog before any
    of it runs: what `plan check` prints is what the swap executes. The live table gives up the
    name, its capture and the application's objects (mover/engines/swap/carry.py); the other takes the name,
    the sequences, those objects and the capture the other way."""
    m = ctx.migration
    if forward:
        live, other, live_renamed = m.source, m.target, m.old
    else:
        live, other, live_renamed = m.source, m.old, m.target
    from_wal = logical.enabled(ctx)  # the forward capture logical: its publication goes, or comes back
    out: list[Statement] = list(changelog.remove_sql(cur, ctx.mid, live, reverse=not forward, logical_capture=from_wal))
    if forward:
        out += _carry_unvalidated_constraints(cur, m.source, m.target)
    carried = carry.carry_sql(cur, ctx, live, other, m.source, forward=forward)
    # Before carry's: they name indexes as they are now (the replica identity's follows its index
    # through carry's renames).
    out += metadata.swap_sql(cur, live, other)
    out += carried.before
    partitions = source_tree.swap_names(cur, live, other, forward=forward)  # a partitioned table's
    out += [ddl.rename_table(live, live_renamed.name), ddl.rename_table(other, m.source.name), *partitions.statements]
    out += _hand_over_sequences(cur, live, other, m.source)
    out += carried.after
    out += changelog.install_sql(cur, ctx.mid, other, tuple(m.key_columns), m.name, reverse=forward, renamed=m.source,
                                 partition_names=partitions.taken, logical_capture=from_wal)
    return out, carried


def swap_sql(cur: psycopg.Cursor, ctx: Context, *, forward: bool) -> list[Statement]:
    return swap_plan(cur, ctx, forward=forward)[0]


def _swap_tables(ctx: Context, forward: bool) -> list[names.QualifiedName]:
    """The live table first, then the other: the order the swap locks them in."""
    return [ctx.original, ctx.new] if forward else [ctx.new, ctx.original]


@dataclass
class Prepared:
    """What the swap runs, read before its lock: the statements, the parity description of the live
    table, the drain's column mapping (both shapes checked). The digest of the catalog rows all of
    them are built from (`digest`, every table's) is read before them; the lock only checks it."""

    stmts: list[Statement]
    carried: carry.Carried
    parity_before: dict[str, Any]
    oids: tuple[int, int]  # (original, new), whatever they are named
    mapping: Mapping  # built after both tables' shapes were checked against the recorded ones
    key_index: str
    prepare_ms: float = 0.0
    attempts: int = 0  # at the lock, each after a drain (drain_before_lock)
    snapshots: snapshots.Waits = field(default_factory=snapshots.Waits)  # waited for across the attempts


def prepare(ctx: Context, *, forward: bool) -> Prepared:
    """Before the lock: reading the catalog is most of the swap's work, done here so that the lock
    only compares one digest (and rebuilds, under the lock, on the rare change in between)."""
    started = time.monotonic()
    prepared = ctx.db.transaction(lambda cur: _prepare(cur, ctx, forward), label="cutover statements")
    prepared.prepare_ms = (time.monotonic() - started) * 1000
    return prepared


def _prepare(cur: psycopg.Cursor, ctx: Context, forward: bool) -> Prepared:
    # The caller read the digest first (steps/cutover.py): a change committed after it, while this
    # is read, changes the digest the lock reads, so nothing read here can be newer than the digest
    # says and still be used.
    refuse_identity_bound(cur, ctx, forward)  # after the digest: one made meanwhile changes it (invariant 15)
    mapping = ctx.mapping(cur, reverse=not forward)  # ShapeChanged now rather than under the lock
    stmts, carried = swap_plan(cur, ctx, forward=forward)
    original, new = parity.oids(cur, ctx.mid)
    assert new is not None  # the swap runs after create_target
    return Prepared(stmts=stmts, carried=carried, parity_before=parity.live_description(cur, ctx.mid, forward),
                    oids=(original, new), mapping=mapping, key_index=introspect.describe(cur, ctx.original).key_index)


def refuse_identity_bound(cur: psycopg.Cursor, ctx: Context, forward: bool) -> None:
    """Invariant 15: what is bound to the live table's oid or row type and the swap does not carry
    (mover/catalog/identity.py) refuses the swap, named with its fix (exit 3)."""
    live = _swap_tables(ctx, forward)[0]
    oid = introspect.table_oid(cur, live)
    assert oid is not None  # the live table carries the name
    identity.refuse_bound(cur, oid, "cutover" if forward else "rollback",
                          f"`mover {'cutover' if forward else 'rollback'} {ctx.migration.name}` again")


def swap_locks(cur: psycopg.Cursor, tables: Sequence[Context], forward: bool) -> list[QualifiedName]:
    """What the swap of `tables` locks, in this order (ACCESS EXCLUSIVE, one at a time, those that
    exist): the live tables, referenced ones first (keys.parents_first); the other side's, in the
    same order; the other tables the swap changes (referencing tables outside the migration,
    views); then mover's own (the logs and notes the swap drops) -- after the live tables, as the
    application's writers take them before the log."""
    ordered = keys.parents_first(cur, tables)
    live = [_swap_tables(t, forward)[0] for t in ordered]
    other = [_swap_tables(t, forward)[1] for t in ordered]
    outside = [x for table in live for x in carry.also_locked(cur, table)]
    own = [x for t in ordered for x in lockwatch.own_tables(t.mid)]
    return list(dict.fromkeys([*live, *other, *outside, *own]))


def digest(cur: psycopg.Cursor, tables: Sequence[Context], forward: bool) -> str:
    """One digest of the catalog rows every table's swap statements, parity description and shapes
    are built from (carry.SWAP_INPUTS over all the tables, one query): read before the lock before
    any table's statements, and once under it."""
    return carry.catalog_digest(cur, [x for t in tables for x in _swap_tables(t, forward)])


def drain_before_lock(ctx: Context, tables: Sequence[Context], prepared: Sequence[Prepared]) -> None:
    """Before each attempt at the swap's lock, outside it: what arrived while the statements were
    read, or while the last attempt waited for its lock, drained so that the lock's own drain is
    small. In passes, since writes go on during each: until one finds few changes. A row it could
    not apply is a divergence: refused as the preflight refuses (under the lock, one would be
    refused by Unapplied). The head's drain replays every table's log (changelog.drain). Counts
    the attempt in each of `prepared` (the swap records which attempt it was)."""
    for p in prepared:
        p.attempts += 1
    for _ in range(PRE_LOCK_PASSES):
        if changelog.drain(ctx, reverse=False, backfill_done=True).log_rows < PRE_LOCK_ENOUGH:
            break
    counts = ctx.db.transaction(lambda cur: [(control.open_divergences(cur, t.mid), integrity.bypassed_note(cur, t.mid))
                                             for t in tables], label="cutover divergences")
    for t, (n, note) in zip(tables, counts, strict=True):
        if n:
            raise Waiting(f"migration {t.migration.name!r} has {n} unresolved divergences; cutover refused{note}",
                          hint=f"see them with `mover divergences {t.migration.name}`")
    # Invariant 16: no transaction whose snapshot predates the last drain meets the new table by name.
    snapshots.settle(ctx, prepared[0].snapshots, lambda: changelog.drain(ctx, reverse=False, backfill_done=True),
                     what="swap in", retry=f"mover cutover {ctx.migration.name}")


def drain_before_swap_back(ctx: Context, tables: Sequence[Context], prepared: Sequence[Prepared],
                           command: str = "rollback") -> None:
    """Before each attempt at the rollback's lock, outside it: the reverse logs drained (what arrived
    while the last attempt waited), then no transaction whose snapshot predates that drain left to
    meet the old table by name (invariant 16). A row the old table rejects is left to the lock's
    drain, which refuses it (invariant 9). Counts the attempt in each of `prepared`."""
    for p in prepared:
        p.attempts += 1

    def drain() -> None:
        for t in tables:
            changelog.drain(t, reverse=True, backfill_done=True)
    drain()
    snapshots.settle(ctx, prepared[0].snapshots, drain, what="swap back", retry=f"mover {command} {ctx.migration.name}")


def refuse_rows_only_in_new(ctx: Context, give_up_rows: bool, command: str) -> None:
    """Before the swap back: the reverse log drained, and a refusal before taking the lock when
    rows are known to exist only in the new table (invariant 9)."""
    changelog.drain(ctx, reverse=True, backfill_done=True)
    left = ctx.db.transaction(lambda cur: retry_unapplied(cur, ctx, reverse=True), label="rollback check")
    if left and not give_up_rows:
        raise refuse_losing(ctx, left, command, "new")


class Swap:
    """One attempt of the swap's (or the swap back's) transaction, in its phases: the cutover step
    (mover/steps/cutover.py) calls them in order inside one transaction that lockwatch.run_locked
    retries whole. Each phase is timed: where the lock's time goes is in the cutover event."""

    def __init__(self, cur: psycopg.Cursor, ctx: Context, prepared: Prepared, *, forward: bool,
                 give_up_rows: bool = False, command: str = "rollback", flusher: logical.Flusher | None = None):
        self.cur, self.ctx, self.prepared, self.forward = cur, ctx, prepared, forward
        self.give_up_rows, self.command = give_up_rows, command
        self.flusher = flusher  # logical capture, forward: the second session that flushes the WAL
        self.fed: dict[str, Any] = {}  # what the feed under the lock read, and how long it took
        self.stmts, self.carried, self.parity_before = prepared.stmts, prepared.carried, prepared.parity_before
        self.rebuilt = False
        self.drained = 0  # changes applied under the lock: what a follower (mover/runner/follow.py) keeps small
        self.trips = 0
        self.marks: dict[str, float] = {}

    def _mark(self, phase: str) -> None:
        self.marks[phase] = time.monotonic()

    def lock(self, relations: Sequence[QualifiedName]) -> None:
        """The lease, then every lock, one relation at a time in swap_locks' order (lockwatch.lock_all
        names the one waited on): each is waited for under lock_timeout before anything else. The
        first table's Swap is given every table's relations; the others', none."""
        m, cur = self.ctx.migration, self.cur
        control.guard(cur, self.ctx.mid, m.step, self.ctx.owner)
        if self.flusher is not None:
            # Before the tables, as every feeder takes it before the change log: no feed is under way
            # while the lock's own reads the slot, and none waits on a table the swap holds.
            logical.lock_feeder(cur, self.ctx.mid)
        lockwatch.lock_all(cur, relations)
        self._mark("locked")

    def verify(self, changed: bool) -> None:
        """The digest of the catalog rows everything was built from (invariant 7, race 8): equal, the
        shapes checked, the statements and the parity description built before the lock stand.
        `changed`: whether one digest of every table's catalog rows (digest), read before any of
        their statements, differs now."""
        self.rebuilt = changed
        self._mark("verified")

    def verify_capture(self) -> None:
        """Invariant 14: the capture whose log this swap drains last was continuously in force since
        mover last verified it, and no gap of it is uncovered; else integrity.Bypassed, and the
        swap rolls back (the caller records the gap and refuses)."""
        integrity.require(self.cur, self.ctx, reverse=not self.forward)

    def mapping(self) -> Mapping:
        """The drain's column mapping under the lock."""
        if self.rebuilt:
            # ctx.mapping checks both tables' shapes under the lock: a change committed since the
            # preparation aborts the swap with ShapeChanged, and nothing is swapped.
            return self.ctx.mapping(self.cur, reverse=not self.forward)
        # The digest covers every catalog row the shapes are described from (carry.SWAP_INPUTS):
        # equal, the shapes are those checked when the mapping was built, before the lock.
        return self.prepared.mapping

    def drain(self, replayed: int | None = None) -> None:
        """Everything logged so far committed before our lock: drain it all (race 4). A change that
        cannot be applied rolls the whole swap back (forward: Unapplied); swapping back, a row the
        old table still rejects exists only in the new one (invariant 9): refused, or given up.
        `replayed`: several tables' logs were replayed already, in one statement (drain_locked),
        these changes among them; what is left is the refusal."""
        cur, ctx = self.cur, self.ctx
        failures: dict[str, Any] = {}
        if replayed is not None:
            self.drained = replayed
        else:
            mapping = self.mapping()
            if self.flusher is not None:
                # Race 4 with logical capture (invariant 13): every change committed before the lock
                # ends before the WAL insert position read now; the WAL is flushed to it from the
                # second session and the slot read to it, into the log drained next.
                self.fed = logical.feed_in(cur, ctx, self.flusher,
                                           logical.Source(self.prepared.oids[0], mapping.key, mapping.src_key_types))
                faults.point("swap:fed")
            while True:
                got = changelog.apply_batch(cur, ctx, mapping, reverse=not self.forward, backfill_done=True,
                                          wait_for_lock=True, limit=DRAIN_BATCH)
                failures.update(got.failures)
                self.drained += got.claimed
                # Fewer log rows than asked for: the log is empty, and stays so (no write reaches the
                # locked table, and the applier lock keeps other appliers out): no empty batch after.
                if got.log_rows < DRAIN_BATCH:
                    break
        if self.forward and failures:
            raise Unapplied(failures)
        if not self.forward:
            # What the replay failed on earlier may go through now; what still fails exists only
            # in the new table, which the swap back would leave behind.
            left = retry_unapplied(cur, ctx, reverse=True)
            if left and not self.give_up_rows:
                raise Unapplied({}, left)
            give_up(cur, ctx, left, self.command)
        self._mark("drained")

    def rebuild(self) -> None:
        """Only when the digest changed: never run statements built from a stale catalog, nor
        compare with a stale description. Under the lock nothing they read can change again, so one
        rebuild is the last."""
        if self.rebuilt:
            refuse_identity_bound(self.cur, self.ctx, self.forward)  # one made since the preparation
            self.stmts, self.carried = swap_plan(self.cur, self.ctx, forward=self.forward)
            self.parity_before = parity.live_description(self.cur, self.ctx.mid, self.forward)
        self._mark("read")

    def execute(self) -> None:
        """The swap's statements (swap_plan: the capture off the live table, the application's objects
        off it, the renames, the sequences, the objects onto the other table, the capture the other
        way), runs without parameters sent as one query; the foreign keys the carry added NOT VALID
        recorded for their validation after the lock."""
        self.trips = execute_batched(self.cur, self.stmts)
        self._mark("ddl")
        carry.record_validation(self.cur, self.ctx, self.carried.to_validate, self.carried.to_attach)

    def check_parity(self, described: dict[int, dict[str, Any]] | None = None) -> None:
        """Both tables in one query: the one that now carries the name must look to the application
        as the other did (an unplanned difference rolls the swap back), and both shapes are recorded
        again (only the names changed; the shapes are those checked, the lock is held).
        `described`: every table of the swap described in that one query."""
        cur, ctx = self.cur, self.ctx
        original, new = self.prepared.oids
        now = described if described is not None else shape.describe(cur, [original, new])
        parity.check_swap(cur, ctx, self.parity_before, self.prepared.key_index, forward=self.forward,
                          after_shape=now[new if self.forward else original])
        shape.store(cur, ctx.mid, "source", now[original])
        shape.store(cur, ctx.mid, "target", now[new])
        self._mark("ran")

    def record(self) -> float:
        """The capture's path checked (a new log another role could write, by default privileges,
        refuses the swap instead of exposing the application's writes), then the transition with
        how long the lock was held and where that time went: the window opens (forward), or the
        migration is back before the gate with its reconcile ranges to verify again. Returns the
        lock's hold in ms."""
        cur, ctx, m = self.cur, self.ctx, self.ctx.migration
        privileges.require_capture_path(cur, names.capture_function(ctx.mid, self.forward),
                                        names.change_log(ctx.mid, self.forward), m.name)
        if not self.forward and logical.enabled(ctx):
            logical.require_slot(cur, ctx.mid)  # made before the lock (logical.preparing_back): still there
        integrity.handed_over(cur, ctx, self.forward)  # the capture installed now is what drains verify next
        faults.point("swap:locked" if self.forward else "swap_back:locked")
        t = self.marks
        held_ms = (time.monotonic() - t["locked"]) * 1000
        phases = {**self.fed,  # logical capture's feed under the lock: feed_ms, flush_ms, decode_ms, ...
                  "verify_ms": (t["verified"] - t["locked"]) * 1000, "drain_ms": (t["drained"] - t["verified"]) * 1000,
                  "catalog_ms": (t["read"] - t["drained"]) * 1000, "ddl_ms": (t["ddl"] - t["read"]) * 1000,
                  "parity_ms": (t["ran"] - t["ddl"]) * 1000, "statements": len(self.stmts), "round_trips": self.trips,
                  "rebuilt": self.rebuilt, "prepare_ms": self.prepared.prepare_ms, "attempt": self.prepared.attempts,
                  "finish_ms": (time.monotonic() - t["ran"]) * 1000}  # the capture path check
        if self.forward:
            control.mark_swapped(cur, m, ctx.owner, lock_ms=held_ms, window_ms=ctx.plan.rollback.window_ms,
                                 detail={"lock_ms": held_ms, "drained": self.drained, **phases,
                                         **({"foreign_keys_not_carried": list(ctx.plan.drop_foreign_keys)}
                                            if ctx.plan.drop_foreign_keys else {})})
        else:
            control.mark_swapped_back(cur, m, ctx.owner, lock_ms=held_ms, attempt=self.prepared.attempts)
            ranges.reset(cur, ctx.mid, "reconcile")
        return held_ms


def run_locked(ctx: Context, tables: Sequence[Context], attempt: Callable[[psycopg.Cursor], float], *,
               forward: bool, command: str = "rollback", before_attempt: Callable[[], None] | None = None) -> float:
    """The swap's transaction under the lock discipline (mover/engines/swap/lockwatch.py: autovacuum
    paused on every table, blocking sessions named, lock_timeout, attempts): returns how long the
    lock was held, in ms. Every relation the swap locks (swap_locks) is watched for blockers.
    `before_attempt` runs before each attempt, outside its transaction (drain_before_lock). The
    live tables are the ones the application writes in orders of its own: one an attempt timed out
    on is locked first by the next (race 9)."""
    m = ctx.migration
    locks = ctx.db.transaction(lambda cur: swap_locks(cur, tables, forward), label="tables the swap locks")
    live = [_swap_tables(t, forward)[0] for t in tables]
    both = live + [_swap_tables(t, forward)[1] for t in tables]

    def before() -> None:
        if before_attempt is not None:
            before_attempt()
        faults.point("swap:before_lock" if forward else "swap_back:before_lock")  # race 4's gap, at its widest

    try:
        return lockwatch.run_locked(ctx, attempt, tables=both, what="swap in" if forward else "swap back",
                                    retry=f"mover {'cutover' if forward else command} {m.name}",
                                    label="cutover" if forward else "rollback",
                                    statement_timeout=LOCK_STATEMENT_TIMEOUT,
                                    extra_tables=[x for x in locks if x not in both], before_attempt=before,
                                    learn_order=live)
    finally:
        for t in tables:
            t._mappings.clear()  # the tables changed names (or may have)


def drain_locked(cur: psycopg.Cursor, ctx: Context, swaps: Sequence[Swap], forward: bool) -> int:
    """Under the swap's lock: every log of the direction, all of it (race 4, race 5). One table's in
    batches (Swap.drain, logical capture fed first); several tables' in one statement (the keys
    between them checked at its end, with each table's mapping as its Swap holds it), each table's
    refusal after it. Forward, a change that fails rolls the whole swap back (Unapplied); swapping
    back, what fails is left to each table's own refusal (rows only in the new table). Returns the
    changes applied."""
    if len(swaps) == 1:
        swaps[0].drain()
        return swaps[0].drained
    got = changelog.apply_family_batch(cur, ctx, reverse=not forward, limit=None, wait_for_lock=True,
                                       copied=[(s.ctx, s.mapping()) for s in swaps])
    if forward and got.failures:
        raise Unapplied(dict(got.failures))
    for i, s in enumerate(swaps):
        s.drain(got.claimed if i == 0 else 0)
    return got.claimed


TOGETHER_PHASES = ("verify_ms", "drain_ms", "catalog_ms", "ddl_ms", "parity_ms", "finish_ms")


def record_together(cur: psycopg.Cursor, ctx: Context, swaps: Sequence[Swap], forward: bool, held: float,
                    replayed: int, marks: Sequence[float]) -> None:
    """Several tables swapped in one transaction: the lock's hold split into its phases, each over
    every table (each table's own transition records its share from its own marks, which
    interleave), as an event on the head's row in the swap's transaction. `marks`: locked,
    verified, drained, read, ddl, ran (monotonic). One table's transition says it all."""
    if len(swaps) < 2:
        return
    ends = [*marks[1:], time.monotonic()]
    phases = {name: (end - start) * 1000 for name, start, end in zip(TOGETHER_PHASES, marks, ends, strict=True)}
    kind = "family_swapped" if forward else "family_swapped_back"
    control.event(cur, ctx.mid, ctx.owner, ctx.migration.step, kind,
                  f"{'swapped' if forward else 'swapped back'} {len(swaps)} tables in one transaction; "
                  f"lock held {held:.1f} ms",
                  {"lock_ms": held, "drained": replayed, "attempt": swaps[0].prepared.attempts, **phases}, held)


def refused(ctx: Context, tables: Sequence[Context], exc: Unapplied, *, forward: bool,
            command: str = "rollback") -> Waiting:
    """After a swap rolled back on changes it could not apply under its lock: replayed outside the
    lock to record them as divergences; the refusal to raise."""
    m = ctx.migration
    if forward:
        changelog.drain(ctx, reverse=False, backfill_done=True)
        return Waiting(f"{len(exc.failures)} changes to {m.source} could not be applied to {m.target} under the "
                       f"cutover's lock ({exc.describe()}); nothing was swapped",
                       hint=f"see `mover divergences {m.name}`; `mover repair {m.name}` once the rows fit")
    for t in tables:
        changelog.drain(t, reverse=True, backfill_done=True)
    for t in tables:
        left = ctx.db.transaction(bind(rows_only_on, t, "new"))
        if left:
            return refuse_losing(t, left, command, "new")
    return refuse_losing(ctx, exc.rows, command, "new")


def finish(ctx: Context, held: float, *, forward: bool, report: bool = True) -> None:
    """After the commit: say how long the lock was held (once for a family: `report`), then
    VALIDATE the foreign keys the swap added NOT VALID, with writes going on (after a crash: the
    window's run, or the next cutover's preflight, resumes it). With logical capture the slot goes
    now: the swap dropped its publication and feed state, a slot is not transactional (a crash
    before this leaves it to logical.cleanup)."""
    ctx.refresh()
    if forward and logical.enabled(ctx):
        faults.point("swap:before_slot_drop")
        logical.drop_slot(ctx.db, ctx.mid)
    if report:
        ctx.report("cutover" if forward else "rolled_back", lock_ms=round(held, 1))
    carry.validate(ctx)


def retire_sql(cur: psycopg.Cursor, ctx: Context) -> list[Statement]:
    """What retire drops: the reverse capture on the live table, what is left of the forward one,
    and the old table unless [rollback] keep_old (then what would still tie it to the live schema)."""
    m = ctx.migration
    out: list[Statement] = [*changelog.remove_sql(cur, ctx.mid, m.source, reverse=True),
                            *changelog.remove_sql(cur, ctx.mid, None, reverse=False,
                                                logical_capture=logical.enabled(ctx))]
    if not ctx.plan.rollback.keep_old:
        out.append(ddl.drop_table(m.old))
    else:
        out += inert_old_sql(cur, m.old)
    return out


def inert_old_sql(cur: psycopg.Cursor, old: names.QualifiedName) -> list[Statement]:
    """A kept old table becomes a plain copy that nothing of the application depends on and that
    acts on nothing: the swap already moved its triggers, rules, policies, row security, views and
    foreign keys to the live table; what can be left is dropped here: its own foreign keys (those
    [target] drop_foreign_keys left on it: they would block, or cascade into it, the application's
    deletes of parent rows) and the column defaults that draw from a sequence it does not own (the
    serial sequence went to the live table: an insert into the copy would consume the live
    table's keys, and the live table could not be dropped without CASCADE)."""
    oid = introspect.table_oid(cur, old)
    if oid is None:
        return []
    cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s AND contype = 'f' ORDER BY 1", (oid,))
    out: list[Statement] = [sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(old.ident, sql.Identifier(r[0]))
                            for r in cur.fetchall()]
    cur.execute("""
        SELECT DISTINCT a.attname FROM pg_attrdef d
        JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        JOIN pg_depend dep ON dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid
                          AND dep.refclassid = 'pg_class'::regclass
        JOIN pg_class s ON s.oid = dep.refobjid AND s.relkind = 'S'
        WHERE d.adrelid = %(oid)s AND NOT EXISTS (
            SELECT 1 FROM pg_depend o WHERE o.classid = 'pg_class'::regclass AND o.objid = s.oid
               AND o.refclassid = 'pg_class'::regclass AND o.refobjid = %(oid)s AND o.deptype IN ('a', 'i'))
        ORDER BY 1""", {"oid": oid})
    out += [sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(old.ident, sql.Identifier(r[0]))
            for r in cur.fetchall()]
    return out


@contextlib.contextmanager
def dependents_named(ctx: Context, command: str) -> Iterator[None]:
    """The last resort behind identity.refuse_blocking: a drop PostgreSQL still refuses over a
    dependent object (2BP01) is said as mover says it, never passed through raw."""
    try:
        yield
    except psycopg.errors.DependentObjectsStillExist as exc:
        detail = (exc.diag.message_detail or "").replace("\n", "; ")
        raise identity.IdentityBound(
            f"{command} refused: {exc.diag.message_primary}: {detail} (nothing was dropped)",
            hint=f"drop or change each object named (docs/operating.md \"Objects bound to the table's identity\"),"
                 f" then `mover {command} {ctx.migration.name}` again") from None


def retire_locks(ctx: Context) -> list[QualifiedName]:
    """What retire locks first (ACCESS EXCLUSIVE, those that exist), each named if it waits: the
    live table, the old one unless kept, the migration's logs and notes."""
    m = ctx.migration
    return [m.source, *([] if ctx.plan.rollback.keep_old else [m.old]), *lockwatch.own_tables(ctx.mid)]


def retire(ctx: Context, tables: Sequence[Context], give_up_rows: bool = False) -> None:
    """The retire of every table, top to bottom, in one transaction under the lock discipline: the
    leases, the locks (each table's retire_locks, by role across the tables), a refusal while rows
    exist only in an old table it would drop (invariant 9), the drops (retire_sql, what `plan
    check` prints), referencing tables first (a key between them refuses the drop of its parent),
    every table done."""
    keep = ctx.plan.rollback.keep_old

    def drop(cur: psycopg.Cursor) -> None:
        for t in tables:
            control.guard(cur, t.mid, "retire", t.owner)
            if logical.enabled(t):
                logical.lock_feeder(cur, t.mid)  # before the tables, as the feeders take it
        ordered = keys.parents_first(cur, tables)
        lockwatch.lock_all(cur, _by_role([retire_locks(t) for t in ordered]))
        if not keep:  # rows the new tables never took exist only in the old ones, about to go
            _before_drops(cur, ctx, tables, "retire", "original", [t.migration.old for t in tables], give_up_rows)
        with dependents_named(ctx, "retire"):
            for t in reversed(ordered):
                execute_all(cur, retire_sql(cur, t))
        for t in tables:
            old = f"kept as {t.migration.old}" if keep else "dropped"
            control.mark_retired(cur, t.migration, t.owner, message=f"retired; old table {old}")
        faults.point("retire:dropped")  # every table's drops and transitions, not committed: none retired

    # Dropping the trigger locks the live table: as briefly as the swap, with the same discipline.
    live = [t.migration.source for t in tables]
    lockwatch.run_locked(ctx, drop, tables=[*live, *(t.migration.old for t in tables)], what="retire",
                         retry=f"mover retire {ctx.migration.name}", label="retire",
                         extra_tables=[x for t in tables for x in lockwatch.own_tables(t.mid)], learn_order=live)
    for t in tables:
        if logical.enabled(t):
            logical.drop_slot(t.db, t.mid)  # gone at the cutover already, unless a crash came before
        t.refresh()


def abort_sql(cur: psycopg.Cursor, ctx: Context) -> list[Statement]:
    """What abort drops (before the swap, or after swapping back): the capture and the new table."""
    m = ctx.migration
    # Under its current name: a source renamed during the migration keeps no capture trigger.
    live = shape.current_name(cur, ctx.mid, "source") or m.source
    return [*changelog.remove_sql(cur, ctx.mid, live, reverse=False, logical_capture=logical.enabled(ctx)),
            ddl.drop_table(m.target)]


def abort(ctx: Context, tables: Sequence[Context], give_up_rows: bool = False) -> None:
    """The abort of every table, top to bottom, in one transaction under the lock discipline: the
    locks, a refusal while rows exist only in a target it drops (invariant 9), the drops
    (abort_sql), referencing tables first (their targets hold keys to the others'), the ranges
    forgotten, every table aborted."""
    def live_of(cur: psycopg.Cursor, t: Context) -> QualifiedName:
        # Under its current name: a source renamed during the migration keeps no capture trigger.
        return shape.current_name(cur, t.mid, "source") or t.migration.source

    def undo(cur: psycopg.Cursor) -> None:
        for t in tables:
            if logical.enabled(t):
                logical.lock_feeder(cur, t.mid)  # before the tables, as the feeders take it
        ordered = keys.parents_first(cur, tables)
        lockwatch.lock_all(cur, _by_role([[live_of(cur, t), t.migration.target, *lockwatch.own_tables(t.mid)]
                                          for t in ordered]))  # each named if it waits
        # Rows a rolled-back window left only in a new table (a rollback that gave up nothing
        # cannot leave any; an older release could): dropping the new table would lose them.
        _before_drops(cur, ctx, tables, "abort", "new", [t.migration.target for t in tables], give_up_rows)
        with dependents_named(ctx, "abort"):
            for t in reversed(ordered):
                execute_all(cur, abort_sql(cur, t))
                ranges.reset(cur, t.mid, "backfill")
                ranges.reset(cur, t.mid, "reconcile")
        for t in tables:
            control.mark_aborted(cur, t.migration, t.owner)
        faults.point("abort:dropped")  # every table's drops and transitions, not committed: none aborted

    # Dropping the trigger locks the live table: as briefly as the swap, with the same discipline.
    live = ctx.db.transaction(lambda cur: [live_of(cur, t) for t in tables], label="tables abort locks")
    lockwatch.run_locked(ctx, undo, tables=[*live, *(t.migration.target for t in tables)], what="abort",
                         retry=f"mover abort {ctx.migration.name}", label="abort",
                         extra_tables=[x for t in tables for x in lockwatch.own_tables(t.mid)], learn_order=live)
    for t in tables:
        if logical.enabled(t):
            faults.point("abort:before_slot_drop")
            logical.drop_slot(t.db, t.mid)  # not transactional: after the drop of what uses it
        t.refresh()


def _before_drops(cur: psycopg.Cursor, ctx: Context, tables: Sequence[Context], command: str, side: str,
                  dropped: Sequence[QualifiedName], give_up_rows: bool) -> None:
    """Before retire's or abort's drops, in their transaction: rows that exist only on the `side`
    dropped refuse (invariant 9), or are given up with --give-up-rows; what PostgreSQL would
    refuse a drop over (2BP01) is named with its fix instead (invariant 15), the keys between the
    tables dropped together aside."""
    for t in tables:
        left = rows_only_on(cur, t, side)
        if left and not give_up_rows:
            raise refuse_losing(t, left, command, side)
        give_up(cur, t, left, command)
    oids = [oid for table in dropped if (oid := introspect.table_oid(cur, table)) is not None]
    for oid in oids:
        identity.refuse_blocking(cur, oid, command, f"`mover {command} {ctx.migration.name}` again", dropped=oids)


def _by_role(per_table: list[list[QualifiedName]]) -> list[QualifiedName]:
    """Each table's locks (its live table, its other, its logs), taken by role across the tables:
    every table's first, then every table's second..., in the tables' order (the live tables
    before the others, as the swap takes them)."""
    width = max((len(x) for x in per_table), default=0)
    return list(dict.fromkeys(x[i] for i in range(width) for x in per_table if i < len(x)))
