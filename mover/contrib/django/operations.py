"""Migration operations that hand a table rewrite to mover while Django's migration state follows:
the SeparateDatabaseAndState pattern, with mover as the database half.

A long move is two phases, each an operation in a migration of its own:

- `StartMove(plan=...)` registers the plan and runs mover up to the cutover gate: the new tables
  created, the copy done, both tables compared equal, the application's writes captured. It
  changes no model state: the tables keep their shape until the swap.
- `MoveTable(plan=..., state_operations=[...])`, in a later migration, swaps the tables in (mover's
  cutover; with `[rollback] window = "0s"` also the retire) and applies `state_operations` to
  Django's state (the AlterField operations makemigrations wrote for the change). While the move
  has not reached the gate it fails, saying where mover stands and the command that gets it there,
  and changes nothing: `manage.py migrate` is then run again once it is there.

Both in one migration (`operations = [StartMove(...), MoveTable(...)]`) is one phase, for tables
that copy within a deploy.

mover works on connections of its own and commits step by step (every transaction short, each
resumable after a crash), so it cannot run inside the transaction PostgreSQL migrations run in by
default: the migration must set `atomic = False`, and an operation in an atomic one refuses before
anything happens. A relative plan path is read from the app's directory. `manage.py sqlmigrate`
prints each operation's description (what mover will do, and the command) and does nothing.
Unapplying goes back the same way: `MoveTable` rolls the swap back during the rollback window,
`StartMove` aborts (drops what mover created). Errors are Django's CommandError, with mover's
message, next command and exit code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.apps import apps as installed_apps
from django.core.management.base import CommandError
from django.db import router
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

from mover import api
from mover.contrib.django.connection import connection_dsn
from mover.db import mask, remember_secrets
from mover.errors import BadInput, MoverError, NotFound, Waiting
from mover.plan import load_plan
from mover.runner import Reporter
from mover.views import console
from mover.views.console import Consoles

# The steps before the swap, in order: a move at one of them has not reached the gate yet.
BEFORE_GATE = ("create_target", "install_capture", "backfill", "reconcile")
# Every mover command named in a message works through manage.py with the project's database.
VIA_MANAGE = "(`manage.py mover ...` runs mover's commands on this project's database)"


class MoverOperation(Operation):
    """What both operations share: the plan, the database to work on, and the refusals."""

    reduces_to_sql = False
    reversible = True

    def __init__(self, plan: str, hints: dict[str, Any] | None = None) -> None:
        self.plan = plan
        self.hints = hints or {}

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        pass

    @contextmanager
    def _mover(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor
               ) -> Iterator[tuple[str, Path, str] | None]:
        """The DSN, the plan file and its migration's name for this database, or None when the router keeps
        the app off this database. mover's errors leave as CommandError. (sqlmigrate never comes
        here: an operation that does not reduce to SQL is printed as its describe().)"""
        connection = schema_editor.connection
        if not router.allow_migrate(connection.alias, app_label, **self.hints):
            yield None
            return
        plan = plan_path(app_label, self.plan)
        try:
            if connection.in_atomic_block:
                raise BadInput(f"{type(self).__name__}(plan={self.plan!r}) of app {app_label!r} runs inside a "
                               "transaction: mover works on its own connections and commits step by step",
                               hint="set `atomic = False` on the Migration class that holds it, then migrate again")
            dsn = connection_dsn(connection)
            remember_secrets(dsn)
            yield dsn, plan, load_plan(plan).name
        except MoverError as exc:
            raise as_command_error(exc) from exc


class StartMove(MoverOperation):
    """Phase one: register the plan with mover and run it to the cutover gate (see the module)."""

    def describe(self) -> str:
        return (f"Run mover plan {self.plan} up to the cutover gate on mover's own connections "
                "(`manage.py mover run PLAN`); unapplied: `manage.py mover abort NAME`")

    @property
    def migration_name_fragment(self) -> str:
        return f"start_move_{Path(self.plan).stem}"

    def database_forwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState,
                          to_state: ProjectState) -> None:
        with self._mover(app_label, schema_editor) as use:
            if use is None:
                return
            dsn, plan, name = use
            api.init(dsn)  # mover's control schema, created or brought up to date (idempotent)
            try:
                st = progressing(lambda report: api.run(dsn, str(plan), report=report))
            except Waiting:
                st = api.status(dsn, name)
                if not at_gate(st) and st["step"] in BEFORE_GATE + ("cutover",):
                    raise
            say(f"mover: {name!r} {where(st)}; a later migration's MoveTable swaps the tables in")

    def database_backwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState,
                           to_state: ProjectState) -> None:
        with self._mover(app_label, schema_editor) as use:
            if use is None:
                return
            dsn, plan, name = use
            st = registered(dsn, name)
            if st is None or st["state"] == "aborted":
                return
            if st["state"] == "done" or st["step"] not in BEFORE_GATE + ("cutover",):
                raise BadInput(f"mover migration {name!r} swapped the tables already ({where(st)}); aborting is "
                               "for a move before its cutover",
                               hint=f"`mover rollback {name}` within the rollback window first, or `manage.py "
                                    "migrate APP MIGRATION --fake` to leave the tables as they are")
            api.abort(dsn, name)
            say(f"mover: {name!r} aborted; the tables are as they were")


class MoveTable(MoverOperation):
    """Phase two: mover's cutover, and Django's state changed by `state_operations` (see the module)."""

    serialization_expand_args = ["state_operations"]

    def __init__(self, plan: str, state_operations: Sequence[Operation] | None = None,
                 hints: dict[str, Any] | None = None) -> None:
        super().__init__(plan, hints)
        self.state_operations = list(state_operations or [])

    def describe(self) -> str:
        return (f"Swap in the tables of mover plan {self.plan} (`manage.py mover cutover NAME`), and "
                f"{len(self.state_operations)} state operations; unapplied: `manage.py mover rollback NAME`")

    @property
    def migration_name_fragment(self) -> str:
        return f"move_{Path(self.plan).stem}"

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        for operation in self.state_operations:
            operation.state_forwards(app_label, state)

    def database_forwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState,
                          to_state: ProjectState) -> None:
        with self._mover(app_label, schema_editor) as use:
            if use is None:
                return
            dsn, plan, name = use
            st = registered(dsn, name)
            if st is None:
                raise BadInput(f"mover has no migration {name!r}: plan {str(plan)!r} was never run",
                               hint=f"run `mover run {shown(plan)}` (or a migration with StartMove(plan=...)) "
                                    "until it stops at the cutover gate, then migrate again")
            if st["state"] == "aborted":
                raise BadInput(f"mover migration {name!r} was aborted",
                               hint=f"run `mover run {shown(plan)}` to start it afresh, then migrate again")
            if st["state"] != "done" and st["step"] in BEFORE_GATE:
                raise Waiting(f"mover migration {name!r} is not at the cutover gate yet: {where(st)}; Django's "
                              "migration is left unapplied and nothing changed",
                              hint=f"run `mover run {name}` (or leave `mover follow {name}` running) until it stops "
                                   "at the gate, then migrate again")
            if st["state"] != "done" and st["step"] == "cutover":
                # At the gate, or stopped there (open divergences, a lock not granted): the cutover's
                # own checks say what stands in the way, with mover's next command.
                st = progressing(lambda report: api.cutover_now(dsn, name, report=report))
            if st["state"] == "done":
                say(f"mover: {name!r} swapped and retired ({where(st)})")
            else:
                say(f"mover: {name!r} swapped; {where(st)}: `manage.py mover run {name} --wait` keeps the old "
                    f"tables in sync and retires them when the window ends")

    def database_backwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState,
                           to_state: ProjectState) -> None:
        with self._mover(app_label, schema_editor) as use:
            if use is None:
                return
            dsn, plan, name = use
            st = registered(dsn, name)
            if st is None or st["state"] == "aborted" or (st["state"] != "done" and st["step"] in BEFORE_GATE
                                                          + ("cutover",)):
                return  # never swapped (or swapped back already): the tables have their old shape
            if st["state"] == "done":
                raise BadInput(f"mover migration {name!r} is retired: the old tables are gone, so the swap cannot "
                               "be rolled back",
                               hint="write a new move back, or `manage.py migrate APP MIGRATION --fake` to leave "
                                    "the tables as they are")
            st = progressing(lambda report: api.rollback(dsn, name, report=report))
            say(f"mover: {name!r} swapped back; {where(st)}")


def plan_path(app_label: str, plan: str) -> Path:
    """The plan file: a relative path is the app's directory's (where its models.py is), so that
    the migration finds it whatever directory manage.py runs in."""
    path = Path(plan)
    if path.is_absolute():
        return path
    return Path(installed_apps.get_app_config(app_label).path) / path


def registered(dsn: str, name: str) -> dict[str, Any] | None:
    """The migration's status, or None when mover has no migration of that name."""
    try:
        return api.status(dsn, name)
    except NotFound:
        return None


