"""`alembic revision --autogenerate` hands a column type change of a large table to mover
(docs/alembic.md, "Autogenerate"). In env.py:

    from mover.contrib.alembic_autogenerate import mover_rewriter

    context.configure(connection=connection, target_metadata=metadata,
                      process_revision_directives=mover_rewriter({"orders": {"window": "24h"}}))

A type change detected on a listed table is written as `op.start_move(...)` (the changed columns
with their new types, and the table's settings) instead of `op.alter_column(..., type_=...)`, which
rewrites the whole table under an ACCESS EXCLUSIVE lock; its downgrade as `op.abort_move(NAME)`.
While that migration is registered and not finished, the model still differs from the database
(the column keeps its old type until the swap), so the next autogenerate writes the revision that
finishes it instead: `op.finish_move(NAME)`, downgrade `op.rollback_move(NAME)`. The table's other
changes (nullability, defaults, comments, anything else) stay Alembic's own operations.

The returned object is an `alembic.autogenerate.rewriter.Rewriter`: `.chain()` joins it to the
application's own rewriters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from alembic.autogenerate import renderers
from alembic.autogenerate.api import AutogenContext
from alembic.autogenerate.rewriter import Rewriter
from alembic.operations import ops
from alembic.runtime.migration import MigrationContext

from mover.contrib.alembic import (
    AbortMove,
    FinishMove,
    RollbackMove,
    StartMove,
    database_url,
    migration_status,
    plan_of,
)
from mover.names import QualifiedName
from mover.state import control

# The keywords a table's entry may give, as op.start_move takes them.
# No dsn: the revision file would carry it (a password with it); the revision's own database is used.
TABLE_KEYS = ("name", "window", "plan", "run_for")


def mover_rewriter(tables: Mapping[str, Mapping[str, Any]]) -> Rewriter:
    """A rewriter for `process_revision_directives`. `tables`: the tables whose type changes mover
    makes, each by its name as the model writes it ("orders", or "sales.orders" for a table of
    another schema than the default), with op.start_move's keywords: `window` (required by mover:
    the rollback window), `name` (the migration's; default TABLE-COLUMN...), `plan` (the plan's
    other sections, as a dict), `run_for`."""
    for table, settings in tables.items():
        unknown = sorted(set(settings) - set(TABLE_KEYS))
        if unknown:
            raise ValueError(f"mover_rewriter: table {table!r} has unknown keys {unknown}; known: {TABLE_KEYS}")
    rewriter = Rewriter()
    # One decision per migration name for an autogenerate run: its upgrade and downgrade agree.
    started: dict[str, bool] = {}

    @rewriter.rewrites(ops.UpgradeOps)
    def upgrade(context: MigrationContext, revision: Any, directive: ops.UpgradeOps) -> ops.UpgradeOps:
        directive.ops = _handed(context, directive.ops, tables, started, upgrade=True)
        return directive

    @rewriter.rewrites(ops.DowngradeOps)
    def downgrade(context: MigrationContext, revision: Any, directive: ops.DowngradeOps) -> ops.DowngradeOps:
        directive.ops = _handed(context, directive.ops, tables, started, upgrade=False)
        return directive

    return rewriter


def _handed(context: MigrationContext, found: list[ops.MigrateOperation], tables: Mapping[str, Mapping[str, Any]],
            started: dict[str, bool], *, upgrade: bool) -> list[ops.MigrateOperation]:
    """The operations with each listed table's type changes taken out and handed to mover."""
    out: list[ops.MigrateOperation] = []
    for directive in found:
        settings = _settings(directive, tables)
        if settings is None or not isinstance(directive, ops.ModifyTableOps):
            out.append(directive)
            continue
        columns: dict[str, str] = {}
        kept: list[ops.MigrateOperation] = []
        for alter in directive.ops:
            if isinstance(alter, ops.AlterColumnOp) and alter.modify_type is not None:
                columns[alter.column_name] = str(alter.modify_type.compile(dialect=context.dialect))
                alter.modify_type = None
                if not _still_changes(alter):
                    continue  # the type was all it changed
            kept.append(alter)
        if not columns:
            out.append(directive)
            continue
        name = settings.get("name") or _default_name(directive.table_name, sorted(columns))
        if name not in started:
            status = migration_status(database_url(context, None), name)
            started[name] = status is not None and status["state"] not in control.TERMINAL
        if started[name]:  # registered by an earlier revision: this one finishes it
            out.append(FinishMove(name) if upgrade else RollbackMove(name))
        elif upgrade:
            source = str(QualifiedName(directive.schema, directive.table_name))
            plan, _ = plan_of(settings.get("plan"), name=name, source=source, columns=columns,
                              window=settings.get("window"))  # checked now: a bad setting fails autogenerate
            arguments = {"name": name, "source": source, "columns": columns,
                         **{k: settings[k] for k in ("window", "plan", "run_for") if k in settings}}
            out.append(StartMove(plan, run_for=settings.get("run_for", 0.0), arguments=arguments))
        else:
            out.append(AbortMove(name))
        if kept:
            directive.ops = kept
            out.append(directive)
    return out


def _settings(directive: ops.MigrateOperation, tables: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    if not isinstance(directive, ops.ModifyTableOps):
        return None
    key = directive.table_name if directive.schema is None else f"{directive.schema}.{directive.table_name}"
    return tables.get(key)


def _still_changes(alter: ops.AlterColumnOp) -> bool:
    """Whether an alter_column changes anything but the type (AlterColumnOp's defaults: unchanged)."""
    return (alter.modify_nullable is not None or alter.modify_server_default is not False
            or alter.modify_comment is not False or alter.modify_name is not None)


def _default_name(table: str, columns: list[str]) -> str:
    """A migration name (1-63 of letters, digits, '_', '.', '-') from the table and its columns."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join([table, *columns]))[:63]


# How autogenerate writes each operation into the revision file.


def _call(autogen_context: AutogenContext, text: str) -> str:
    autogen_context.imports.add("import mover.contrib.alembic  # noqa: F401  (mover's operations on op)")
    return text


@renderers.dispatch_for(StartMove)
def _render_start(autogen_context: AutogenContext, op: StartMove) -> str:
    arguments = op.arguments or {"name": op.plan.name}
    return _call(autogen_context, f"op.start_move({', '.join(f'{k}={v!r}' for k, v in arguments.items())})")


@renderers.dispatch_for(FinishMove)
def _render_finish(autogen_context: AutogenContext, op: FinishMove) -> str:
    return _call(autogen_context, f"op.finish_move({op.name!r})")


@renderers.dispatch_for(AbortMove)
def _render_abort(autogen_context: AutogenContext, op: AbortMove) -> str:
    return _call(autogen_context, f"op.abort_move({op.name!r})")


@renderers.dispatch_for(RollbackMove)
def _render_rollback(autogen_context: AutogenContext, op: RollbackMove) -> str:
    return _call(autogen_context, f"op.rollback_move({op.name!r})")
