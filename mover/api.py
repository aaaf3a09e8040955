"""The commands as plain functions (used by the CLI, the demo and the tests): each opens the
database and hands over: plan checks to mover/checks/, registration and transitions to
mover/state/control.py, the steps and the operator commands (legal per control.COMMANDS) to
mover/runner/__init__.py, the reads to mover/views/status.py, range workers to chunks.run_workers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import psycopg

from mover import checks, runner, steps
from mover.catalog import shape, subscribers
from mover.checks import edits as edits_check
from mover.db import Database, bind, conversion_settings, is_connection_lost, one, search_path
from mover.db import open_database as _database
from mover.engines import adopt as adopt_engine
from mover.engines import backfill as backfill_engine
from mover.engines import logical, parity, partitions
from mover.engines import reconcile as reconcile_engine
from mover.engines.context import Context, Reporter, log_reporter
from mover.errors import BadInput, Failed, Interrupted, LeaseHeld, NotFound, PlanError, Waiting
from mover.names import QualifiedName
from mover.plan import Plan, load_plan, plan_from_canonical
from mover.runner import follow as follow_engine
from mover.sql import ddl
from mover.state import control, ranges, samples
from mover.views import status as status_mod

if TYPE_CHECKING:  # imported where the workers start (api.work); only the annotation needs it here
    from mover.state.heartbeat import Heartbeat

log = logging.getLogger("mover")


def _require_schema(db: Database) -> None:
    if not db.transaction(control.schema_ready):
        raise BadInput("mover's control schema is not installed in this database", hint="run `mover init` first")


# ---------------------------------------------------------------------------------------------
# init


def init(dsn: str) -> str:
    db = _database(dsn)
    try:
        subscribers.refuse_init(db)  # before anything is created
    finally:
        db.close()
    return control.init_schema(dsn)


# ---------------------------------------------------------------------------------------------
# Plans against the live database (the checks themselves: mover/checks/)


def resolve_plan(cur: psycopg.Cursor, plan: Plan) -> dict[str, Any]:
    """Check the plan against the catalog (every problem at once); return resolved names and the
    key. Changes nothing: the target's DDL is rehearsed inside a savepoint that is rolled back."""
    return checks.resolved(checks.run(cur, plan))


def _next_id(cur: psycopg.Cursor) -> int:
    """The id registration gives the next migration, so that `plan check` shows the names (which
    carry it: mover.m7_changes...) the run will use. Peeked, not taken: a registration by someone
    else in between would take it, and the names shift by one."""
    cur.execute("SELECT pg_sequence_last_value(pg_get_serial_sequence('mover.migrations', 'id'))")
    last = one(cur)[0]
    return 1 if last is None else int(last) + 1


def _provisional(plan: Plan, r: dict[str, Any], mid: int = 0) -> control.Migration:
    """A migration row as registration would write it, for describing a plan not yet registered."""
    now = datetime.now(UTC)
    return control.Migration(
        id=mid, name=plan.name, plan=plan.canonical(), plan_hash=plan.shape_hash(r["source"].schema),
        source=r["source"],
        target=r["target"], old=r["old"], key_columns=r["key"], step="create_target", state="pending",
        paused=False, error=None, created_at=now, updated_at=now, cutover_at=None, cutover_lock_ms=None,
        window_ends_at=None, finished_at=None, lease_owner=None, lease_host=None, lease_pid=None,
        lease_expires_at=None, settings={"search_path": search_path(r["operator_schemas"])})


