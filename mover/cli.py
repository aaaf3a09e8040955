"""The command line: flags -> an api call -> a view (mover/views/) -> the exit code. Errors become
exit codes in one place, mover/views/console.py's `failure`. Nothing is kept between calls: a
command's consoles and options are its context's (typer.Context.obj), and what it sets for the
whole process `main` puts back."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
import typer

from mover import api, threads
from mover.db import own_secrets, remember_secrets
from mover.errors import BadInput, Failed, MoverError, Waiting
from mover.fleet import members as fleet_api
from mover.fleet import rollout
from mover.fleet import text as fleet_text
from mover.fleet import views as fleet_views
from mover.fleet.file import FleetFile, load_fleet
from mover.views import console, history_text, json_log, status_text
from mover.views import divergences as divergences_view
from mover.views import parity as parity_view
from mover.views import partitions as partitions_view
from mover.views import plan_check as plan_check_view
from mover.views import plan_new as plan_new_view
from mover.views import rehearse as rehearse_view
from mover.views import report as report_view
from mover.views import watch as watch_view
from mover.views.console import Consoles
from mover.views.help_text import Command, Group
from mover.views.json_log import LogFormat

app = typer.Typer(cls=Group, add_completion=True, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Move a live PostgreSQL table into a new one, swap it in, keep a rollback window.")
plan_app = typer.Typer(cls=Group, no_args_is_help=True, help="Work with plan files.")
app.add_typer(plan_app, name="plan")
partitions_app = typer.Typer(cls=Group, no_args_is_help=True, help="Upkeep of partitioned tables mover converted.")
app.add_typer(partitions_app, name="partitions")
fleet_app = typer.Typer(cls=Group, no_args_is_help=True,
                        help="One plan over a fleet of databases (or tenant schemas): a canary first, then waves.")
app.add_typer(fleet_app, name="fleet")

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
MetricsListenOption = typer.Option(None, "--metrics-listen", metavar="ADDR",
                                   help="Also serve every migration's Prometheus metrics on ADDR (`:9187`, "
                                        "`127.0.0.1:9187`) while it runs, as `mover metrics --listen` does.")
GiveUpRowsOption = typer.Option(False, "--give-up-rows",
                                help="Go ahead although rows exist only on the side left behind; they are given up "
                                     "and listed in the events.")


def _consoles(ctx: typer.Context | None) -> Consoles:
    # Without the callback's context (a command called as a function): consoles of its own.
    return ctx.obj if ctx is not None and isinstance(ctx.obj, Consoles) else Consoles.make()


def _call(ctx: typer.Context, dsn: str | None) -> tuple[Consoles, str]:
    """The command's consoles and its DSN: its own --dsn, else the one before the command name,
    else $DATABASE_URL; an empty one makes libpq read the PG* variables (PGHOST, PGPASSFILE...)."""
    value = dsn or ctx.find_root().params.get("dsn") or os.environ.get("DATABASE_URL", "")
    remember_secrets(value)
    return _consoles(ctx), value


def _exits(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A command's errors become its exit code and what it prints (views/console.failure: 1
    failed, 2 bad input, 3 waiting, 130 interrupted); 0 when it returns."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException):
            raise
        except (Exception, KeyboardInterrupt) as exc:
            raise typer.Exit(console.failure(_consoles(kwargs.get("ctx")), exc)) from exc

    return wrapper


def _command(group: typer.Typer, name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command of `group`: its help shows flags without a type, its errors become exit codes."""
    return lambda fn: group.command(name, cls=Command)(_exits(fn))


def _waits(waiting: Waiting | None) -> None:
    if waiting is not None:
        raise waiting


def _interruptible(con: Consoles) -> threading.Event:
    """First Ctrl-C (or SIGTERM): stop at the next safe point. A second one interrupts at once (the
    open transaction is rolled back; the migration stays resumable). The stop event carries the
    signal's name, so that the events say what stopped the run. `main` puts the handlers back."""
    stop = threading.Event()
    received: list[int] = []  # the handler's own record: stop is set later, by the relay thread

    def handler(signum: int, frame: FrameType | None) -> None:
        if received or stop.is_set():
            raise KeyboardInterrupt
        received.append(signum)
        word = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name

        def stopping() -> None:
            stop.reason = word  # type: ignore[attr-defined]
            stop.set()
            console.stopping(con.err, word)

        threads.from_signal(stopping)

    threads.start_signal_relay()
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


