"""A plan becomes a migration: `mover init`, `mover plan check` (what registering the plan would do,
rolled back) and registration itself (the plan checked against the catalog, the migration row and
its recorded shape in one transaction), or the registered migration a name or plan file locates.

The checks themselves are mover/checks/ (every problem at once); what plan check prints for each
step comes from the steps' own describe() (describe == run); the row and its events are
mover/state/control.py's.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from mover import checks, steps
from mover.catalog import shape, subscribers
from mover.checks import edits as edits_check
from mover.db import Database, conversion_settings, search_path
from mover.engines import backfill, throttle
from mover.engines.context import Context
from mover.errors import BadInput, PlanError
from mover.names import QualifiedName
from mover.plan import Plan, load_plan
from mover.state import control

log = logging.getLogger("mover")

# What gets an aborted migration going again: its plan file registers it afresh (the aborted
# attempt is kept under another name, control.set_aside_aborted).
AFRESH = "`mover run PLAN` with its plan file starts it afresh (the aborted attempt's history is kept)"


def init(db: Database) -> str:
    """`mover init`: create or upgrade the control schema; returns the revision in force."""
    subscribers.refuse_init(db)  # before anything is created
    return control.init_schema(db.dsn)


def require_schema(db: Database) -> None:
    if not db.transaction(control.schema_ready):
        raise BadInput("mover's control schema is not installed in this database", hint="run `mover init` first")
    have, need = db.transaction(control.schema_revision), control.newest_revision()
    if have is not None and have < need:
        raise BadInput(f"mover's control schema is at revision {have}, and this mover needs {need}",
                       hint="run `mover init`: it upgrades the schema in place (migrations under way keep their state)")


def resolve(cur: psycopg.Cursor, plan: Plan) -> dict[str, Any]:
    """Check the plan against the catalog (every problem at once); return resolved names and the
    key. Changes nothing: the target's DDL is rehearsed inside a savepoint that is rolled back."""
    return checks.resolved(checks.run(cur, plan))


def check(db: Database, path: str | Path) -> tuple[dict[str, Any], control.Migration | None]:
    """`mover plan check`: what registering the plan would do (each step and the SQL it will run,
    from the steps' describe()), or, for a plan registered already, which of its edits take effect
    when. Returns that, and the registered migration if there is one (the caller shows its status).
    Runs in one transaction that is rolled back whatever happens: checking a plan changes nothing."""
    plan = load_plan(path)

    def describe(cur: psycopg.Cursor) -> tuple[dict[str, Any], control.Migration | None]:
        existing = control.find(cur, plan.name)
        if existing is not None and existing.state != "aborted":
            same_shape(existing, plan)
            changes = edits_check.check(cur, existing, plan)
            guards = governor_lines(cur, plan, existing.source, existing.id)
            return ({"plan": str(path), "name": plan.name, "registered": True, "ok": True,
                     "edits": [{"key": c.key, "takes_effect": c.effect} for c in changes],
                     "steps": [], **guards, **hooks_and_warnings(plan, guards.pop("warnings"))}, existing)
        r = resolve(cur, plan)
        mid = control.next_id(cur)
        ctx = Context(db=db, migration=provisional(plan, r, mid), owner="plan-check", planned_target=r["rehearsed"])
        described = [{"name": step.name, "sql": [s if isinstance(s, str) else s.as_string(cur)
                                                 for s in step.describe(ctx, cur)]}
                     for step in steps.ALL]
        guards = governor_lines(cur, plan, r["source"])
        return ({"plan": str(path), "name": plan.name, "registered": False, "ok": True, "migration_id": mid,
                 "tables": {"source": str(r["source"]), "target": str(r["target"]), "old": str(r["old"])},
                 "key": r["key"], "lossy_accepted": r["lossy"], "rollback_carries_back": r["carried_back"],
                 "partitioning": r["partitioning"], "metadata": r["metadata"], "steps": described, **guards,
                 **hooks_and_warnings(plan, r["warnings"] + guards.pop("warnings"))}, None)

    # Not READ ONLY: the target's DDL is rehearsed, in a savepoint that is rolled back too.
    conn = db.connection()
    with conn.transaction(force_rollback=True), conn.cursor() as cur:
        db.pin_local(cur)  # the pinned settings, behind a pooler too (as Database.transaction)
        cur.execute("SET LOCAL lock_timeout = '2s'; SET LOCAL statement_timeout = '30s'")
        return describe(cur)


