"""The operator's commands on a migration, each over a Database the caller opened (the session is
mover/api.py's): `run` and `follow`; the moves made under the orchestrator's lease (cutover,
rollback, retire, abort, reconcile, repair, adopt), each legal at the steps control.COMMANDS
lists (checked before the lease, to refuse early, and again under it); the changes that need no
lease (accept, pause, set: one guarded transaction each); partition upkeep. They return the
migration or plain data; what the operator reads of it is the interface's (mover/views/)."""

from __future__ import annotations

import logging
import threading
import tomllib
from collections.abc import Callable
from typing import Any

import psycopg

from mover import steps
from mover.catalog import shape
from mover.db import Database, bind
from mover.engines.bulk import adopt as adopt_engine
from mover.engines.bulk import reconcile as reconcile_engine
from mover.engines.capture import logical
from mover.engines.context import Context, Reporter, log_reporter
from mover.engines.partitioning import upkeep
from mover.engines.swap import keys
from mover.errors import BadInput, NotFound, Waiting
from mover.plan import RENAMED_KEYS, SETTABLE, Plan, parse_plan, plan_from_canonical, to_document
from mover.runner import follow as follower
from mover.runner import lifecycle, register
from mover.runner.lease import leased
from mover.state import control
from mover.steps import reconcile as reconcile_step

log = logging.getLogger("mover")


def run(db: Database, name_or_plan: str, *, one_step: bool = False, wait: bool = False,
        report: Reporter = log_reporter, stop: threading.Event | None = None) -> control.Migration:
    """`mover run` (and `mover step`): the steps that need no decision, up to the cutover gate;
    with `wait`, follow on from there (`mover follow`)."""
    if wait:
        return follow(db, name_or_plan, report=report, stop=stop)
    owner = control.new_owner_id()
    m = register.locate(db, name_or_plan, owner)
    if m.state != "done":
        with leased(db, m, owner, report=report, stop=stop) as ctx:
            step = control.step_of([t.migration for t in ctx.tables()])  # its tables' earliest
            if one_step and steps.BY_NAME.get(step, steps.ALL[0]).gate:
                raise Waiting(f"the next step of {m.name!r} is the cutover",
                              hint=f"run `mover cutover {m.name}` to swap")
            lifecycle.advance(ctx, one_step=one_step)
    return m


def follow(db: Database, name_or_plan: str, *, report: Reporter = log_reporter, stop: threading.Event | None = None,
           interval: float = follower.INTERVAL_SECONDS) -> control.Migration:
    """`mover follow` (= `mover run --wait`): run the steps that need no decision, then keep the
    log drained at the gate and in the window until the operator decides elsewhere."""
    owner = control.new_owner_id()
    m = register.locate(db, name_or_plan, owner)
    follower.follow(db, m, owner, report=report, stop=stop or threading.Event(), interval=interval)
    return m


def register_plan(db: Database, plan: Plan) -> control.Migration:
    """The migration `plan` defines, registered now (or its changed settings applied to the one
    registered under its name), without running a step: a program that starts a migration and
    leaves the running to `mover run NAME` elsewhere (mover/contrib/alembic.py)."""
    return register.register_or_load(db, plan, control.new_owner_id())


# ---------------------------------------------------------------------------------------------
# Under the lease


def _under_lease(db: Database, name: str, command: str, action: Callable[[Context], object], *,
                 report: Reporter = log_reporter, stop: threading.Event | None = None) -> control.Migration:
    """Run one operator command under the lease, from the recorded shapes (but abort and adopt, the
    two ways out of a changed shape)."""
    m = db.transaction(lambda cur: control.head_of(cur, control.get(cur, name)))  # a family's table: the family
    control.require_command(m, command)
    with leased(db, m, control.new_owner_id(), report=report, stop=stop, command=command) as ctx:
        control.require_command(ctx.refresh(), command)
        if command not in ("abort", "adopt"):
            for t in ctx.tables():
                ctx.db.transaction(bind(shape.verify_at_step, t.migration, t.swapped), label="shape check")
        action(ctx)
        return ctx.migration


