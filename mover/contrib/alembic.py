"""Alembic operations that hand a table rewrite to mover from an application's own revisions
(docs/alembic.md). Importing this module adds them to Alembic's `op`:

    op.start_move(PLAN_FILE | name=, source=, columns=, window=, run_for=, dsn=)  # registers, runs a while
    op.finish_move(NAME, retire=False, run_for=0)   # the cutover, refused with the status until it is ready
    op.abort_move(NAME)                             # start_move's downgrade()
    op.rollback_move(NAME)                          # finish_move's downgrade()

Why two revisions: rewriting a large table takes hours, and Alembic runs a revision inside a
transaction it commits when the revision returns. So the revision that starts a migration
registers it and runs it for a bounded time (`run_for`, 0 = not at all), then returns; the work up
to the cutover gate belongs to a process with a lifetime of its own (`mover run NAME` by an
operator, a job, `mover worker NAME` helpers); a later revision swaps the table in, and fails
naming the migration's step, its state and the command to run while the migration is not there.

Transactions. mover works only on connections of its own, in its own short transactions (the
invariants of docs/design.md hold as under the CLI). Before it starts, an operation commits what
the revision's connection holds (Alembic's autocommit_block: the revisions before it in the same
run are committed then), so that mover sees the application's tables as those revisions left
them and never waits on the revision's locks; Alembic begins a new transaction after it. What
mover did is not undone when the revision's transaction rolls back afterwards: the error then
carries a note naming the migration and what undoes it, and registration is idempotent, so
`alembic upgrade` again picks the migration up where it stands.

Offline (`alembic upgrade --sql`): nothing is registered, run or swapped. The script gets, as SQL
comments, what `mover plan check` says of the plan (its summary, then every step's statements),
read from the database when one can be reached (the check changes nothing), and what the online
operation would do.

What `alembic revision --autogenerate` writes with these operations: mover/contrib/alembic_autogenerate.py.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import alembic.context
import alembic.op
import psycopg
from alembic.operations import MigrateOperation, Operations
from alembic.runtime.migration import MigrationContext
from rich.console import Console
from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url

from mover import api
from mover.db import mask
from mover.errors import BadInput, Failed, Interrupted, MoverError, NotFound, Waiting
from mover.plan import Plan, load_plan, parse_plan
from mover.runner import register
from mover.state import control
from mover.views import plan_check as plan_check_view
from mover.views.console import Consoles

# Alembic's generated logging configuration shows the `alembic` logger at INFO and the rest at
# WARN: under it, what the operations report appears beside Alembic's own "Running upgrade" lines.
log = logging.getLogger("alembic.mover")


class MoveNotReady(Waiting):
    """op.finish_move ran before its migration waited at the cutover gate, or the gate refused the
    swap: nothing was swapped, the revision fails and Alembic's version stays where it was. The
    message names the migration, its step and state; the hint, what to run before `alembic
    upgrade` again. `status` is mover's status of the migration (None: not registered)."""

    def __init__(self, message: str, *, hint: str, status: dict[str, Any] | None):
        super().__init__(message, hint=hint)
        self.status = status


class MoveStopped(Failed):
    """mover failed inside a revision after the migration was registered: the revision fails, the
    migration stays registered where it stopped (the hint says how to resume it, or undo it)."""

    def __init__(self, message: str, *, hint: str, status: dict[str, Any] | None):
        super().__init__(message, hint=hint)
        self.status = status


# ---------------------------------------------------------------------------------------------
# The operations