def check_plan(dsn: str, path: str | Path) -> dict[str, Any]:
    plan = load_plan(path)
    db = _database(dsn)
    try:
        def check(cur: psycopg.Cursor) -> dict[str, Any]:
            if not control.schema_ready(cur):
                raise BadInput("mover's control schema is not installed in this database",
                               hint="run `mover init` first")
            existing = control.find(cur, plan.name)
            if existing is not None and existing.state not in ("aborted",):
                _same_shape(existing, plan)
                changes = edits_check.check(cur, existing, plan)
                return {"plan": str(path), "name": plan.name, "registered": True, "ok": True,
                        "edits": [{"key": c.key, "takes_effect": c.effect} for c in changes],
                        "status": status_mod.status_of(cur, existing), "steps": [], **_hooks_and_warnings(plan)}
            r = resolve_plan(cur, plan)
            mid = _next_id(cur)
            ctx = Context(db=db, migration=_provisional(plan, r, mid), owner="plan-check")
            out_steps = []
            for step in steps.ALL:
                out_steps.append({"name": step.name,
                                  "sql": [s if isinstance(s, str) else s.as_string(cur)
                                          for s in step.describe(ctx, cur)]})
            return {"plan": str(path), "name": plan.name, "registered": False, "ok": True, "migration_id": mid,
                    "tables": {"source": str(r["source"]), "target": str(r["target"]), "old": str(r["old"])},
                    "key": r["key"], "lossy_accepted": r["lossy"], "partitioning": r["partitioning"],
                    "metadata": r["metadata"],
                    "steps": out_steps, **_hooks_and_warnings(plan, r["warnings"])}
        # Rolled back whatever happens: checking a plan changes nothing. (Not READ ONLY: the
        # target's DDL is rehearsed, in a savepoint that is rolled back too.)
        conn = db.connection()
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            db.pin_local(cur)  # the pinned settings, behind a pooler too (as Database.transaction)
            cur.execute("SET LOCAL lock_timeout = '2s'; SET LOCAL statement_timeout = '30s'")
            return check(cur)
    finally:
        db.close()


def _hooks_and_warnings(plan: Plan, found: list[str] | None = None) -> dict[str, Any]:
    """The plan's hooks, and what the operator should know before the swap (`found`: what the
    checks saw in the database, mover/checks/search_path.py)."""
    warnings = list(found or [])
    if plan.columns:
        # PostgreSQL re-plans a prepared statement after the swap, and refuses one whose result
        # type changed: every execution fails until the application prepares it again.
        hooked = [e for e in ("after_cutover", "after_rollback") if e in plan.hooks]
        warnings.append(
            f"the type change of {', '.join(repr(c) for c in sorted(plan.columns))} changes the result type of "
            f"statements that return {'it' if len(plan.columns) == 1 else 'them'}: a server-side prepared statement "
            f"prepared before the swap (or the rollback) fails with SQLSTATE 0A000 \"cached plan must not change "
            f"result type\" on every execution until the application prepares it again"
            + (f"; hooks configured: {', '.join(hooked)}" if hooked else
               "; add [hooks.after_cutover] and [hooks.after_rollback] that make the application re-prepare (e.g. "
               "PgBouncer's RECONNECT, DEALLOCATE ALL on its sessions, or a pg_notify it listens to); see "
               "docs/operating.md"))
    return {"hooks": {event: h.describe() for event, h in plan.hooks.items()}, "warnings": warnings}


def _same_shape(existing: control.Migration, plan: Plan) -> None:
    if existing.plan_hash != plan.shape_hash(existing.source.schema):
        # The hint names what works at the migration's step: abort only before the cutover.
        if existing.state == "done" or existing.step == "finished":
            how = (f"migration {plan.name!r} is done (retired); give the changed plan a new [migration] name to run "
                   f"it as a new migration")
        elif existing.step in control.COMMANDS["abort"]:
            how = f"restore the plan, or `mover abort {plan.name}` and start again under a new [migration] name"
        elif existing.step == "rollback_window":
            how = (f"restore the plan; or `mover retire {plan.name}` (after its window) and run the changed plan "
                   f"under a new [migration] name; or `mover rollback {plan.name}` then `mover abort {plan.name}`")
        else:
            how = f"restore the plan, or let `mover run {plan.name}` finish it, then use a new [migration] name"
        raise PlanError(
            f"plan for {plan.name!r} differs from the one registered (source, target, columns and "
            f"[rollback] old_name define a migration; only the other settings may change between runs)",
            hint=how)