def governor_lines(cur: psycopg.Cursor, plan: Plan, source: QualifiedName, mid: int | None = None) -> dict[str, Any]:
    """What plan check says of the throttle (one line per input, from the governor's own readings
    and verdicts) and the backfill's preflight (the space and the WAL it takes), and a warning
    when a guard would hold mover at its first range now."""
    guards = throttle.describe(cur, plan, mid)
    pre = backfill.preflight(cur, source, plan.columns)
    warnings = [f"mover would wait at its first range now: {guards['wait']}"] if guards["wait"] else []
    return {"throttle": guards["lines"], "preflight": pre["lines"],
            "estimates": {k: v for k, v in pre.items() if k != "lines"}, "server": guards["readings"],
            "warnings": warnings}


def provisional(plan: Plan, r: dict[str, Any], mid: int = 0) -> control.Migration:
    """A migration row as registration would write it, for describing a plan not yet registered."""
    now = datetime.now(UTC)
    return control.Migration(
        id=mid, name=plan.name, plan=plan.canonical(), plan_hash=plan.shape_hash(r["source"].schema),
        source=r["source"],
        target=r["target"], old=r["old"], key_columns=r["key"], step="create_target", state="pending",
        paused=False, error=None, created_at=now, updated_at=now, cutover_at=None, cutover_lock_ms=None,
        window_ends_at=None, finished_at=None, lease_owner=None, lease_host=None, lease_pid=None,
        lease_expires_at=None, settings={"search_path": search_path(r["operator_schemas"])})


def hooks_and_warnings(plan: Plan, found: list[str] | None = None) -> dict[str, Any]:
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


def same_shape(existing: control.Migration, plan: Plan) -> None:
    """Refuse a plan whose defining part (source, target, columns, old name) differs from the
    registered one's, naming what works at the migration's step."""
    if existing.plan_hash != plan.shape_hash(existing.source.schema):
        # The hint names what works at the migration's step: abort only before the cutover.
        if existing.state == "done" or existing.step == control.FINISHED:
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


def register_or_load(db: Database, plan: Plan, actor: str) -> control.Migration:
    """The migration `plan` defines: registered now (checked, its shape recorded, in one
    transaction), or the registered one with the plan's changed tunables applied."""
    def register(cur: psycopg.Cursor) -> control.Migration:
        existing = control.find(cur, plan.name)
        if existing is not None and existing.state == "aborted":
            # Keep the aborted attempt's history under another name; start afresh.
            control.set_aside_aborted(cur, existing, actor)
            existing = None
        if existing is not None:
            same_shape(existing, plan)
            if existing.plan != plan.canonical():
                changes = edits_check.check(cur, existing, plan)
                control.update_plan(cur, existing.id, plan.canonical(), actor, [c.describe() for c in changes])
                for c in changes:
                    log.warning("plan of %r updated: %s", plan.name, c.describe())
            return control.get_by_id(cur, existing.id)
        r = resolve(cur, plan)
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


def locate(db: Database, name_or_plan: str, actor: str) -> control.Migration:
    """A migration by name, or the one a plan file defines (registering it if need be); an aborted
    one is refused (its plan file starts it afresh)."""
    if name_or_plan.endswith(".toml") or Path(name_or_plan).is_file():
        m = register_or_load(db, load_plan(name_or_plan), actor)
    else:
        m = db.transaction(lambda cur: control.get(cur, name_or_plan))
    if m.state == "aborted":
        raise BadInput(f"migration {m.name!r} was aborted", hint=AFRESH)
    return m
