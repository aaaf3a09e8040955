"""Every `next:` that names a command in a state-dependent way names one that works where the
migration stands (control.COMMANDS, the transition table), and each command of a chain (`mover
rollback NAME`, then `mover abort NAME`) works where the one before leaves it (control.leaves_at):
over every step and state, the hints of a refused command, of a migration in the way of another
(plan check), of a changed plan, of a changed shape, of `mover adopt`, and of the capture
trigger's TRUNCATE refusal (issue 35)."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from mover.catalog import shape
from mover.engines.bulk import adopt
from mover.errors import BadInput, PlanError
from mover.names import QualifiedName
from mover.plan.forms import parse_plan
from mover.runner import register
from mover.sql import capture
from mover.state import control

NAME = "users"
# Commands that read (no step refuses them): a hint may name them anywhere.
READS = {"status", "history", "events", "divergences", "parity", "report", "watch", "run"}
STATES = ("pending", "running", "waiting", "failed", "interrupted")
COMMAND = re.compile(r"`mover (\w+) ([^`\s]+)")


def migration(step: str, state: str = "running") -> control.Migration:
    now = datetime.now(UTC)
    return control.Migration(
        id=1, name=NAME, plan={}, plan_hash="registered", source=QualifiedName("public", "auth_user"),
        target=QualifiedName("public", "auth_user_new"), old=QualifiedName("public", "auth_user_old"),
        key_columns=["id"], step=step, state=state, paused=False, error=None, created_at=now, updated_at=now,
        cutover_at=None, cutover_lock_ms=None, window_ends_at=None, finished_at=None, lease_owner=None,
        lease_host=None, lease_pid=None, lease_expires_at=None)


def commands_work(hint: str, m: control.Migration) -> list[str]:
    """The commands `hint` names, each checked: the first of each alternative works at m's step,
    each next one where the one before leaves the migration. Returns them (a hint naming none is
    not what these hints are for)."""
    named = []
    # Alternatives: "X; or Y", "finish it (X) or undo it (Y)", "at step s: X, Y, Z"; a chain: "X, then Y".
    for alternative in re.split(r";| or |, (?!then )", hint):
        step = m.step
        for command, name in COMMAND.findall(alternative):
            assert name == m.name, hint
            named.append(command)
            if command in READS and command != "run":
                continue
            assert command in control.COMMANDS, (command, hint)
            assert step in control.COMMANDS[command], f"at step {step!r} (from {m.step!r}): `mover {command}` " \
                                                      f"does not work; hint: {hint}"
            step = control.leaves_at(command, step)
    return named


EVERY = [(step, state) for step in control.STEPS for state in STATES]


@pytest.mark.parametrize(("step", "state"), EVERY)
def test_a_refused_command_names_commands_that_work(step, state):
    m = migration(step, state)
    for command in control.COMMANDS:
        if control.allows(m, command):
            continue
        with pytest.raises(BadInput) as info:
            control.require_command(m, command)
        assert commands_work(info.value.hint or "", m), info.value.hint


@pytest.mark.parametrize(("step", "state"), EVERY)
def test_a_migration_in_the_way_and_a_changed_plan_name_commands_that_work(step, state):
    m = migration(step, state)
    named = commands_work(control.ways_out(m), m)
    assert named and named[0] != "abort" or step in control.COMMANDS["abort"]
    undo = control.way_to_undo(m)
    if undo is not None:
        assert commands_work(undo, m)[-1] == "abort"
    assert commands_work(control.way_to_finish(m), m)
    plan = parse_plan({"migration": {"name": NAME, "source": "public.auth_user"},
                       "target": {"columns": {"id": "bigint"}}, "rollback": {"window": "1h"}})
    with pytest.raises(PlanError) as info:
        register.same_shape(m, plan)
    assert commands_work(info.value.hint or "", m), info.value.hint


def test_after_the_cutover_abort_comes_only_after_a_rollback():
    """The case issue 35 found: plan check of another plan for a table in a rollback window."""
    m = migration("rollback_window", "waiting")
    hint = control.ways_out(m)
    assert hint.index("`mover rollback users`") < hint.index("`mover abort users`"), hint
    assert "`mover retire users`" in hint, hint
    assert control.way_to_undo(migration("retire", "failed")) is None


@pytest.mark.parametrize(("step", "state"), EVERY)
def test_a_shape_change_and_adopt_name_commands_that_work(step, state):
    m = migration(step, state)
    swapped = control.STEPS.index(step) > control.STEPS.index("cutover")
    live, other = ("target", "source") if swapped else ("source", "target")
    added = [shape.Change(live, "column_added", "column p was added", True, "p")]
    dropped = [shape.Change(live, "column_dropped", "column q was dropped", False, "q")]
    theirs = [shape.Change(other, "column_dropped", "column r was dropped", False, "r")]
    for changes in (added, dropped, added + theirs):
        hint = shape.explain(NAME, changes, swapped, 1, step).hint or ""
        assert commands_work(hint, m) or "undo the change" in hint, hint
    if step in control.COMMANDS["adopt"]:
        assert commands_work(adopt._undo(m), m) or "mover status" in adopt._undo(m)


def test_the_capture_triggers_truncate_refusal_names_what_works_where_the_trigger_is():
    """The forward capture's trigger is on the source before the swap; the reverse capture's on
    the live table in the rollback window."""
    log, fn = QualifiedName("mover", "m1_changes"), QualifiedName("mover", "m1_capture")
    for reverse, steps in ((False, control._through("install_capture", "cutover")),
                           (True, frozenset({"rollback_window"}))):
        body = capture.create_trigger_function(fn, log, ("id",), NAME, reverse=reverse)[0].as_string()
        (template,) = re.findall(r"format\(''(delete the rows instead[^']*)''", body)
        for step in steps:
            assert commands_work(template.replace("%s", NAME), migration(step)) == [
                "retire" if reverse else "abort"]


def test_the_checker_finds_a_command_that_does_not_work():
    """What the tests above rely on: abort in the window, and a chain whose second command does
    not work where the first leaves it, are caught."""
    with pytest.raises(AssertionError):
        commands_work("`mover abort users` first", migration("rollback_window"))
    with pytest.raises(AssertionError):
        commands_work("`mover run users` takes it to step 'rollback_window', then `mover rollback users`",
                      migration("backfill"))
    assert commands_work("`mover rollback users`, then `mover abort users`", replace(
        migration("rollback_window"), state="waiting")) == ["rollback", "abort"]
