"""How a command prints: its own two consoles (made per call, never kept in a global), tables
that fit a terminal and are never cut off one, JSON, plain lines, log records, a progress bar's
lifetime, and the one place an error becomes what the operator reads and the exit code."""

from __future__ import annotations

import dataclasses
import json
import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, cast

import psycopg
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mover.db import is_connection_lost, mask
from mover.errors import MoverError
from mover.state.control import events_log
from mover.views import json_log
from mover.views.progress import ProgressReporter

GENERAL_NEXT = "fix the cause, then run the same command again; `mover status` shows where things stand"
INTERRUPTED = "interrupted; the open transaction was rolled back"
INTERRUPTED_NEXT = "`mover run NAME` resumes (`mover status` shows where it stopped)"
LOST = "lost the connection to the database server"
LOST_NEXT = "once the server is back, run the same command again"
DATABASE_ERROR_NEXT = ("fix the cause, then run the same command again (mover resumes where it stopped; "
                       "`mover status` shows where that is)")
BUG_NEXT = ("this is a bug in mover; report it with the traceback above. The migration stays resumable: "
            "`mover status` shows where it stopped")

log = logging.getLogger("mover")


@dataclasses.dataclass(frozen=True)
class Consoles:
    """One command's consoles: results on stdout, messages, progress and logs on stderr; whether
    it was asked for tracebacks (--debug); and whether stderr is JSON lines (--log-format json:
    then what is printed on `err` becomes log records, views/json_log.py)."""

    out: Console
    err: Console
    debug: bool = False
    json_logs: bool = False

    @classmethod
    def make(cls, *, debug: bool = False, json_logs: bool = False) -> Consoles:
        # Made when the command starts, so that they write to the streams and take the width
        # (COLUMNS) it starts with.
        if json_logs:
            # rich needs only write and flush of its file (typed as a whole IO[str]).
            lines = cast(IO[str], json_log.LoggedLines(logging.getLogger("mover.console")))
            err = Console(file=lines, width=10_000, color_system=None, force_terminal=False, highlight=False)
            return cls(out=Console(), err=err, debug=debug, json_logs=True)
        return cls(out=Console(), err=Console(stderr=True), debug=debug)


def say(console: Console, text: str) -> None:
    """One line as it is: no markup, no highlighting."""
    console.print(text, highlight=False, markup=False)


def row(t: Table, *cells: str) -> None:
    """A row of values as they are: rich would take "[throttle]" in a message, or a key like
    "[x]", for markup and drop it."""
    t.add_row(*(Text(c) for c in cells))


def table(out: Console, t: Table) -> None:
    """A table on a terminal fits its width; off a terminal (a pipe, a file, a script) nothing
    may be cut or folded: the columns take the width their contents need."""
    if out.is_terminal:
        out.print(t)
        return
    Console(file=out.file, width=10_000, color_system=None).print(t)


def as_json(out: Console, value: Any) -> None:
    out.print_json(json.dumps(value, default=str))


@contextmanager
def progress(con: Consoles) -> Iterator[ProgressReporter | json_log.LogReporter]:
    """The progress bars of a long command on stderr, closed however it ends (a live bar left
    running would hide the error message and leave the terminal askew); in json mode, log records."""
    reporter = json_log.LogReporter() if con.json_logs else ProgressReporter(con.err)
    try:
        yield reporter
    finally:
        reporter.close()


