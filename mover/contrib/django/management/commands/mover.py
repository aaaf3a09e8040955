"""`manage.py mover COMMAND ...`: mover's command line (mover.cli) against a database of the
project's DATABASES. Everything after `mover` is mover's (`manage.py mover status NAME --json`,
`manage.py mover run plan.toml`); the DSN comes from the settings, and the exit code is mover's
(0 done, 1 failed, 2 bad input, 3 waiting for the operator, 130 interrupted)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from mover import cli
from mover.contrib.django.connection import database_dsn
from mover.errors import MoverError


class Command(BaseCommand):
    help = ("Run a mover command against a database of DATABASES (no DSN needed): `manage.py mover status`, "
            "`manage.py mover run PLAN`, `manage.py mover cutover NAME`... `manage.py mover --help` lists "
            "mover's commands. Exit codes are mover's.")
    # mover's commands read and move tables, not models: the project's system checks are not theirs to run.
    requires_system_checks: list[str] = []

    def run_from_argv(self, argv: list[str]) -> None:
        """manage.py's way in: every argument after `mover` is mover's (`--help` too), but for
        `--database` and Django's `--settings` / `--pythonpath`, which manage.py has applied already.
        (call_command's way in is the parser of add_arguments.)"""
        alias, mover_args = database_option(without_django_options(argv[2:]))
        try:
            self.execute(mover_args=mover_args, database=alias, no_color=False, force_color=False, skip_checks=True)
        except CommandError as exc:
            self.stderr.write(f"{exc.__class__.__name__}: {exc}")
            raise SystemExit(exc.returncode) from exc
        finally:
            connections.close_all()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=None,
                            help=f"The database alias of DATABASES mover works on (default {DEFAULT_DB_ALIAS!r}).")
        parser.add_argument("mover_args", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                            help="mover's command and its arguments.")

    def handle(self, *args: Any, **options: Any) -> None:
        alias, mover_args = database_option(list(options["mover_args"]))
        try:
            dsn = database_dsn(alias or options["database"] or DEFAULT_DB_ALIAS)
        except MoverError as exc:
            raise CommandError(f"{exc.message}; next: {exc.hint}", returncode=exc.exit_code) from exc
        try:
            cli.main(["--dsn", dsn, *mover_args], prog_name="manage.py mover")
        except SystemExit as exc:
            # mover printed its result or its error with the next command; its exit code is the
            # command's, for scripts that branch on 3 (waiting) as they do with `mover`.
            if exc.code not in (0, None):
                raise


def without_django_options(args: list[str]) -> list[str]:
    """The arguments without `--settings` and `--pythonpath` (with their values) before a `--`."""
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return rest + args[i:]
        if a in ("--settings", "--pythonpath"):
            i += 2
            continue
        if not a.startswith(("--settings=", "--pythonpath=")):
            rest.append(a)
        i += 1
    return rest


def database_option(args: list[str]) -> tuple[str | None, list[str]]:
    """`--database ALIAS` (or `--database=ALIAS`) wherever it stands among mover's arguments (mover
    has no option of that name), and the arguments without it; nothing after a `--` is looked at."""
    alias: str | None = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest.extend(args[i:])
            break
        if a == "--database" and i + 1 < len(args):
            alias = args[i + 1]
            i += 2
            continue
        if a.startswith("--database="):
            alias = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return alias, rest
