"""The engines: the data work of each step (copy, capture and replay, compare, swap, carry, parity),
with no knowledge of the state machine. Steps (mover/steps/) call them; they call catalog/, sql/ and state/."""
