"""How `--help` prints the command line's options: a flag takes no value, so it shows no type
(typer prints "<bool>" for it otherwise). The command line's groups and commands are made of
these classes; nothing of typer's own is changed."""

from __future__ import annotations

from typing import Any

import typer


def _untyped_flags(params: list[Any]) -> list[Any]:
    # What typer prints for an option's type is its metavar when it has one: an empty one for a
    # flag (--help and the completion flags included).
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    return params


class Group(typer.core.TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))


class Command(typer.core.TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))
