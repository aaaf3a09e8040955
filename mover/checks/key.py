"""The key: compared by bytes wherever mover compares keys, so its collations must be deterministic."""

from __future__ import annotations

from mover import names
from mover.checks import Subject
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