@Operations.register_operation("start_move")
class StartMove(MigrateOperation):
    """Register a mover migration and run it for at most `run_for` seconds (0: register only)."""

    def __init__(self, plan: Plan, *, run_for: float = 0.0, dsn: str | None = None, origin: str | None = None,
                 arguments: dict[str, Any] | None = None):
        self.plan = plan
        self.run_for = run_for
        self.dsn = dsn
        self.origin = origin or f"plan {plan.name!r}"  # a plan file's path, for plan check's lines
        # The keywords of op.start_move that give this plan, for autogenerate to write the call
        # into a revision (mover/contrib/alembic_autogenerate.py).
        self.arguments = arguments

    @classmethod
    def start_move(cls, operations: Operations, plan: str | os.PathLike[str] | Mapping[str, Any] | None = None, *,
                   name: str | None = None, source: str | None = None, columns: Mapping[str, str] | None = None,
                   window: str | None = None, run_for: float = 0.0, dsn: str | None = None) -> Any:
        """`plan`: a plan file (TOML, as `mover run` takes it; relative to the directory alembic
        runs in), or the plan inline: a dict shaped as the TOML file (sections to keys), and/or the
        keywords for its most common keys ([migration] name and source, [target] columns,
        [rollback] window). `run_for`: seconds to run the migration toward its cutover gate before
        the revision returns (0: only register it). `dsn`: the database for mover, by default the
        revision's own (its connection's URL)."""
        built, origin = plan_of(plan, name=name, source=source, columns=columns, window=window)
        return operations.invoke(cls(built, run_for=run_for, dsn=dsn, origin=origin))

    def reverse(self) -> AbortMove:
        return AbortMove(self.plan.name, dsn=self.dsn)


@Operations.register_operation("finish_move")
class FinishMove(MigrateOperation):
    """Swap a mover migration in once it waits at its cutover gate; refused (MoveNotReady) before."""

    def __init__(self, name: str, *, retire: bool = False, run_for: float = 0.0, dsn: str | None = None):
        self.name = name
        self.retire = retire
        self.run_for = run_for
        self.dsn = dsn

    @classmethod
    def finish_move(cls, operations: Operations, name: str, *, retire: bool = False, run_for: float = 0.0,
                    dsn: str | None = None) -> Any:
        """`retire`: after the swap, close the rollback window at once and drop the old table
        (`mover retire NAME --force`); by default the window runs as the plan says, and `mover run
        NAME --wait` (or `mover retire NAME` after it) retires. `run_for`: seconds to run a
        migration not yet at its gate toward it first (0: none)."""
        return operations.invoke(cls(name, retire=retire, run_for=run_for, dsn=dsn))

    def reverse(self) -> RollbackMove:
        return RollbackMove(self.name, dsn=self.dsn)


@Operations.register_operation("abort_move")
class AbortMove(MigrateOperation):
    """`mover abort NAME` (before the cutover): remove what mover built; nothing to do for a
    migration not registered or aborted already."""

    def __init__(self, name: str, *, give_up_rows: bool = False, dsn: str | None = None):
        self.name = name
        self.give_up_rows = give_up_rows
        self.dsn = dsn

    @classmethod
    def abort_move(cls, operations: Operations, name: str, *, give_up_rows: bool = False,
                   dsn: str | None = None) -> Any:
        return operations.invoke(cls(name, give_up_rows=give_up_rows, dsn=dsn))


@Operations.register_operation("rollback_move")
class RollbackMove(MigrateOperation):
    """`mover rollback NAME` (in the rollback window): swap the original table back, losing
    nothing; nothing to do for a migration not cut over."""

    def __init__(self, name: str, *, dsn: str | None = None):
        self.name = name
        self.dsn = dsn

    @classmethod
    def rollback_move(cls, operations: Operations, name: str, *, dsn: str | None = None) -> Any:
        return operations.invoke(cls(name, dsn=dsn))


# The same as plain functions, for a revision that prefers an import its type checker can follow.
def start_move(plan: str | os.PathLike[str] | Mapping[str, Any] | None = None, *, name: str | None = None,
               source: str | None = None, columns: Mapping[str, str] | None = None, window: str | None = None,
               run_for: float = 0.0, dsn: str | None = None) -> Any:
    built, origin = plan_of(plan, name=name, source=source, columns=columns, window=window)
    return alembic.op.invoke(StartMove(built, run_for=run_for, dsn=dsn, origin=origin))


def finish_move(name: str, *, retire: bool = False, run_for: float = 0.0, dsn: str | None = None) -> Any:
    return alembic.op.invoke(FinishMove(name, retire=retire, run_for=run_for, dsn=dsn))


def abort_move(name: str, *, give_up_rows: bool = False, dsn: str | None = None) -> Any:
    return alembic.op.invoke(AbortMove(name, give_up_rows=give_up_rows, dsn=dsn))


def rollback_move(name: str, *, dsn: str | None = None) -> Any:
    return alembic.op.invoke(RollbackMove(name, dsn=dsn))


