"""Fleets (issue 38): one plan over many databases, or over the tenant schemas of one, a canary
first, then waves; resumable from anywhere. A fleet is a list of members, each an ordinary
migration in its own database: no lifecycle of its own, no coordinator process beyond the
command that runs.

- file.py: the fleet file (TOML), parsed and checked without a database.
- members.py: the members as they are now (listed, discovered, tenant schemas), each reached, in
  waves, with its plan.
- state.py: the fleet's own state in its home database (revision 0012): members' states, waves
  reached, what stopped the rollout, the runner's lease, events.
- rollout.py: the commands, wave by wave, bounded overall and per server.
- views.py and text.py: what status and watch read, and how they print it.
"""