def _register_or_load(db: Database, plan: Plan, actor: str) -> control.Migration:
    def register(cur: psycopg.Cursor) -> control.Migration:
        existing = control.find(cur, plan.name)
        if existing is not None and existing.state == "aborted":
            # Keep the aborted attempt's history under another name; start afresh.
            control.set_aside_aborted(cur, existing, actor)
            existing = None
        if existing is not None:
            _same_shape(existing, plan)
            if existing.plan != plan.canonical():
                changes = edits_check.check(cur, existing, plan)
                control.update_plan(cur, existing.id, plan.canonical(), actor, [c.describe() for c in changes])
                for c in changes:
                    log.warning("plan of %r updated: %s", plan.name, c.describe())
            return control.get_by_id(cur, existing.id)
        r = resolve_plan(cur, plan)
        m = control.register(cur, name=plan.name, plan=plan.canonical(),
                             plan_hash=plan.shape_hash(r["source"].schema),
                             source=r["source"], target=r["target"], old=r["old"], key=r["key"], actor=actor,
                             settings={**conversion_settings(cur),
                                       "search_path": search_path(r["operator_schemas"])})
        # The shape is described under the search_path every later step runs with: format_type and
        # pg_get_expr qualify names by it, and a description read under another would differ.
        db.pin_local(cur, m.settings)
        shape.record(cur, m.id, source=r["source"])  # fixed from here on (mover/catalog/shape.py)
        return m
    try:
        return db.transaction(register, label="register")
    except psycopg.errors.UniqueViolation as exc:
        raise PlanError(f"another migration of the same table or name was registered concurrently: {exc}",
                        hint="`mover status` shows it; run this plan again once that one is done, or rename it") \
            from exc


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
        return _run(db, dsn, name_or_plan, owner, one_step, wait, report, stop)
    except psycopg.Error as exc:
        if is_connection_lost(exc):
            raise runner.server_gone(name_or_plan, exc) from exc
        raise
    finally:
        db.close()


def follow(dsn: str, name_or_plan: str, *, report: Reporter = log_reporter, stop: threading.Event | None = None,
           interval: float = follow_engine.INTERVAL_SECONDS) -> dict[str, Any]:
    """`mover follow NAME` (= `mover run NAME --wait`): run the steps that need no decision, then
    keep the log drained at the gate and in the window until the operator decides elsewhere."""
    db = _database(dsn)
    owner = control.new_owner_id()
    try:
        m = _locate(db, name_or_plan, owner)
        if m.state == "aborted":
            raise BadInput(f"migration {m.name!r} was aborted", hint=_AFRESH)
        _follow(db, m, owner, report=report, stop=stop or threading.Event(), interval=interval)
        return status(dsn, m.name, db=db)
    except psycopg.Error as exc:
        if is_connection_lost(exc):
            raise runner.server_gone(name_or_plan, exc) from exc
        raise
    finally:
        db.close()


def _run(db: Database, dsn: str, name_or_plan: str, owner: str, one_step: bool, wait: bool, report: Reporter,
         stop: threading.Event | None) -> dict[str, Any]:
    m = _locate(db, name_or_plan, owner)
    if m.state == "aborted":
        raise BadInput(f"migration {m.name!r} was aborted", hint=_AFRESH)
    if wait:
        _follow(db, m, owner, report=report, stop=stop or threading.Event())
    elif m.state != "done":
        with runner.leased(db, m, owner, report=report, stop=stop) as ctx:
            if one_step and steps.BY_NAME.get(ctx.migration.step, steps.ALL[0]).gate:
                raise Waiting(f"the next step of {m.name!r} is the cutover",
                              hint=f"run `mover cutover {m.name}` to swap")
            runner.advance(ctx, one_step=one_step)
    return status(dsn, m.name, db=db)


# What gets an aborted migration going again: its plan file registers it afresh (the aborted
# attempt is kept under another name, control.set_aside_aborted).
_AFRESH = "`mover run PLAN` with its plan file starts it afresh (the aborted attempt's history is kept)"