def plan_of(plan: str | os.PathLike[str] | Mapping[str, Any] | None, *, name: str | None, source: str | None,
            columns: Mapping[str, str] | None, window: str | None) -> tuple[Plan, str | None]:
    """The plan start_move was given, parsed and checked as `mover run` checks a file (every problem
    at once, nothing changed); and the file's path, if it came from one."""
    given = {"name": name, "source": source, "columns": columns, "window": window}
    if isinstance(plan, (str, os.PathLike)):
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise BadInput(f"start_move got a plan file ({os.fspath(plan)}) and {', '.join(extra)}",
                           hint="put every setting in the plan file, or give the plan inline without a file")
        return load_plan(Path(plan)), os.fspath(plan)
    doc = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (plan or {}).items()}
    for section, key, value in (("migration", "name", name), ("migration", "source", source),
                                ("target", "columns", dict(columns) if columns is not None else None),
                                ("rollback", "window", window)):
        if value is not None:
            doc.setdefault(section, {})[key] = value
    label = (doc.get("migration") or {}).get("name")
    return parse_plan(doc, origin=f"start_move({label!r})" if label else "start_move"), None


# ---------------------------------------------------------------------------------------------
# What each does, online


@Operations.implementation_for(StartMove)
def _start(operations: Operations, operation: StartMove) -> dict[str, Any] | None:
    ctx = operations.get_context()
    name = operation.plan.name
    if ctx.as_sql:
        _offline_start(ctx, operation)
        return None
    dsn = database_url(ctx, operation.dsn)
    with own_connections(ctx):
        ensure_schema(dsn)
        st = api.register_plan(dsn, operation.plan)  # a PlanError here: nothing registered, nothing changed
        log.info("mover: migration %r registered (%s)", name, where(st))
        if operation.run_for > 0:
            try:
                run_for(dsn, name, operation.run_for)
            except MoverError as exc:
                stopped = migration_status(dsn, name)
                raise MoveStopped(
                    f"mover migration {name!r}, registered by this revision, stopped: {exc}",
                    hint=f"it stays registered ({where(stopped) if stopped else 'status unknown'}); fix the cause, "
                         f"then `alembic upgrade` again (or `mover run {name}`) resumes it; `mover abort {name}` "
                         f"removes what mover built", status=stopped) from exc
            st = api.status(dsn, name)
        log.info("mover: migration %r %s; next: %s", name, where(st), after_start(st))
    note_if_rolled_back(ctx, name, "registered", f"`alembic upgrade` again picks it up where it stands; "
                                                  f"`mover abort {name}` removes what mover built")
    return st


@Operations.implementation_for(FinishMove)
def _finish(operations: Operations, operation: FinishMove) -> dict[str, Any] | None:
    ctx = operations.get_context()
    name = operation.name
    if ctx.as_sql:
        _offline_finish(ctx, operation)
        return None
    dsn = database_url(ctx, operation.dsn)
    with own_connections(ctx):
        ensure_schema(dsn)
        st = migration_status(dsn, name)
        if st is None:
            raise MoveNotReady(f"mover has no migration {name!r} in this database: nothing to cut over",
                               hint="the revision that starts it (op.start_move) registers it: apply that one "
                                    "first", status=None)
        swapped = False
        if not cut_over(st):
            if operation.run_for > 0 and st["step"] != "cutover" and st["state"] != "aborted":
                run_for(dsn, name, operation.run_for)
                st = api.status(dsn, name)
            if st["step"] != "cutover" or st["state"] in control.TERMINAL:
                raise MoveNotReady(f"mover migration {name!r} is not ready for its cutover: {where(st)}",
                                   hint=not_ready(st), status=st)
            try:
                st = api.cutover_now(dsn, name)
            except Waiting as exc:  # the gate refused the swap: divergences, locks, old snapshots, a lease
                st = api.status(dsn, name)
                raise MoveNotReady(f"mover migration {name!r} waits at its cutover gate and did not swap: "
                                   f"{exc.message}",
                                   hint=f"{exc.hint or f'`mover status {name}` says why'}; then `alembic upgrade` "
                                        f"again", status=st) from exc
            swapped = True
            log.info("mover: migration %r cut over (%s)", name, where(st))
        if operation.retire and st["step"] == "rollback_window":
            st = api.retire(dsn, name, force=True)
            log.info("mover: migration %r retired (%s)", name, where(st))
    if swapped:
        note_if_rolled_back(ctx, name, "cut over", f"`alembic upgrade` again finds it cut over and goes on; "
                                                  f"`mover rollback {name}` swaps the original back during the window")
    return st