def cutover(db: Database, name: str, **kw: Any) -> control.Migration:
    return _under_lease(db, name, "cutover", lifecycle.cutover, **kw)


def rollback(db: Database, name: str, *, give_up_rows: bool = False, **kw: Any) -> control.Migration:
    return _under_lease(db, name, "rollback", lambda ctx: lifecycle.rollback(ctx, give_up_rows=give_up_rows), **kw)


def retire(db: Database, name: str, *, force: bool = False, give_up_rows: bool = False,
           **kw: Any) -> control.Migration:
    return _under_lease(db, name, "retire", lambda ctx: lifecycle.retire(ctx, force=force, give_up_rows=give_up_rows),
                        **kw)


def abort(db: Database, name: str, *, give_up_rows: bool = False, **kw: Any) -> control.Migration:
    return _under_lease(db, name, "abort", lambda ctx: lifecycle.abort(ctx, give_up_rows=give_up_rows), **kw)


def reconcile(db: Database, name: str, *, full: bool = False, **kw: Any) -> dict[str, Any]:
    """`mover reconcile`: a pass now. At the reconcile step it is that step (the migration moves to
    the cutover gate when the tables are equal); at the gate it is an extra pass over the ranges
    changed since the last one (all of them with `full`). Returns the pass."""
    out: dict[str, Any] = {}

    def go(head: Context) -> None:
        passes = []
        members = head.tables()
        for ctx in members:  # a family's tables one after another
            at_step = ctx.migration.step == "reconcile"
            if at_step:
                ctx.db.transaction(bind(control.start_step, ctx.migration, "reconcile", ctx.owner))
            result = reconcile_engine.run(ctx, full=full)
            passes.append({"table": str(ctx.migration.source), **result.as_dict()})
            if at_step:
                try:
                    reconcile_step.conclude(ctx, result)
                except Waiting:
                    pass  # recorded; the caller reports the divergences
            else:
                _wait_at_gate(ctx)
        out["pass"] = passes[0] if len(passes) == 1 else _family_pass(passes)
        if len(members) > 1:
            # The family's reconcile checks the keys between its tables on the side the application
            # does not write, as its reconcile step does (Failed, naming the rows, if one breaks).
            out["pass"]["foreign_keys_checked"] = keys.check_keys(head, members)
    _under_lease(db, name, "reconcile", go, **kw)
    passed: dict[str, Any] = out["pass"]
    return passed


