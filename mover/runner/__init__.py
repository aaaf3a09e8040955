"""Everything that moves a migration, under mover/api.py and over the steps and engines:

- lease.py: the orchestrator's lease around a piece of work (heartbeat, outcome recorded).
- lifecycle.py: the step loop (advance) and the operator's moves under the lease (cutover,
  rollback, retire, abort).
- commands.py: the operator's commands over an open database (run, follow, cutover, ..., accept,
  pause, set, partition upkeep).
- register.py: init, plan check, registration, finding a migration by name or plan file.
- draft.py: `mover plan new`, the plan for a table and a change, read from the catalog.
- follow.py: the follower that keeps the log drained at the gate and in the window.
- workers.py: helper range workers (`mover worker`).
- rehearse.py: the query rehearsal before the cutover (`mover rehearse`).
- sampler.py: the heartbeat's progress samples.

The runner returns the migration or plain data; what the operator reads is mover/views/.
"""

from mover.engines.context import Reporter, log_reporter

# The progress callback every command takes (the CLI passes mover/views/progress.py's).
__all__ = ["Reporter", "log_reporter"]
