"""A plan becomes a migration: `mover init`, `mover plan check` (what registering the plan would do,
rolled back) and registration itself (the plan checked against the catalog, the migration row and
its recorded shape in one transaction), or the registered migration a name or plan file locates.

The checks themselves are mover/checks/ (every problem at once); what plan check prints for each
step comes from the steps' own describe() (describe == run); the row and its events are
mover/state/control.py's.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from mover import checks, names, steps
from mover.catalog import family as family_catalog
from mover.catalog import introspect, shape, subscribers
from mover.checks import edits as edits_check
from mover.checks import names as names_check
from mover.db import Database, conversion_settings, search_path
from mover.engines.bulk import builds, preflight
from mover.engines.context import Context
from mover.engines.governor import throttle
from mover.engines.swap import carry, cutover, lockwatch
from mover.errors import BadInput, PlanError, combined
from mover.names import QualifiedName
from mover.plan import Plan, duration_text, load_plan, member_name
from mover.plan.writer import toml_name
from mover.sql.mapping import Mapping
from mover.state import control
from mover.steps import cutover as cutover_step

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


def resolve_tables(cur: psycopg.Cursor, plan: Plan) -> list[tuple[Plan, dict[str, Any]]]:
    """Each table the plan moves (plan.tables(): itself, then its [[also]] tables, each named as
    registration names it), checked as a plan of one table would be, and the family as a whole
    (each table once); every problem of every table at once."""
    problems: list[PlanError] = []
    if plan.also and plan.capture.logical:
        # A family's replay is one statement over every table's log, and the keys between the
        # tables are checked at its end: it needs every change the sources show at that moment in
        # the logs, which the trigger gives (each change logged in the application's transaction).
        # Logical capture fills each log from its own slot, behind the application and table by
        # table: a child's new row can reach its log before its parent's, and the targets' keys
        # would refuse the replay though the application wrote nothing wrong.
        problems.append(PlanError(
            f"[capture] method = \"logical\" cannot move a family ({len(plan.also) + 1} tables: [migration] source "
            f"and [[also]]): the keys between its tables are checked at the end of each replay of their change "
            f"logs, which must then hold every change the sources show; logical capture fills each table's log "
            f"from its own slot, behind the application, so a child's change can be logged before its parent's",
            hint="remove [capture] method (the trigger, the default, logs each change in the application's "
                 "transaction), or move each table with a migration of its own"))
    out: list[tuple[Plan, dict[str, Any]]] = []
    for i, table in enumerate(plan.tables()):
        try:
            r = resolve(cur, table)
        except PlanError as exc:
            problems += exc.problems if i == 0 else [PlanError(f"[[also]] source = {table.source}: {p.message}",
                                                               hint=p.hint) for p in exc.problems]
            continue
        if i:
            table = dataclasses.replace(table, name=member_name(plan.name, r["source"]))
        out.append((table, r))
    seen: dict[int, QualifiedName] = {}
    for _, r in out:
        oid = r["info"].oid
        if oid in seen:
            problems.append(PlanError(f"[[also]] source = {r['source']} is {seen[oid]}, which the plan moves already",
                                      hint="list each table once: [migration] source, or one [[also]] table"))
        seen[oid] = r["source"]
    # A key between two tables of the family stays with them through the swap (docs/design.md
    # "Families"): it cannot be left on the old table alone.
    between = {(k.child, k.name) for k in family_catalog.between(cur, list(seen))} if len(seen) > 1 else set()
    for table, r in out:
        for name in table.drop_foreign_keys:
            if (r["info"].oid, name) in between:
                problems.append(PlanError(
                    f"drop_foreign_keys of {r['source']}: {names.display_ident(name)} references another table of "
                    f"this migration, and the keys between its tables move with them",
                    hint="remove it from drop_foreign_keys (or drop the key before the migration)"))
    if problems:
        raise combined(problems)
    return out


def widening_advice(cur: psycopg.Cursor, resolved: list[tuple[Plan, dict[str, Any]]]) -> tuple[list[str], list[str]]:
    """The columns that reference a key the plan widens and are narrower than it becomes
    (recursively, mover/catalog/family.py): a warning for each, and the [[also]] lines that widen
    them in this migration, ready to paste."""
    planned = {r["info"].oid: dict(p.columns) for p, r in resolved}
    found = family_catalog.widenings(cur, planned)
    in_plan = {r["info"].oid: "[target]" if i == 0 else f"[[also]] source = {toml_name(r['source'])}"
               for i, (_, r) in enumerate(resolved)}
    warnings = [f"column {names.display_ident(w.column)} of {w.table} ({w.was}) references {w.references}, which "
                f"becomes {w.type}: once the key passes the {w.was} range, rows referencing the new keys cannot be "
                f"written; widen it in this migration (foreign key {names.display_ident(w.constraint)}): plan check "
                f"prints the [[also]] lines" for w in found]
    return warnings, family_catalog.advice(found, in_plan)


def check(db: Database, path: str | Path | Plan) -> tuple[dict[str, Any], control.Migration | None]:
    """`mover plan check`: what registering the plan would do (each step and the SQL it will run,
    from the steps' describe(); per table, the counts and names its summary says), or, for a plan
    registered already, which of its edits take effect when. Returns that, and the registered
    migration if there is one (the caller shows its status). Runs in one transaction that is
    rolled back whatever happens: checking a plan changes nothing. `path`: a plan file, or a plan
    parsed already (a program's, mover/contrib/alembic.py), reported under its name."""
    plan = path if isinstance(path, Plan) else load_plan(path)
    if isinstance(path, Plan):
        path = f"plan {plan.name!r}"

    def describe(cur: psycopg.Cursor) -> tuple[dict[str, Any], control.Migration | None]:
        existing = control.find(cur, plan.name)
        if existing is not None and existing.state != "aborted":
            same_shape(control.as_one(control.family(cur, existing)), plan)
            changes = edits_check.check(cur, existing, plan)
            columns = [plan.columns, *(a.columns for a in plan.also)]  # the family's rows are in the plan's order
            guards = governor_lines(cur, plan, [(t.source, c) for t, c in zip(control.family(cur, existing), columns,
                                                                              strict=False)], existing.id)
            guards.pop("by_table")
            return ({"plan": str(path), "name": plan.name, "registered": True, "ok": True,
                     "edits": [{"key": c.key, "takes_effect": c.effect} for c in changes],
                     "steps": [], **guards, **hooks_and_warnings(plan, guards.pop("warnings"))}, existing)
        resolved = resolve_tables(cur, plan)
        mid = control.next_id(cur)
        rows = [provisional(p, r, mid + i, family=mid if plan.also else None, position=i if plan.also else None,
                            operator_schemas=[x for _, r2 in resolved for x in r2["operator_schemas"]])
                for i, (p, r) in enumerate(resolved)]
        head = Planned(db=db, migration=rows[0], owner="plan-check", rows=rows,
                       rehearsed={row.id: r2["rehearsed"] for row, (_, r2) in zip(rows, resolved, strict=True)})
        members = head.family(cur)
        taken(cur, [(t.migration, p) for t, (p, _) in zip(members, resolved, strict=True)])

        def text(stmts: list[Any]) -> list[str]:
            return [s if isinstance(s, str) else s.as_string(cur) for s in stmts]

        def described(ctx: Context) -> list[dict[str, Any]]:
            return [{"name": step.name, "sql": text(step.describe(ctx, cur))} for step in steps.ALL]

        r = resolved[0][1]
        warnings, advice = widening_advice(cur, resolved)
        found = [w for _, r2 in resolved for w in r2["warnings"]]
        guards = governor_lines(cur, plan, [(r2["source"], p.columns) for p, r2 in resolved])
        estimates = guards.pop("by_table")
        moved = {str(r2["source"]) for _, r2 in resolved}

        def table(ctx: Context, r: dict[str, Any], estimate: dict[str, Any]) -> dict[str, Any]:
            return {"name": ctx.migration.name, "migration_id": ctx.mid,
                    "tables": {"source": str(r["source"]), "target": str(r["target"]), "old": str(r["old"])},
                    "key": r["key"], "lossy_accepted": r["lossy"], "rollback_carries_back": r["carried_back"],
                    "partitioning": r["partitioning"], "metadata": r["metadata"],
                    "summary": summary(cur, ctx, r, estimate, moved)}

        out = {"plan": str(path), "name": plan.name, "registered": False, "ok": True,
               **table(head, r, estimates[0]), "steps": described(head), **guards,
               **hooks_and_warnings(plan, [*found, *warnings, *guards.pop("warnings")]), "also": advice,
               "swap": swap_summary(cur, plan, members)}
        if plan.also:
            sources = {r2["info"].oid: str(r2["source"]) for _, r2 in resolved}
            out["family"] = {"tables": [{**table(t, r2, e), "steps": described(t) if t is not head else []}
                                        for t, (_, r2), e in zip(members, resolved, estimates, strict=True)],
                             "sql": text([x for step in steps.ALL for x in step.describe_together(head, members, cur)]),
                             "keys": [{"name": k.name, "table": sources[k.child], "references": sources[k.parent]}
                                      for k in family_catalog.between(cur, list(sources))]}
        return out, None

    # Not READ ONLY: the target's DDL is rehearsed, in a savepoint that is rolled back too.
    conn = db.connection()
    with conn.transaction(force_rollback=True), conn.cursor() as cur:
        db.pin_local(cur)  # the pinned settings, behind a pooler too (as Database.transaction)
        cur.execute("SET LOCAL lock_timeout = '2s'; SET LOCAL statement_timeout = '30s'")
        return describe(cur)


@dataclasses.dataclass
class Planned(Context):
    """plan check's context: the tables' rows as registration would write them (not registered
    yet), and each target as its DDL rehearsal created it (rolled back since), so that the steps'
    describe() prints the copy's and the replay's conversions before the target exists."""

    rows: list[control.Migration] = dataclasses.field(default_factory=list)
    rehearsed: dict[int, introspect.TableInfo] = dataclasses.field(default_factory=dict)  # by migration id

    def rows_of_family(self, cur: psycopg.Cursor) -> list[control.Migration]:
        return self.rows

    def member(self, row: control.Migration) -> Context:
        return Planned(db=self.db, migration=row, owner=self.owner, report=self.report, rows=self.rows,
                       rehearsed=self.rehearsed)

    def described_mapping(self, cur: psycopg.Cursor, reverse: bool = False) -> Mapping | None:
        found = super().described_mapping(cur, reverse)
        planned = self.rehearsed.get(self.mid)
        if found is not None or planned is None:
            return found
        return self.map_tables(cur, introspect.describe(cur, self.original), planned, reverse)


def taken(cur: psycopg.Cursor, tables: list[tuple[control.Migration, Plan]]) -> None:
    """Every name plan check prints for these tables is free (mover/checks/names.py collisions): a
    taken one refused now, not met after the whole copy."""
    problems = [p for m, plan in tables for p in names_check.collisions(cur, m, plan)]
    if problems:
        raise combined(problems)


def governor_lines(cur: psycopg.Cursor, plan: Plan, tables: list[tuple[QualifiedName, dict[str, str]]],
                   mid: int | None = None) -> dict[str, Any]:
    """What plan check says of the throttle (one line per input, from the governor's own readings
    and verdicts) and the backfill's preflight for each table moved (the space and the WAL it
    takes; a family's summed), and a warning when a guard would hold mover at its first range now."""
    guards = throttle.describe(cur, plan, mid)
    pres = [(source, preflight.preflight(cur, source, columns)) for source, columns in tables]
    lines = [line if len(pres) == 1 else f"{source}: {line}" for source, pre in pres for line in pre["lines"][:2]]
    lines += pres[0][1]["lines"][2:]
    by_table = [{k: v for k, v in pre.items() if k != "lines"} for _, pre in pres]
    estimates = {k: sum(pre[k] for pre in by_table) for k in by_table[0]}
    segments = preflight.wal_segments(cur, estimates["wal_bytes"])
    lines.append(segments.pop("line"))
    estimates.update(segments)
    warnings = [f"mover would wait at its first range now: {guards['wait']}"] if guards["wait"] else []
    return {"throttle": guards["lines"], "preflight": lines, "estimates": estimates, "server": guards["readings"],
            "warnings": warnings, "by_table": by_table}


def summary(cur: psycopg.Cursor, ctx: Context, r: dict[str, Any], estimate: dict[str, Any],
            moved: set[str]) -> dict[str, Any]:
    """What plan check's summary says of one table (mover/views/plan_check.py), by name and count:
    what it creates, copies, checks and swaps, and what it leaves behind. From the same sources
    as the steps' describe() (the deferred builds, the capture's names, the swap's locks), read
    before anything exists. `estimate`: the table's preflight; `moved`: every source of the plan."""
    plan, m = ctx.plan, ctx.migration
    deferred = builds.deferred_indexes(cur, ctx)
    part = r["partitioning"]
    return {
        "created": {"target": str(m.target), "columns": dict(sorted(plan.columns.items())),
                    "partitions": len(part["partitions"]) if part else 0,
                    "indexes": [name for name, ix in deferred if not ix.by_constraint],
                    "constraints": [name for name, ix in deferred if ix.by_constraint],
                    "capture": "logical" if plan.capture.logical else "trigger",
                    "trigger": names.capture_trigger(ctx.mid), "change_log": str(names.change_log(ctx.mid))},
        "copied": {"range_rows": plan.backfill.range_rows, "rows_estimate": estimate["rows"],
                   "target_bytes": estimate["target_bytes"]},
        "checked": {"range_rows": plan.reconcile.range_rows, "workers": plan.reconcile.workers,
                    "before_cutover": plan.reconcile.before_cutover, "rehearse": plan.cutover.rehearse},
        # The tables whose foreign keys reference it and the views that read it, outside the
        # migration: the swap locks them and moves them onto the new table.
        "swapped": {"window": duration_text(plan.rollback.window_ms),
                    "also_changed": [str(x) for x in carry.also_locked(cur, m.source) if str(x) not in moved]},
        "left_behind": {"drop_foreign_keys": list(plan.drop_foreign_keys),
                        "not_carried": list((r["metadata"] or {}).get("not_carried", []))},
    }


def swap_summary(cur: psycopg.Cursor, plan: Plan, tables: list[Context]) -> dict[str, Any]:
    """The cutover's one transaction for plan check's summary: how many tables it swaps, the
    relations it locks (mover's own logs left out: lockwatch.own_tables), its lock_timeout and
    attempts, and for several tables the warning their statements carry (steps/cutover.py)."""
    own = {x for t in tables for x in lockwatch.own_tables(t.mid)}
    locks = [str(x) for x in cutover.swap_locks(cur, tables, forward=True) if x not in own]
    return {"tables": len(tables), "locks": locks, "lock_timeout_ms": plan.cutover.lock_timeout_ms,
            "attempts": plan.cutover.attempts,
            # A family's swap holds more locks for longer: what its statements warn of (race 9).
            "warning": cutover_step.deadlock_warning(cur, tables[0]) if len(tables) > 1 else None}


def provisional(plan: Plan, r: dict[str, Any], mid: int = 0, *, family: int | None = None,
                position: int | None = None, operator_schemas: list[str] | None = None) -> control.Migration:
    """A migration row as registration would write it, for describing a plan not yet registered."""
    now = datetime.now(UTC)
    return control.Migration(
        id=mid, name=plan.name, plan=plan.canonical(), plan_hash=plan.shape_hash(r["source"].schema),
        source=r["source"],
        target=r["target"], old=r["old"], key_columns=r["key"], step="create_target", state="pending",
        paused=False, error=None, created_at=now, updated_at=now, cutover_at=None, cutover_lock_ms=None,
        window_ends_at=None, finished_at=None, lease_owner=None, lease_host=None, lease_pid=None,
        lease_expires_at=None,
        settings={"search_path": search_path(operator_schemas if operator_schemas is not None
                                             else r["operator_schemas"])},
        family_id=family, family_position=position)


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
        else:  # only commands that work where it stands (control.ways_out)
            how = f"restore the plan; or {control.ways_out(existing)}, then run the changed plan under a new" \
                  f" [migration] name"
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
            same_shape(control.as_one(control.family(cur, existing)), plan)
            if existing.plan != plan.canonical():
                changes = edits_check.check(cur, existing, plan)
                update_plan(cur, existing, plan, actor, [c.describe() for c in changes])
                for c in changes:
                    log.warning("plan of %r updated: %s", plan.name, c.describe())
            return control.get_by_id(cur, existing.id)
        resolved = resolve_tables(cur, plan)
        # One search_path for the family: the one its sessions run with (every table's key operators').
        settings = {**conversion_settings(cur),
                    "search_path": search_path([x for _, r in resolved for x in r["operator_schemas"]])}
        head: control.Migration | None = None
        for i, (table, r) in enumerate(resolved):
            m = control.register(cur, name=table.name, plan=table.canonical(),
                                 plan_hash=table.shape_hash(r["source"].schema), source=r["source"], target=r["target"],
                                 old=r["old"], key=r["key"], actor=actor, settings=settings, family=head,
                                 position=i if plan.also else None)
            head = head or m
            taken(cur, [(m, table)])  # with the ids the run will use; the transaction rolls back
            # The shape is described under the search_path every later step runs with: format_type and
            # pg_get_expr qualify names by it, and a description read under another would differ.
            db.pin_local(cur, m.settings)
            shape.record(cur, m.id, source=r["source"])  # fixed from here on (mover/catalog/shape.py)
        assert head is not None
        return control.get_by_id(cur, head.id)
    try:
        return db.transaction(register, label="register")
    except psycopg.errors.UniqueViolation as exc:
        raise PlanError(f"another migration of the same table or name was registered concurrently: {exc}",
                        hint="`mover status` shows it; run this plan again once that one is done, or rename it") \
            from exc


def update_plan(cur: psycopg.Cursor, m: control.Migration, plan: Plan, actor: str, changes: list[str]) -> None:
    """Tunables changed (the shape hash is the same): stored with the migration, and with each other
    table of its family (each table's plan is derived from the family's, plan.tables())."""
    control.update_plan(cur, m.id, plan.canonical(), actor, changes)
    for row, table in zip(control.family(cur, m)[1:], plan.tables()[1:], strict=True):
        control.update_plan(cur, row.id, dataclasses.replace(table, name=row.name).canonical(), actor, changes)


def locate(db: Database, name_or_plan: str, actor: str) -> control.Migration:
    """A migration by name, or the one a plan file defines (registering it if need be); an aborted
    one is refused (its plan file starts it afresh). A table of a family is the family (its head)."""
    if name_or_plan.endswith(".toml") or Path(name_or_plan).is_file():
        m = register_or_load(db, load_plan(name_or_plan), actor)
    else:
        m = db.transaction(lambda cur: control.head_of(cur, control.get(cur, name_or_plan)))
    if m.state == "aborted":
        raise BadInput(f"migration {m.name!r} was aborted", hint=AFRESH)
    return m
