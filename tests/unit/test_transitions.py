"""The state machine's pure half, without a server: the step order, the step after each, and which
operator command control.require_command lets through at which step (the guarded UPDATEs that
follow are tests/integration/test_state_machine.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mover.errors import BadInput
from mover.names import QualifiedName
from mover.state import control


def migration(step: str, state: str = "running") -> control.Migration:
    now = datetime.now(UTC)
    return control.Migration(
        id=1, name="orders-bigint", plan={}, plan_hash="", source=QualifiedName("public", "orders"),
        target=QualifiedName("public", "orders_new"), old=QualifiedName("public", "orders_old"), key_columns=["id"],
        step=step, state=state, paused=False, error=None, created_at=now, updated_at=now, cutover_at=None,
        cutover_lock_ms=None, window_ends_at=None, finished_at=None, lease_owner=None, lease_host=None,
        lease_pid=None, lease_expires_at=None)


def test_each_step_is_followed_by_the_next_and_the_last_by_finished():
    walked = [control.STEPS[0]]
    while walked[-1] != control.FINISHED:
        walked.append(control.next_step(walked[-1]))
    assert walked == [*control.STEPS, control.FINISHED]


def test_named_phases_are_runs_of_steps_and_the_end_reads_retire():
    """The step sets other modules ask about (control.BUILDING...) are contiguous runs of STEPS, and
    the internal step after the last one is shown as the last."""
    for phase in (control.SETTING_UP, control.BUILDING, control.RANGE_STEPS, control.HELPED, control.COMPARING,
                  control.BEFORE_SWAP, control.FOLLOWED):
        at = sorted(control.STEPS.index(s) for s in phase)
        assert at == list(range(at[0], at[-1] + 1)), phase
    assert control.COMMANDS["pause"] == control.RANGE_STEPS and control.COMMANDS["abort"] == control.BEFORE_SWAP
    assert control.shown_step(control.FINISHED) == "retire" and control.shown_step("backfill") == "backfill"


# abort after the swap has its own refusal (roll back first): the last test.
@pytest.mark.parametrize(("command", "step"), [(c, s) for c in sorted(control.COMMANDS) for s in control.STEPS
                                               if (c, s) != ("abort", "rollback_window")])
def test_a_command_passes_exactly_at_the_steps_its_table_lists(command, step):
    m = migration(step)
    if step in control.COMMANDS[command]:
        control.require_command(m, command)
    else:
        with pytest.raises(BadInput, match=f"at step '{step}'") as info:
            control.require_command(m, command)
        assert info.value.exit_code == 2 and info.value.hint


@pytest.mark.parametrize("state", control.TERMINAL)
def test_nothing_but_reading_passes_once_done_or_aborted(state):
    for command in control.COMMANDS:
        with pytest.raises(BadInput, match=f"state '{state}'"):
            control.require_command(migration("retire", state), command)


def test_abort_after_the_swap_says_to_roll_back_first():
    with pytest.raises(BadInput, match="after its cutover") as info:
        control.require_command(migration("rollback_window"), "abort")
    assert "mover rollback orders-bigint" in (info.value.hint or "")


@pytest.mark.parametrize(("step", "command", "hint"), [
    # After a rollback the migration is back at reconcile: run takes it to the gate, then the cutover.
    ("reconcile", "cutover",
     "`mover run orders-bigint` takes it to step 'cutover', then `mover cutover orders-bigint`"),
    # run stops at the gate: the cutover takes it into the window.
    ("backfill", "rollback", "`mover run orders-bigint`, then `mover cutover orders-bigint` take it to step "
                             "'rollback_window', then `mover rollback orders-bigint`"),
    ("rollback_window", "cutover", "at step 'rollback_window': `mover run orders-bigint`, "
                                   "`mover rollback orders-bigint`, `mover retire orders-bigint`"),
])
def test_a_refused_command_says_the_command_that_leads_on(step, command, hint):
    with pytest.raises(BadInput) as info:
        control.require_command(migration(step), command)
    assert hint in (info.value.hint or ""), info.value.hint