def _follow(db: Database, m: control.Migration, owner: str, *, report: Reporter, stop: threading.Event,
            interval: float = follow_engine.INTERVAL_SECONDS) -> None:
    """Steps under the lease; the gate and the window without it (the operator's commands take it).
    Ends when the migration is done or aborted, when the operator took it elsewhere than the window
    (a rollback, a retire, an abort), or on SIGTERM / Ctrl-C."""
    ctx = Context(db=db, migration=m, owner=owner, report=report, stop=stop)
    followed = False
    while not stop.is_set():
        m = ctx.refresh()
        if m.state in control.TERMINAL or m.step == control.FINISHED:
            return
        if follow_engine.following(m):
            followed = True
            why = follow_engine.follow(ctx, interval=interval)
            if why == "stopped":
                report("follow_stopped", step=ctx.migration.step, reason="signal")
                return
            if why == "left" and not follow_engine.following(ctx.refresh()):
                report("follow_done", step=ctx.migration.step, state=ctx.migration.state)
                return  # a rollback, retire or abort from another terminal: the operator decides what next
            if why != "window_over":
                continue
        elif followed:
            return
        # A step to run (or the window is over: close it and retire), under the lease.
        try:
            with runner.leased(db, m, owner, report=report, stop=stop) as leased_ctx:
                runner.advance(leased_ctx)
        except Waiting:
            if not follow_engine.following(ctx.refresh()):
                raise  # waiting for something else than the gate or window (divergences are at the gate)
        except LeaseHeld:
            # An operator command runs now; look again shortly.
            if stop.wait(interval):
                return
        except Interrupted:
            return


def _operator_command(dsn: str, name: str, command: str, action: Callable[[Context], object],
                      report: Reporter = log_reporter, stop: threading.Event | None = None) -> dict[str, Any]:
    """Run one operator command under the lease; control.COMMANDS says at which steps it is legal
    (checked here to refuse early, and again under the lease)."""
    db = _database(dsn)
    owner = control.new_owner_id()
    try:
        _require_schema(db)
        m = db.transaction(lambda cur: control.get(cur, name))
        control.require_command(m, command)
        with runner.leased(db, m, owner, report=report, stop=stop, command=command) as ctx:
            control.require_command(ctx.refresh(), command)
            if command not in ("abort", "adopt"):  # the two ways out of a changed shape
                ctx.db.transaction(lambda cur: shape.verify_at_step(cur, ctx.migration, ctx.swapped),
                                   label="shape check")
            action(ctx)
        return status(dsn, name, db=db)
    except psycopg.Error as exc:
        if is_connection_lost(exc):
            raise runner.server_gone(name, exc) from exc
        raise
    finally:
        db.close()


def cutover_now(dsn: str, name: str, **kw: Any) -> dict[str, Any]:
    return _operator_command(dsn, name, "cutover", runner.cutover, **kw)


def rollback(dsn: str, name: str, *, give_up_rows: bool = False, **kw: Any) -> dict[str, Any]:
    return _operator_command(dsn, name, "rollback", lambda ctx: runner.rollback(ctx, give_up_rows=give_up_rows),
                             **kw)


def retire(dsn: str, name: str, *, force: bool = False, give_up_rows: bool = False, **kw: Any) -> dict[str, Any]:
    return _operator_command(dsn, name, "retire",
                             lambda ctx: runner.retire(ctx, force=force, give_up_rows=give_up_rows), **kw)


def reconcile(dsn: str, name: str, *, full: bool = False, **kw: Any) -> dict[str, Any]:
    """`mover reconcile NAME`: a reconcile pass now. At the reconcile step it is that step (the
    migration moves to the cutover gate when the tables are equal); at the gate it is an extra
    pass over the ranges changed since the last one (all of them with `full`)."""
    from mover.steps import reconcile as reconcile_step
    out: dict[str, Any] = {}

    def go(ctx: Context) -> None:
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
    st = _operator_command(dsn, name, "reconcile", go, **kw)
    return {"pass": out.get("pass"), "status": st}


