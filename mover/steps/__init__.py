"""The seven steps, each a small adapter over the engines.

A step describes the SQL it will run (`plan check`) and runs re-entrantly: it marks itself done
with a control transition (finish_step...) in the same transaction as its effect wherever
PostgreSQL allows it.
"""

from __future__ import annotations

from mover.state import control
from mover.steps.backfill import Backfill
from mover.steps.base import Step
from mover.steps.create_target import CreateTarget
from mover.steps.cutover import Cutover
from mover.steps.install_capture import InstallCapture
from mover.steps.reconcile import Reconcile
from mover.steps.retire import Retire
from mover.steps.rollback_window import RollbackWindow

# The order is control.STEPS (the state machine's); each name has exactly one step here.
_STEPS: tuple[Step, ...] = (CreateTarget(), InstallCapture(), Backfill(), Reconcile(), Cutover(), RollbackWindow(),
                            Retire())
BY_NAME = {s.name: s for s in _STEPS}
assert sorted(BY_NAME) == sorted(control.STEPS) and len(_STEPS) == len(control.STEPS), "steps and control.STEPS differ"
ALL: tuple[Step, ...] = tuple(BY_NAME[name] for name in control.STEPS)

__all__ = ["ALL", "BY_NAME", "Step"]