@Operations.implementation_for(AbortMove)
def _abort(operations: Operations, operation: AbortMove) -> dict[str, Any] | None:
    ctx = operations.get_context()
    name = operation.name
    if ctx.as_sql:
        emit(ctx, [f"mover: `mover abort {name}`: drops what mover built for the migration (the target, the "
                   f"capture, the change log), before its cutover; the source stays as it is"])
        return None
    dsn = database_url(ctx, operation.dsn)
    with own_connections(ctx):
        st = migration_status(dsn, name)
        if st is None or st["state"] == "aborted":
            log.info("mover: migration %r is %s: nothing to abort", name, "aborted" if st else "not registered")
            return st
        st = api.abort(dsn, name, give_up_rows=operation.give_up_rows)
        log.info("mover: migration %r aborted", name)
        return st


@Operations.implementation_for(RollbackMove)
def _rollback(operations: Operations, operation: RollbackMove) -> dict[str, Any] | None:
    ctx = operations.get_context()
    name = operation.name
    if ctx.as_sql:
        emit(ctx, [f"mover: `mover rollback {name}`: in the rollback window, swaps the original table back "
                   f"(losing nothing); the migration returns to its cutover gate"])
        return None
    dsn = database_url(ctx, operation.dsn)
    with own_connections(ctx):
        st = migration_status(dsn, name)
        if st is None or not cut_over(st) and st["state"] != "done":
            log.info("mover: migration %r is not cut over: nothing to roll back", name)
            return st
        st = api.rollback(dsn, name)
        log.info("mover: migration %r rolled back (%s)", name, where(st))
        return st


def run_for(dsn: str, name: str, seconds: float) -> None:
    """`mover run NAME` for at most `seconds`: it returns at the cutover gate, or stops at its next
    safe point once the time is up (recorded as interrupted; `mover run NAME` resumes)."""
    stop = threading.Event()
    stop.reason = f"the revision's run_for of {seconds:g} s ended"  # type: ignore[attr-defined]  # the lease's record
    timer = threading.Timer(seconds, stop.set)
    timer.daemon = True
    timer.start()
    try:
        api.run(dsn, name, stop=stop)
    except Waiting:
        pass  # at the cutover gate (`mover run`'s exit 3), or another process holds it: the status says which
    except Interrupted:
        if not stop.is_set():
            raise
    finally:
        timer.cancel()


# ---------------------------------------------------------------------------------------------
# The revision's connection and mover's


def database_url(ctx: MigrationContext, dsn: str | None) -> str:
    """The database mover works on: `dsn` if given, else the revision's own, as libpq takes it
    (the connection's URL without SQLAlchemy's driver name; the password kept: mover connects)."""
    if dsn:
        return dsn
    if ctx.connection is None:
        raise BadInput("the Alembic revision has no database connection", hint="pass dsn= to the operation")
    url = ctx.connection.engine.url
    if url.get_backend_name() != "postgresql":
        raise BadInput(f"mover moves PostgreSQL tables; this revision runs on {url.get_backend_name()}",
                       hint="hand mover only the revisions of a PostgreSQL database, or pass dsn= naming one")
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def own_connections(ctx: MigrationContext) -> Iterator[None]:
    """Commit what the revision's connection holds before mover starts, so that mover's own
    connections see what the revisions before made and never wait on their locks (Alembic's
    autocommit_block, which begins the revision's transaction again after the block). A transaction
    that env.py began itself, around Alembic's, cannot be committed from here: then mover starts
    only if it wrote nothing yet."""
    conn = ctx.connection
    assert conn is not None
    # autocommit_block commits the transaction Alembic began and tracks (begin_transaction); one
    # env.py began (configure() on a connection in a transaction) it cannot commit: it asserts.
    external = getattr(ctx, "_in_external_transaction", False)
    tracked = getattr(ctx, "_transaction", None) is not None
    if not external and (tracked or not conn.in_transaction()):
        with ctx.autocommit_block():
            yield
        return
    if conn.exec_driver_sql("SELECT pg_current_xact_id_if_assigned()").scalar() is not None:
        raise BadInput(
            "the Alembic revision's transaction holds uncommitted changes, which mover's own connections cannot "
            "see (and whose locks they would wait on); env.py began that transaction itself, so it cannot be "
            "committed before mover starts",
            hint="in env.py, call context.configure(connection=..., transaction_per_migration=True) on a "
                 "connection not in a transaction, and run the migrations in `with context.begin_transaction():`")
    yield


