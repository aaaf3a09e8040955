"""Capture engine: install and remove the change-log trigger, apply the log by state.

Invariants:
- The trigger only appends keys; it cannot fail on the application's data (invariant 3).
- A logged key is replayed only once the backfill range covering it is done; otherwise a range
  still copying from an older snapshot could insert a row the replay already deleted (race 1).
- One applier at a time per migration and direction (a transaction-scoped advisory lock), so
  two replays of one key from different snapshots cannot commit out of order (race 2).
- A batch the target's unique indexes or exclusion constraints reject though the source never
  held such a state (rows that swapped a unique value, a booking moved into a slot another left:
  race 7) is replayed as the closure of the keys involved, computed and replaced in one
  statement, in one savepoint (replay_set).
- A replay that fails on data (overflow, constraint) does not stop the others: the key becomes
  a recorded divergence, and cutover refuses until it is resolved.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from mover import names
from mover.catalog import family as family_catalog
from mover.catalog import introspect, partition_tree, privileges, reading
from mover.db import one
from mover.engines.capture import integrity, logical
from mover.engines.context import Context
from mover.errors import PlanError
from mover.sql import capture as q
from mover.sql import trusted
from mover.sql.copy import covered_by
from mover.sql.mapping import Mapping, named_bound, refusal
from mover.state import control, ranges

log = logging.getLogger("mover.capture")

BATCH = 5000


def key_equality(cur: psycopg.Cursor, info: introspect.TableInfo, key: tuple[str, ...]) -> tuple[str, ...]:
    """The schema of each key column's equality operator, from the operator class of the table's
    key index (the one that decides which rows are one key). Refused if it is not named `=`."""
    cur.execute(q.key_equality(), {"table": info.oid, "index": info.key_index, "columns": list(key)})
    found = {r[0]: (r[1], r[2]) for r in cur.fetchall()}
    out = []
    for k in key:
        schema, op = found.get(k, ("pg_catalog", "="))
        if op != "=":
            raise PlanError(f"the key column {k!r} of {info.name} compares with operator {schema}.{op}, not `=`; the "
                            "capture trigger cannot name it", hint="use a key whose operator class's equality is `=`")
        out.append(schema)
    return tuple(out)


def install_sql(cur: psycopg.Cursor, mid: int, table: names.QualifiedName, key: tuple[str, ...],
                migration: str, reverse: bool = False, *, renamed: names.QualifiedName | None = None,
                partition_names: dict[names.QualifiedName, names.QualifiedName] | None = None,
                logical_capture: bool = False) -> list[sql.Composed]:
    """The statements that start capturing `table` into migration `mid`'s log (`table` read from
    the catalog now, the trigger created on `renamed` when a swap renames it first). With
    `logical_capture` (forward only: the reverse direction always uses the trigger), no row
    trigger: mover/engines/capture/logical.py feeds the log from the replication slot that logical.prepare()
    made before this transaction, and the TRUNCATE trigger alone stays, refusing a TRUNCATE.
    `partition_names`: the names the swap gives the table's partitions (source_tree.swap_names)."""
    partition_names = partition_names or {}
    info = introspect.describe(cur, table)
    table = renamed or table
    key_types = tuple(info.column(k).type for k in key)
    collations = tuple(info.column(k).collation for k in key)
    log_table = names.change_log(mid, reverse)
    fn = names.capture_function(mid, reverse)
    from_wal = logical_capture and not reverse
    trigger = names.capture_trigger(mid, reverse)
    # A partitioned table's partitions take its row trigger by themselves; a TRUNCATE of one of
    # them fires only its own statement triggers, so each gets the one that refuses it.
    partitions = [partition_names.get(p, p) for p in partition_tree.relations(cur, info.oid)]
    return [*q.create_log(log_table, key, key_types, collations),
            *q.create_trigger_function(fn, log_table, key, migration, key_equality(cur, info, key), reverse),
            *q.create_trigger(trigger, table, fn, rows=not from_wal),
            *[s for p in partitions for s in q.create_trigger(trigger, p, fn, rows=False)],
            *(logical.install_sql(cur, mid) if from_wal else [])]


def install(cur: psycopg.Cursor, mid: int, table: names.QualifiedName, key: tuple[str, ...], migration: str,
            reverse: bool = False, *, logical_capture: bool = False) -> None:
    for stmt in install_sql(cur, mid, table, key, migration, reverse, logical_capture=logical_capture):
        cur.execute(stmt)
    if logical_capture and not reverse:
        logical.require_slot(cur, mid)  # made by logical.prepare() before this transaction: still there
    # In the same transaction: a trigger that could not insert into its log refuses the install
    # (or the swap that installs the reverse capture), instead of failing the application's writes.
    privileges.require_capture_path(cur, names.capture_function(mid, reverse), names.change_log(mid, reverse),
                                    migration)