@app.callback()
def main_options(ctx: typer.Context, debug: bool = typer.Option(False, "--debug", help="Tracebacks and debug logs."),
                 verbose: bool = typer.Option(False, "-v", "--verbose", help="Log each transaction retry."),
                 dsn: str | None = DsnOption,
                 log_format: LogFormat = typer.Option(LogFormat.text, "--log-format", case_sensitive=False,
                                                      help="stderr as text, or as one JSON object per line (every "
                                                           "log record, event and progress report; no bars).")
                 ) -> None:
    json_logs = log_format is LogFormat.json
    ctx.obj = con = Consoles.make(debug=debug, json_logs=json_logs)  # the command's own, never a global
    remember_secrets(dsn)
    remember_secrets(os.environ.get("DATABASE_URL"))
    root = logging.getLogger()
    if json_logs:
        # The events and the progress are info records: a log pipeline gets them all.
        root.handlers[:] = [json_log.handler(sys.stderr)]  # main() puts back what was there
        root.setLevel(logging.DEBUG if debug else logging.INFO)
        return
    handler = console.ConsoleLog(con.err)
    handler.setFormatter(logging.Formatter())
    root.handlers[:] = [handler]  # main() puts back what was there
    root.setLevel(logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING)


@_command(app)
def init(ctx: typer.Context, dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Create or upgrade mover's control schema (idempotent)."""
    con, url = _call(ctx, dsn)
    status_text.initialised(con, api.init(url), as_json)


@_command(plan_app, "check")
def plan_check(ctx: typer.Context, plan: Path = typer.Argument(..., help="Plan file (TOML)."),
               statements: bool = typer.Option(False, "--sql", "--statements",
                                               help="Print every step's SQL statements, as the steps will run "
                                                    "them, instead of the summary."),
               dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Validate a plan against the live database; print what it will create, copy, check and swap."""
    con, url = _call(ctx, dsn)
    try:
        result = api.check_plan(url, plan)
    except MoverError as exc:
        if not as_json:
            raise
        plan_check_view.problems(con, plan, exc)
        raise typer.Exit(exc.exit_code) from exc
    plan_check_view.show(con, plan, result, as_json, statements)


@_command(plan_app, "new")
def plan_new(ctx: typer.Context, table: str = typer.Argument(..., help="The table, as SQL names it: orders, "
                                                                   "public.orders, '\"Sales\".\"Order Items\"'."),
             columns: list[str] | None = typer.Option(None, "--columns", help="column=type: the column's type in the "
                                                                                "new table (repeatable)."),
             partition: str | None = typer.Option(None, "--partition",
                                                  help="The keys of the plan's target.partition table as key=value "
                                                       "pairs, e.g. \"by=range,column=created_at,interval=1 month\"."),
             name: str | None = typer.Option(None, "--name", help="The migration's name (default: the table's and "
                                                                  "the change's, e.g. orders_bigint)."),
             output: str | None = typer.Option(None, "-o", "--output", help="The plan file to write (- or none: "
                                                                             "stdout)."),
             force: bool = typer.Option(False, "--force", help="Overwrite the file -o names."),
             dsn: str | None = DsnOption) -> None:
    """Write a plan file for a table and a change, ready for `mover plan check`.

    Every table whose columns reference a key the change widens moves with it (an also table
    each); every other setting is at its default, as a comment."""
    con, url = _call(ctx, dsn)
    path = plan_new_view.destination(output, force)
    drafted = api.new_plan(url, table, columns=tuple(columns or ()), partition=partition, name=name)
    plan_new_view.written(con, drafted, path, force)


@_command(partitions_app, "maintain")
def partitions_maintain(ctx: typer.Context,
                        table: str | None = typer.Argument(None, help="Migration name or source table."),
                        all_tables: bool = typer.Option(False, "--all", help="Every partitioned conversion."),
                        dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be done only."),
                        dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Create partitions `premake` ahead, report default-partition rows, apply retention. Idempotent."""
    con, url = _call(ctx, dsn)
    results = api.maintain_partitions(url, table, all_tables=all_tables, dry_run=dry_run)
    partitions_view.maintained(con, results, dry_run, as_json)


def _run(ctx: typer.Context, dsn: str | None, target: str, one_step: bool, wait: bool, as_json: bool) -> None:
    con, url = _call(ctx, dsn)
    with console.progress(con) as reporter:
        st = api.run(url, target, one_step=one_step, wait=wait, report=reporter, stop=_interruptible(con))
    status_text.result(con, st, as_json)


@_command(app)
def run(ctx: typer.Context, target: str = TargetArgument,
        dsn: str | None = DsnOption,
        wait: bool = typer.Option(False, "--wait", help="Do not stop at the gate or in the window: keep the change "
                                                          "log drained (same as `mover follow`)."),
        as_json: bool = JsonOption) -> None:
    """Run every step that needs no decision; stop at the cutover gate (exit 3)."""
    _run(ctx, dsn, target, False, wait, as_json)


@contextmanager
def _metrics(con: Consoles, url: str, listen: str | None) -> Iterator[None]:
    """With --metrics-listen: the exporter's endpoint for as long as the command runs."""
    if listen is None:
        yield
        return
    with api.serve_metrics(url, listen) as where:
        console.say(con.err, f"serving metrics on {where}")
        yield


@_command(app)
def follow(ctx: typer.Context, target: str = typer.Argument(..., help="Migration name, or a plan file to register."),
           dsn: str | None = DsnOption,
           interval: float = typer.Option(2.0, "--interval", min=0.1, help="Seconds between rounds (and backlog "
                                                                            "lines)."),
           metrics_listen: str | None = MetricsListenOption) -> None:
    """Run the steps that need no decision, then keep the change log drained at the cutover gate and
    in the rollback window (retiring when it ends) until the operator cuts over, rolls back, retires or
    aborts from another terminal. Holds no lease while it waits. Exit 0; SIGTERM stops it cleanly."""
    con, url = _call(ctx, dsn)
    with _metrics(con, url, metrics_listen), console.progress(con) as reporter:
        st = api.follow(url, target, report=reporter, stop=_interruptible(con), interval=interval)
    status_text.show(con, st)


@_command(app)
def step(ctx: typer.Context, target: str = TargetArgument,
         dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Run exactly the next step."""
    _run(ctx, dsn, target, True, False, as_json)


@_command(app)
def status(ctx: typer.Context, name: str | None = typer.Argument(None, help="One migration (default: every one).",
                                                                 autocompletion=_complete_names),
           dsn: str | None = DsnOption, as_json: bool = JsonOption,
           watch_: bool = typer.Option(False, "--watch", help="The live view of `mover watch NAME`.")) -> None:
    """Where every migration (or one) stands."""
    con, url = _call(ctx, dsn)
    if watch_:
        if name is None:
            raise BadInput("`mover status --watch` watches one migration", hint="`mover status NAME --watch`")
        _watch(con, url, name, 2.0)
        return
    status_text.every(con, api.status(url, name), as_json)


@_command(app)
def history(ctx: typer.Context, name: str | None = typer.Argument(None, help="One migration and its aborted attempts.",
                                                                  autocompletion=_complete_names),
            dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Every migration with its outcome and how long each step took, aborted attempts included."""
    con, url = _call(ctx, dsn)
    history_text.history(con, api.history(url, name), as_json)


@_command(app)
def cutover(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption,
            as_json: bool = JsonOption) -> None:
    """Swap the new table in; the rollback window starts."""
    con, url = _call(ctx, dsn)
    with console.progress(con) as reporter:
        st = api.cutover_now(url, name, report=reporter, stop=_interruptible(con))
    status_text.result(con, st, as_json)


@_command(app)
def rollback(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
             give_up_rows: bool = GiveUpRowsOption) -> None:
    """During the rollback window: swap the original table back, losing nothing."""
    con, url = _call(ctx, dsn)
    with console.progress(con) as reporter:
        st = api.rollback(url, name, give_up_rows=give_up_rows, report=reporter, stop=_interruptible(con))
    status_text.result(con, st, as_json)


@_command(app)
def retire(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           force: bool = typer.Option(False, "--force", help="Retire before the rollback window ends."),
           give_up_rows: bool = GiveUpRowsOption) -> None:
    """After the rollback window: drop the old table and everything mover created."""
    con, url = _call(ctx, dsn)
    st = api.retire(url, name, force=force, give_up_rows=give_up_rows, stop=_interruptible(con))
    status_text.result(con, st, as_json)


@_command(app)
def adopt(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption,
          as_json: bool = JsonOption) -> None:
    """After a shape change: apply an added column, CHECK or index to the other table too, and go on."""
    con, url = _call(ctx, dsn)
    status_text.adopted(con, api.adopt(url, name, stop=_interruptible(con)), as_json)


@_command(app)
def abort(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
          give_up_rows: bool = GiveUpRowsOption) -> None:
    """Before cutover (or after a rollback): remove everything mover created; the source stays as it was."""
    con, url = _call(ctx, dsn)
    st = api.abort(url, name, give_up_rows=give_up_rows, stop=_interruptible(con))
    status_text.result(con, st, as_json)


@_command(app)
def recapture(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption,
              as_json: bool = JsonOption) -> None:
    """After a lost replication slot (logical capture): a new slot, and a reconcile pass over every range next."""
    con, url = _call(ctx, dsn)
    status_text.recaptured(con, name, api.recapture(url, name, stop=_interruptible(con)), as_json)


@_command(app)
def pause(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption,
          as_json: bool = JsonOption) -> None:
    """Pause the backfill workers at their next range boundary."""
    con, url = _call(ctx, dsn)
    status_text.result(con, api.set_paused(url, name, True), as_json)


@_command(app)
def unpause(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption,
            as_json: bool = JsonOption) -> None:
    """Let paused workers go on."""
    con, url = _call(ctx, dsn)
    status_text.result(con, api.set_paused(url, name, False), as_json)


@_command(app, "set")
def set_(ctx: typer.Context, name: str = NameArgument,
         assignments: list[str] = typer.Argument(..., help="section.key=value, e.g. "
                                                                       "backfill.max_rows_per_second=50000"),
         dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Change settings of a running migration (recorded as an event; workers pick them up)."""
    con, url = _call(ctx, dsn)
    status_text.result(con, api.set_settings(url, name, assignments), as_json)


@_command(app)
def worker(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           threads: int = typer.Option(1, "--threads", help="Workers in this process."),
           metrics_listen: str | None = MetricsListenOption) -> None:
    """Join a migration's backfill, then its reconcile pass, from this host; exits when no ranges are left."""
    con, url = _call(ctx, dsn)
    with _metrics(con, url, metrics_listen), console.progress(con) as reporter:
        st = api.work(url, name, threads=threads, report=reporter, stop=_interruptible(con))
    status_text.result(con, st, as_json)


@_command(app)
def metrics(ctx: typer.Context, dsn: str | None = DsnOption,
            listen: str | None = typer.Option(None, "--listen", metavar="ADDR",
                                              help="Serve /metrics on ADDR (`:9187`, `127.0.0.1:9187`, `[::1]:9187`) "
                                                   "until Ctrl-C or SIGTERM."),
            textfile: Path | None = typer.Option(None, "--textfile", metavar="PATH",
                                                 help="Write the metrics to PATH (for node_exporter's textfile "
                                                      "collector: a .prom file), atomically."),
            interval: float | None = typer.Option(None, "--interval", min=1.0,
                                                  help="With --textfile: write every S seconds until Ctrl-C or "
                                                       "SIGTERM (default: once)."),
            timeout: float = typer.Option(5.0, "--timeout", min=0.1,
                                          help="Seconds a read of the control schema (and a connection) may "
                                               "take before the scrape says mover_up 0.")) -> None:
    """Prometheus metrics of every migration in the database, read from mover's control schema at each
    scrape: served over HTTP, or written for node_exporter. Needs read access to schema mover only."""
    con, url = _call(ctx, dsn)
    if (listen is None) == (textfile is None):
        raise BadInput("`mover metrics` takes one of --listen ADDR and --textfile PATH",
                       hint="`mover metrics --listen :9187`, or `mover metrics --textfile /var/lib/node_exporter/"
                            "mover.prom` (from cron, or with --interval 15)")
    if interval is not None and textfile is None:
        raise BadInput("--interval goes with --textfile (a scrape of --listen reads the schema each time)",
                       hint="`mover metrics --textfile PATH --interval 15`")
    stop = _interruptible(con)
    if textfile is not None:
        if not api.write_metrics(url, textfile, interval=interval, stop=stop, timeout=timeout):
            raise Failed(f"could not read mover's control schema; {textfile} says mover_up 0",
                         hint="check the DSN and that the database is up (`mover status`); the privileges are "
                              "in docs/metrics.md")
        return
    assert listen is not None
    with api.serve_metrics(url, listen, timeout=timeout) as where:
        console.say(con.err, f"serving metrics on {where} (Ctrl-C or SIGTERM stops)")
        while not stop.wait(1.0):
            pass


@_command(app)
def divergences(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
                all_: bool = typer.Option(False, "--all", help="Include resolved ones.")) -> None:
    """Rows that differ between the tables, as reconcile found them."""
    con, url = _call(ctx, dsn)
    divergences_view.listed(con, api.divergences(url, name, include_resolved=all_), all_, as_json)


@_command(app)
def rehearse(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
             top: int | None = typer.Option(None, "--top", min=1, max=1000,
                                            help="Statements per table: the N most called and the N that took "
                                                 "most time (default [cutover] rehearse_statements, 20).")) -> None:
    """Plan the statements pg_stat_statements recorded on the source against the target under the
    source's name (EXPLAIN, never executed); exit 3 when one plans markedly worse there."""
    con, url = _call(ctx, dsn)
    result = api.rehearse(url, name, top=top)
    rehearse_view.show(con, result, as_json)
    _waits(rehearse_view.marked(name, result))


@_command(app, "parity")
def parity(ctx: typer.Context, name: str, dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Compare the live table's metadata before and after the swap (or the two tables before it);
    exit 3 on a difference that is neither planned nor accepted in the plan."""
    con, url = _call(ctx, dsn)
    result = api.parity_report(url, name)
    parity_view.show(con, result, as_json)
    _waits(parity_view.unplanned(name, result))


@_command(app, "reconcile")
def reconcile_cmd(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption,
                  as_json: bool = JsonOption,
                  full: bool = typer.Option(False, "--full", help="Compare every range, not only those changed "
                                                                   "since the last pass.")) -> None:
    """Compare the tables now (the ranges changed since the last pass); exit 3 if any row differs."""
    con, url = _call(ctx, dsn)
    with console.progress(con) as reporter:
        result = api.reconcile(url, name, full=full, report=reporter, stop=_interruptible(con))
    divergences_view.reconciled(con, result, as_json)
    _waits(divergences_view.still_open(result["status"]))


@_command(app)
def repair(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           divergence_id: int | None = typer.Option(None, "--id", help="Repair this divergence only.")) -> None:
    """Re-sync the divergent rows from the source's current state, check them again, resolve them."""
    con, url = _call(ctx, dsn)
    result = api.repair(url, name, divergence_id=divergence_id, stop=_interruptible(con))
    divergences_view.repaired(con, result, as_json)
    _waits(divergences_view.still_open(result["status"]))


@_command(app)
def accept(ctx: typer.Context, name: str = NameArgument,
           reason: str = typer.Option(..., "--reason", help="Why the difference is intended (kept with the "
                                                            "divergence)."),
           divergence_id: int | None = typer.Option(None, "--id", help="Accept this divergence only."),
           dsn: str | None = DsnOption, as_json: bool = JsonOption) -> None:
    """Accept open divergences as intended: they stay in the history, and no longer block the cutover."""
    con, url = _call(ctx, dsn)
    divergences_view.accepted(con, api.accept(url, name, reason, divergence_id=divergence_id), as_json)


@_command(app)
def events(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           limit: int = typer.Option(50, "--limit")) -> None:
    """The migration's recent events (who, when, what, how long)."""
    con, url = _call(ctx, dsn)
    history_text.events(con, api.events(url, name, limit), as_json)


@_command(app)
def watch(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption,
          interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes.")) -> None:
    """A live view of one migration until it is finished or aborted (Ctrl-C leaves it); one line per
    interval when the output is not a terminal."""
    con, url = _call(ctx, dsn)
    _watch(con, url, name, interval)


def _watch(con: Consoles, url: str, name: str, interval: float) -> None:
    try:
        with watch_view.shown(con.out) as show:
            snap = api.watch(url, name, show, interval=interval, stop=threading.Event())
    except KeyboardInterrupt:
        return  # leaving a view changes nothing: no message, exit 0
    status_text.show(con, snap)


@_command(app)
def report(ctx: typer.Context, name: str = NameArgument, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           html_file: Path | None = typer.Option(None, "--html",
                                                 help="Write the self-contained HTML page here.")) -> None:
    """The whole story of a migration (plan, timeline, charts, divergences, locks, who did what): an HTML
    page to attach to the change ticket, or JSON."""
    con, url = _call(ctx, dsn)
    r = api.report(url, name)
    if html_file is not None:
        html_file.write_text(report_view.render_html(r), encoding="utf-8")
    status_text.report(con, name, r, html_file, as_json)


# ---------------------------------------------------------------------------------------------
# Fleets (mover/fleet/): each command loads the fleet file, calls one function, prints the result.

FleetArgument = typer.Argument(..., help="Fleet file (TOML).", show_default=False)


def _fleet(ctx: typer.Context, path: Path) -> tuple[Consoles, FleetFile]:
    return _consoles(ctx), load_fleet(path)


def _fleet_say(con: Consoles) -> Callable[[str], None]:
    return lambda text: console.say(con.err, text)


@_command(fleet_app, "init")
def fleet_init(ctx: typer.Context, path: Path = FleetArgument, as_json: bool = JsonOption) -> None:
    """Create or upgrade mover's control schema on every member's database."""
    con, fleet = _fleet(ctx, path)
    fleet_text.initialised(con, fleet_api.init(fleet), as_json)


@_command(fleet_app, "check")
def fleet_check(ctx: typer.Context, path: Path = FleetArgument, as_json: bool = JsonOption) -> None:
    """Plan check on every member: one summary; exit 2 naming each member that refuses (nothing started)."""
    con, fleet = _fleet(ctx, path)
    fleet_text.summary(con, rollout.check(fleet, say=_fleet_say(con)), as_json)


@_command(fleet_app, "run")
def fleet_run(ctx: typer.Context, path: Path = FleetArgument) -> None:
    """Each member to its cutover gate: the canaries first, then wave by wave; exit 3 once all wait there."""
    con, fleet = _fleet(ctx, path)
    rollout.run(fleet, stop=_interruptible(con), say=_fleet_say(con))


@_command(fleet_app, "cutover")
def fleet_cutover(ctx: typer.Context, path: Path = FleetArgument, as_json: bool = JsonOption,
                  wave: int | None = typer.Option(None, "--wave",
                                                  help="Cut over the waves up to this one only.")) -> None:
    """Cut the members over, wave by wave; never a wave `fleet run` has not reached."""
    con, fleet = _fleet(ctx, path)
    fleet_text.summary(con, rollout.cutover(fleet, through=wave, stop=_interruptible(con), say=_fleet_say(con)),
                       as_json)


@_command(fleet_app, "rollback")
def fleet_rollback(ctx: typer.Context, path: Path = FleetArgument, as_json: bool = JsonOption,
                   wave: int | None = typer.Option(None, "--wave", help="Only the members of this wave."),
                   member: str | None = typer.Option(None, "--member", help="Only this member.")) -> None:
    """Swap back the members already cut over (of a wave, or one), the latest wave first."""
    con, fleet = _fleet(ctx, path)
    fleet_text.summary(con, rollout.rollback(fleet, wave=wave, member=member, stop=_interruptible(con),
                                             say=_fleet_say(con)), as_json)


@_command(fleet_app, "retire")
def fleet_retire(ctx: typer.Context, path: Path = FleetArgument, as_json: bool = JsonOption,
                 force: bool = typer.Option(False, "--force", help="Retire before the rollback windows end.")) -> None:
    """Retire every member cut over (drop its old table), wave by wave."""
    con, fleet = _fleet(ctx, path)
    fleet_text.summary(con, rollout.retire(fleet, force=force, stop=_interruptible(con), say=_fleet_say(con)),
                       as_json)


@_command(fleet_app, "abort")
def fleet_abort(ctx: typer.Context, path: Path = FleetArgument, as_json: bool = JsonOption) -> None:
    """Abort every member not cut over (refused while one is: roll it back first)."""
    con, fleet = _fleet(ctx, path)
    fleet_text.summary(con, rollout.abort(fleet, stop=_interruptible(con), say=_fleet_say(con)), as_json)


@_command(fleet_app, "status")
def fleet_status(ctx: typer.Context, path: Path = FleetArgument, as_json: bool = JsonOption) -> None:
    """One line per member (step, state, progress, ETA, divergences, throttle) and the totals."""
    con, fleet = _fleet(ctx, path)
    fleet_text.status(con, fleet_views.status(fleet), as_json)


@_command(fleet_app, "watch")
def fleet_watch(ctx: typer.Context, path: Path = FleetArgument,
                interval: float = typer.Option(2.0, "--interval", min=0.2, help="Seconds between readings.")) -> None:
    """The fleet's status, live, until every member is retired, aborted or skipped (or Ctrl-C)."""
    con, fleet = _fleet(ctx, path)
    try:
        with fleet_text.shown(con.out) as show:
            st = fleet_views.watch(fleet, show, interval=interval, stop=threading.Event())
    except KeyboardInterrupt:
        return  # leaving a view changes nothing
    fleet_text.status(con, st, False)


@_command(app)
def demo(ctx: typer.Context, rows: int = typer.Option(300_000, "--rows", help="Rows in the sample table."),
         keep: bool = typer.Option(False, "--keep",
                                   help="Leave the server running at the end (prints its DSN).")) -> None:
    """Start an embedded PostgreSQL, a live writer, and migrate a table through every step."""
    from mover.demo import demo as demo_mod
    demo_mod.main(rows=rows, keep=keep, console=_consoles(ctx).err)


def normalise_argv(argv: list[str]) -> list[str]:
    """Global options on either side of the command name: `mover status --debug` is `mover --debug
    status` (--log-format too), and `mover --json status` is `mover status --json` (--dsn is on
    both sides already)."""
    head, rest = [], []
    json_early = False
    command_seen = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest.extend(argv[i:])
            break
        if a in ("--debug", "-v", "--verbose") or a.startswith("--log-format="):
            head.append(a)
        elif a == "--log-format" and i + 1 < len(argv):
            head.extend(argv[i:i + 2])
            i += 1
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
        rest.insert(min(len(rest), 1 + (rest[:1] in (["plan"], ["partitions"], ["fleet"]))), "--json")
    return head + rest


def main(argv: list[str] | None = None, prog_name: str = "mover") -> None:
    """`mover` (and `python -m mover`; `manage.py mover` passes its own `argv` and `prog_name`).
    Ends with SystemExit carrying the exit code. What a command sets for the whole process is put
    back when it returns: the signal handlers (Ctrl-C, SIGTERM), the root logger, the excepthook
    typer installs, the passwords remembered for masking (each command knows only its own). A
    process can so run one command after another (the tests' does, tests/workload.py)."""
    root = logging.getLogger()
    handlers, level, hook = root.handlers[:], root.level, sys.excepthook
    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with own_secrets():
            app(args=normalise_argv(sys.argv[1:] if argv is None else argv), prog_name=prog_name)
    finally:
        sys.excepthook = hook
        root.handlers[:] = handlers
        root.setLevel(level)
        for signum, handler in signals.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