def repair(dsn: str, name: str, *, divergence_id: int | None = None, **kw: Any) -> dict[str, Any]:
    """`mover repair NAME`: re-sync the open divergences' rows from the source and check them again."""
    out: dict[str, Any] = {}

    def go(ctx: Context) -> None:
        out["repair"] = reconcile_engine.repair(ctx, divergence_id)
        if ctx.migration.step == "cutover":
            left = ctx.db.transaction(lambda cur: control.open_divergences(cur, ctx.mid))
            ctx.db.transaction(lambda cur: control.set_state(
                cur, ctx.mid, "waiting", owner=ctx.owner, error=f"{left} divergences" if left else None))
    st = _operator_command(dsn, name, "repair", go, **kw)
    return {"repair": out.get("repair"), "status": st}


def accept(dsn: str, name: str, reason: str, *, divergence_id: int | None = None) -> dict[str, Any]:
    """`mover accept NAME --reason TEXT`: close open divergences (or one) as intended; they stay in
    the history with the reason, and a later pass that finds the same difference leaves it be."""
    if not reason or not reason.strip():
        raise BadInput("accepting divergences needs a reason", hint="pass --reason TEXT")
    db = _database(dsn)
    try:
        _require_schema(db)

        def go(cur: psycopg.Cursor) -> list[int]:
            m = control.get(cur, name, lock=True)
            control.require_command(m, "accept")
            ids = reconcile_engine.accept(cur, m.id, reason.strip(), control.new_owner_id(), divergence_id)
            if divergence_id is not None and not ids:
                raise NotFound(f"migration {m.name!r} has no open divergence with id {divergence_id}",
                               hint=f"`mover divergences {m.name}` lists the open ones")
            return ids
        ids = db.transaction(go)
        return {"accepted": ids, "status": status(dsn, name, db=db)}
    finally:
        db.close()


def adopt(dsn: str, name: str, **kw: Any) -> dict[str, Any]:
    """`mover adopt NAME`: apply an additive change of the live table's shape (a column, a CHECK, an
    index) to the other table, re-sync what it touched, record the new shapes; refused (exit 2) for
    any other change."""
    out: dict[str, Any] = {}

    def go(ctx: Context) -> None:
        out["adopted"] = adopt_engine.adopt(ctx)
    st = _operator_command(dsn, name, "adopt", go, **kw)
    return {"adopted": out.get("adopted", []), "status": st}


def recapture(dsn: str, name: str, **kw: Any) -> dict[str, Any]:
    """`mover recapture NAME`: after its replication slot was lost, logical capture from a new one,
    and the next reconcile pass over every range (mover/engines/logical.py recapture)."""
    out: dict[str, Any] = {}

    def go(ctx: Context) -> None:
        out["slot"] = logical.recapture(ctx)
    st = _operator_command(dsn, name, "recapture", go, **kw)
    return {"slot": out.get("slot"), "status": st}


def abort(dsn: str, name: str, *, give_up_rows: bool = False, **kw: Any) -> dict[str, Any]:
    return _operator_command(dsn, name, "abort", lambda ctx: runner.abort(ctx, give_up_rows=give_up_rows), **kw)


# ---------------------------------------------------------------------------------------------
# Reading


# One migration's status for a name, every migration's without: typed per call for the callers.
@overload
def status(dsn: str, name: str, *, db: Database | None = None) -> dict[str, Any]: ...
@overload
def status(dsn: str, name: None = None, *, db: Database | None = None) -> list[dict[str, Any]]: ...
@overload
def status(dsn: str, name: str | None, *, db: Database | None = None) -> dict[str, Any] | list[dict[str, Any]]: ...


def status(dsn: str, name: str | None = None, *, db: Database | None = None) -> Any:
    own = db is None
    db = db or _database(dsn)
    try:
        _require_schema(db)

        def read(cur: psycopg.Cursor) -> dict[str, Any] | list[dict[str, Any]]:
            if name is not None:
                return status_mod.status_of(cur, control.get(cur, name))
            return [status_mod.status_of(cur, m) for m in control.list_all(cur)]
        return db.transaction(read, label="status")
    finally:
        if own:
            db.close()


def parity_report(dsn: str, name: str) -> dict[str, Any]:
    """`mover parity NAME`: the metadata differences (mover/engines/parity.py), read-only."""
    db = _database(dsn)
    try:
        _require_schema(db)

        def read(cur: psycopg.Cursor) -> dict[str, Any]:
            m = control.get(cur, name)
            return parity.report(cur, Context(db=db, migration=m, owner="parity"))
        return db.transaction(read, label="parity")
    finally:
        db.close()