def _trigger_table(cur: psycopg.Cursor, fn: names.QualifiedName) -> names.QualifiedName | None:
    cur.execute("SELECT n.nspname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE t.tgfoid = to_regprocedure(%s) ORDER BY t.tgname LIMIT 1", (fn.ident.as_string(cur) + "()",))
    row = cur.fetchone()
    return names.QualifiedName(row[0], row[1]) if row else None


def upgrade_sql(cur: psycopg.Cursor, mid: int, key: tuple[str, ...], migration: str,
                reverse: bool = False) -> list[sql.Composed]:
    """A capture an older mover installed (a SECURITY INVOKER function, the log granted to PUBLIC:
    any role could forge log rows that failed the application's writes) brought to this design in
    place: the function replaced (CREATE OR REPLACE: no lock on the table, the next row a writer
    logs runs the new body), the log's grants revoked. Nothing when it already is, or is gone.
    The old log keeps its primary key on seq: with no role but its owner able to insert, nothing
    else can collide with it (dropping it would take an ACCESS EXCLUSIVE lock on the log)."""
    fn, log_table = names.capture_function(mid, reverse), names.change_log(mid, reverse)
    cur.execute("SELECT p.prosecdef, has_table_privilege('public', c.oid, 'INSERT')"
                " FROM pg_proc p, pg_class c WHERE p.oid = to_regprocedure(%s) AND c.oid = to_regclass(%s)",
                (fn.ident.as_string(cur) + "()", log_table.ident.as_string(cur)))
    row = cur.fetchone()
    table = _trigger_table(cur, fn) if row is not None and not (row[0] and not row[1]) else None
    if table is None:
        return []
    info = introspect.describe(cur, table)
    return [*q.create_trigger_function(fn, log_table, key, migration, key_equality(cur, info, key), reverse),
            q.revoke_log(log_table)]


def upgrade(ctx: Context) -> None:
    """On resume, each direction's capture of the migration brought to this design (upgrade_sql),
    checked as an install is, and recorded."""
    m = ctx.migration

    def go(cur: psycopg.Cursor) -> list[str]:
        done = []
        for reverse in (False, True):
            stmts = upgrade_sql(cur, m.id, tuple(m.key_columns), m.name, reverse)
            for stmt in stmts:
                cur.execute(stmt)
            if stmts:
                privileges.require_capture_path(cur, names.capture_function(m.id, reverse),
                                                names.change_log(m.id, reverse), m.name)
                done.append(str(names.capture_function(m.id, reverse)))
        if done:
            control.event(cur, m.id, ctx.owner, m.step, "capture_upgraded",
                          f"capture function(s) {', '.join(done)} replaced by SECURITY DEFINER ones; PUBLIC's"
                          " grants on the change log revoked", {"functions": done})
        return done

    done = ctx.db.transaction(go, label="upgrade capture")
    if done:
        ctx.report("capture_upgraded", functions=", ".join(done))


def remove_sql(cur: psycopg.Cursor, mid: int, table: names.QualifiedName | None,
               reverse: bool = False, *, logical_capture: bool = False) -> list[sql.Composed]:
    """The statements that stop capturing (`table` None when it is gone) and drop the log; with
    `logical_capture` (forward), mover's publication and feed state too (the slot is dropped after
    the transaction commits: logical.drop_slot)."""
    stmts = []
    if table is not None and introspect.exists(cur, table):
        trigger = names.capture_trigger(mid, reverse)
        stmts += [q.drop_trigger(trigger, table), q.drop_trigger(q.truncate_trigger(trigger), table)]
        oid = introspect.table_oid(cur, table)
        assert oid is not None
        stmts += [q.drop_trigger(q.truncate_trigger(trigger), p) for p in partition_tree.relations(cur, oid)]
    stmts += [q.drop_function(names.capture_function(mid, reverse)), q.drop_table(names.change_log(mid, reverse))]
    if not reverse:
        # Reconcile's notes of applied keys (mover/engines/bulk/reconcile.py) live and die with the forward log;
        # the log's drop took their trigger with it.
        stmts += [q.drop_table(names.applied_notes(mid)), q.drop_function(names.notes_function(mid))]
        if logical_capture:
            stmts += logical.remove_sql(mid)
    return stmts


def remove(cur: psycopg.Cursor, mid: int, table: names.QualifiedName | None, reverse: bool = False) -> None:
    for stmt in remove_sql(cur, mid, table, reverse):
        cur.execute(stmt)


