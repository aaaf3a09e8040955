"""Partitioned targets: which partitions a conversion creates before anything is created
(partitions.py: every value the source holds has one) and the upkeep of the tables mover converted
after the cutover (upkeep.py: `mover partitions maintain`, or pg_partman's run_maintenance)."""