def history(dsn: str, name: str | None = None) -> list[dict[str, Any]]:
    """`mover history [NAME]`: every migration (or NAME and its aborted attempts) with its outcome
    and step durations."""
    from mover.views import history as history_mod
    db = _database(dsn)
    try:
        _require_schema(db)
        found = db.transaction(lambda cur: history_mod.history(cur, name), label="history")
        if name is not None and not found:
            raise NotFound(f"no migration named {name!r}, now or in the past",
                           hint="`mover history` lists every migration")
        return found
    finally:
        db.close()


def divergences(dsn: str, name: str, *, include_resolved: bool = False) -> list[dict[str, Any]]:
    db = _database(dsn)
    try:
        _require_schema(db)

        def read(cur: psycopg.Cursor) -> list[dict[str, Any]]:
            m = control.get(cur, name)
            return [{**d, "found_at": status_mod.iso(d["found_at"]), "resolved_at": status_mod.iso(d["resolved_at"]),
                     "checked_at": status_mod.iso(d["checked_at"])}
                    for d in control.list_divergences(cur, m.id, include_resolved)]
        return db.transaction(read)
    finally:
        db.close()


def events(dsn: str, name: str, limit: int = 50) -> list[dict[str, Any]]:
    db = _database(dsn)
    try:
        def read(cur: psycopg.Cursor) -> list[dict[str, Any]]:
            m = control.get(cur, name)
            return [{**e, "at": status_mod.iso(e["at"])} for e in control.events(cur, m.id, limit)]
        return db.transaction(read)
    finally:
        db.close()


# ---------------------------------------------------------------------------------------------
# Throttling and extra workers


def set_paused(dsn: str, name: str, paused: bool) -> dict[str, Any]:
    db = _database(dsn)
    try:
        _require_schema(db)

        db.transaction(bind(control.set_paused, name, paused, control.new_owner_id()), label="pause")
        return status(dsn, name, db=db)
    finally:
        db.close()


def set_settings(dsn: str, name: str, assignments: list[str]) -> dict[str, Any]:
    """`section.key=value` for the settings a running migration may change (plan.SETTABLE);
    values are parsed as TOML, validated like a plan file, recorded as an event."""
    import tomllib

    from mover.plan import RENAMED_KEYS, SETTABLE, parse_plan, to_document
    db = _database(dsn)
    try:
        _require_schema(db)

        def apply(cur: psycopg.Cursor) -> None:
            m = control.get(cur, name, lock=True)
            doc = to_document(plan_from_canonical(m.plan))
            changes = {}
            for item in assignments:
                key, sep, raw = item.partition("=")
                section, _, field = key.strip().partition(".")
                field = RENAMED_KEYS.get((section, field), field)
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
    """`mover worker NAME`: help an orchestrator from any host with the ranges of the backfill, then
    of a reconcile pass it has started; returns when there are none left to take."""
    from mover.state.heartbeat import Heartbeat
    db = _database(dsn)
    stop = stop or threading.Event()
    try:
        _require_schema(db)
        served: set[str] = set()
        while not stop.is_set():
            m = db.transaction(lambda cur: control.get(cur, name))
            if m.state in ("aborted", "failed", "done"):
                break
            if m.step in ("create_target", "install_capture"):
                stop.wait(1.0)  # the orchestrator has not reached the backfill yet
                continue
            kind = backfill_engine.KIND if m.step == "backfill" else reconcile_engine.KIND
            if m.step not in ("backfill", "reconcile", "cutover"):
                break
            if kind in served:
                if kind == backfill_engine.KIND and _orchestrated(db, m):
                    stop.wait(1.0)  # the orchestrator builds the indexes; a reconcile pass comes next
                    continue
                break
            if kind == reconcile_engine.KIND:
                st = db.transaction(bind(ranges.state, m.id, reconcile_engine.KIND))
                if m.step == "reconcile" and not st["started"] and _orchestrated(db, m):
                    stop.wait(1.0)  # the orchestrator has yet to start the first pass
                    continue
                if st["exhausted"] and st["open"] == 0:
                    break  # no pass is under way: nothing to help with
            served.add(kind)
            _serve(db, m, kind, threads, report, stop, Heartbeat)
        return status(dsn, name, db=db)
    finally:
        db.close()