@dataclass
class Applied:
    claimed: int = 0
    deleted: int = 0
    upserted: int = 0
    failed: int = 0
    failures: dict[tuple[Any, ...], str] = field(default_factory=dict)  # key -> the error that stopped its replay
    log_rows: int = 0  # log rows taken (claimed counts keys on the key-by-key path): fewer than asked, none left


def _lock_applier(cur: psycopg.Cursor, mid: int, reverse: bool, wait: bool) -> bool:
    fn = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    cur.execute(sql.SQL("SELECT {}(hashtext(%s), %s::int)").format(sql.Identifier(fn)),
                (control.APPLIER_LOCKS[1 if reverse else 0], mid))
    got = True if wait else bool(one(cur)[0])
    if got:
        # Whoever holds the applier lock writes the application's tables (replay, repair, adopt's
        # re-sync): from here on this transaction checks its constraints at once, deferrable ones
        # included. A DEFERRABLE INITIALLY DEFERRED unique index or foreign key would otherwise
        # queue its check to the COMMIT: the swap's DDL, in the same transaction after its drain,
        # then fails ("cannot ALTER TABLE ... because it has pending trigger events"), and a row
        # the constraint rejects raises at the COMMIT, past the savepoints that make it a
        # divergence (invariant 3). Checked at the end of each statement instead, a replay needs
        # nothing deferred: each one reaches the source's committed state, which satisfies them.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    return got


def lock_applier(cur: psycopg.Cursor, mid: int, reverse: bool) -> None:
    """Wait for the applier lock of one direction (transaction-scoped): no batch replays the same
    keys meanwhile from another snapshot (race 2)."""
    _lock_applier(cur, mid, reverse, wait=True)


def covered_condition(cur: psycopg.Cursor, ctx: Context, m: Mapping,
                      backfill_done: bool, name: str = "wm") -> tuple[sql.Composable, dict[str, Any]] | None:
    """Which log rows may be replayed now: all once the backfill is done, else the keys at or
    below the done prefix of the backfill's ranges; None when nothing is covered yet. `name`:
    the bound's parameters' (a statement replaying several logs names each apart)."""
    if backfill_done:
        return sql.SQL("true"), {}
    everything, hi = ranges.watermark(cur, ctx.mid, "backfill")
    if everything:
        return sql.SQL("true"), {}
    if hi is None:
        return None
    return covered_by("c", m, name), named_bound(name, hi)


# Planner settings a replay into a partitioned destination runs with (SET LOCAL, put back after
# it). Its unique key there is the source's key plus the partition columns, so no index says a
# key matches one row; with no statistics yet (the backfill is filling the partitions, nothing
# has analyzed them) the planner takes a lookup by the key alone to match thousands of rows, and
# hashes every partition and the whole source for each batch, a cost that grows with the table.
# A key matches at most one row per partition, and a batch is at most BATCH keys: nested loops
# driven by the keys (an index probe per partition and key) are the plan at any size. The same
# estimates price that plan above jit_above_cost: JIT then compiles the expressions of every
# partition for each batch, far longer than the plan runs. Measured by bench/partition.py (the
# replay explained mid-copy), figures in bench/README.md.
KEY_DRIVEN = (("enable_hashjoin", "off"), ("enable_mergejoin", "off"), ("jit", "off"))


def _drive_by_keys(cur: psycopg.Cursor, m: Mapping) -> list[tuple[str, str]]:
    """KEY_DRIVEN for the rest of the caller's transaction when `m`'s destination is partitioned;
    returns the settings to put back (a transaction or savepoint rolled back puts them back too)."""
    if not m.dst_partition:
        return []
    before = []
    for name, value in KEY_DRIVEN:
        cur.execute("SELECT current_setting(%s), set_config(%s, %s, true)", (name, name, value))
        before.append((name, one(cur)[0]))
    return before


def _put_back(cur: psycopg.Cursor, settings: list[tuple[str, str]]) -> None:
    for name, value in settings:
        cur.execute("SELECT set_config(%s, %s, true)", (name, value))


def apply_batch(cur: psycopg.Cursor, ctx: Context, m: Mapping, *, reverse: bool, backfill_done: bool,
                limit: int = BATCH, wait_for_lock: bool = False) -> Applied:
    """Replay up to `limit` logged changes inside the caller's transaction."""
    if not _lock_applier(cur, ctx.mid, reverse, wait_for_lock):
        return Applied()
    integrity.check(cur, ctx, reverse)  # invariant 14: the capture feeding this log still in force, continuously
    cond = covered_condition(cur, ctx, m, backfill_done)
    if cond is None:
        return Applied()
    settings = _drive_by_keys(cur, m)
    applied = _apply(cur, ctx, m, reverse, cond, limit, wait_for_lock)
    # Only when it returned: an error leaves the transaction (or the caller's savepoint) to be
    # rolled back, which puts the settings back with it.
    _put_back(cur, settings)
    return applied


