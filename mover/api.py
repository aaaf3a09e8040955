"""The commands as plain functions, used by the CLI and the tests."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from mover import adopt as adopt_engine
from mover import backfill as backfill_engine
from mover import (
    capture,
    chunks,
    control,
    conversion,
    cutover,
    introspect,
    names,
    partitions,
    privileges,
    runner,
    shape,
    steps,
)
from mover import reconcile as reconcile_engine
from mover.context import Context, Reporter, log_reporter
from mover.db import Database, bind, dsn_problem, mask, redact
from mover.errors import BadInput, Failed, NotFound, PlanError, Waiting
from mover.names import QualifiedName
from mover.plan import Plan, load_plan, plan_from_canonical
from mover.sql import ddl

log = logging.getLogger("mover")


def _database(dsn: str) -> Database:
    problem = dsn_problem(dsn) if dsn else None
    if problem:
        raise BadInput(f"the DSN is malformed: {problem}",
                       hint="fix --dsn or DATABASE_URL: a URL such as postgresql://user@host:5432/dbname, or "
                            "key=value pairs such as 'host=... dbname=... user=...'; give the password through "
                            "PGPASSWORD or ~/.pgpass rather than in the DSN")
    db = Database(dsn)
    try:
        db.connection()
    except psycopg.OperationalError as exc:
        raise Failed(f"cannot connect to {redact(dsn) or 'the database given by the PG* variables'}: "
                     f"{mask(str(exc).strip().splitlines()[-1] if str(exc).strip() else str(exc))}",
                     hint="check --dsn, DATABASE_URL or the PG* variables") from exc
    return db


def _require_schema(db: Database) -> None:
    if not db.transaction(control.schema_ready):
        raise BadInput("mover's control schema is not installed in this database", hint="run `mover init` first")


# ---------------------------------------------------------------------------------------------
# init


def init(dsn: str) -> str:
    _database(dsn).close()
    return control.init_schema(dsn)


# ---------------------------------------------------------------------------------------------
# Plans against the live database


def resolve_plan(cur, plan: Plan, *, registering: bool) -> dict[str, Any]:
    """Check the plan against the catalog; return resolved names and the key. Changes nothing
    (when registering, the target's DDL is rehearsed inside a savepoint that is rolled back)."""
    source = introspect.resolve(cur, plan.source)
    if source is None:
        raise PlanError(f"[migration] source: table {plan.source} does not exist",
                        hint="check the name; unquoted names fold to lower case, quote mixed-case names")
    assert source.schema is not None  # resolve() names the schema
    if source.schema == names.CONTROL_SCHEMA:
        raise PlanError(f"[migration] source: {source} belongs to mover itself")
    if introspect.persistence(cur, source) == "t":
        raise PlanError(f"[migration] source: {source} is a temporary table; mover cannot move it, because it "
                        f"exists only in the session that created it (mover works from sessions of its own)",
                        hint="move a permanent table: copy the rows into one (CREATE TABLE ... AS) if you need to")
    if source.schema in ("pg_catalog", "information_schema") or source.schema.startswith("pg_"):
        raise PlanError(f"[migration] source: {source} is a system table", hint="mover moves user tables")
    # The kind first: describe() would report a view's missing key, or choke on a partitioned
    # table's index definitions, before saying what is really wrong.
    cur.execute("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s", (source.schema, source.name))
    relkind = cur.fetchone()[0]
    if relkind != "r":
        kinds = {"p": "a partitioned table", "v": "a view", "m": "a materialized view", "f": "a foreign table",
                 "S": "a sequence", "i": "an index", "I": "an index", "c": "a composite type"}
        raise PlanError(f"[migration] source: {source} is {kinds.get(relkind, 'not an ordinary table')}",
                        hint="mover moves ordinary tables")
    try:
        info = introspect.describe(cur, source)
    except PlanError as exc:  # no usable key, an index form mover cannot read
        raise PlanError(f"[migration] source: {exc.message}", hint=exc.hint) from None

    def sibling(name: QualifiedName | None, key: str, suffix: str) -> QualifiedName:
        assert source.schema is not None
        if name is None:
            return QualifiedName(source.schema, names.derived(source.name, suffix))
        if name.schema is None:
            name = name.with_schema(source.schema)
        if name.schema != source.schema:
            raise PlanError(f"{key}: {name} must be in the source's schema {names.display_ident(source.schema)}",
                            hint="the swap renames tables within one schema")
        return name

    target = sibling(plan.target, "[target] name", "_new")
    old = sibling(plan.rollback.old_name, "[rollback] old_name", "_old")
    if len({target, old, source}) < 3:
        raise PlanError(f"source {source}, target {target} and old name {old} must all differ",
                        hint="set [target] name and [rollback] old_name to two new names")
    if registering:
        # Another migration of the same source first: its target explains why a name is taken.
        other = control.active_on_source(cur, source) if control.schema_ready(cur) else None
        if other is not None and other.name != plan.name:
            raise PlanError(f"table {source} is already being moved by migration {other.name!r}",
                            hint=f"finish or `mover abort {other.name}` first")
        for name, key in ((target, "[target] name"), (old, "[rollback] old_name")):
            if introspect.exists(cur, name):
                raise PlanError(f"{key}: {name} already exists", hint="choose another name or drop that table")
            # A table brings a row type of its own name: an enum or a domain of that name blocks it too.
            cur.execute("SELECT EXISTS (SELECT 1 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
                        " WHERE n.nspname = %s AND t.typname = %s)", (name.schema, name.name))
            if cur.fetchone()[0]:
                raise PlanError(f"{key}: {name} already exists as a type",
                                hint="choose another name or drop that type")

    for col, typ in sorted(plan.columns.items()):
        try:
            column = info.column(col)
        except KeyError:
            raise PlanError(f"[target] columns: {source} has no column {names.display_ident(col)}",
                            hint=f"columns are: {', '.join(c.name for c in info.columns)}") from None
        if column.generated:
            raise PlanError(f"[target] columns: {names.display_ident(col)} is a generated column; change its "
                            f"expression's type instead")
        if not introspect.type_exists(cur, typ):
            raise PlanError(f"[target] columns: {typ!r} (for column {names.display_ident(col)}) is not a type "
                            f"this database knows")
        _check_cast(cur, source, col, typ)
    for k in info.key:
        coll = info.column(k).collation
        if coll is None:
            continue
        cur.execute("SELECT c.collisdeterministic FROM pg_collation c JOIN pg_namespace n ON n.oid = c.collnamespace"
                    " WHERE n.nspname = %s AND c.collname = %s", coll)
        if not cur.fetchone()[0]:
            # Two keys equal under the collation can differ in bytes ('a' and 'A'): the replay
            # and the comparison by key would not see a change between them.
            raise PlanError(f"[migration] source: key column {names.display_ident(k)} of {source} has the "
                            f"nondeterministic collation {names.display_ident(coll[1])}, which mover cannot move",
                            hint="use a deterministic collation for the key, or a key on other columns")
    for ix in info.indexes:
        if ix.is_exclusion:
            raise PlanError(f"{source} has the exclusion constraint index {names.display_ident(ix.name)}, which "
                            f"mover cannot recreate yet")
    partitioning = (partitions.check_plan(cur, plan.partition, source, info, target, plan.columns)
                    if plan.partition is not None else None)
    fks = introspect.inbound_foreign_keys(cur, info.oid)
    if fks:
        raise PlanError(f"{source} is referenced by foreign keys ({'; '.join(fks)}); re-pointing them at cutover "
                        f"is not supported yet", hint="drop them before the migration and recreate them after")
    _check_outbound_foreign_keys(cur, plan, source, info.oid)
    meta = introspect.metadata(cur, info.oid)
    unsupported = []
    if meta.inheritance:
        unsupported.append(meta.inheritance)
    if meta.row_security or meta.policies:
        unsupported.append(f"has row-level security ({len(meta.policies)} policies)")
    if meta.user_triggers:
        unsupported.append(f"has triggers ({', '.join(names.display_ident(t) for t in meta.user_triggers)}) that "
                           f"mover cannot move to the new table yet")
    if meta.rules:
        unsupported.append(f"has rules ({', '.join(names.display_ident(r) for r in meta.rules)})")
    if unsupported:
        raise PlanError(f"[migration] source: {source} {'; '.join(unsupported)}: not supported yet",
                        hint="mover refuses rather than lose this at the swap; see the README's limitations")
    views = introspect.dependent_views(cur, info.oid)
    if views:
        raise PlanError(f"views depend on {source} ({', '.join(views)}); they would keep reading the old table "
                        f"after the swap", hint="drop them before the migration and recreate them after")
    if registering and control.schema_ready(cur):
        # Missing privileges first: the rehearsal below would only say "permission denied".
        privileges.require_setup(cur, source, target)
    lossy: dict[str, str] = {}
    if registering:
        # What the catalog alone cannot tell (a type change that needs USING, a column used by a
        # generated column or a CHECK constraint, an identity column turned text, an index name
        # that is taken): run create_target's DDL and roll it back. Without the type changes
        # first, so that the message can name the key at fault.
        hint = "change the plan (or the source table) so that this DDL succeeds; `mover plan check` prints it"
        problem = _rehearse_create_target(cur, replace(plan, columns={}), source, target)
        if problem:
            raise PlanError(f"[target] name: the target {target} cannot be created: {problem}", hint=hint)
        rehearsed: list = []
        if plan.columns and _rehearse_create_target(cur, plan, source, target, rehearsed):
            # Find the column at fault (this is the error path; one more rehearsal per column is cheap).
            for col, typ in sorted(plan.columns.items()):
                failed: list = []
                problem = _rehearse_create_target(cur, replace(plan, columns={col: typ}), source, target, failed)
                if problem and isinstance(failed[0], psycopg.errors.DatatypeMismatch):
                    raise PlanError(
                        f"[target] columns: column {names.display_ident(col)} cannot become {typ!r}: PostgreSQL has "
                        f"no assignment cast from {info.column(col).type} to {typ} ({problem})",
                        hint="mover converts as ALTER TABLE ... TYPE does, without USING: change the type in the "
                             "plan, or convert the column in the source table first")
                if problem:
                    raise PlanError(f"[target] columns: column {names.display_ident(col)} cannot become {typ!r} "
                                    f"in the target {target}: {problem}", hint=hint)
            raise PlanError(f"[target] columns: the target {target} cannot be created with these type changes: "
                            f"{_rehearse_create_target(cur, plan, source, target)}", hint=hint)
        lossy = _check_lossy(plan, info, rehearsed[0]) if plan.columns else {}
    return {"source": source, "target": target, "old": old, "key": list(info.key), "info": info,
            "lossy": lossy, "partitioning": partitioning}


def _check_outbound_foreign_keys(cur, plan: Plan, source: QualifiedName, oid: int) -> None:
    """The swap does not carry the source's own foreign keys over yet: the plan must name each one
    it accepts to lose (`[target] drop_foreign_keys`), so that nothing is dropped silently."""
    fks = dict(introspect.outbound_foreign_keys(cur, oid))
    unknown = [n for n in plan.drop_foreign_keys if n not in fks]
    if unknown:
        raise PlanError(f"[target] drop_foreign_keys: {', '.join(names.display_ident(n) for n in unknown)} "
                        f"{'is not a foreign key' if len(unknown) == 1 else 'are not foreign keys'} of {source}",
                        hint=f"its foreign keys are: {', '.join(names.display_ident(n) for n in fks) or 'none'}")
    missing = [n for n in fks if n not in plan.drop_foreign_keys]
    if missing:
        listed = "; ".join(f"{names.display_ident(n)} {fks[n]}" for n in missing)
        keys = ", ".join(json.dumps(n) for n in sorted(plan.drop_foreign_keys + tuple(missing)))  # TOML strings
        raise PlanError(f"{source} has foreign keys that the new table would not have after the swap ({listed}); "
                        f"mover does not carry them over yet, and afterwards rows that break them would be accepted",
                        hint=f"to go ahead without them, acknowledge each one in the plan: [target] drop_foreign_keys"
                             f" = [{keys}] (and recreate them after the migration); or drop them first")


def _rehearse_create_target(cur, plan: Plan, source: QualifiedName, target: QualifiedName,
                            out: list | None = None) -> str | None:
    """Run create_target's DDL in a savepoint and roll it back; the error it met, if any.
    `out` receives the error, or the rehearsed target's description."""
    from mover.db import is_retryable
    from mover.steps.create_target import target_ddl

    cur.execute("SAVEPOINT mover_rehearsal")
    try:
        for stmt in target_ddl(cur, plan, source, target):
            cur.execute(stmt)
        # The NOT VALID checks come back at the swap (mover/cutover.py): they must fit the new types.
        source_oid = introspect.table_oid(cur, source)
        assert source_oid is not None  # resolved by the caller
        for name, definition, _ in introspect.unvalidated_checks(cur, source_oid):
            cur.execute(ddl.add_constraint(target, name, definition))
        if out is not None:
            out.append(introspect.describe(cur, target))
    except psycopg.Error as exc:
        if is_retryable(exc) or isinstance(exc, psycopg.OperationalError):
            raise  # a lock timeout or a lost connection says nothing about the plan
        cur.execute("ROLLBACK TO SAVEPOINT mover_rehearsal")
        if out is not None:
            out.append(exc)
        diag = exc.diag
        detail = f" ({diag.message_detail.rstrip('.')})" if diag.message_detail else ""
        return f"{diag.message_primary or str(exc).splitlines()[0]}{detail}"
    cur.execute("ROLLBACK TO SAVEPOINT mover_rehearsal")
    return None


def lossy_columns(plan: Plan, source: introspect.TableInfo, target: introspect.TableInfo) -> dict[str, str]:
    """Column -> why its type change can lose information (as the target's catalog types it)."""
    out = {}
    for col in sorted(plan.columns):
        s, t = source.column(col), target.column(col)
        reason = conversion.lossy_reason(s, t)
        if reason:
            out[col] = f"{s.type} -> {t.type}: {reason}"
    return out


def _check_lossy(plan: Plan, source: introspect.TableInfo, target: introspect.TableInfo) -> dict[str, str]:
    """A conversion that can refuse or change values must be acknowledged in the plan; never on
    a key column, whose values ranges, logs and the swap compare exactly."""
    lossy = lossy_columns(plan, source, target)
    keys = [c for c in lossy if c in source.key]
    if keys:
        raise PlanError(
            f"[target] columns: key column {names.display_ident(keys[0])} of {source.name} cannot change type "
            f"{lossy[keys[0]]}", hint="mover narrows no key column: keep its type, or one that holds every value")
    missing = [c for c in lossy if c not in plan.accept_lossy]
    if missing:
        listed = "; ".join(f"{names.display_ident(c)} {lossy[c]}" for c in missing)
        accept = ", ".join(f'"{c}"' for c in missing)
        raise PlanError(
            f"[target] columns: {len(missing)} type change{'s' if len(missing) > 1 else ''} can lose information: "
            f"{listed}",
            hint=f"if that is intended, add accept_lossy = [{accept}] under [target]: a row that does not fit "
                 f"becomes a divergence, and reconcile reports every value the conversion changed as different")
    return lossy


def _check_cast(cur, source: QualifiedName, col: str, typ: str) -> None:
    from psycopg import sql
    cur.execute("SAVEPOINT mover_cast_check")
    try:
        # EXPLAIN plans the cast without reading a row: a missing cast fails here, not mid-backfill.
        cur.execute(sql.SQL("EXPLAIN SELECT CAST({c} AS {t}) FROM {s}").format(
            c=sql.Identifier(col), t=sql.SQL(typ), s=source.ident))
        cur.execute("RELEASE SAVEPOINT mover_cast_check")
    except psycopg.errors.Error as exc:
        cur.execute("ROLLBACK TO SAVEPOINT mover_cast_check")
        raise PlanError(f"[target] columns: column {names.display_ident(col)} cannot become {typ!r}: "
                        f"{str(exc).splitlines()[0]}") from None


def _check_capture_path(cur, plan: Plan, source: QualifiedName) -> None:
    """Can every writer of the source run the capture trigger? Its log is created and granted in
    a savepoint, asked about, and rolled back (the trigger itself is not: it would lock the table)."""
    from mover.sql import capture as capture_sql

    log_table = names.change_log(0)
    info = introspect.describe(cur, source)
    cur.execute("SAVEPOINT mover_capture_check")
    try:
        cur.execute(capture_sql.create_log(log_table, tuple(info.key), tuple(info.column(k).type for k in info.key)))
        for stmt in capture_sql.grant_log(log_table):
            cur.execute(stmt)
        missing = privileges.capture_path_missing(cur, source, log_table)
    finally:
        cur.execute("ROLLBACK TO SAVEPOINT mover_capture_check")
    if missing:
        raise PlanError(privileges.capture_message(source, missing),
                        hint=privileges.capture_hint(cur, missing, plan.name))


def _provisional(plan: Plan, r: dict[str, Any]) -> control.Migration:
    """A migration row as registration would write it, for describing a plan not yet registered."""
    now = datetime.now(UTC)
    return control.Migration(
        id=0, name=plan.name, plan=plan.canonical(), plan_hash=plan.shape_hash(r["source"].schema),
        source=r["source"],
        target=r["target"], old=r["old"], key_columns=r["key"], step="create_target", state="pending",
        paused=False, error=None, created_at=now, updated_at=now, cutover_at=None, cutover_lock_ms=None,
        window_ends_at=None, finished_at=None, lease_owner=None, lease_host=None, lease_pid=None,
        lease_expires_at=None)


def check_plan(dsn: str, path: str | Path) -> dict[str, Any]:
    plan = load_plan(path)
    db = _database(dsn)
    try:
        def check(cur):
            if not control.schema_ready(cur):
                raise BadInput("mover's control schema is not installed in this database",
                               hint="run `mover init` first")
            existing = control.find(cur, plan.name)
            if existing is not None and existing.state not in ("aborted",):
                _same_shape(existing, plan)
                return {"plan": str(path), "name": plan.name, "registered": True,
                        "status": status_of(cur, existing), "steps": []}
            r = resolve_plan(cur, plan, registering=True)
            _check_capture_path(cur, plan, r["source"])
            ctx = Context(db=db, migration=_provisional(plan, r), owner="plan-check")
            out_steps = []
            for step in steps.ALL:
                out_steps.append({"name": step.name,
                                  "sql": [s if isinstance(s, str) else s.as_string(cur)
                                          for s in step.describe(ctx, cur)]})
            return {"plan": str(path), "name": plan.name, "registered": False,
                    "tables": {"source": str(r["source"]), "target": str(r["target"]), "old": str(r["old"])},
                    "key": r["key"], "lossy_accepted": r["lossy"], "partitioning": r["partitioning"],
                    "steps": out_steps}
        # Rolled back whatever happens: checking a plan changes nothing. (Not READ ONLY: the
        # target's DDL is rehearsed, in a savepoint that is rolled back too.)
        conn = db.connection()
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            cur.execute("SET LOCAL lock_timeout = '2s'; SET LOCAL statement_timeout = '30s'")
            return check(cur)
    finally:
        db.close()


def _same_shape(existing: control.Migration, plan: Plan) -> None:
    if existing.plan_hash != plan.shape_hash(existing.source.schema):
        raise PlanError(
            f"plan for {plan.name!r} differs from the one registered (source, target, columns and "
            f"[rollback] old_name define a migration; only the other settings may change between runs)",
            hint=f"restore the plan, or `mover abort {plan.name}` and start again under a new [migration] name")


def _register_or_load(db: Database, plan: Plan, actor: str) -> control.Migration:
    def register(cur):
        existing = control.find(cur, plan.name)
        if existing is not None and existing.state == "aborted":
            # Keep the aborted attempt's history under another name; start afresh.
            cur.execute("UPDATE mover.migrations SET name = name || '#' || id WHERE id = %s", (existing.id,))
            existing = None
        if existing is not None:
            _same_shape(existing, plan)
            if existing.plan != plan.canonical():
                control.update_plan(cur, existing.id, plan.canonical(), actor)
            return control.get_by_id(cur, existing.id)
        r = resolve_plan(cur, plan, registering=True)
        _check_capture_path(cur, plan, r["source"])
        m = control.register(cur, name=plan.name, plan=plan.canonical(),
                             plan_hash=plan.shape_hash(r["source"].schema),
                             source=r["source"], target=r["target"], old=r["old"], key=r["key"], actor=actor)
        shape.record(cur, m.id, source=r["source"])  # fixed from here on (mover/shape.py)
        return m
    try:
        return db.transaction(register, label="register")
    except psycopg.errors.UniqueViolation as exc:
        raise PlanError(f"another migration of the same table or name was registered concurrently: {exc}") from exc


def _locate(db: Database, name_or_plan: str, actor: str) -> control.Migration:
    _require_schema(db)
    if name_or_plan.endswith(".toml") or Path(name_or_plan).is_file():
        return _register_or_load(db, load_plan(name_or_plan), actor)
    return db.transaction(lambda cur: control.get(cur, name_or_plan))


# ---------------------------------------------------------------------------------------------
# Running


def run(dsn: str, name_or_plan: str, *, one_step: bool = False, wait: bool = False,
        report: Reporter = log_reporter, stop: threading.Event | None = None) -> dict[str, Any]:
    db = _database(dsn)
    owner = control.new_owner_id()
    try:
        m = _locate(db, name_or_plan, owner)
        if m.state == "aborted":
            raise BadInput(f"migration {m.name!r} was aborted", hint="run its plan file to start it afresh")
        if m.state != "done":
            with runner.leased(db, m, owner, report=report, stop=stop) as ctx:
                if one_step and steps.BY_NAME.get(ctx.migration.step, steps.ALL[0]).gate:
                    raise Waiting(f"the next step of {m.name!r} is the cutover",
                                  hint=f"run `mover cutover {m.name}` to swap")
                runner.advance(ctx, one_step=one_step, wait_window=wait)
        return status(dsn, m.name, db=db)
    finally:
        db.close()


def _operator_command(dsn: str, name: str, expect_steps: tuple[str, ...], what: str, action,
                      report: Reporter = log_reporter, stop: threading.Event | None = None) -> dict[str, Any]:
    db = _database(dsn)
    owner = control.new_owner_id()
    try:
        _require_schema(db)
        m = db.transaction(lambda cur: control.get(cur, name))
        if m.state in ("done", "aborted") or m.step not in expect_steps:
            raise BadInput(f"cannot {what} migration {m.name!r}: it is at step {m.step!r}, state {m.state!r}",
                           hint=f"`mover status {m.name}` shows where it stands")
        with runner.leased(db, m, owner, report=report, stop=stop) as ctx:
            if what not in ("abort", "adopt"):  # the two ways out of a changed shape
                ctx.db.transaction(lambda cur: shape.verify_at_step(cur, ctx.migration, ctx.swapped),
                                   label="shape check")
            action(ctx)
        return status(dsn, name, db=db)
    finally:
        db.close()


def cutover_now(dsn: str, name: str, **kw) -> dict[str, Any]:
    def go(ctx: Context):
        ctx.db.transaction(lambda cur: control.start_step(cur, ctx.migration, "cutover", ctx.owner))
        cutover.swap_in(ctx)
        try:  # a zero-length window retires at once; otherwise the window is open: that is success
            runner.advance(ctx)
        except Waiting:
            ctx.db.transaction(lambda cur: control.set_state(cur, ctx.mid, "waiting", owner=ctx.owner))
    return _operator_command(dsn, name, ("cutover",), "cut over", go, **kw)


def rollback(dsn: str, name: str, *, give_up_rows: bool = False, **kw) -> dict[str, Any]:
    return _operator_command(dsn, name, ("rollback_window",), "roll back",
                             lambda ctx: cutover.swap_back(ctx, give_up_rows), **kw)


def retire(dsn: str, name: str, *, force: bool = False, give_up_rows: bool = False, **kw) -> dict[str, Any]:
    def go(ctx: Context):
        m = ctx.migration
        if m.step == "rollback_window":
            capture.drain(ctx, reverse=True, backfill_done=True)

            def close(cur):
                cur.execute("SELECT window_ends_at <= now() FROM mover.migrations WHERE id = %s", (m.id,))
                if not cur.fetchone()[0] and not force:
                    raise Waiting(f"the rollback window of {m.name!r} is still open",
                                  hint=f"wait, or `mover retire {m.name} --force`")
                control.finish_step(cur, m, "rollback_window", "retire", ctx.owner,
                                    message="rollback window closed" + (" early (--force)" if force else ""))
            ctx.db.transaction(close)
            ctx.refresh()
        ctx.db.transaction(lambda cur: control.start_step(cur, ctx.migration, "retire", ctx.owner))
        cutover.retire(ctx, give_up_rows)
    return _operator_command(dsn, name, ("rollback_window", "retire"), "retire", go, **kw)


def reconcile(dsn: str, name: str, *, full: bool = False, **kw) -> dict[str, Any]:
    """`mover reconcile NAME`: a reconcile pass now. At the reconcile step it is that step (the
    migration moves to the cutover gate when the tables are equal); at the gate it is an extra
    pass over the ranges changed since the last one (all of them with `full`)."""
    from mover.steps import reconcile as reconcile_step
    out: dict[str, Any] = {}

    def go(ctx: Context):
        at_step = ctx.migration.step == "reconcile"
        if at_step:
            ctx.db.transaction(lambda cur: control.start_step(cur, ctx.migration, "reconcile", ctx.owner))
        result = reconcile_engine.run(ctx, full=full)
        out["pass"] = result.as_dict()
        if at_step:
            try:
                reconcile_step.conclude(ctx, result)
            except Waiting:
                pass  # recorded; the caller reports the divergences
        else:
            ctx.db.transaction(lambda cur: control.set_state(
                cur, ctx.mid, "waiting", owner=ctx.owner,
                error=f"{result.open} divergences" if result.open else None))
    st = _operator_command(dsn, name, ("reconcile", "cutover"), "reconcile", go, **kw)
    return {"pass": out.get("pass"), "status": st}


def repair(dsn: str, name: str, *, divergence_id: int | None = None, **kw) -> dict[str, Any]:
    """`mover repair NAME`: re-sync the open divergences' rows from the source and check them again."""
    out: dict[str, Any] = {}

    def go(ctx: Context):
        out["repair"] = reconcile_engine.repair(ctx, divergence_id)
        if ctx.migration.step == "cutover":
            left = ctx.db.transaction(lambda cur: control.open_divergences(cur, ctx.mid))
            ctx.db.transaction(lambda cur: control.set_state(
                cur, ctx.mid, "waiting", owner=ctx.owner, error=f"{left} divergences" if left else None))
    st = _operator_command(dsn, name, ("reconcile", "cutover"), "repair", go, **kw)
    return {"repair": out.get("repair"), "status": st}


def accept(dsn: str, name: str, reason: str, *, divergence_id: int | None = None) -> dict[str, Any]:
    """`mover accept NAME --reason TEXT`: close open divergences (or one) as intended; they stay in
    the history with the reason, and a later pass that finds the same difference leaves it be."""
    if not reason or not reason.strip():
        raise BadInput("accepting divergences needs a reason", hint="pass --reason TEXT")
    db = _database(dsn)
    try:
        _require_schema(db)

        def go(cur):
            m = control.get(cur, name, lock=True)
            ids = reconcile_engine.accept(cur, m.id, reason.strip(), control.new_owner_id(), divergence_id)
            if divergence_id is not None and not ids:
                raise NotFound(f"migration {m.name!r} has no open divergence with id {divergence_id}",
                               hint=f"`mover divergences {m.name}` lists the open ones")
            return ids
        ids = db.transaction(go)
        return {"accepted": ids, "status": status(dsn, name, db=db)}
    finally:
        db.close()


def adopt(dsn: str, name: str, **kw) -> dict[str, Any]:
    """`mover adopt NAME`: apply an additive change of the live table's shape (a column, a CHECK, an
    index) to the other table, re-sync what it touched, record the new shapes; refused (exit 2) for
    any other change."""
    out: dict[str, Any] = {}

    def go(ctx: Context):
        out["adopted"] = adopt_engine.adopt(ctx)
    st = _operator_command(dsn, name, ("create_target", "install_capture", "backfill", "reconcile", "cutover",
                                       "rollback_window"), "adopt", go, **kw)
    return {"adopted": out.get("adopted", []), "status": st}


def abort(dsn: str, name: str, *, give_up_rows: bool = False, **kw) -> dict[str, Any]:
    db = _database(dsn)
    try:
        _require_schema(db)
        m = db.transaction(bind(control.get, name))
    finally:
        db.close()
    if m.step == "rollback_window" and m.state not in ("done", "aborted"):
        # The new table is live: abort would drop the application's table. Rollback is the one
        # command that brings the original back (losing nothing, or refusing); abort comes after.
        raise BadInput(f"cannot abort migration {m.name!r} after its cutover: {m.source} is the new table now",
                       hint=f"`mover rollback {m.name}` swaps the original back, then `mover abort {m.name}`")
    return _operator_command(dsn, name, ("create_target", "install_capture", "backfill", "reconcile", "cutover"),
                             "abort", lambda ctx: cutover.abort(ctx, give_up_rows), **kw)


# ---------------------------------------------------------------------------------------------
# Reading


def _backfill_status(cur, m: control.Migration) -> dict[str, Any]:
    st = chunks.state(cur, m.id, "backfill")
    cur.execute(
        """
        SELECT count(*) FILTER (WHERE heartbeat_at > now() - make_interval(secs => %s)),
               max(chunk_rows), array_remove(array_agg(DISTINCT waiting_for), NULL)
        FROM mover.workers WHERE migration_id = %s
        """, (control.LEASE_SECONDS, m.id))
    workers, chunk_rows, waiting = cur.fetchone()
    # Speed over the last 30 s of finished ranges: what the copy does now, not on average.
    cur.execute("SELECT sum(rows) / nullif(extract(epoch FROM now() - min(finished_at)), 0) FROM mover.chunks"
                " WHERE migration_id = %s AND kind = 'backfill' AND status = 'done'"
                " AND finished_at > now() - interval '30 seconds'", (m.id,))
    rate = cur.fetchone()[0]
    estimate = None if m.step not in ("create_target", "install_capture", "backfill") else \
        backfill_engine.estimate_rows(cur, m.source)
    eta = None
    if rate and estimate and not st["finished"]:
        eta = max(estimate - st["rows"], 0) / float(rate)
    return {"rows_copied": st["rows"], "chunks_done": st["done"], "chunks_total": st["total"],
            "chunks_failed": st["failed"], "rows_estimate": estimate, "workers": workers,
            "chunk_rows": chunk_rows, "rows_per_second": None if rate is None else round(float(rate)),
            "eta_seconds": None if eta is None else round(eta), "waiting_for": waiting or [],
            "paused": m.paused}


def status_of(cur, m: control.Migration) -> dict[str, Any]:
    pending_fwd, lag_fwd = capture.pending(cur, m.id, reverse=False)
    pending_rev, lag_rev = capture.pending(cur, m.id, reverse=True)
    cur.execute("SELECT coalesce(sum(applied), 0) FROM mover.capture_stats WHERE migration_id = %s", (m.id,))
    applied = int(cur.fetchone()[0])
    step = "retire" if m.step == "finished" else m.step
    state, error = m.state, m.error
    if state == "running" and (m.lease_expires_at is None or m.lease_expires_at < _now(cur)):
        # The row says running, but no live process holds the lease: it died mid-step.
        state, error = "failed", error or f"the process running it stopped; `mover run {m.name}` resumes"
    return {
        "name": m.name,
        "step": step,
        "state": state,
        "steps": [{"name": s["name"], "status": s["status"],
                   "started_at": _iso(s["started_at"]), "finished_at": _iso(s["finished_at"])}
                  for s in control.steps(cur, m.id)],
        "tables": {"source": str(m.source), "target": str(m.target), "old": str(m.old)},
        "key": m.key_columns,
        "backfill": _backfill_status(cur, m),
        "capture": {"pending": pending_fwd + pending_rev, "applied": applied,
                    "lag_seconds": lag_fwd if lag_fwd is not None else lag_rev,
                    "direction": "reverse" if m.cutover_at else "forward"},
        "divergences": control.open_divergences(cur, m.id),
        "reconcile": _reconcile_status(cur, m),
        "cutover": None if m.cutover_at is None else {"at": _iso(m.cutover_at), "lock_ms": m.cutover_lock_ms},
        "rollback_window_ends_at": _iso(m.window_ends_at),
        "lease": None if m.lease_owner is None else {"owner": m.lease_owner, "expires_at": _iso(m.lease_expires_at)},
        "error": error,
        "created_at": _iso(m.created_at),
        "finished_at": _iso(m.finished_at),
        "partitions": partitions.status(cur, m.source, m.target) if m.plan.get("partition") else None,
    }


def _reconcile_status(cur, m: control.Migration) -> dict[str, Any]:
    ranges = control.reconcile_ranges(cur, m.id)
    counts = control.divergence_counts(cur, m.id)
    return {"ranges_done": ranges["ranges_done"], "ranges_total": ranges["ranges_total"],
            "ranges_failed": ranges["ranges_failed"], "rows_compared": ranges["source_rows"],
            "verified_at": _iso(ranges["newest_verification"]),
            "divergences": {"open": counts["open_by_kind"], "resolved": counts["resolved_by_how"]},
            # The backfill has no conflict clause (mover/sql/copy.py): a key conflict fails the
            # range instead of skipping a row, so nothing is ever skipped silently. Kept as a field
            # so that scripts need not change if a conflict policy is ever added.
            "skipped_on_conflict": 0}


def _now(cur):
    cur.execute("SELECT clock_timestamp()")
    return cur.fetchone()[0]


def _iso(value) -> str | None:
    return None if value is None else value.isoformat()


def status(dsn: str, name: str | None = None, *, db: Database | None = None) -> Any:
    own = db is None
    db = db or _database(dsn)
    try:
        _require_schema(db)

        def read(cur):
            if name is not None:
                return status_of(cur, control.get(cur, name))
            return [status_of(cur, m) for m in control.list_all(cur)]
        return db.transaction(read, label="status")
    finally:
        if own:
            db.close()


def divergences(dsn: str, name: str, *, include_resolved: bool = False) -> list[dict[str, Any]]:
    db = _database(dsn)
    try:
        _require_schema(db)

        def read(cur):
            m = control.get(cur, name)
            return [{**d, "found_at": _iso(d["found_at"]), "resolved_at": _iso(d["resolved_at"]),
                     "checked_at": _iso(d["checked_at"])}
                    for d in control.list_divergences(cur, m.id, include_resolved)]
        return db.transaction(read)
    finally:
        db.close()


def events(dsn: str, name: str, limit: int = 50) -> list[dict[str, Any]]:
    db = _database(dsn)
    try:
        def read(cur):
            m = control.get(cur, name)
            return [{**e, "at": _iso(e["at"])} for e in control.events(cur, m.id, limit)]
        return db.transaction(read)
    finally:
        db.close()


# ---------------------------------------------------------------------------------------------
# Throttling and extra workers


def set_paused(dsn: str, name: str, paused: bool) -> dict[str, Any]:
    db = _database(dsn)
    try:
        _require_schema(db)

        def flip(cur):
            m = control.get(cur, name, lock=True)
            if m.state in ("done", "aborted"):
                raise BadInput(f"migration {m.name!r} is {m.state}")
            cur.execute("UPDATE mover.migrations SET paused = %s, updated_at = now() WHERE id = %s", (paused, m.id))
            control.event(cur, m.id, control.new_owner_id(), None, "paused" if paused else "unpaused",
                          "paused by the operator" if paused else "unpaused by the operator")
        db.transaction(flip)
        return status(dsn, name, db=db)
    finally:
        db.close()


def set_settings(dsn: str, name: str, assignments: list[str]) -> dict[str, Any]:
    """`section.key=value` for the settings a running migration may change (plan.SETTABLE);
    values are parsed as TOML, validated like a plan file, recorded as an event."""
    import tomllib

    from mover.plan import SETTABLE, parse_plan, to_document
    db = _database(dsn)
    try:
        _require_schema(db)

        def apply(cur):
            m = control.get(cur, name, lock=True)
            doc = to_document(plan_from_canonical(m.plan))
            changes = {}
            for item in assignments:
                key, sep, raw = item.partition("=")
                section, _, field = key.strip().partition(".")
                if not sep or field not in SETTABLE.get(section, ()):
                    allowed = ", ".join(f"{s}.{k}" for s, ks in SETTABLE.items() for k in sorted(ks))
                    raise BadInput(f"cannot set {key.strip()!r}", hint=f"settable: {allowed}")
                try:
                    value = tomllib.loads(f"v = {raw.strip()}")["v"]
                except tomllib.TOMLDecodeError:
                    value = raw.strip()  # a bare word such as 200ms
                doc[section][field] = value
                changes[key.strip()] = value
            new_plan = parse_plan(doc, origin="mover set")
            control.update_plan(cur, m.id, new_plan.canonical(), control.new_owner_id())
            control.event(cur, m.id, "operator", None, "settings_changed", f"set {changes}", changes)
        db.transaction(apply)
        return status(dsn, name, db=db)
    finally:
        db.close()


def work(dsn: str, name: str, *, threads: int = 1, report: Reporter = log_reporter,
         stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover worker NAME`: help an orchestrator with the backfill from any host; returns when
    there are no ranges left to copy."""
    from mover.heartbeat import Heartbeat
    db = _database(dsn)
    stop = stop or threading.Event()
    lost = threading.Event()
    registry: set[str] = set()
    try:
        _require_schema(db)
        m = db.transaction(lambda cur: control.get(cur, name))
        while m.step in ("create_target", "install_capture") and m.state not in ("aborted", "failed"):
            stop.wait(1.0)  # the orchestrator has not reached the backfill yet
            if stop.is_set():
                break
            m = db.transaction(lambda cur: control.get(cur, name))
        if m.step != "backfill" or m.state == "aborted":
            return status(dsn, name, db=db)
        def keep(cur) -> bool:
            chunks.keep_leases(cur, m.id, sorted(registry))
            return True  # a worker's only lease is its ranges': losing one shows when it commits

        beat = Heartbeat(dsn, keep, lost, name=f"worker-lease-{m.id}")
        beat.start()
        try:
            workers = [backfill_engine.Worker(dsn, m, backfill_engine.worker_id(i), stop=stop, lost=lost,
                                              registry=registry, report=report, n_workers=threads)
                       for i in range(threads)]
            pool = [threading.Thread(target=w.run, daemon=True) for w in workers]
            for t in pool:
                t.start()
            for t in pool:
                while t.is_alive():
                    t.join(0.5)
        finally:
            beat.stop()
        errors = [w.error for w in workers if w.error is not None]
        if errors:
            raise errors[0]
        return status(dsn, name, db=db)
    finally:
        db.close()


def maintain_partitions(dsn: str, table: str | None = None, *, all_tables: bool = False,
                        dry_run: bool = False) -> list[dict[str, Any]]:
    """`mover partitions maintain [TABLE | --all]`: for each partitioned conversion, create the
    partitions `premake` ahead, report the default partition's rows, detach (and with
    drop_detached, drop) partitions past the retention. Idempotent: safe from cron."""
    from mover.db import bind
    from mover.sql import partitions as partition_sql

    if (table is None) == (not all_tables):
        raise BadInput("name one table (or migration), or pass --all", hint="mover partitions maintain --all")
    db = _database(dsn)
    try:
        _require_schema(db)

        def find(cur):
            out = []
            for m in control.list_all(cur):
                plan = plan_from_canonical(m.plan)
                if plan.partition is None or m.state == "aborted":
                    continue
                if table is not None and table not in (m.name, m.source.name, str(m.source)):
                    continue
                live = partitions.live_table(cur, m.source, m.target)
                if live is not None:
                    out.append((m, plan, live))
            return out
        found = db.transaction(find, label="partitions")
        if table is not None and not found:
            raise NotFound(f"no partitioned conversion of {table!r} (by migration name or source table)",
                           hint="`mover status` lists the migrations")
        results = []
        for m, plan, live in found:
            spec = plan.partition
            assert spec is not None and live.schema is not None
            premake = spec.premake if plan.upkeep.premake is None else plan.upkeep.premake
            # The plan's cutover lock_timeout: the application waits at most this long behind
            # a partition being created or detached; a busy table is retried (db.transaction).
            lock = f"{plan.cutover.lock_timeout_ms}ms"
            todo = db.transaction(bind(partitions.maintain_plan, spec, premake, plan.upkeep.retention, live,
                                       m.source.name), label="partitions")
            report: dict[str, Any] = {"migration": m.name, "table": todo["table"], "partitions": todo["partitions"],
                                      "default_rows": todo["default_rows"], "dry_run": dry_run,
                                      "create": [p.describe() for p in todo["create"]], "created": [],
                                      "blocked": [], "detach": todo["detach"], "detached": [], "dropped": []}
            if todo["default_rows"]:
                log.warning("%s: %d rows are in the default partition; partitions covering them cannot be created "
                            "until they are moved out", live, todo["default_rows"])
            if not dry_run:
                for p in todo["create"]:
                    stmt = partition_sql.create_partition(QualifiedName(live.schema, p.name), live, p.bound)
                    try:
                        db.transaction(bind(psycopg.Cursor.execute, stmt), lock_timeout=lock, label="create partition")
                        report["created"].append(p.name)
                    except psycopg.errors.CheckViolation:
                        # The default partition holds rows of this range: PostgreSQL refuses.
                        # Carve them out under the parent's lock instead.
                        try:
                            moved = db.transaction(bind(partitions.carve_from_default, live, p, spec.columns[0]),
                                                   lock_timeout=lock, statement_timeout="30s",
                                                   label="partition from default")
                            report["created"].append(p.name)
                            report["moved_from_default"] = report.get("moved_from_default", 0) + moved
                        except psycopg.errors.QueryCanceled as exc:
                            report["blocked"].append({"name": p.name, "error": str(exc).splitlines()[0]})
                for name in todo["detach"]:
                    child = QualifiedName(live.schema, name)
                    if name in todo["pending"]:
                        db.autocommit(partition_sql.detach_finalize(live, child), lock_timeout="1min")
                    elif todo["has_default"]:
                        db.transaction(bind(psycopg.Cursor.execute, partition_sql.detach(live, child)),
                                       lock_timeout=lock, label="detach partition")
                    else:
                        # SHARE UPDATE EXCLUSIVE only: writers go on; the wait is for older snapshots.
                        db.autocommit(partition_sql.detach_concurrently(live, child), lock_timeout="1min")
                    report["detached"].append(name)
                    if plan.upkeep.drop_detached:
                        db.transaction(bind(psycopg.Cursor.execute, ddl.drop_table(child)), lock_timeout=lock,
                                       label="drop partition")
                        report["dropped"].append(name)
            results.append(report)
        return results
    finally:
        db.close()
