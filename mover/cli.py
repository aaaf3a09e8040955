"""The command line: flags -> api calls. The one place that maps errors to exit codes."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, ParamSpec, TypeVar

import psycopg
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mover import api
from mover.db import is_connection_lost, mask, remember_secrets
from mover.engines.swap import query_rehearsal
from mover.errors import BadInput, MoverError, Waiting
from mover.state import control
from mover.views import status as status_view
from mover.views.progress import ProgressReporter

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Move a live PostgreSQL table into a new one, swap it in, keep a rollback window.")
plan_app = typer.Typer(no_args_is_help=True, help="Work with plan files.")
app.add_typer(plan_app, name="plan")
partitions_app = typer.Typer(no_args_is_help=True, help="Upkeep of partitioned tables mover converted.")
app.add_typer(partitions_app, name="partitions")

err = Console(stderr=True)
out = Console()

DsnOption = typer.Option(None, "--dsn", help="libpq DSN or URL; default $DATABASE_URL, else the PG* variables.")
JsonOption = typer.Option(False, "--json", help="Print JSON.")


def _complete_names(ctx: typer.Context, incomplete: str) -> list[str]:
    """Migration names for shell completion, from the control schema when it is reachable (the
    --dsn given so far, else $DATABASE_URL / PG*); silently none otherwise: a completion that
    hangs or prints an error is worse than none."""
    dsn = (ctx.params.get("dsn") or (ctx.parent.params.get("dsn") if ctx.parent else None)
           or os.environ.get("DATABASE_URL", ""))
    try:
        with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
            prefix = incomplete.replace("\\", "\\\\").replace("%", r"\%").replace("_", r"\_")
            rows = conn.execute("SELECT name FROM mover.migrations WHERE name LIKE %s || '%%' AND name NOT LIKE "
                                "'%%#%%' ORDER BY name", (prefix,))
            return [r[0] for r in rows]
    except (psycopg.Error, OSError):
        return []


NameArgument = typer.Argument(..., help="Migration name.", autocompletion=_complete_names, show_default=False)
TargetArgument = typer.Argument(..., help="Migration name, or a plan file to register.",
                                autocompletion=_complete_names, show_default=False)
GiveUpRowsOption = typer.Option(False, "--give-up-rows",
                                help="Go ahead although rows exist only on the side left behind; they are given up "
                                     "and listed in the events.")


_GENERAL_NEXT = "fix the cause, then run the same command again; `mover status` shows where things stand"


class State:
    debug = False
    dsn: str | None = None


P = ParamSpec("P")
R = TypeVar("R")


def _exits(fn: Callable[P, R]) -> Callable[P, R]:
    """The one place errors become exit codes: 0 done, 1 failed, 2 bad input (nothing changed),
    3 waiting for the operator, 130 interrupted. No traceback unless --debug."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except MoverError as exc:
            style = {3: "yellow", 130: "yellow"}.get(exc.exit_code, "red")
            err.print(f"[{style}]{escape(mask(exc.message))}[/{style}]", highlight=False)
            # Every message ends with what to do next; an error raised without a hint gets the general one.
            err.print(f"next: {mask(exc.hint or _GENERAL_NEXT)}", highlight=False, markup=False)
            if State.debug:
                _print_traceback(exc)
            raise typer.Exit(exc.exit_code) from exc
        except KeyboardInterrupt:
            err.print("[yellow]interrupted; the open transaction was rolled back[/yellow]")
            err.print("next: `mover run NAME` resumes (`mover status` shows where it stopped)", highlight=False,
                      markup=False)
            raise typer.Exit(130) from None
        except psycopg.Error as exc:
            if is_connection_lost(exc):
                err.print(f"lost the connection to the database server: {mask(str(exc).strip())}", highlight=False,
                          markup=False)
                err.print("next: once the server is back, run the same command again", highlight=False,
                          markup=False)
                raise typer.Exit(1) from exc
            err.print(f"database error: {mask(str(exc).strip())}", highlight=False, markup=False)
            err.print("next: fix the cause, then run the same command again (mover resumes where it stopped; "
                      "`mover status` shows where that is)", highlight=False, markup=False)
            if State.debug:
                _print_traceback(exc)
            raise typer.Exit(1) from exc
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException):
            raise
        except Exception as exc:
            # A bug: its traceback, masked like everything else printed (its text may quote a DSN).
            _print_traceback(exc)
            err.print("next: this is a bug in mover; report it with the traceback above. The migration stays "
                      "resumable: `mover status` shows where it stopped", highlight=False, markup=False)
            raise typer.Exit(1) from exc

    return wrapper


def _print_traceback(exc: BaseException) -> None:
    # Plain text so it can be masked: exception texts (psycopg's among them) may quote the DSN.
    err.print(mask("".join(traceback.format_exception(exc))), highlight=False, markup=False, end="")


