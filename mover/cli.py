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
from pathlib import Path
from typing import Any

import psycopg
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mover import api
from mover.db import mask, remember_secrets
from mover.errors import MoverError, Waiting
from mover.progress import ProgressReporter

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Move a live PostgreSQL table into a new one, swap it in, keep a rollback window.")
plan_app = typer.Typer(no_args_is_help=True, help="Work with plan files.")
app.add_typer(plan_app, name="plan")
partitions_app = typer.Typer(no_args_is_help=True, help="Upkeep of partitioned tables mover converted.")
app.add_typer(partitions_app, name="partitions")

err = Console(stderr=True)
out = Console()

DsnOption = typer.Option(None, "--dsn", help="libpq DSN or URL; default $DATABASE_URL, else the PG* variables.")
JsonOption = typer.Option(False, "--json", help="Print JSON.")
GiveUpRowsOption = typer.Option(False, "--give-up-rows",
                                help="Go ahead although rows exist only on the side left behind; they are given up "
                                     "and listed in the events.")


class State:
    debug = False
    dsn: str | None = None


def _exits(fn):
    """The one place errors become exit codes: 0 done, 1 failed, 2 bad input (nothing changed),
    3 waiting for the operator, 130 interrupted. No traceback unless --debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MoverError as exc:
            style = {3: "yellow", 130: "yellow"}.get(exc.exit_code, "red")
            err.print(f"[{style}]{escape(mask(exc.message))}[/{style}]", highlight=False)
            if exc.hint:
                err.print(f"next: {mask(exc.hint)}", highlight=False, markup=False)
            if State.debug:
                _print_traceback(exc)
            raise typer.Exit(exc.exit_code) from exc
        except KeyboardInterrupt:
            err.print("[yellow]interrupted; the open transaction was rolled back; `mover run NAME` resumes[/yellow]")
            raise typer.Exit(130) from None
        except psycopg.Error as exc:
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
            raise typer.Exit(1) from exc

    return wrapper


def _print_traceback(exc: BaseException) -> None:
    # Plain text so it can be masked: exception texts (psycopg's among them) may quote the DSN.
    err.print(mask("".join(traceback.format_exception(exc))), highlight=False, markup=False, end="")


class _MaskingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return mask(super().format(record))


def _dsn(dsn: str | None) -> str:
    # An empty DSN makes libpq read the PG* variables (PGHOST, PGUSER, PGPASSFILE...).
    value = dsn or State.dsn or os.environ.get("DATABASE_URL", "")
    remember_secrets(value)
    return value


def _print_json(value: Any) -> None:
    out.print_json(json.dumps(value, default=str))


def _interruptible():
    """First Ctrl-C: stop at the next safe point. A second one interrupts at once (the open
    transaction is rolled back; the migration stays resumable)."""
    stop = threading.Event()

    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        err.print("[yellow]stopping at the next safe point (Ctrl-C again to stop now)[/yellow]")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _show_status(st: dict[str, Any]) -> None:
    table = Table(title=f"migration {st['name']}", show_header=False)
    table.add_row("step / state", f"{st['step']} / {st['state']}")
    table.add_row("tables",
                  f"source {st['tables']['source']}, target {st['tables']['target']}, old {st['tables']['old']}")
    b = st["backfill"]
    line = f"{b['rows_copied']:,} rows in {b['ranges_done']} ranges"
    if b["ranges_failed"]:
        line += f", {b['ranges_failed']} FAILED"
    if b["workers"]:
        line += f", {b['workers']} workers, {b['rows_per_second'] or 0:,} rows/s"
        if b["eta_seconds"] is not None:
            line += f", ETA {b['eta_seconds']}s"
    if b["paused"] or b["waiting_for"]:
        line += f" (waiting: {', '.join(b['waiting_for']) or 'paused'})"
    table.add_row("backfill", line)
    c = st["capture"]
    table.add_row("capture", f"{c['pending']} pending, {c['applied']:,} applied ({c['direction']})")
    r = st.get("reconcile")
    if r and r["ranges_total"]:
        table.add_row("reconcile", f"{r['ranges_done']}/{r['ranges_total']} ranges verified, {r['rows_compared']:,} "
                                   f"rows" + (f", {r['ranges_failed']} FAILED" if r["ranges_failed"] else "")
                      + (f", last at {r['verified_at']}" if r["verified_at"] else ""))
    by_kind = ", ".join(f"{k} {v}" for k, v in (r or {}).get("divergences", {}).get("open", {}).items())
    table.add_row("divergences", str(st["divergences"]) + (f" ({by_kind})" if by_kind else ""))
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
        table.add_row("error", st["error"])
    out.print(table)


@app.callback()
def main_options(debug: bool = typer.Option(False, "--debug", help="Tracebacks and debug logs."),
                 verbose: bool = typer.Option(False, "-v", "--verbose", help="Log each transaction retry."),
                 dsn: str | None = DsnOption):
    State.debug = debug
    State.dsn = dsn
    remember_secrets(dsn)
    remember_secrets(os.environ.get("DATABASE_URL"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    for handler in logging.getLogger().handlers:  # no log line may carry a password either
        handler.setFormatter(_MaskingFormatter(handler.formatter._fmt if handler.formatter else None))


@app.command()
@_exits
def init(dsn: str | None = DsnOption):
    """Create or upgrade mover's control schema (idempotent)."""
    rev = api.init(_dsn(dsn))
    err.print(f"control schema at revision {rev}")


