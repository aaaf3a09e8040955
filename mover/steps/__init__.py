"""The seven steps, each a small adapter over the engines.

A step can describe the SQL it will run (dry run), tell from the catalog whether its effect is
there, and run re-entrantly: it marks itself done with control.finish_step in the same
transaction as its effect wherever PostgreSQL allows it.
"""

from __future__ import annotations

from itertools import pairwise

from mover.steps.backfill import Backfill
from mover.steps.base import Step
from mover.steps.create_target import CreateTarget
from mover.steps.cutover import Cutover
from mover.steps.install_capture import InstallCapture
from mover.steps.reconcile import Reconcile
from mover.steps.retire import Retire
from mover.steps.rollback_window import RollbackWindow

ALL: tuple[Step, ...] = (CreateTarget(), InstallCapture(), Backfill(), Reconcile(), Cutover(), RollbackWindow(),
                         Retire())
BY_NAME = {s.name: s for s in ALL}
NEXT = {a.name: b.name for a, b in pairwise(ALL)} | {"retire": "finished"}

__all__ = ["ALL", "BY_NAME", "NEXT", "Step"]