def note_if_rolled_back(ctx: MigrationContext, name: str, what: str, then: str) -> None:
    """If the revision's transaction rolls back after the operation (a later statement of the
    revision, or a later revision in the same transaction, fails), what mover did stays: say so on
    the error Alembic is raising, and in the log."""
    conn = ctx.connection
    if conn is None:
        return
    live = [True]

    def rolled_back(_conn: Connection) -> None:
        if not live[0]:
            return
        live[0] = False
        note = (f"mover: migration {name!r} was {what} by this upgrade and stays {what}: mover works on "
                f"connections of its own, which the revision's transaction rolling back does not undo; {then}")
        exc = sys.exception()
        if exc is not None:
            exc.add_note(note)
        log.warning("%s", note)

    def committed(_conn: Connection) -> None:
        live[0] = False

    event.listen(conn, "rollback", rolled_back)
    event.listen(conn, "commit", committed)


@contextmanager
def alembic_proxies_kept() -> Iterator[None]:
    """`mover init` runs mover's own Alembic environment (its control schema's revisions, on a
    connection of its own). Alembic's `op` and `context` are module-level proxies that the end of
    an environment removes: without this the application's revision would lose them mid-run."""
    saved = [getattr(module, "_proxy", None) for module in (alembic.context, alembic.op)]
    try:
        yield
    finally:
        for proxy in saved:
            if proxy is not None:
                proxy._install_proxy()


def schema_ready(dsn: str) -> bool:
    with api.session(dsn, schema=False) as db:
        try:
            register.require_schema(db)
        except BadInput:  # missing, or at an older revision than this mover's
            return False
        return True


def ensure_schema(dsn: str) -> None:
    """mover's control schema, created or upgraded if need be (`mover init`)."""
    if not schema_ready(dsn):
        with alembic_proxies_kept():
            revision = api.init(dsn)
        log.info("mover: control schema at revision %s (`mover init`)", revision)


def migration_status(dsn: str, name: str) -> dict[str, Any] | None:
    """The migration's status; None if it is not registered (or mover's schema is not there)."""
    if not schema_ready(dsn):
        return None
    try:
        return api.status(dsn, name)
    except NotFound:
        return None


# ---------------------------------------------------------------------------------------------
# What the operations say


def cut_over(st: dict[str, Any]) -> bool:
    """Past its swap: in the rollback window, retiring, or done."""
    return st["state"] == "done" or control.STEPS.index(st["step"]) > control.STEPS.index("cutover")


def where(st: dict[str, Any]) -> str:
    """Where a migration stands, in one line: step, state, and what matters there."""
    parts = [f"step {st['step']!r}, state {st['state']!r}"]
    b = st["backfill"]
    if st["step"] in ("create_target", "install_capture", "backfill") and st["state"] not in control.TERMINAL:
        parts.append(f"{b['rows_copied']:,} rows copied" + (f" of about {b['rows_estimate']:,}"
                                                           if b.get("rows_estimate") else ""))
    if st["divergences"]:
        parts.append(f"{st['divergences']} divergences open")
    if b.get("paused"):
        parts.append("paused")
    if st.get("error"):
        parts.append(f"last: {st['error']}")
    return ", ".join(parts)


def after_start(st: dict[str, Any]) -> str:
    name = st["name"]
    if st["step"] == "cutover" and st["state"] == "waiting":
        return "it waits at its cutover gate: the revision with op.finish_move swaps it in"
    return (f"`mover run {name}` takes it to its cutover gate (from a shell, a job; `mover worker {name}` "
            f"helps from other hosts), then the revision with op.finish_move swaps it in")


def not_ready(st: dict[str, Any]) -> str:
    """The next command for a migration that is not at its cutover gate."""
    name, state = st["name"], st["state"]
    again = "then `alembic upgrade` again"
    if state == "aborted":
        return ("it was aborted: `alembic downgrade` to before the revision that starts it (op.start_move) and "
                "`alembic upgrade` registers it afresh")
    if st["backfill"].get("paused"):
        return f"`mover unpause {name}`, `mover run {name}` (it stops at the cutover gate, exit 3), {again}"
    if state == "running":
        return (f"a mover process is running it (`mover status {name}`); once it waits at step 'cutover', "
                f"{again}")
    if state == "failed":
        return f"fix the cause, `mover run {name}` resumes it to the cutover gate (exit 3), {again}"
    return f"`mover run {name}` takes it to the cutover gate (exit 3), {again}"


