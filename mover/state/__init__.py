"""mover's own control schema: the migration's state machine, leases, events, range queues, samples.
Each control table has one owner module here."""