@plan_app.command("check")
@_exits
def plan_check(plan: Path = typer.Argument(..., help="Plan file (TOML)."), dsn: str | None = DsnOption,
               as_json: bool = JsonOption):
    """Validate a plan against the live database; print each step and the SQL it will run."""
    result = api.check_plan(_dsn(dsn), plan)
    if as_json:
        _print_json(result)
        return
    if result["registered"]:
        out.print(f"plan {plan} is registered as migration {result['name']!r}:")
        _show_status(result["status"])
        return
    out.print(f"plan {plan}: OK. tables {result['tables']}, key {result['key']}")
    for col, why in result.get("lossy_accepted", {}).items():
        out.print(f"lossy type change accepted ([target] accept_lossy): {col!r} {why}", highlight=False, markup=False)
    part = result.get("partitioning")
    if part:
        out.print(f"partitioned by {part['by']} ({', '.join(part['columns'])}), unique key ({', '.join(part['key'])})",
                  highlight=False, markup=False)
        if part["key_change"]:
            out.print(f"key change accepted ([target.partition] accept_key_change): {part['key_change']}",
                      highlight=False, markup=False)
        out.print(f"{len(part['partitions'])} partitions to create:", highlight=False, markup=False)
        for p in part["partitions"]:
            out.print(f"  {p['name']}  {p['bound']}", highlight=False, markup=False)
    for step in result["steps"]:
        out.print(f"\n[bold]{step['name']}[/bold]")
        for stmt in step["sql"]:
            out.print(stmt, highlight=False, markup=False)


@partitions_app.command("maintain")
@_exits
def partitions_maintain(table: str | None = typer.Argument(None, help="Migration name or source table."),
                        all_tables: bool = typer.Option(False, "--all", help="Every partitioned conversion."),
                        dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be done only."),
                        dsn: str | None = DsnOption, as_json: bool = JsonOption):
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


def _run(dsn, target, one_step, wait):
    reporter = ProgressReporter(err)
    try:
        st = api.run(_dsn(dsn), target, one_step=one_step, wait=wait, report=reporter, stop=_interruptible())
    finally:
        reporter.close()
    _show_status(st)


@app.command()
@_exits
def run(target: str = typer.Argument(..., help="Migration name, or a plan file to register."),
        dsn: str | None = DsnOption,
        wait: bool = typer.Option(False, "--wait", help="Keep the old table in sync until the rollback window ends, "
                                                          "then retire.")):
    """Run every step that needs no decision; stop at the cutover gate (exit 3)."""
    _run(dsn, target, False, wait)


@app.command()
@_exits
def step(target: str = typer.Argument(..., help="Migration name, or a plan file to register."),
         dsn: str | None = DsnOption):
    """Run exactly the next step."""
    _run(dsn, target, True, False)


@app.command()
@_exits
def status(name: str | None = typer.Argument(None), dsn: str | None = DsnOption, as_json: bool = JsonOption):
    """Where every migration (or one) stands."""
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
def cutover(name: str, dsn: str | None = DsnOption):
    """Swap the new table in; the rollback window starts."""
    reporter = ProgressReporter(err)
    try:
        st = api.cutover_now(_dsn(dsn), name, report=reporter, stop=_interruptible())
    finally:
        reporter.close()  # also on error: a live bar would hide the message and leave the terminal askew
    _show_status(st)


@app.command()
@_exits
def rollback(name: str, dsn: str | None = DsnOption, give_up_rows: bool = GiveUpRowsOption):
    """During the rollback window: swap the original table back, losing nothing."""
    st = api.rollback(_dsn(dsn), name, give_up_rows=give_up_rows, stop=_interruptible())
    _show_status(st)


@app.command()
@_exits
def retire(name: str, dsn: str | None = DsnOption,
           force: bool = typer.Option(False, "--force", help="Retire before the rollback window ends."),
           give_up_rows: bool = GiveUpRowsOption):
    """After the rollback window: drop the old table and everything mover created."""
    st = api.retire(_dsn(dsn), name, force=force, give_up_rows=give_up_rows, stop=_interruptible())
    _show_status(st)


@app.command()
@_exits
def adopt(name: str, dsn: str | None = DsnOption):
    """After a shape change: apply an added column, CHECK or index to the other table too, and go on."""
    out = api.adopt(_dsn(dsn), name, stop=_interruptible())
    for change in out["adopted"]:
        err.print(f"adopted: {change['message']}")
    if not out["adopted"]:
        err.print("nothing to adopt: both tables have their recorded shape")
    _show_status(out["status"])