class _ConsoleLog(logging.Handler):
    """Log records through the same console as everything else (a raw stderr line would tear a
    live progress bar), masked. A warning reads like the other messages, `warning: ...` then its
    `next:` (a record's `next` attribute, from `extra=`), and is said once per process: a
    throttle that meets the same condition in every worker would otherwise repeat it."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self._said: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
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
                    self.console.print(f"next: {mask(str(hint))}", highlight=False, markup=False)
                return
            self.console.print(f"{self.formatter.formatTime(record) if self.formatter else ''} {record.name} "
                               f"{record.levelname} {message}", highlight=False, markup=False)
        except Exception:  # a log line must never take the command down
            self.handleError(record)


def _dsn(dsn: str | None) -> str:
    # An empty DSN makes libpq read the PG* variables (PGHOST, PGUSER, PGPASSFILE...).
    value = dsn or State.dsn or os.environ.get("DATABASE_URL", "")
    remember_secrets(value)
    return value


def _print_table(table: Table) -> None:
    """A table on a terminal fits its width; off a terminal (a pipe, a file, a script) nothing
    may be cut or folded: the columns take the width their contents need."""
    if out.is_terminal:
        out.print(table)
        return
    Console(file=out.file, width=10_000, color_system=None).print(table)


def _print_json(value: Any) -> None:
    out.print_json(json.dumps(value, default=str))


def _interruptible() -> threading.Event:
    """First Ctrl-C (or SIGTERM): stop at the next safe point. A second one interrupts at once (the
    open transaction is rolled back; the migration stays resumable). The stop event carries the
    signal's name, so that the events say what stopped the run."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        word = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        stop.reason = word  # type: ignore[attr-defined]
        stop.set()
        err.print(f"[yellow]{word}: stopping at the next safe point ({word} again to stop now)[/yellow]")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _show_status(st: dict[str, Any]) -> None:
    # Every value is escaped: rich would take "[cutover]" in a hint for markup and drop it.
    table = Table(title=escape(f"migration {st['name']}"), show_header=False)
    table.add_row("step / state", escape(f"{st['step']} / {st['state']}"))
    present = st.get("tables_present", list(st["tables"]))
    table.add_row("tables", escape(", ".join(f"{role} {st['tables'][role]}" for role in ("source", "target", "old")
                                             if role in present) or "none left"))
    b = st["backfill"]
    line = f"{b['rows_copied']:,} rows in {b['ranges_done']} ranges"
    if b["ranges_failed"]:
        line += f", {b['ranges_failed']} FAILED"
    if b["workers"]:
        line += f", {b['workers']} workers, {b['rows_per_second'] or 0:,} rows/s"
        if b["eta_seconds"] is not None:
            line += f", ETA {b['eta_seconds']}s"
    if (b["paused"] or b["waiting_for"]) and st["step"] in control.RANGE_STEPS:
        line += f" (waiting: {', '.join(b['waiting_for']) or 'paused'})"
    table.add_row("backfill", escape(line))
    if (throttle := status_view.throttle_line(st.get("throttle"))) is not None:
        table.add_row("throttle", escape(throttle))
    c = st["capture"]
    if st["state"] not in ("done", "aborted") or c["pending"]:  # after retire or abort no log is left
        wal = ", from the WAL" if c.get("method") == "logical" and c["direction"] == "forward" else ""
        table.add_row("capture", f"{c['pending']:,} pending, {c['applied']:,} applied ({c['direction']}{wal})")
    if c.get("slot"):
        table.add_row("slot", escape(c["slot"]["summary"]))
    for gap in c.get("gaps") or []:  # invariant 14: the capture was bypassed; no swap until covered
        table.add_row("CAPTURE GAP", escape(gap["summary"]))
    r = st.get("reconcile")
    if r and r["ranges_total"]:
        table.add_row("reconcile", f"{r['ranges_done']}/{r['ranges_total']} ranges verified, {r['rows_compared']:,} "
                                   f"rows" + (f", {r['ranges_failed']} FAILED" if r["ranges_failed"] else "")
                      + (f", last at {r['verified_at']}" if r["verified_at"] else ""))
    by_kind = ", ".join(f"{k} {v}" for k, v in (r or {}).get("divergences", {}).get("open", {}).items())
    retired = (r or {}).get("divergences", {}).get("resolved", {}).get("retired")  # with the old table
    table.add_row("divergences", str(st["divergences"]) + (f" ({by_kind})" if by_kind else "")
                  + (f"; {retired} resolved with the old table at retire" if retired else ""))
    for t in (st.get("family") or {}).get("tables", []):
        # Each table of a family (issue 27); the rows above are the whole family's.
        b, r = t["backfill"], t["reconcile"]
        where = "source" if "source" in t["tables_present"] else "target"
        line = (f"{t['step']} / {t['state']}: {b['rows_copied']:,} rows copied, {t['capture']['pending']:,} pending, "
                f"{r['ranges_done']}/{r['ranges_total']} ranges verified, {t['divergences']} divergences")
        table.add_row(escape(f"table {t['tables'][where]}"), escape(line))
    if st.get("family_of"):
        table.add_row("family", escape(f"a table of migration {st['family_of']!r}: its commands take that name"))
    if st["cutover"]:
        table.add_row("cutover", f"{st['cutover']['at']} (lock held {st['cutover']['lock_ms']:.1f} ms)")
    if st["rollback_window_ends_at"]:
        table.add_row("rollback window ends", st["rollback_window_ends_at"])
    p = st.get("partitions")
    if p:
        line = f"{p['count']} in {p['table']} (upkeep: {p.get('manager', 'mover')})"
        if p["newest_bound"] is not None:
            line += f", newest up to {p['newest_bound']}" + (f" ({p['ahead']} ahead)" if p["ahead"] else "")
        if p["next_boundary"] is not None:
            line += f", next boundary {p['next_boundary']}"
        if p["default_rows_estimate"] is not None:
            line += f", ~{p['default_rows_estimate']:,} rows in the default partition"
        table.add_row("partitions", line)
    if st["error"]:
        # A migration waiting for the operator (the gate, the window, a lock not had) says why; that is no error.
        table.add_row("waiting" if st["state"] == "waiting" else "error", escape(st["error"]))
    _print_table(table)