# ---------------------------------------------------------------------------------------------
# Offline: `alembic upgrade --sql`


def emit(ctx: MigrationContext, lines: list[str]) -> None:
    """Lines into the SQL script Alembic writes, as SQL comments."""
    ctx.impl.static_output("\n".join(f"-- {line}".rstrip() for text in lines for line in text.splitlines()))


def offline_url(ctx: MigrationContext, dsn: str | None) -> str | None:
    """The database an offline run can read plan check from: `dsn`, the configuration's
    sqlalchemy.url, or DATABASE_URL; None if none is set."""
    if dsn:
        return dsn
    env = ctx.environment_context
    text = env.config.get_main_option("sqlalchemy.url") if env is not None else None
    if text:
        url = make_url(text)
        return url.set(drivername="postgresql").render_as_string(hide_password=False)
    return os.environ.get("DATABASE_URL") or None


def _offline_start(ctx: MigrationContext, operation: StartMove) -> None:
    name = operation.plan.name
    run = (f"then runs it toward its cutover gate for at most {operation.run_for:g} s" if operation.run_for > 0
           else f"and leaves the run to `mover run {name}`")
    lines = [f"mover: start_move registers migration {name!r} ({operation.origin}) on mover's own connections, "
             f"{run}; what `mover plan check` says of it:"]
    dsn = offline_url(ctx, operation.dsn)
    if dsn is None:
        lines.append("(no database to check the plan against: set sqlalchemy.url or DATABASE_URL, or pass dsn=)")
    else:
        lines += plan_check_lines(dsn, operation)
    emit(ctx, lines)


def plan_check_lines(dsn: str, operation: StartMove) -> list[str]:
    """`mover plan check` as it prints, then `mover plan check --sql` (every step's statements);
    or why it could not run. Read-only: plan check rolls its transaction back."""
    try:
        if not schema_ready(dsn):
            return ["(mover's control schema is not installed in this database: the online upgrade runs `mover "
                    "init` first; plan check needs it: `mover init`, then `alembic upgrade --sql` again)"]
        result = api.check_plan(dsn, operation.plan)
    except (MoverError, psycopg.Error) as exc:
        return [f"(plan check could not run: {mask(str(exc))})"]
    summary, statements = (shown(result, Path(operation.origin), statements=s) for s in (False, True))
    # --sql prints the same head (the plan, the throttle, the warnings), then the statements instead
    # of the summary: the summary, then what only --sql prints.
    same = next((i for i, (a, b) in enumerate(zip(summary, statements, strict=False)) if a != b),
                min(len(summary), len(statements)))
    return summary + statements[same:]


def shown(result: dict[str, Any], origin: Path, *, statements: bool) -> list[str]:
    """plan check's result as `mover plan check` prints it (off a terminal: nothing cut or folded)."""
    out = io.StringIO()
    con = Consoles(out=Console(file=out, width=1000, color_system=None, soft_wrap=True),
                   err=Console(file=io.StringIO(), width=1000, color_system=None))
    plan_check_view.show(con, origin, result, as_json=False, statements=statements)
    return out.getvalue().splitlines()


def _offline_finish(ctx: MigrationContext, operation: FinishMove) -> None:
    name = operation.name
    lines = [f"mover: finish_move runs `mover cutover {name}` (the swap, under the plan's lock_timeout) once the "
             f"migration waits at its cutover gate, and fails naming its step and the command to run before that"]
    if operation.retire:
        lines.append(f"then `mover retire {name} --force`: the rollback window closes at once, the old table is "
                     f"dropped")
    dsn = offline_url(ctx, operation.dsn)
    if dsn is not None:
        try:
            st = migration_status(dsn, name)
            lines.append(f"now: {where(st)}" if st else f"now: mover has no migration {name!r} in this database")
        except (MoverError, psycopg.Error) as exc:
            lines.append(f"(its status could not be read: {mask(str(exc))})")
    emit(ctx, lines)