@app.command()
@_exits
def abort(name: str, dsn: str | None = DsnOption, give_up_rows: bool = GiveUpRowsOption):
    """Before cutover (or after a rollback): remove everything mover created; the source stays as it was."""
    st = api.abort(_dsn(dsn), name, give_up_rows=give_up_rows, stop=_interruptible())
    _show_status(st)


@app.command()
@_exits
def pause(name: str, dsn: str | None = DsnOption):
    """Pause the backfill workers at their next range boundary."""
    _show_status(api.set_paused(_dsn(dsn), name, True))


@app.command()
@_exits
def unpause(name: str, dsn: str | None = DsnOption):
    """Let paused workers go on."""
    _show_status(api.set_paused(_dsn(dsn), name, False))


@app.command("set")
@_exits
def set_(name: str, assignments: list[str] = typer.Argument(..., help="section.key=value, e.g. "
                                                                       "backfill.max_rows_per_second=50000"),
         dsn: str | None = DsnOption):
    """Change settings of a running migration (recorded as an event; workers pick them up)."""
    _show_status(api.set_settings(_dsn(dsn), name, assignments))


@app.command()
@_exits
def worker(name: str, dsn: str | None = DsnOption,
           threads: int = typer.Option(1, "--threads", help="Workers in this process.")):
    """Join a migration's backfill, then its reconcile pass, from this host; exits when no ranges are left."""
    reporter = ProgressReporter(err)
    try:
        st = api.work(_dsn(dsn), name, threads=threads, report=reporter, stop=_interruptible())
    finally:
        reporter.close()
    _show_status(st)


@app.command()
@_exits
def divergences(name: str, dsn: str | None = DsnOption, as_json: bool = JsonOption,
                all_: bool = typer.Option(False, "--all", help="Include resolved ones.")):
    """Rows that differ between the tables, as reconcile found them."""
    rows = api.divergences(_dsn(dsn), name, include_resolved=all_)
    if as_json:
        _print_json(rows)
        return
    table = Table("id", "key", "kind", "details (source -> target)", "found", "resolved")
    for d in rows:
        table.add_row(str(d["id"]), ", ".join(d["key"]), d["kind"], _details(d["kind"], d["columns"]),
                      d["found_at"], _resolution(d))
    out.print(table)
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


@app.command("reconcile")
@_exits
def reconcile_cmd(name: str, dsn: str | None = DsnOption, as_json: bool = JsonOption,
                  full: bool = typer.Option(False, "--full", help="Compare every range, not only those changed "
                                                                   "since the last pass.")):
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
        by_kind = st["reconcile"]["divergences"]["open"]
        table.add_row("open divergences", ", ".join(f"{k}: {v}" for k, v in by_kind.items()) or "none")
        table.add_row("step / state", f"{st['step']} / {st['state']}")
        out.print(table)
    _still_open(result["status"])


@app.command()
@_exits
def repair(name: str, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           divergence_id: int | None = typer.Option(None, "--id", help="Repair this divergence only.")):
    """Re-sync the divergent rows from the source's current state, check them again, resolve them."""
    result = api.repair(_dsn(dsn), name, divergence_id=divergence_id, stop=_interruptible())
    if as_json:
        _print_json(result)
    else:
        r = result["repair"]
        out.print(f"{r['repaired']} divergences repaired, {r['still_open']} still differ, {r['failed']} failed")
        for line in r["errors"]:
            err.print(f"  {line}", highlight=False, markup=False)
    _still_open(result["status"])


@app.command()
@_exits
def accept(name: str, reason: str = typer.Option(..., "--reason", help="Why the difference is intended (kept with "
                                                                          "the divergence)."),
           divergence_id: int | None = typer.Option(None, "--id", help="Accept this divergence only."),
           dsn: str | None = DsnOption, as_json: bool = JsonOption):
    """Accept open divergences as intended: they stay in the history, and no longer block the cutover."""
    result = api.accept(_dsn(dsn), name, reason, divergence_id=divergence_id)
    if as_json:
        _print_json(result)
        return
    ids = result["accepted"]
    out.print(f"{len(ids)} divergences accepted" + (f" (ids {', '.join(map(str, ids))})" if ids else ""))


@app.command()
@_exits
def events(name: str, dsn: str | None = DsnOption, as_json: bool = JsonOption,
           limit: int = typer.Option(50, "--limit")):
    """The migration's recent events (who, when, what, how long)."""
    rows = api.events(_dsn(dsn), name, limit)
    if as_json:
        _print_json(rows)
        return
    table = Table("at", "step", "kind", "message", "ms")
    for e in rows:
        table.add_row(e["at"], e["step"] or "", e["kind"], e["message"],
                      "" if e["duration_ms"] is None else f"{e['duration_ms']:.1f}")
    out.print(table)


@app.command()
@_exits
def demo(rows: int = typer.Option(300_000, "--rows", help="Rows in the sample table."),
         keep: bool = typer.Option(False, "--keep", help="Leave the server running at the end (prints its DSN).")):
    """Start an embedded PostgreSQL, a live writer, and migrate a table through every step."""
    from mover import demo as demo_mod
    demo_mod.main(rows=rows, keep=keep, console=err)


def main() -> None:
    app()