def _orchestrated(db: Database, m: control.Migration) -> bool:
    """Whether a live process holds the migration's lease: only then is a next phase coming for a
    helper to wait for (with none, it would wait for ever)."""
    def live(cur: psycopg.Cursor) -> bool:
        cur.execute("SELECT lease_expires_at > clock_timestamp() FROM mover.migrations WHERE id = %s", (m.id,))
        row = cur.fetchone()
        return bool(row and row[0])
    return db.transaction(live)


def _serve(db: Database, m: control.Migration, kind: str, threads: int, report: Reporter,
           stop: threading.Event, heartbeat: Callable[..., Heartbeat]) -> None:
    """Run `threads` workers of one engine on this migration's ranges until none is left, under a
    heartbeat that keeps their ranges' leases (a worker holds no lease of the migration's own)."""
    lost = threading.Event()
    registry: set[str] = set()
    workers: list[ranges.RangeWorker]
    if kind == backfill_engine.KIND:
        workers = [backfill_engine.Worker(db.dsn, m, ranges.worker_id(i), stop=stop, lost=lost, registry=registry,
                                          report=report, n_workers=threads) for i in range(threads)]
    else:
        ctx = Context(db=db, migration=m, owner=control.new_owner_id(), report=report, stop=stop, lease_lost=lost)
        spec = db.transaction(lambda cur: reconcile_engine.spec_for(cur, ctx.mapping(cur)))
        result = reconcile_engine.PassResult("helper")
        workers = [reconcile_engine.Worker(db.dsn, m, ranges.worker_id(i), spec, result, stop=stop, lost=lost,
                                           registry=registry, report=report, n_workers=threads)
                   for i in range(threads)]

    def keep(cur: psycopg.Cursor) -> bool:
        ranges.keep_leases(cur, m.id, sorted(registry))
        return True  # a worker's only lease is its ranges': losing one shows when it commits

    beat = heartbeat(db.dsn, keep, lost, name=f"worker-lease-{m.id}")
    beat.start()
    try:
        ranges.run_workers(workers, f"helper-{kind}")
    finally:
        beat.stop()


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

        def find(cur: psycopg.Cursor) -> list[tuple[control.Migration, Plan, QualifiedName]]:
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
            if plan.upkeep.manager == "pg_partman" and m.state == "done":
                results.append(_partman_maintain(db, m, plan, premake, live, lock, dry_run))
                continue
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
            if plan.upkeep.manager == "pg_partman":
                report["manager"] = "mover (pg_partman takes over once the migration is retired)"
            results.append(report)
        return results
    finally:
        db.close()


