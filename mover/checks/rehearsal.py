"""The DDL rehearsal: what the catalog alone cannot tell (a type change that needs USING, a column
used by a generated column or a CHECK constraint, an identity column turned text, an index name
that is taken) is found by running create_target's own DDL in a savepoint and rolling it back."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg

from mover import names
from mover.catalog import introspect
from mover.checks.subject import Subject
from mover.db import is_retryable
from mover.engines.bulk import builds
from mover.engines.swap import carry
from mover.errors import PlanError
from mover.names import QualifiedName
from mover.plan import Plan
from mover.sql import ddl

HINT = "change the plan (or the source table) so that this DDL succeeds; `mover plan check` prints it"


def create_target(s: Subject) -> None:
    """Without the type changes first, so that the message can name the key at fault; then with
    them, and one column at a time when they fail (this is the error path: cheap enough)."""
    cur, plan, source, target = s.cur, s.plan, s.src, s.new
    rehearsed: list[Any] = []
    problem = rehearse(cur, replace(plan, columns={}), source, target, None if plan.columns else rehearsed)
    if problem:
        raise PlanError(f"[target] name: the target {target} cannot be created: {problem}", hint=HINT)
    if not plan.columns:
        s.rehearsed = rehearsed[0]
        return
    if not rehearse(cur, plan, source, target, rehearsed):
        s.rehearsed = rehearsed[0]
        return
    for col, typ in sorted(plan.columns.items()):
        failed: list[Any] = []
        problem = rehearse(cur, replace(plan, columns={col: typ}), source, target, failed)
        if problem and isinstance(failed[0], psycopg.errors.DatatypeMismatch):
            raise PlanError(
                f"[target] columns: column {names.display_ident(col)} cannot become {typ!r}: PostgreSQL has "
                f"no assignment cast from {s.table.column(col).type} to {typ} ({problem})",
                hint="mover converts as ALTER TABLE ... TYPE does, without USING: change the type in the "
                     "plan, or convert the column in the source table first")
        if problem:
            raise PlanError(f"[target] columns: column {names.display_ident(col)} cannot become {typ!r} "
                            f"in the target {target}: {problem}", hint=HINT)
    raise PlanError(f"[target] columns: the target {target} cannot be created with these type changes: "
                    f"{rehearse(cur, plan, source, target)}", hint=HINT)


def rehearse(cur: psycopg.Cursor, plan: Plan, source: QualifiedName, target: QualifiedName,
             out: list[Any] | None = None) -> str | None:
    """Run create_target's DDL in a savepoint and roll it back; the error it met, if any.
    `out` receives the error, or the rehearsed target's description."""
    from mover.steps.create_target import target_ddl  # the step's own DDL, not a copy of it

    cur.execute("SAVEPOINT mover_rehearsal")
    try:
        for stmt in target_ddl(cur, plan, source, target):
            cur.execute(stmt)
        # The NOT VALID checks (and, on 18, NOT NULLs) come back at the swap (mover/engines/swap/cutover.py):
        # they must fit the new types, and the target's kind (a partitioned one takes no NO INHERIT).
        source_oid = introspect.table_oid(cur, source)
        assert source_oid is not None  # resolved by the caller
        for name, definition, _ in introspect.unvalidated_constraints(cur, source_oid):
            cur.execute(ddl.add_constraint(target, name, definition))
        # The source's own foreign keys as the swap and the validation after it carry them (to a
        # partitioned target: onto each partition, then the parent): on this empty table, cheap.
        for fk in carry.outbound_rehearsal_sql(cur, source, target, plan.drop_foreign_keys):
            cur.execute(fk)
        # The exclusion constraints the backfill builds after the copy (over the new types, on a
        # partitioned target where the server takes them): tried on the empty table now.
        for ix in introspect.describe(cur, source).indexes:
            if ix.by_constraint:
                cur.execute(builds.IndexBuild(builds.deferred_index_name(0, ix.name), ix, target).statement())
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