def _family_pass(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """A family's pass: the sums of its tables' (a pass's counts), and each table's."""
    total = {k: sum(p[k] for p in passes) for k, v in passes[0].items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "rows_per_second"}
    # The tables are compared one after another: the family's rate is its rows over its time.
    total["rows_per_second"] = round(total["rows"] / total["seconds"]) if total.get("seconds") else None
    return {"mode": passes[0]["mode"], **total, "tables": passes}


def repair(db: Database, name: str, *, divergence_id: int | None = None, **kw: Any) -> dict[str, Any]:
    """`mover repair`: re-sync the open divergences' rows from the source and check them again."""
    out: dict[str, Any] = {}

    def go(head: Context) -> None:
        # A family's tables in turn, referenced ones first (a parent's row before its children's).
        members = head.db.transaction(lambda cur: keys.parents_first(cur, head.family(cur)))
        if divergence_id is not None and len(members) > 1:  # the table whose divergence it is
            members = [t for t in members if t.db.transaction(bind(control.open_divergence_rows, t.mid,
                                                                   divergence_id))] or [head]
        for ctx in members:
            repaired = reconcile_engine.repair(ctx, divergence_id)
            out["repair"] = _merged(out.get("repair"), repaired)
            if ctx.migration.step == "cutover":
                _wait_at_gate(ctx)
    _under_lease(db, name, "repair", go, **kw)
    repaired: dict[str, Any] = out["repair"]
    return repaired


def _merged(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Two tables' repair results as one: counts added, lists joined."""
    if a is None:
        return b
    return {k: (a.get(k, 0) + v if isinstance(v, (int, list)) and not isinstance(v, bool) else v) for k, v in b.items()}


def _wait_at_gate(ctx: Context) -> None:
    """At the gate after a pass or a repair: the divergences left say whether the cutover may go."""
    ctx.db.transaction(lambda cur: control.wait_at_gate(cur, ctx.migration, ctx.owner,
                                                        control.divergence_counts(cur, ctx.mid)),
                       label="wait at the gate")


def adopt(db: Database, name: str, **kw: Any) -> list[dict[str, Any]]:
    """`mover adopt`: apply an additive change of the live table's shape (a column, a CHECK, an
    index) to the other table, re-sync what it touched, record the new shapes; refused (exit 2) for
    any other change. Returns what was adopted."""
    out: dict[str, Any] = {}

    def go(head: Context) -> None:
        out["adopted"] = [a for ctx in head.tables() for a in adopt_engine.adopt(ctx)]
    _under_lease(db, name, "adopt", go, **kw)
    adopted: list[dict[str, Any]] = out.get("adopted", [])
    return adopted


def recapture(db: Database, name: str, **kw: Any) -> str:
    """`mover recapture`: after a lost replication slot (logical capture), a new one and the next
    reconcile pass over every range (mover/engines/capture/logical.py). Returns the slot's name."""
    out: dict[str, str] = {}

    def go(ctx: Context) -> None:
        out["slot"] = logical.recapture(ctx)
    _under_lease(db, name, "recapture", go, **kw)
    return out["slot"]


# ---------------------------------------------------------------------------------------------
# Without the lease: one guarded transaction each


def accept(db: Database, name: str, reason: str, *, divergence_id: int | None = None) -> list[int]:
    """`mover accept --reason TEXT`: close open divergences (or one) as intended; they stay in the
    history with the reason, and a later pass that finds the same difference leaves it be."""
    if not reason or not reason.strip():
        raise BadInput("accepting divergences needs a reason", hint="pass --reason TEXT")

    def go(cur: psycopg.Cursor) -> list[int]:
        m = control.head_of(cur, control.get(cur, name, lock=True))
        control.require_command(m, "accept")
        ids = [i for t in control.family(cur, m)
               for i in reconcile_engine.accept(cur, t.id, reason.strip(), control.new_owner_id(), divergence_id)]
        if divergence_id is not None and not ids:
            raise NotFound(f"migration {m.name!r} has no open divergence with id {divergence_id}",
                           hint=f"`mover divergences {m.name}` lists the open ones")
        return ids
    return db.transaction(go)


def set_paused(db: Database, name: str, paused: bool) -> None:
    """`mover pause` / `unpause`: the flag the range workers read at their next range boundary."""
    db.transaction(bind(control.set_paused, name, paused, control.new_owner_id()), label="pause")


def set_settings(db: Database, name: str, assignments: list[str]) -> None:
    """`mover set section.key=value ...` for the settings a running migration may change
    (plan.SETTABLE); values are parsed as TOML, validated like a plan file, recorded as an event."""
    def apply(cur: psycopg.Cursor) -> None:
        m = control.head_of(cur, control.get(cur, name, lock=True))
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
            # A section at its defaults is not in the document ([throttle]): the first key set adds it.
            doc.setdefault(section, {})[field] = value
            changes[key.strip()] = value
        new_plan = parse_plan(doc, origin="mover set")
        register.update_plan(cur, m, new_plan, control.new_owner_id(), [])  # a family's tables with it
        control.event(cur, m.id, "operator", None, "settings_changed", f"set {changes}", changes)
    db.transaction(apply)


def maintain_partitions(db: Database, table: str | None, *, all_tables: bool,
                        dry_run: bool) -> list[dict[str, Any]]:
    """`mover partitions maintain [TABLE | --all]`: each partitioned conversion's upkeep
    (mover/engines/partitioning/upkeep.py). Idempotent: safe from cron."""
    if (table is None) == (not all_tables):
        raise BadInput("name one table (or migration), or pass --all", hint="mover partitions maintain --all")
    found = db.transaction(bind(upkeep.conversions, table), label="partitions")
    if table is not None and not found:
        raise NotFound(f"no partitioned conversion of {table!r} (by migration name or source table)",
                       hint="`mover status` lists the migrations")
    return [upkeep.maintain(db, m, plan, live, dry_run=dry_run) for m, plan, live in found]
