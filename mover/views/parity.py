"""`mover parity NAME`: the metadata differences between the live table and what it was (after the
swap, after a rollback) or the two tables (before the swap), as mover/engines/swap/parity.py compares
them, with the swap's own judgement of what is planned. A family's name: every table's
comparisons, each naming its table (the keys between the family's tables are planned: the swap
renames the tables and the keys stay with them). Reads only."""

from __future__ import annotations

from typing import Any

import psycopg

from mover.db import Database
from mover.engines.context import Context
from mover.engines.swap import parity
from mover.state import control


def report(db: Database, name: str) -> dict[str, Any]:
    def read(cur: psycopg.Cursor) -> dict[str, Any]:
        m = control.get(cur, name)
        head = Context(db=db, migration=control.head_of(cur, m), owner="parity")
        members = head.family(cur)
        family = parity.family_names(cur, members)
        chosen = members if m.head else [t for t in members if t.mid == m.id]
        each = [parity.report(cur, t, family) for t in chosen]
        if len(members) == 1:
            return each[0]
        out = {**each[0], "name": m.name,
               "equal": all(r["equal"] for r in each),
               "comparisons": [{**c, "table": str(t.migration.source)} for t, r in zip(chosen, each, strict=True)
                               for c in r["comparisons"]]}
        return out
    return db.transaction(read, label="parity")