def at_gate(st: dict[str, Any]) -> bool:
    """Stopped at the cutover gate with the tables equal: what the cutover may start from."""
    return st["step"] == "cutover" and st["state"] in ("waiting", "pending") and not st["divergences"]


def where(st: dict[str, Any]) -> str:
    """Where a migration stands, in words, from its status."""
    if st["state"] == "done":
        return "done"
    if st["step"] == "rollback_window":
        return f"rollback window open until {st['rollback_window_ends_at']}"
    if at_gate(st):
        return "at the cutover gate, the tables equal"
    backfill = st["backfill"]
    copied = f", {backfill['rows_copied']:,} rows copied" if st["step"] == "backfill" else ""
    error = f" ({st['error']})" if st.get("error") else ""
    return f"step {st['step']}, {st['state']}{copied}{error}"


def progressing(command: Callable[[Reporter], dict[str, Any]]) -> dict[str, Any]:
    """An api call with mover's progress display on stderr, as the command line shows it."""
    with console.progress(Consoles.make()) as reporter:
        return command(reporter)


def say(text: str) -> None:
    console.say(Consoles.make().err, mask(text))


def shown(plan: Path) -> str:
    """A plan path as the operator types it: relative to the working directory when under it."""
    relative = os.path.relpath(plan)
    return plan.as_posix() if relative.startswith("..") else relative


def as_command_error(exc: MoverError) -> CommandError:
    """A mover error as manage.py reports one: its message and next command (passwords masked), and
    mover's exit code (2 bad input, 3 waiting for the operator...)."""
    hint = f"; next: {exc.hint} {VIA_MANAGE}" if exc.hint else ""
    return CommandError(mask(exc.message + hint), returncode=exc.exit_code)