# ---------------------------------------------------------------------------------------------
# A family's logs (issue 27), replayed together. The foreign keys between a family's tables are on
# both sides (mover/engines/swap/keys.py), so replaying one table's log alone could reach a state the
# other side's keys refuse though the application never wrote it: a child replayed before its new
# parent, a parent deleted before its children. All of the family's logs are replayed by one
# statement instead (q.replay_family): one snapshot of every source, and the keys checked once, at
# its end, against the state it reached. A batch of each log is not always a cut the keys hold
# (a child's new row in the batch, its parent's beyond it): a batch the keys refuse is replayed
# again with every logged row of every log, which is (one snapshot of sources whose keys hold).


def family_members(cur: psycopg.Cursor, ctx: Context, reverse: bool) -> list[tuple[Context, bool]]:
    """The tables of ctx's family whose log in this direction the applier may replay now, each with
    whether its backfill is done (a table still copying replays only the keys of its done ranges;
    one not yet copying, nothing)."""
    out = []
    for member in ctx.family(cur):
        m = member.migration
        if m.state == "aborted" or m.step in control.SETTING_UP or m.step == control.FINISHED:
            continue
        if not introspect.exists(cur, names.change_log(m.id, reverse)):
            continue
        out.append((member, m.step not in control.BUILDING))
    return out


def apply_family_batch(cur: psycopg.Cursor, ctx: Context, *, reverse: bool, limit: int | None = BATCH,
                       wait_for_lock: bool = False,
                       copied: Sequence[tuple[Context, Mapping]] | None = None) -> Applied:
    """Replay up to `limit` logged changes of each table of ctx's family (None: all of them) in the
    caller's transaction, as one statement; the appliers' locks of every table first, in id order
    (every family applier takes them in that order). A batch that fails on data otherwise than by
    the family's keys is replayed table by table, the referenced tables first, each as apply_batch
    would (key by key, a failing key a divergence). `copied`: the tables, with their mappings, when
    the caller knows them all copied and their mappings checked (the swap, under its lock: no
    catalog read beyond the replay's own)."""
    members = family_members(cur, ctx, reverse) if copied is None else [(t, True) for t, _ in copied]
    if not _lock_appliers(cur, sorted(t.mid for t, _ in members), reverse, wait_for_lock):
        return Applied()
    for member, _ in members:
        integrity.check(cur, member, reverse)  # invariant 14, for each table's capture
    given = {t.mid: m for t, m in copied or ()}
    parts = []
    params: dict[str, Any] = {}
    for i, (member, done) in enumerate(members):
        m = given.get(member.mid) or member.mapping(cur, reverse)
        cond = covered_condition(cur, member, m, done, name=f"wm{i}")
        if cond is not None:
            parts.append((member, m, cond[0]))
            params.update(cond[1])
    if not parts:
        return Applied()
    if len(parts) == 1:
        member, m, covered = parts[0]
        return _apply(cur, member, m, reverse, (covered, params), BATCH if limit is None else limit, wait_for_lock)
    if wait_for_lock:
        # Under the swap's lock most drains find every log empty: one probe instead of the statement.
        cur.execute(sql.SQL(" UNION ALL ").join(
            sql.SQL("(SELECT 1 FROM {} c WHERE {} LIMIT 1)").format(names.change_log(member.mid, reverse).ident,
                                                                   covered)
            for member, _, covered in parts), params)
        if cur.fetchone() is None:
            return Applied()
    settings: list[tuple[str, str]] = []
    for _, m, _ in parts:  # the values before the first change are those to put back
        settings = settings or _drive_by_keys(cur, m)
    logs = [(m, names.change_log(member.mid, reverse), covered) for member, m, covered in parts]
    stmt = trusted(q.replay_family(logs, skip_locked=not wait_for_lock).as_string(cur), "composed")
    for attempt_limit in dict.fromkeys([limit, None]):
        cur.execute("SAVEPOINT mover_family_replay")
        try:
            cur.execute(stmt, {**params, "limit": attempt_limit})
            row = one(cur)
            cur.execute("RELEASE SAVEPOINT mover_family_replay")
        except psycopg.errors.ForeignKeyViolation as exc:
            cur.execute("ROLLBACK TO SAVEPOINT mover_family_replay")
            log.info("the family's replay batch broke a foreign key between its tables (%s); every logged row "
                     "next", str(exc).splitlines()[0])
            continue
        except DATA_ERRORS as exc:
            cur.execute("ROLLBACK TO SAVEPOINT mover_family_replay")
            log.info("the family's replay batch failed on data (%s); replaying table by table", exc.sqlstate)
            break
        _put_back(cur, settings)
        total = Applied()
        for i, (member, _, _) in enumerate(parts):
            claimed, deleted, upserted = row[3 * i:3 * i + 3]
            _count(cur, member.mid, reverse, claimed)
            total.claimed += claimed
            total.deleted += deleted
            total.upserted += upserted
            total.log_rows = max(total.log_rows, claimed)
        return total
    _put_back(cur, settings)
    return _apply_each(cur, parts, params, reverse, limit, wait_for_lock)