def _partman_maintain(db: Database, m: control.Migration, plan: Plan, premake: int, live: QualifiedName, lock: str,
                      dry_run: bool) -> dict[str, Any]:
    """maintain for a retired conversion with manager = "pg_partman": the first run hands the
    table over (create_parent), every run defers to pg_partman's run_maintenance. Reports the
    partitions it created and removed by comparing before and after."""
    from mover.sql import partitions as partition_sql
    spec = plan.partition
    assert spec is not None  # only partitioned conversions reach maintain

    def names_of(cur: psycopg.Cursor) -> set[str]:
        return {c.name for c, _, _, _ in partitions.children(cur, live)}

    def default_rows(cur: psycopg.Cursor) -> int | None:
        default = next((c for c, _, d, _ in partitions.children(cur, live) if d), None)
        if default is None:
            return None
        cur.execute(partition_sql.count_rows(default))
        rows: int = one(cur)[0]
        return rows

    def registered(cur: psycopg.Cursor) -> bool:
        return partitions.partman_config(cur, partitions.check_partman(cur, live), live) is not None

    before = db.transaction(names_of, label="partitions")
    handed = db.transaction(registered, label="partitions")
    report: dict[str, Any] = {"migration": m.name, "table": str(live), "manager": "pg_partman", "dry_run": dry_run,
                              "partitions": len(before), "handed_over": False, "registered": handed,
                              "create": [], "created": [], "blocked": [], "detach": [], "detached": [],
                              "dropped": [], "default_rows": None}
    if dry_run:
        return report
    # Under the parent's lock (hand-over) and pg_partman's DDL: bounded like a swap, retried whole.
    step = "create_parent"
    try:
        report["handed_over"] = db.transaction(
            bind(partitions.hand_over, spec, premake, plan.upkeep.retention, plan.upkeep.drop_detached, live),
            lock_timeout=lock, statement_timeout="60s", label="pg_partman create_parent")
        step = "run_maintenance"
        moved = db.transaction(bind(partitions.partman_maintain, spec, premake, live), lock_timeout=lock,
                               statement_timeout="60s", label="pg_partman run_maintenance")
    except psycopg.Error as exc:
        # Rolled back whole: the table is as it was (handed over or not).
        raise Failed(f"pg_partman {step} for {live} failed: {exc.diag.message_primary or exc}",
                     hint=f"fix the cause (pg_partman's part_config row for {partitions.partman_parent(live)}), "
                          f"then `mover partitions maintain {m.name}` again") from exc
    if moved:
        report["moved_from_default"] = moved
    after = db.transaction(names_of, label="partitions")
    report["registered"] = True
    report["partitions"] = len(after)
    report["default_rows"] = db.transaction(default_rows, label="partitions")
    report["created"] = sorted(after - before)
    report["detached"] = sorted(before - after)
    return report


# ---------------------------------------------------------------------------------------------
# Watching and reporting (the views themselves: mover/views/watch.py, mover/views/report.py)

WATCH_WINDOW_SECONDS = 600  # the sparklines' "last minutes"


def watch(dsn: str, name: str, show: Callable[[dict[str, Any]], None], *, interval: float,
          stop: threading.Event) -> dict[str, Any]:
    """Call show(snapshot) every `interval` seconds until the migration is done or aborted, or
    `stop` is set; returns the last snapshot. A snapshot is the status (mover/views/status.py) plus the
    live workers one by one, the samples of the last minutes, and this watch's own readings (one per
    interval: finer than the samples, which come every few seconds at best)."""
    db = _database(dsn)
    readings: list[dict[str, Any]] = []
    try:
        _require_schema(db)
        while True:
            snap = db.transaction(bind(_watch_snapshot, name), label="watch")
            now = datetime.now(UTC)
            readings = [r for r in readings if (now - r["at"]).total_seconds() < WATCH_WINDOW_SECONDS]
            readings.append({"at": now, "backfill_rows": snap["backfill"]["rows_copied"],
                             "reconcile_rows": snap["reconcile"]["rows_compared"],
                             "pending": snap["capture"]["pending"], "lag": snap["capture"]["lag_seconds"]})
            snap["readings"] = readings
            show(snap)
            if snap["state"] in ("done", "aborted") or stop.wait(interval):
                return snap
    finally:
        db.close()


def _watch_snapshot(cur: psycopg.Cursor, name: str) -> dict[str, Any]:
    m = control.get(cur, name)
    snap = status_mod.status_of(cur, m)
    snap["worker_list"] = status_mod.workers_of(cur, m)
    snap["lock_waits"] = status_mod.lock_waits(cur)
    cur.execute("SELECT now() - make_interval(secs => %s)", (WATCH_WINDOW_SECONDS,))
    snap["samples"] = samples.read(cur, m.id, since=one(cur)[0])
    snap["recent_events"] = [{**e, "at": status_mod.iso(e["at"])} for e in control.events(cur, m.id, 6)]
    return snap


def report(dsn: str, name: str) -> dict[str, Any]:
    """Everything `mover report` shows, in one snapshot: the plan, the status, the whole event story,
    every sample, every divergence with its resolution."""
    from mover.views import report as report_mod
    db = _database(dsn)
    try:
        _require_schema(db)
        return db.transaction(bind(report_mod.gather, name), label="report")
    finally:
        db.close()
