"""The error hierarchy. Each class carries its exit code; cli.py is the one place that maps them.

Exit codes: 0 done, 1 failed, 2 bad input and nothing changed, 3 waiting for the operator.
"""

from __future__ import annotations

from typing import Any


class MoverError(Exception):
    """Something went wrong; the migration stays resumable."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class Failed(MoverError):
    """A step failed; fix the cause and run the migration again."""

    exit_code = 1


class ConstraintBuildFailed(Failed):
    """A constraint of the new table (an exclusion constraint, built after the copy) rejects rows
    it holds: the source's rows as converted, or a row whose replay failed. Resumable: once the
    rows fit, `mover run NAME` builds it again."""

    event_kind = "constraint_build_failed"


class ServerGone(Failed):
    """The database server went away (shutdown, restart, network) in the middle of a command: the
    migration is resumable once the server is back."""


class SlotLost(Failed):
    """The replication slot of a migration's logical capture is gone or invalidated: changes since
    its position may never reach the change log. The migration stops (exit 1) until the operator
    recovers (`mover recapture NAME`: a new slot, then a reconcile pass over every range)."""

    event_kind = "capture_slot_lost"


class BadInput(MoverError):
    """The plan, the command line or the database state makes the request invalid; nothing was changed."""

    exit_code = 2


class PlanError(BadInput):
    """The plan file is malformed or does not fit the live database."""

    problems: list[PlanError]

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.problems = [self]


def combined(problems: list[PlanError], hint: str = "fix each of them, then `mover plan check PLAN` again") \
        -> PlanError:
    """One problem as it is; several as a numbered list, each with its own next step. The
    problems stay listed on the error (`plan check --json` prints them)."""
    if len(problems) == 1:
        return problems[0]
    lines = [f"the plan has {len(problems)} problems:"]
    for i, p in enumerate(problems, 1):
        lines.append(f"{i}. {p.message}" + (f" (next: {p.hint})" if p.hint else ""))
    error = PlanError("\n".join(lines), hint=hint)
    error.problems = list(problems)
    return error


class NotFound(BadInput):
    """A named migration or database object does not exist."""


class ShapeChanged(BadInput):
    """A table's shape changed since mover recorded it (mover/catalog/shape.py): nothing is copied,
    compared or swapped across it; `mover adopt NAME` or `mover abort NAME`, as the hint says."""

    event_kind = "shape_changed"

    def __init__(self, message: str, *, hint: str | None = None, changes: list[Any] | None = None):
        super().__init__(message, hint=hint)
        self.changes = changes or []
        self.detail = {"changes": [c.as_dict() for c in self.changes]}


class Waiting(MoverError):
    """The migration waits for the operator: a gate, an open rollback window, divergences, a held lease."""

    exit_code = 3


class CatalogMoved(Waiting):
    """A catalog read found an object that another session's DDL dropped or replaced while the read
    ran (mover/catalog/reading.py): its print came back NULL. Database.transaction runs the whole
    transaction again, like a serialization failure; this reaches the operator only when the
    catalog kept moving through every attempt, and then running the command again is the cure."""

    event_kind = "catalog_moved"


class LeaseHeld(Waiting):
    """Another live process is the orchestrator of this migration."""


class LeaseLost(Failed):
    """Our lease expired and another process took the migration over; we stop without writing."""


class Interrupted(MoverError):
    """Ctrl-C: stopped at a safe point; `mover run NAME` resumes."""

    exit_code = 130


class FleetStopped(Failed):
    """A fleet's rollout stopped on one of its stop conditions (a member failed, refused or could not
    be reached): the members in flight finished where they were, nothing further started; `mover
    fleet status FLEET` names what stopped it, and once it is fixed the same command resumes."""


class FleetHeld(Waiting):
    """A fleet waits for the operator: every member is at its gate, a member has open divergences or
    its governor is at its floor, or a wave was not reached yet."""
