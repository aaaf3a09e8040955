"""`mover parity NAME`: the metadata differences between the live table and what it was (after the
swap, after a rollback) or the two tables (before the swap), as mover/engines/swap/parity.py compares
them. Reads only."""

from __future__ import annotations

from typing import Any

import psycopg

from mover.db import Database
from mover.engines.context import Context
from mover.engines.swap import parity
from mover.state import control


def report(db: Database, name: str) -> dict[str, Any]:
    def read(cur: psycopg.Cursor) -> dict[str, Any]:
        return parity.report(cur, Context(db=db, migration=control.get(cur, name), owner="parity"))
    return db.transaction(read, label="parity")