def _lock_appliers(cur: psycopg.Cursor, mids: list[int], reverse: bool, wait: bool) -> bool:
    """_lock_applier of several migrations in one statement, in the order given (evaluated left to
    right); False when one of them is taken (those got meanwhile are held to the transaction's end)."""
    if len(mids) == 1:
        return _lock_applier(cur, mids[0], reverse, wait)
    fn = sql.Identifier("pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock")
    name = control.APPLIER_LOCKS[1 if reverse else 0]
    cur.execute(sql.SQL("SELECT {}").format(sql.SQL(", ").join(
        sql.SQL("{}(hashtext(%s), %s::int)").format(fn) for _ in mids)), [x for mid in mids for x in (name, mid)])
    got = wait or all(one(cur))
    if got:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # as _lock_applier says why
    return got


def _apply_each(cur: psycopg.Cursor, parts: list[tuple[Context, Mapping, sql.Composable]], params: dict[str, Any],
                reverse: bool, limit: int | None, wait_for_lock: bool) -> Applied:
    """The family's tables one by one, the referenced ones first (a parent's new row before its
    children's): the fallback of a batch that failed on a row's data."""
    oids = {introspect.table_oid(cur, m.dst) or 0: i for i, (_, m, _) in enumerate(parts)}
    order = family_catalog.parents_first(list(oids), family_catalog.between(cur, list(oids)))
    total = Applied()
    for oid in order:
        member, m, covered = parts[oids[oid]]
        got = _apply(cur, member, m, reverse, (covered, params), BATCH if limit is None else limit, wait_for_lock)
        total.claimed += got.claimed
        total.deleted += got.deleted
        total.upserted += got.upserted
        total.failed += got.failed
        total.failures.update(got.failures)
        total.log_rows = max(total.log_rows, got.log_rows)
    return total


def _apply(cur: psycopg.Cursor, ctx: Context, m: Mapping, reverse: bool,
           cond: tuple[sql.Composable, dict[str, Any]], limit: int, wait_for_lock: bool) -> Applied:
    covered, params = cond
    log_table = names.change_log(ctx.mid, reverse)
    # Most drains find the log empty (under the swap's lock; between reconcile ranges and in their
    # settle rounds): one index probe instead of the replay statement, which on a wide table
    # costs its parsing and planning (115 ms for 1600 columns, issue 34).
    cur.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} c WHERE {})").format(log_table.ident, covered), params)
    if not one(cur)[0]:
        return Applied()
    cur.execute("SAVEPOINT mover_replay")
    try:
        cur.execute(_replay_statement(cur, m, log_table, covered, skip_locked=not wait_for_lock),
                    {**params, "limit": limit})
        claimed, deleted, upserted = one(cur)
        cur.execute("RELEASE SAVEPOINT mover_replay")
        _count(cur, ctx.mid, reverse, claimed)
        return Applied(claimed, deleted, upserted, log_rows=claimed)
    except DATA_ERRORS as exc:
        cur.execute("ROLLBACK TO SAVEPOINT mover_replay")
        log.info("replay batch failed on data (%s); replaying it as a closure of keys", exc.sqlstate)
    return _apply_key_by_key(cur, ctx, m, log_table, covered, params, limit)


_REPLAY_STATEMENTS: dict[tuple[Any, ...], sql.SQL] = {}


def _replay_statement(cur: psycopg.Cursor, m: Mapping, log_table: names.QualifiedName, covered: sql.Composable,
                      *, skip_locked: bool) -> sql.SQL:
    """q.replay's text, composed once per mapping: composing it is linear in the columns (140 ms a
    batch for 800 of them, measured), and an unchanged text lets psycopg prepare it server-side."""
    key = (m, log_table, covered.as_string(cur), skip_locked)
    stmt = _REPLAY_STATEMENTS.get(key)
    if stmt is None:
        if len(_REPLAY_STATEMENTS) >= 32:  # mappings change with the tables' shapes: keep few
            _REPLAY_STATEMENTS.clear()
        stmt = _REPLAY_STATEMENTS[key] = trusted(q.replay(m, log_table, covered=covered,
                                                          skip_locked=skip_locked).as_string(cur), "composed")
    return stmt


