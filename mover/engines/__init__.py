"""The engines: the data work of each step, with no knowledge of the state machine's order. Steps
(mover/steps/) and the runner (mover/runner/) call them; they call catalog/, state/ and sql/.

By concern, bottom to top (an engine imports from its own package or one below it, never up;
tests/unit/test_layers.py holds the order and refuses any import circle):
- partitioning/  which partitions a conversion creates, and their upkeep after it
- context.py     what one run of a migration works with (one per table); hooks.py, the plan's hooks
- capture/       the change logs: the triggers (or the WAL feeder) that fill them, their replay, and
                 the proof that capture stayed in force
- governor/      how fast bulk work may go: the budget, the guards, what is read from the server
- bulk/          the work over every row, range by range: the copy, the builds after it, the
                 comparison, and adopting a change of the live table's shape
- swap/          everything around the swap's lock: the cutover, the swap back, retire and abort,
                 what is carried and checked across it, the keys between a migration's tables
"""
