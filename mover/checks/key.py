"""The key: compared by bytes wherever mover compares keys, so its collations must be deterministic."""

from __future__ import annotations

from mover import names
from mover.checks.subject import Subject
from mover.db import one
from mover.errors import PlanError


def deterministic_collations(s: Subject) -> None:
    info = s.table
    for k in info.key:
        coll = info.column(k).collation
        if coll is None:
            continue
        s.cur.execute("SELECT c.collisdeterministic FROM pg_collation c"
                      " JOIN pg_namespace n ON n.oid = c.collnamespace WHERE n.nspname = %s AND c.collname = %s",
                      coll)
        if not one(s.cur)[0]:
            # Two keys equal under the collation can differ in bytes ('a' and 'A'): the replay
            # and the comparison by key would not see a change between them.
            s.report(PlanError(f"[migration] source: key column {names.display_ident(k)} of {s.src} has the "
                               f"nondeterministic collation {names.display_ident(coll[1])}, which mover cannot "
                               f"move", hint="use a deterministic collation for the key, or a key on other columns"))


def immediate(s: Subject) -> None:
    """A deferrable key cannot be the replay's conflict target: INSERT ... ON CONFLICT refuses a
    deferrable index as its arbiter, and the target's key (built before the backfill) is not
    deferrable, so the swap would change what the application's transactions may do. Refused
    here, before anything is created, rather than by the swap's parity check after the copy."""
    s.cur.execute("SELECT k.conname, k.contype, k.condeferred FROM pg_index i"
                  " JOIN pg_class ic ON ic.oid = i.indexrelid"
                  " LEFT JOIN pg_constraint k ON k.conindid = i.indexrelid AND k.conrelid = i.indrelid"
                  " WHERE i.indrelid = %s AND ic.relname = %s AND NOT i.indimmediate", (s.table.oid, s.table.key_index))
    row = s.cur.fetchone()
    if row is None:
        return
    name, contype, deferred = row
    kind = "PRIMARY KEY" if contype == "p" else "UNIQUE"
    cols = ", ".join(names.display_ident(k) for k in s.table.key)
    s.report(PlanError(
        f"[migration] source: the key of {s.src}, {kind} constraint {names.display_ident(name or s.table.key_index)}"
        f" ({cols}), is DEFERRABLE{' INITIALLY DEFERRED' if deferred else ''}: mover replays rows by key with"
        f" INSERT ... ON CONFLICT, which cannot use a deferrable key, and the swapped-in table's key would not be"
        f" deferrable (nothing was created)",
        hint=f"make the key not deferrable before the migration (PostgreSQL cannot ALTER a key's deferrability: drop"
             f" the constraint and add it again without DEFERRABLE, e.g. `ALTER TABLE {s.src} DROP CONSTRAINT"
             f" {names.display_ident(name or s.table.key_index)}, ADD {kind} ({cols})`, with the foreign keys that"
             f" reference it), then `mover plan check` again; DEFERRABLE unique constraints and foreign keys"
             f" other than the key are carried as they are"))