def _apply_key_by_key(cur: psycopg.Cursor, ctx: Context, m: Mapping, log_table: names.QualifiedName,
                      covered: sql.Composable, params: dict[str, Any], limit: int) -> Applied:
    cur.execute(q.claim_keys(log_table, covered, m.key), {**params, "limit": limit})
    rows = cur.fetchall()
    keys = list(dict.fromkeys(tuple(r) for r in rows))
    result = Applied(claimed=len(keys), log_rows=len(rows))
    failed = replay_set(cur, m, keys)
    reverse = m.src == ctx.new
    for key, exc in failed.items():
        columns = {**data_error(exc), "direction": "reverse" if reverse else "forward"}
        # A row the application keeps changing fails at each replay: one open divergence per key.
        cur.execute("SELECT id FROM mover.divergences WHERE migration_id = %s AND key = %s AND kind = 'apply_error'"
                    " AND resolved_at IS NULL AND columns->>'direction' = %s ORDER BY id LIMIT 1",
                    (ctx.mid, list(key), columns["direction"]))
        row = cur.fetchone()
        if row:
            control.update_divergence(cur, ctx.mid, row[0], "apply_error", columns)
        else:
            control.record_divergence(cur, ctx.mid, list(key), "apply_error", columns)
        control.event(cur, ctx.mid, ctx.owner, None, "apply_error",
                      f"replaying key {list(key)} into {m.dst} failed: {columns['error']}")
    result.failed = len(failed)
    result.failures = {k: data_error(e)["error"] for k, e in failed.items()}
    result.upserted = len(keys) - len(failed)
    _count(cur, ctx.mid, reverse, result.claimed)
    return result


# A replay that fails on the data (class 22 or 23) is contained; anything else is a real error.
# Also contained: an upsert that meets one destination row twice (21000, CardinalityViolation).
# Several source rows then map to one destination key: after a partition conversion the live
# table's key is the old one plus the partition columns, so the reverse replay can find two rows
# of one id, which the old table cannot hold (and forward, two source keys the target's key type
# takes as equal). The batch is then replayed key by key, and such a key is a divergence like
# any other row the destination cannot hold (invariant 9: rollback refuses to leave it behind).
DATA_ERRORS = (psycopg.DataError, psycopg.IntegrityError, psycopg.errors.CardinalityViolation)
SEVERAL_ROWS = "21000"


def data_error(exc: psycopg.Error) -> dict[str, Any]:
    """What an apply_error divergence records of a copy or replay that failed on a row's data."""
    out: dict[str, Any] = {"error": str(exc).splitlines()[0], "sqlstate": exc.sqlstate}
    own = refusal(exc.diag.message_primary or "")
    if own is not None:  # a value refused by mover itself (mover/sql/mapping.py source_values): its words
        out["error"] = own
    if exc.sqlstate == SEVERAL_ROWS:
        # PostgreSQL's wording names the upsert, not the data: say what the row is.
        out["error"] = ("the source holds several rows with this key, and the destination's key holds one: "
                        + out["error"])
    if exc.diag.message_detail:  # e.g. "Partition key of the failing row contains (...) = (...)"
        out["detail"] = exc.diag.message_detail
    return out


def no_partition(exc: psycopg.Error) -> bool:
    """The row's value has no partition in a partitioned destination without a DEFAULT one."""
    return exc.sqlstate == "23514" and (exc.diag.message_primary or "").startswith("no partition of relation")


def replay_set(cur: psycopg.Cursor, m: Mapping, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], psycopg.Error]:
    """Bring the destination rows of `keys` (text, in m's source key types) to their source state,
    within the caller's transaction and applier lock. The whole set is replayed as one closure; a
    set that fails on data is split in halves, each replayed the same way, down to the single keys
    that fail: about f*log(n) statements for f failing keys among n, where key by key would cost n
    (a writer producing rows the destination rejects must not slow every batch to a key at a time).
    The failing keys are tried once more at the end: a key held up by another's old value goes
    through once that one was replaced. Returns the keys that still fail, with the error: only
    those are real data problems (an overflow, a constraint the source lacks)."""
    if not keys:
        return {}
    conflicts = _conflicts(cur, m)
    failures = _bisect(cur, m, conflicts, keys)
    if failures and len(failures) < len(keys):
        failures = _bisect(cur, m, conflicts, list(failures))
    return failures


