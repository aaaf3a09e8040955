"""The engines: the data work of each step (copy, capture and replay, compare, swap, carry, metadata,
parity, partition upkeep), with no knowledge of the state machine's order. Steps (mover/steps/) and
the runner (mover/runner/) call them; they call catalog/, state/ and sql/."""
