"""How fast mover's bulk work may go: one governor per migration holds what the application pays
for it inside a budget and keeps the WAL and replication guards.

- throttle.py  the governor and the throttle every bulk loop asks before each piece of work
- pacing.py    its arithmetic, pure (readings in, decisions out), each rule a unit test
- signals.py   what it reads from the server: the probe, standbys, slots, the archiver, sessions
"""
