from __future__ import annotations

from typing import NoReturn

import psycopg
from psycopg import sql

from mover.engines.context import Context


class Step:
    name: str = ""
    # A gate: `mover run` stops before it unless the operator (or the plan) says go.
    gate: bool = False

    def describe(self, ctx: Context, cur: psycopg.Cursor) -> list[sql.Composable | str]:
        """The SQL this step will run, for `mover plan check`."""
        return []

    def run(self, ctx: Context) -> None:
        raise NotImplementedError

    def wait(self, ctx: Context) -> NoReturn:
        """A gate's work while it waits for the operator, instead of run: raises Waiting."""
        raise NotImplementedError