@app.callback()
def main_options(debug: bool = typer.Option(False, "--debug", help="Tracebacks and debug logs."),
                 verbose: bool = typer.Option(False, "-v", "--verbose", help="Log each transaction retry."),
                 dsn: str | None = DsnOption) -> None:
    State.debug = debug
    State.dsn = dsn
    remember_secrets(dsn)
    remember_secrets(os.environ.get("DATABASE_URL"))
    handler = _ConsoleLog(err)
    handler.setFormatter(logging.Formatter())
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING,
                        handlers=[handler], force=True)


@app.command()
@_exits
def init(dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Create or upgrade mover's control schema (idempotent)."""
    rev = api.init(_dsn(dsn))
    err.print(f"control schema at revision {rev}")
    if as_json:
        _print_json({"revision": rev})


@plan_app.command("check")
@_exits
def plan_check(plan: Path = typer.Argument(..., help="Plan file (TOML)."), dsn: str | None = DsnOption,
               as_json: bool = JsonOption) -> None:
    """Validate a plan against the live database; print each step and the SQL it will run."""
    try:
        result = api.check_plan(_dsn(dsn), plan)
    except MoverError as exc:
        if not as_json:
            raise
        # --json stays JSON when the plan is invalid: every problem listed, the exit code kept.
        problems = getattr(exc, "problems", [exc])
        _print_json({"plan": str(plan), "ok": False, "exit_code": exc.exit_code,
                     "problems": [{"message": mask(p.message), "next": p.hint} for p in problems]})
        raise typer.Exit(exc.exit_code) from exc
    if as_json:
        _print_json(result)
        return
    if result["registered"]:
        out.print(f"plan {plan} is registered as migration {result['name']!r}:", highlight=False, markup=False)
        for e in result.get("edits", []):
            out.print(f"changed: {e['key']}, takes effect {e['takes_effect']}", highlight=False, markup=False)
        _show_status(result["status"])
        _show_throttle(result)
        _show_hooks(result)
        return
    t = result["tables"]
    out.print(f"plan {plan}: OK. migration {result['name']!r} (id {result['migration_id']} when registered now)",
              highlight=False, markup=False)
    out.print(f"  copies {t['source']} into {t['target']}, keyed by ({', '.join(result['key'])}); after the "
              f"cutover the original is kept as {t['old']}", highlight=False, markup=False)
    _show_throttle(result)
    _show_hooks(result)
    for col, why in result.get("lossy_accepted", {}).items():
        out.print(f"lossy type change accepted ([target] accept_lossy): {col!r} {why}", highlight=False, markup=False)
    if result.get("rollback_carries_back"):
        out.print("in the rollback window, a value goes back to the old table only if it converts to the old type "
                  "unchanged; a row whose value does not stays only in the new table (`mover rollback` refuses "
                  "while one exists, `--give-up-rows` gives it up, `mover retire` keeps it):", highlight=False,
                  markup=False)
        for col, why in result["rollback_carries_back"].items():
            out.print(f"  {col!r} {why}", highlight=False, markup=False)
    part = result.get("partitioning")
    if part:
        out.print(f"partitioned by {part['by']} ({', '.join(part['columns'])}), unique key ({', '.join(part['key'])})",
                  highlight=False, markup=False)
        if part["key_change"]:
            out.print(f"key change accepted ([target.partition] accept_key_change): {part['key_change']}",
                      highlight=False, markup=False)
        if part.get("row_movement"):
            out.print(f"note: {part['row_movement']}", highlight=False, markup=False)
        out.print(f"{len(part['partitions'])} partitions to create:", highlight=False, markup=False)
        for p in part["partitions"]:
            out.print(f"  {p['name']}  {p['bound']}", highlight=False, markup=False)
    meta = result.get("metadata") or {}
    for key, title in (("at_create_target", "carried to the new table at create_target"),
                       ("at_swap", "carried over at the swap"),
                       ("not_carried", "not carried over (`mover parity` lists it as planned)")):
        if meta.get(key):
            out.print(f"{title}:", highlight=False, markup=False)
            for line in meta[key]:
                out.print(f"  {line}", highlight=False, markup=False)
    _show_also(result)
    _show_steps(result["steps"])
    family = result.get("family")
    if family:
        for table in family["tables"][1:]:
            t = table["tables"]
            out.print(f"\n[bold]table {table['name']!r}[/bold] (id {table['migration_id']} when registered now): "
                      f"copies {t['source']} into {t['target']}, keyed by ({', '.join(table['key'])}); after the "
                      f"cutover the original is kept as {t['old']}", highlight=False)
            _show_steps(table["steps"])
        out.print("\n[bold]the family[/bold]")
        for stmt in family["sql"]:
            out.print(stmt, highlight=False, markup=False)


def _show_steps(described: list[dict[str, Any]]) -> None:
    for step in described:
        out.print(f"\n[bold]{step['name']}[/bold]")
        for stmt in step["sql"]:
            out.print(stmt, highlight=False, markup=False)


def _show_throttle(result: dict[str, Any]) -> None:
    """The governor's inputs and the backfill's preflight (plan check)."""
    for title, key in (("throttle", "throttle"), ("preflight", "preflight")):
        if result.get(key):
            out.print(f"{title}:", highlight=False, markup=False)
            for line in result[key]:
                out.print(f"  {line}", highlight=False, markup=False)


def _show_also(result: dict[str, Any]) -> None:
    """The [[also]] lines that widen every column referencing a key the plan widens: to paste."""
    if result.get("also"):
        out.print("\nto widen the columns that reference the widened key in the same migration (one cutover), add "
                  "to the plan:", highlight=False, markup=False)
        for line in result["also"]:
            out.print(line, highlight=False, markup=False)


def _show_hooks(result: dict[str, Any]) -> None:
    for event, hook in result["hooks"].items():
        out.print(f"hook {event}: {hook}", highlight=False, markup=False)
    for warning in result["warnings"]:
        out.print(f"warning: {warning}", highlight=False, markup=False)


@partitions_app.command("maintain")
@_exits
def partitions_maintain(table: str | None = typer.Argument(None, help="Migration name or source table."),
                        all_tables: bool = typer.Option(False, "--all", help="Every partitioned conversion."),
                        dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be done only."),
                        dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Create partitions `premake` ahead, report default-partition rows, apply retention. Idempotent."""
    results = api.maintain_partitions(_dsn(dsn), table, all_tables=all_tables, dry_run=dry_run)
    if as_json:
        _print_json(results)
        return
    for r in results:
        verb = "would create" if dry_run else "created"
        made = [p["name"] for p in r["create"]] if dry_run else r["created"]
        out.print(f"{r['table']}: {r['partitions']} partitions; {verb} {len(made)}: {', '.join(made) or '-'}",
                  highlight=False, markup=False)
        if r.get("manager"):
            verb = "would defer" if dry_run else "deferred"
            out.print(f"  managed by {r['manager']}" + (f"; {verb} to pg_partman run_maintenance" + (
                ", after handing the table over (create_parent)" if not r["registered"] else "")
                if r["manager"] == "pg_partman" else ""), highlight=False, markup=False)
        for b in r["blocked"]:
            out.print(f"  not created {b['name']}: {b['error']}", highlight=False, markup=False)
        if r["default_rows"]:
            out.print(f"  {r['default_rows']} rows in the default partition", highlight=False, markup=False)
        gone = r["detach"] if dry_run else r["detached"]
        if gone:
            dropped = f"; dropped: {', '.join(r['dropped'])}" if r["dropped"] else ""
            out.print(f"  {'would detach' if dry_run else 'detached'}: {', '.join(gone)}{dropped}",
                      highlight=False, markup=False)


def _result(st: dict[str, Any], as_json: bool) -> None:
    """A command's result: the migration's status, as a table or (--json) as `mover status --json`."""
    if as_json:
        _print_json(st)
    else:
        _show_status(st)


def _run(dsn: str | None, target: str, one_step: bool, wait: bool, as_json: bool = False) -> None:
    reporter = ProgressReporter(err)
    try:
        st = api.run(_dsn(dsn), target, one_step=one_step, wait=wait, report=reporter, stop=_interruptible())
    finally:
        reporter.close()
    _result(st, as_json)


@app.command()
@_exits
def run(target: str = TargetArgument,
        dsn: str | None = DsnOption,
        wait: bool = typer.Option(False, "--wait", help="Do not stop at the gate or in the window: keep the change "
                                                          "log drained (same as `mover follow`)."),
        as_json: bool = JsonOption) -> None:
    """Run every step that needs no decision; stop at the cutover gate (exit 3)."""
    _run(dsn, target, False, wait, as_json)


@app.command()
@_exits
def follow(target: str = typer.Argument(..., help="Migration name, or a plan file to register."),
           dsn: str | None = DsnOption,
           interval: float = typer.Option(2.0, "--interval", min=0.1, help="Seconds between rounds (and backlog "
                                                                            "lines).")) -> None:
    """Run the steps that need no decision, then keep the change log drained at the cutover gate and
    in the rollback window (retiring when it ends) until the operator cuts over, rolls back, retires or
    aborts from another terminal. Holds no lease while it waits. Exit 0; SIGTERM stops it cleanly."""
    reporter = ProgressReporter(err)
    try:
        st = api.follow(_dsn(dsn), target, report=reporter, stop=_interruptible(), interval=interval)
    finally:
        reporter.close()
    _show_status(st)


@app.command()
@_exits
def step(target: str = TargetArgument,
         dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Run exactly the next step."""
    _run(dsn, target, True, False, as_json)


@app.command()
@_exits
def status(name: str | None = typer.Argument(None, help="One migration (default: every one).",
                                             autocompletion=_complete_names),
           dsn: str | None = DsnOption, as_json: bool = JsonOption,
           watch_: bool = typer.Option(False, "--watch", help="The live view of `mover watch NAME`.")) -> None:
    """Where every migration (or one) stands."""
    if watch_:
        if name is None:
            raise BadInput("`mover status --watch` watches one migration", hint="`mover status NAME --watch`")
        _watch(name, dsn, 2.0)
        return
    st = api.status(_dsn(dsn), name)
    if as_json:
        _print_json(st)
    elif isinstance(st, list):
        if not st:
            out.print("no migrations")
        for one in st:
            _show_status(one)
    else:
        _show_status(st)


@app.command()
@_exits
def history(name: str | None = typer.Argument(None, help="One migration and its aborted attempts.",
                                              autocompletion=_complete_names),
            dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Every migration with its outcome and how long each step took, aborted attempts included."""
    rows = api.history(_dsn(dsn), name)
    if as_json:
        _print_json(rows)
        return
    if not rows:
        out.print("no migrations")
    for h in rows:
        took = "" if h["seconds"] is None else f" in {_seconds(h['seconds'])}"
        extra = "".join([f", {h['rollbacks']} rollbacks" if h["rollbacks"] else "",
                         f", {h['failures']} failures" if h["failures"] else "",
                         "" if h["cutover_lock_ms"] is None else f", cutover lock {h['cutover_lock_ms']:.1f} ms"])
        out.print(f"{h['name']}  {h['outcome']}{took} (source {h['source']}, started {h['created_at']}{extra})",
                  highlight=False, markup=False)
        for a in h["attempts"]:  # each attempt its own line: a failure, a rollback, a second cutover
            took = "" if a["seconds"] is None else _seconds(a["seconds"])
            lock = "" if a["lock_ms"] is None else f", lock held {a['lock_ms']:.1f} ms"
            why = f" ({a['message']})" if a["message"] and a["outcome"] not in ("done", "running") else ""
            out.print(f"  {a['started_at']}  " + (f"{a['table'] or 'all tables'}  " if "table" in a else "")
                      + f"{a['step']:<16} {a['outcome']:<12} {took}{lock}{why}",
                      highlight=False, markup=False)
        for t in h.get("tables", []):  # a family's other tables (issue 27), each with its steps
            done = [s for s in t["steps"] if s["seconds"] is not None]
            steps = ", ".join(f"{s['name']} {_seconds(s['seconds'])}" for s in done)
            out.print(f"  table {t['source']}  {t['outcome']}" + (f": {steps}" if steps else ""),
                      highlight=False, markup=False)


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


@app.command()
@_exits
def cutover(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Swap the new table in; the rollback window starts."""
    reporter = ProgressReporter(err)
    try:
        st = api.cutover_now(_dsn(dsn), name, report=reporter, stop=_interruptible())
    finally:
        reporter.close()  # also on error: a live bar would hide the message and leave the terminal askew
    _result(st, as_json)


@app.command()
@_exits
def rollback(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
             give_up_rows: bool = GiveUpRowsOption) -> None:
    """During the rollback window: swap the original table back, losing nothing."""
    reporter = ProgressReporter(err)
    try:
        st = api.rollback(_dsn(dsn), name, give_up_rows=give_up_rows, report=reporter, stop=_interruptible())
    finally:
        reporter.close()
    _result(st, as_json)


@app.command()
@_exits
def retire(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           force: bool = typer.Option(False, "--force", help="Retire before the rollback window ends."),
           give_up_rows: bool = GiveUpRowsOption) -> None:
    """After the rollback window: drop the old table and everything mover created."""
    st = api.retire(_dsn(dsn), name, force=force, give_up_rows=give_up_rows, stop=_interruptible())
    _result(st, as_json)


@app.command()
@_exits
def adopt(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """After a shape change: apply an added column, CHECK or index to the other table too, and go on."""
    out = api.adopt(_dsn(dsn), name, stop=_interruptible())
    if as_json:
        _print_json({"adopted": out["adopted"], "status": out["status"]})
        return
    for change in out["adopted"]:
        err.print(f"adopted: {change['message']}")
    if not out["adopted"]:
        err.print("nothing to adopt: both tables have their recorded shape")
    _show_status(out["status"])


@app.command()
@_exits
def abort(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
          give_up_rows: bool = GiveUpRowsOption) -> None:
    """Before cutover (or after a rollback): remove everything mover created; the source stays as it was."""
    st = api.abort(_dsn(dsn), name, give_up_rows=give_up_rows, stop=_interruptible())
    _result(st, as_json)


@app.command()
@_exits
def recapture(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """After a lost replication slot (logical capture): a new slot, and a reconcile pass over every range next."""
    out = api.recapture(_dsn(dsn), name, stop=_interruptible())
    if not as_json:
        err.print(f"capturing again from the new replication slot {out['slot']}; `mover run {name}` compares every "
                  f"range, then `mover repair {name}` re-syncs what the lost slot did not deliver")
    _result(out["status"], as_json)


@app.command()
@_exits
def pause(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Pause the backfill workers at their next range boundary."""
    _result(api.set_paused(_dsn(dsn), name, True), as_json)


@app.command()
@_exits
def unpause(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Let paused workers go on."""
    _result(api.set_paused(_dsn(dsn), name, False), as_json)


@app.command("set")
@_exits
def set_(name: str = NameArgument,
         assignments: list[str] = typer.Argument(..., help="section.key=value, e.g. "
                                                                       "backfill.max_rows_per_second=50000"),
         dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Change settings of a running migration (recorded as an event; workers pick them up)."""
    _result(api.set_settings(_dsn(dsn), name, assignments), as_json)


@app.command()
@_exits
def worker(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           threads: int = typer.Option(1, "--threads", help="Workers in this process.")) -> None:
    """Join a migration's backfill, then its reconcile pass, from this host; exits when no ranges are left."""
    reporter = ProgressReporter(err)
    try:
        st = api.work(_dsn(dsn), name, threads=threads, report=reporter, stop=_interruptible())
    finally:
        reporter.close()
    _result(st, as_json)


@app.command()
@_exits
def divergences(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
                all_: bool = typer.Option(False, "--all", help="Include resolved ones.")) -> None:
    """Rows that differ between the tables, as reconcile found them."""
    rows = api.divergences(_dsn(dsn), name, include_resolved=all_)
    if as_json:
        _print_json(rows)
        return
    table = Table("id", "key", "kind", "details (source -> target)", "found", "resolved")
    for d in rows:
        table.add_row(str(d["id"]), ", ".join(d["key"]), d["kind"], _details(d["kind"], d["columns"]),
                      d["found_at"], _resolution(d))
    _print_table(table)
    if not rows:
        err.print("no open divergences" if not all_ else "no divergences")


def _details(kind: str, columns: Any) -> str:
    if kind == "different" and isinstance(columns, dict):
        return "; ".join(f"{c}: {_value(v[0])} -> {_value(v[1])}" for c, v in columns.items())[:300]
    if columns is None:
        return ""
    return json.dumps(columns)[:300]


def _value(v: Any) -> str:
    return "NULL" if v is None else repr(v)


def _resolution(d: dict[str, Any]) -> str:
    if d["resolved_at"] is None:
        return "open"
    how = d.get("resolved_how") or "superseded"
    return f"{how}: {d['reason']}" if how == "accepted" and d.get("reason") else how


def _still_open(st: dict[str, Any]) -> None:
    """Exit 3 while divergences are open, naming the commands that deal with them."""
    n, name = st["divergences"], st["name"]
    if n:
        raise Waiting(f"migration {name!r} has {n} open divergences; cutover is refused until none remain",
                      hint=f"see them with `mover divergences {name}`; `mover repair {name}` re-syncs them from the "
                           f"source; `mover accept {name} --reason TEXT` accepts intended ones")


_VERDICTS = {"seq_scan": "SEQ SCAN", "cost_up": "COST UP", "fails": "FAILS", "changed": "changed", "same": "same",
             "skipped": "skipped"}


def _plan_words(p: dict[str, Any] | None) -> str:
    """A plan in a few words: the scans of the migrated table, else its top node."""
    if p is None:
        return "-"
    scans = [f"{s['node']}" + (f" using {s['index']}" if s["index"] else "") for s in p["scans"]]
    return ", ".join(dict.fromkeys(scans)) or (p["plan"][0] if p["plan"] else "-")


def _statement_words(text: str, width: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[:width - 3] + "..."


@app.command()
@_exits
def rehearse(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
             top: int | None = typer.Option(None, "--top", min=1, max=1000,
                                            help="Statements per table: the N most called and the N that took "
                                                 "most time (default [cutover] rehearse_statements, 20).")) -> None:
    """Plan the statements pg_stat_statements recorded on the source against the target under the
    source's name (EXPLAIN, never executed); exit 3 when one plans markedly worse there."""
    result = api.rehearse(_dsn(dsn), name, top=top)
    if as_json:
        _print_json(result)
    else:
        for t in result["tables"]:
            analyzed = "analyzed" if t["analyzed"] else "not analyzed"
            out.print(f"{t['source']} -> {t['target']} ({analyzed}): {t['rehearsed']} statements rehearsed of "
                      f"{t['considered']} recorded that name it", highlight=False, markup=False)
            if t["analyze_note"]:
                out.print(f"  note: {t['analyze_note']}", highlight=False, markup=False)
            if t["hidden"]:
                out.print(f"  note: {t['hidden']} statements of other roles are hidden from mover's role (GRANT "
                          f"pg_read_all_stats to it to rehearse them)", highlight=False, markup=False)
            table = Table(show_lines=False)
            for col in ("verdict", "calls", "cost before -> after", "plan before -> after", "statement"):
                table.add_column(col, overflow="fold")
            for s in t["statements"]:
                b, a = s["before"], s["after"]
                cost = "-" if b is None else f"{b['cost']:,.1f} -> " + ("-" if a is None else f"{a['cost']:,.1f}")
                if s["cost_factor"] is not None and s["verdict"] != "same":
                    cost += f" (x{s['cost_factor']:g})"
                plans = f"{_plan_words(b)} -> {_plan_words(a)}" if s["verdict"] != "skipped" else s["note"] or ""
                if s["error"]:
                    plans += f": {s['error']}"
                table.add_row(_VERDICTS.get(s["verdict"], s["verdict"]), f"{s['calls']:,}", cost, escape(plans),
                              escape(_statement_words(s["statement"])))
            if t["statements"]:
                _print_table(table)
    if result["marked"]:
        raise Waiting(query_rehearsal.marked_message(name, result),
                      hint=f"each marked statement plans worse on the target than on the source (`--json` has "
                           f"both plans whole); change what makes it worse (an index, a type, the statement) and "
                           f"run `mover rehearse {name}` again, or go ahead: `mover cutover {name}`")


@app.command("parity")
@_exits
def parity(name: str, dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Compare the live table's metadata before and after the swap (or the two tables before it);
    exit 3 on a difference that is neither planned nor accepted in the plan."""
    result = api.parity_report(_dsn(dsn), name)
    if as_json:
        _print_json(result)
    else:
        for c in result["comparisons"]:
            out.print(f"{c['mode']}: {c['before']} -> {c['after']}: {'equal' if c['equal'] else 'DIFFERENT'}",
                      highlight=False, markup=False)
            for d in c["differences"]:
                why = f" ({d['reason']})" if d["reason"] else ""
                out.print(f"  {d['status']:<9} {d['key']}: {d['before']} -> {d['after']}{why}",
                          highlight=False, markup=False)
    if not result["equal"]:
        keys = ", ".join(f'"{d["key"]}"' for c in result["comparisons"] for d in c["differences"]
                         if d["status"] == "unplanned")
        raise Waiting(f"the metadata of migration {name!r} differs where nothing planned it: {keys}",
                      hint=f"undo the change, or accept it in the plan: [cutover] accept_parity = [{keys}]"
                           f" (`mover set` cannot change it: edit the plan, then `mover run PLAN`)")


@app.command("reconcile")
@_exits
def reconcile_cmd(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
                  full: bool = typer.Option(False, "--full", help="Compare every range, not only those changed "
                                                                   "since the last pass.")) -> None:
    """Compare the tables now (the ranges changed since the last pass); exit 3 if any row differs."""
    reporter = ProgressReporter(err)
    try:
        result = api.reconcile(_dsn(dsn), name, full=full, report=reporter, stop=_interruptible())
    finally:
        reporter.close()
    if as_json:
        _print_json(result)
    else:
        p, st = result["pass"], result["status"]
        table = Table(title=f"reconcile {st['name']}", show_header=False)
        table.add_row("pass", f"{p['mode']}: {p['ranges']} ranges, {p['rows']:,} source rows in {p['seconds']:.1f}s"
                              + (f" ({p['rows_per_second']:,} rows/s)" if p["rows_per_second"] else ""))
        table.add_row("this pass", f"{p['found']} new divergences, {p['still_open']} found again, "
                                   f"{p['resolved']} resolved (equal now)"
                      + (f", {p['unsettled']} keys kept changing (left to the next pass)" if p["unsettled"] else ""))
        if "foreign_keys_checked" in p:  # a family's: the keys between its tables on the other side
            table.add_row("family keys", f"{p['foreign_keys_checked']} foreign keys between the tables hold on the "
                                         f"side the application does not write")
        by_kind = st["reconcile"]["divergences"]["open"]
        table.add_row("open divergences", ", ".join(f"{k}: {v}" for k, v in by_kind.items()) or "none")
        table.add_row("step / state", f"{st['step']} / {st['state']}")
        _print_table(table)
    _still_open(result["status"])


@app.command()
@_exits
def repair(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           divergence_id: int | None = typer.Option(None, "--id", help="Repair this divergence only.")) -> None:
    """Re-sync the divergent rows from the source's current state, check them again, resolve them."""
    result = api.repair(_dsn(dsn), name, divergence_id=divergence_id, stop=_interruptible())
    if as_json:
        _print_json(result)
    else:
        r = result["repair"]
        out.print(f"{r['repaired']} divergences repaired, {r['still_open']} still differ, {r['failed']} failed")
        for line in r["errors"]:
            err.print(f"  {line}", highlight=False, markup=False)
        if r["hint"]:
            err.print(f"next: {r['hint']}", highlight=False, markup=False)
    _still_open(result["status"])


@app.command()
@_exits
def accept(name: str = NameArgument,
           reason: str = typer.Option(..., "--reason", help="Why the difference is intended (kept with the "
                                                            "divergence)."),
           divergence_id: int | None = typer.Option(None, "--id", help="Accept this divergence only."),
           dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Accept open divergences as intended: they stay in the history, and no longer block the cutover."""
    result = api.accept(_dsn(dsn), name, reason, divergence_id=divergence_id)
    if as_json:
        _print_json(result)
        return
    ids = result["accepted"]
    out.print(f"{len(ids)} divergences accepted" + (f" (ids {', '.join(map(str, ids))})" if ids else ""))


@app.command()
@_exits
def events(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           limit: int = typer.Option(50, "--limit")) -> None:
    """The migration's recent events (who, when, what, how long)."""
    rows = api.events(_dsn(dsn), name, limit)
    if as_json:
        _print_json(rows)
        return
    table = Table("at", "table", "step", "kind", "message", "ms")
    for e in rows:
        table.add_row(e["at"], e["table"], e["step"] or "", e["kind"], e["message"],
                      "" if e["duration_ms"] is None else f"{e['duration_ms']:.1f}")
    _print_table(table)


@app.command()
@_exits
def watch(name: str = NameArgument, dsn: str | None = DsnOption,
          interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes.")) -> None:
    """A live view of one migration until it is finished or aborted (Ctrl-C leaves it); one line per
    interval when the output is not a terminal."""
    _watch(name, dsn, interval)


def _watch(name: str, dsn: str | None, interval: float) -> None:
    from rich.live import Live

    from mover.views import watch as view
    stop = threading.Event()
    try:
        if out.is_terminal:
            with Live(console=out, screen=True, auto_refresh=False) as live:
                snap = api.watch(_dsn(dsn), name, lambda s: live.update(view.screen(s), refresh=True),
                                 interval=interval, stop=stop)
        else:
            snap = api.watch(_dsn(dsn), name, lambda s: out.print(view.line(s), highlight=False, markup=False,
                                                                  soft_wrap=True),
                             interval=interval, stop=stop)
    except KeyboardInterrupt:
        return  # leaving a view changes nothing: no message, exit 0
    _show_status(snap)


@app.command()
@_exits
def report(name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           html_file: Path | None = typer.Option(None, "--html",
                                                 help="Write the self-contained HTML page here.")) -> None:
    """The whole story of a migration (plan, timeline, charts, divergences, locks, who did what): an HTML
    page to attach to the change ticket, or JSON."""
    from mover.views import report as report_mod
    r = api.report(_dsn(dsn), name)
    if html_file is not None:
        html_file.write_text(report_mod.render_html(r), encoding="utf-8")
        err.print(f"report of {name!r} written to {html_file}", highlight=False, markup=False)
    if as_json:
        _print_json(r)
    elif html_file is None:
        _show_status(r["status"])
        err.print(f"next: `mover report {name} --html FILE` writes the page with the charts", highlight=False,
                  markup=False)


@app.command()
@_exits
def demo(rows: int = typer.Option(300_000, "--rows", help="Rows in the sample table."),
         keep: bool = typer.Option(False, "--keep",
                                   help="Leave the server running at the end (prints its DSN).")) -> None:
    """Start an embedded PostgreSQL, a live writer, and migrate a table through every step."""
    from mover.demo import demo as demo_mod
    demo_mod.main(rows=rows, keep=keep, console=err)


# Flags take no value: help shows none (typer prints "<bool>" for them otherwise). Patched here,
# the one module that builds the command line, so that `--help` itself is covered too.
_display_type_rich = typer.core.TyperOption.display_type_rich


def _flag_type(self: typer.core.TyperOption, ctx: Any) -> str | None:
    return None if self.is_flag else _display_type_rich(self, ctx)


typer.core.TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]

_GLOBAL_FLAGS = {"--debug", "-v", "--verbose"}


def normalise_argv(argv: list[str]) -> list[str]:
    """Global options on either side of the command name: `mover status --debug` is `mover --debug
    status`, and `mover --json status` is `mover status --json` (--dsn is on both sides already)."""
    head, rest = [], []
    json_early = False
    command_seen = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest.extend(argv[i:])
            break
        if a in _GLOBAL_FLAGS:
            head.append(a)
        elif a == "--json" and not command_seen:
            json_early = True
        elif not command_seen and a in ("--dsn",) and i + 1 < len(argv):
            head.extend(argv[i:i + 2])
            i += 1
        else:
            if not a.startswith("-"):
                command_seen = True
            (rest if command_seen else head).append(a)
        i += 1
    if json_early:
        rest.insert(min(len(rest), 1 + (rest[:1] == ["plan"] or rest[:1] == ["partitions"])), "--json")
    return head + rest


def main() -> None:
    app(args=normalise_argv(sys.argv[1:]), prog_name="mover")