def failure(con: Consoles, exc: BaseException) -> int:
    """The one place errors become exit codes, with what the operator reads: 1 failed, 2 bad
    input (nothing changed), 3 waiting for the operator, 130 interrupted. Every message ends
    with what to do next. No traceback unless --debug, but for a bug. In json mode, one log record
    says all of it (`failed`)."""
    if con.json_logs:
        return failed(exc, debug=con.debug)
    err = con.err
    if isinstance(exc, MoverError):
        style = {3: "yellow", 130: "yellow"}.get(exc.exit_code, "red")
        err.print(f"[{style}]{escape(mask(exc.message))}[/{style}]", highlight=False)
        # An error raised without a hint gets the general one.
        say(err, f"next: {mask(exc.hint or GENERAL_NEXT)}")
        if con.debug:
            _traceback(err, exc)
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        err.print(f"[yellow]{INTERRUPTED}[/yellow]")
        say(err, f"next: {INTERRUPTED_NEXT}")
        return 130
    if isinstance(exc, psycopg.Error):
        if is_connection_lost(exc):
            say(err, f"{LOST}: {mask(str(exc).strip())}")
            say(err, f"next: {LOST_NEXT}")
            return 1
        say(err, f"database error: {mask(str(exc).strip())}")
        say(err, f"next: {DATABASE_ERROR_NEXT}")
        if con.debug:
            _traceback(err, exc)
        return 1
    # A bug: its traceback, masked like everything else printed (its text may quote a DSN).
    _traceback(err, exc)
    say(err, f"next: {BUG_NEXT}")
    return 1


def failed(exc: BaseException, *, debug: bool) -> int:
    """`failure` as one log record (json mode): the message, `next` and `exit_code`; an error
    (a warning for 3 waiting and 130 interrupted); the traceback where text mode prints it."""
    code, traced = 1, debug
    if isinstance(exc, MoverError):
        code, message, hint = exc.exit_code, exc.message, exc.hint or GENERAL_NEXT
    elif isinstance(exc, KeyboardInterrupt):
        code, message, hint, traced = 130, INTERRUPTED, INTERRUPTED_NEXT, False
    elif isinstance(exc, psycopg.Error) and is_connection_lost(exc):
        message, hint, traced = f"{LOST}: {str(exc).strip()}", LOST_NEXT, False
    elif isinstance(exc, psycopg.Error):
        message, hint = f"database error: {str(exc).strip()}", DATABASE_ERROR_NEXT
    else:
        message, hint, traced = f"{type(exc).__name__}: {exc}", BUG_NEXT, True
    # Masked by the formatter, as every line.
    log.log(logging.WARNING if code in (3, 130) else logging.ERROR, "%s", message,
            extra={"next": hint, "exit_code": code}, exc_info=exc if traced else None)
    return code


def _traceback(err: Console, exc: BaseException) -> None:
    # Plain text so it can be masked: exception texts (psycopg's among them) may quote the DSN.
    err.print(mask("".join(traceback.format_exception(exc))), highlight=False, markup=False, end="")


class ConsoleLog(logging.Handler):
    """Log records through the same console as everything else (a raw stderr line would tear a
    live progress bar), masked. A warning reads like the other messages, `warning: ...` then its
    `next:` (a record's `next` attribute, from `extra=`), and is said once per command: a
    throttle that meets the same condition in every worker would otherwise repeat it. The
    records of recorded events are not shown (with -v they would double the progress lines):
    `mover events` lists them, and json mode's handler writes them."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self._said: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == events_log.name:
            return  # the events are `mover events`'s; the console tells the story through the progress lines
        try:
            message = mask(record.getMessage())
            if record.exc_info and self.formatter:
                message += "\n" + mask(self.formatter.formatException(record.exc_info))
            if record.levelno >= logging.WARNING:
                if message in self._said:
                    return
                self._said.add(message)
                self.console.print(f"warning: {message}", style="yellow", highlight=False, markup=False)
                hint = getattr(record, "next", None)
                if hint:
                    say(self.console, f"next: {mask(str(hint))}")
                return
            say(self.console, f"{self.formatter.formatTime(record) if self.formatter else ''} {record.name} "
                              f"{record.levelname} {message}")
        except Exception:  # a log line must never take the command down
            self.handleError(record)


def stopping(err: Console, word: str) -> None:
    """The first Ctrl-C (or SIGTERM) of a long command."""
    err.print(f"[yellow]{word}: stopping at the next safe point ({word} again to stop now)[/yellow]")