def _bisect(cur: psycopg.Cursor, m: Mapping, conflicts: q.Conflicts,
            keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], psycopg.Error]:
    try:
        _replay_closure(cur, m, keys, conflicts)
        return {}
    except DATA_ERRORS as exc:
        if len(keys) > 1:
            log.debug("replaying %d keys failed on data (%s); halving", len(keys), exc.sqlstate)
    if len(keys) > 1:
        half = len(keys) // 2
        return _bisect(cur, m, conflicts, keys[:half]) | _bisect(cur, m, conflicts, keys[half:])
    # One key whose closure fails: the error may be another row's of the closure. Alone, the key
    # may go through (then it is replayed), or fail with an error that names its own data.
    cur.execute("SAVEPOINT mover_key")
    try:
        cur.execute(q.replay_keys(m), list(keys[0]))
        cur.execute("RELEASE SAVEPOINT mover_key")
        return {}
    except DATA_ERRORS as own:
        cur.execute("ROLLBACK TO SAVEPOINT mover_key")
        return {keys[0]: own}


def _replay_closure(cur: psycopg.Cursor, m: Mapping, keys: list[tuple[Any, ...]],
                    conflicts: q.Conflicts | None = None) -> None:
    """Race 7: replaying keys one at a time can pass through states the destination's unique
    indexes or exclusion constraints reject though the source never held them (two rows swap a
    value, or a longer cycle; a booking moves into the slot another one left). Replace the set,
    with every destination row that stands in the way of its source rows (recursively), by their
    source rows: one statement, one snapshot of the source (q.replace_closure), in one savepoint:
    all or nothing. Raises the data error (class 22 or 23) if the set still cannot reach the
    source's state: then a row of it (or of its closure) does not fit the destination."""
    c = conflicts if conflicts is not None else _conflicts(cur, m)
    cur.execute("SAVEPOINT mover_closure")
    try:
        cur.execute(_closure_statement(cur, m, c), q.key_params(keys, len(m.key)))
        cur.execute("RELEASE SAVEPOINT mover_closure")
    except DATA_ERRORS:
        cur.execute("ROLLBACK TO SAVEPOINT mover_closure")
        raise


_CLOSURE_STATEMENTS: dict[tuple[Mapping, q.Conflicts], sql.SQL] = {}


def _closure_statement(cur: psycopg.Cursor, m: Mapping, c: q.Conflicts) -> sql.SQL:
    """q.replace_closure's text (q.replace_keys' without conflicts), composed once per mapping and
    destination catalog, as _replay_statement's."""
    stmt = _CLOSURE_STATEMENTS.get((m, c))
    if stmt is None:
        if len(_CLOSURE_STATEMENTS) >= 32:
            _CLOSURE_STATEMENTS.clear()
        stmt = _CLOSURE_STATEMENTS[(m, c)] = trusted(
            (q.replace_closure(m, c) if c else q.replace_keys(m)).as_string(cur), "composed")
    return stmt


def _conflicts(cur: psycopg.Cursor, m: Mapping) -> q.Conflicts:
    """What can refuse a replayed row on the destination besides its own key: each unique index
    (as its column/expression texts and predicate) and each exclusion constraint (with its
    operators), and the generated columns both tables compute. Left out: an index or constraint
    that reads a column the replay does not copy (its expressions could not be evaluated on the
    converted source row), and a unique index on the key's columns and more (a row can only meet
    its own key there: the key's own index, or a partitioned destination's key)."""
    src, dst = introspect.table_oid(cur, m.src), introspect.table_oid(cur, m.dst)
    cur.execute(q.generated_columns(), {"src": src, "dst": dst})
    computed = tuple(r[0] for r in cur.fetchall())
    readable = {c.name for c in m.columns} | set(computed)
    unique = []
    for name, exprs, predicate, reads, plain in reading.read(cur, q.unique_indexes(), {"table": dst},
                                                             missing=_index_gone):
        if set(m.key) <= set(plain):
            continue
        if set(reads) <= readable:
            unique.append(q.Unique(tuple(exprs), predicate))
        else:
            log.debug("unique index %s reads columns not copied; left out of replay closures", name)
    exclusions = []
    for name, exprs, schemas, operators, predicate, reads in reading.read(cur, q.exclusion_constraints(),
                                                                         {"table": dst}, missing=_index_gone):
        if set(reads) <= readable:
            exclusions.append(q.Exclusion(tuple(exprs), tuple(zip(schemas, operators, strict=True)), predicate))
        else:
            log.debug("exclusion constraint %s reads columns not copied; left out of replay closures", name)
    return q.Conflicts(tuple(unique), tuple(exclusions), computed)


def _index_gone(row: reading.Row) -> str | None:
    """An index (or exclusion constraint) whose key texts did not print: dropped since the scan."""
    return f"index {row[0]}" if any(reading.gone(e) for e in row[1]) else None


