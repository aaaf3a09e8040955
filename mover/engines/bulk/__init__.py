"""The work over every row of a table, range by range, resumable at any range.

- rangework.py  the loop every range worker runs (claim, work, record), here and in `mover worker`
- backfill.py   the copy of the original into the new table, and the applier beside it
- builds.py     after the copy: the deferred indexes and constraints built, then ANALYZE
- preflight.py  what the copy will cost before it starts: disk, WAL
- reconcile.py  the comparison of both tables, range by range, each range with the log in one snapshot
- adopt.py      `mover adopt`: an additive change of the live table's shape carried to the other
"""
