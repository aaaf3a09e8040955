"""Everything around the swap's lock: the cutover, the swap back in the rollback window, retire
and abort, each one transaction for every table of the migration.

- cutover.py          the swap's phases (preflight, prepare, the locked Swap, finish), retire, abort
- lockwatch.py        the lock discipline: autovacuum paused, blockers named, lock_timeout, attempts
- snapshots.py        transactions with an older snapshot waited for before each attempt
- carry.py            what the swap carries besides rows: names, keys both ways, triggers, views
- metadata.py         the rest of a table's metadata carried to the new table
- parity.py           the table taking the name looks to the application as the other did
- keys.py             the foreign keys between a migration's tables, linked on the targets and checked
- query_rehearsal.py  the application's statements planned against the target before the swap
"""