def _count(cur: psycopg.Cursor, mid: int, reverse: bool, n: int) -> None:
    # Appliers of one direction are serialized by the advisory lock: no contention on this row.
    if n:
        cur.execute("INSERT INTO mover.capture_stats (migration_id, direction, applied, last_applied_at)"
                    " VALUES (%s, %s, %s, now()) ON CONFLICT (migration_id, direction)"
                    " DO UPDATE SET applied = capture_stats.applied + EXCLUDED.applied, last_applied_at = now()",
                    (mid, "reverse" if reverse else "forward", n))


def pending(cur: psycopg.Cursor, mid: int, reverse: bool = False) -> tuple[int, float | None]:
    log_table = names.change_log(mid, reverse)
    if not introspect.exists(cur, log_table):
        return 0, None
    try:
        with cur.connection.transaction():  # a savepoint
            cur.execute(q.pending_count(log_table))
            count, lag = one(cur)
    except psycopg.errors.UndefinedTable:
        # Dropped since the check by a retire, abort or swap committing meanwhile (`mover status`
        # runs beside them): a log that is gone holds nothing pending.
        return 0, None
    return count, (float(lag) if lag is not None else None)


def apply_tables_batch(cur: psycopg.Cursor, ctx: Context, *, reverse: bool, backfill_done: bool = True) -> Applied:
    """One batch of every table's log of the migration ctx heads, in the caller's transaction: one
    table's as apply_batch, several tables' in one statement (apply_family_batch: the keys between
    them hold at its end)."""
    if ctx.migration.family_id is not None:
        return apply_family_batch(cur, ctx, reverse=reverse)
    return apply_batch(cur, ctx, ctx.mapping(cur, reverse), reverse=reverse, backfill_done=backfill_done)


def drain(ctx: Context, *, reverse: bool, backfill_done: bool, max_rounds: int | None = None) -> Applied:
    """Apply batches until caught up: a batch that finds less than a full batch means the log
    is within one batch of empty. (Under a busy writer "empty" may never come; the cutover
    empties the log under its lock, where writers wait.) With logical capture the log is fed from
    the slot first: to the changes committed before this call (a whole drain), or one bounded feed
    (max_rounds: the background's, between ranges)."""
    if not reverse:
        integrity.before_feed(ctx)  # a publication dropped or altered: named, not a decoding error
        logical.feed(ctx, catch_up=max_rounds is None)
    total = Applied()
    rounds = 0
    while max_rounds is None or rounds < max_rounds:
        ctx.checkpoint()

        got = ctx.db.transaction(lambda cur: apply_tables_batch(cur, ctx, reverse=reverse, backfill_done=backfill_done),
                                 statement_timeout="120s", label="apply")
        total.claimed += got.claimed
        total.deleted += got.deleted
        total.upserted += got.upserted
        total.failed += got.failed
        total.log_rows += got.log_rows
        rounds += 1
        # Log rows, not keys: a batch replayed as a closure claims BATCH rows but fewer keys (a
        # key written many times), and stopping on its key count left the log full after "caught
        # up" (issue 21, item 4: the re-check rounds then found the same keys pending again).
        if got.log_rows < BATCH:
            break
    if total.claimed:
        ctx.report("capture", applied=total.claimed, deleted=total.deleted, upserted=total.upserted)
    return total


def replay_keys(cur: psycopg.Cursor, ctx: Context, statement: sql.Composed,
                keys: list[list[str]], mapping: Mapping | None = None) -> dict[tuple[Any, ...], psycopg.Error]:
    """Replay the given keys by state now (`mover repair`), in the caller's transaction, holding
    the forward applier's lock so no batch replays the same keys from another snapshot (race 2).
    `statement` is sql.capture.replay_keys() for `mapping`, the mapping whose key types the keys
    are in; with the mapping, a key that fails alone is replayed with the keys it conflicts with
    (race 7). Returns the keys that failed on data (class 22 or 23), with the error."""
    _lock_applier(cur, ctx.mid, False, wait=True)
    failed: dict[tuple[Any, ...], psycopg.Error] = {}
    for key in dict.fromkeys(tuple(k) for k in keys):
        cur.execute("SAVEPOINT mover_key")
        try:
            cur.execute(statement, list(key))
            cur.execute("RELEASE SAVEPOINT mover_key")
            continue
        except DATA_ERRORS as exc:
            cur.execute("ROLLBACK TO SAVEPOINT mover_key")
            error = exc
        if mapping is not None:
            try:
                _replay_closure(cur, mapping, [key])
                continue
            except DATA_ERRORS:
                pass  # the key's own error names it; its closure's may be another row's
        failed[key] = error
    return failed
