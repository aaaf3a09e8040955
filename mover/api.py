"""The commands as plain functions, used by the CLI, the demo, the tests and programs (docs/api.md
documents them for programs: keep it in step, tests/unit/test_api_doc.py checks). Each is a few lines
over one `session`: open the database, check that mover's control schema is there, hand over,
translate a server that went away into the typed ServerGone, close.

What a command does is elsewhere: whatever moves a migration is mover/runner/ (registration and
plan check in runner/register.py, the operator's commands in runner/commands.py, following in
runner/follow.py, helper workers in runner/workers.py); what the operator reads is mover/views/
(status, history, watch, report, parity). Rendering is the CLI's (mover/cli.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, overload

import psycopg

from mover.db import Database, bind, is_connection_lost, open_database
from mover.plan import Draft, Plan
from mover.runner import Reporter, commands, draft, log_reporter, register, workers
from mover.runner import rehearse as rehearsal
from mover.runner.follow import INTERVAL_SECONDS
from mover.runner.lease import server_gone
from mover.views import exporter
from mover.views import history as history_view
from mover.views import parity as parity_view
from mover.views import report as report_view
from mover.views import status as status_view
from mover.views import watch as watch_view


@contextmanager
def session(dsn: str, moving: str | None = None, *, schema: bool = True) -> Iterator[Database]:
    """The database for one command: opened (a bad DSN is bad input, an unreachable server names
    it), mover's control schema checked (unless `schema` is False: `mover init` makes it), closed
    after. A server that goes away meanwhile becomes ServerGone, naming `moving`, the migration
    (or plan file) the command moves, with the command that resumes it."""
    db = open_database(dsn)
    try:
        if schema:
            register.require_schema(db)
        yield db
    except psycopg.Error as exc:
        if is_connection_lost(exc):
            raise server_gone(moving, exc) from exc
        raise
    finally:
        db.close()


# ---------------------------------------------------------------------------------------------
# The control schema and plans


def init(dsn: str) -> str:
    """`mover init`: create or upgrade mover's control schema; returns the revision in force."""
    with session(dsn, schema=False) as db:
        return register.init(db)


def new_plan(dsn: str, table: str, *, columns: tuple[str, ...] = (), partition: str | None = None,
             name: str | None = None) -> Draft:
    """`mover plan new TABLE`: the plan for the table and the change (`columns`: "column=type" each;
    `partition`: [target.partition]'s keys as "key=value,..."), every referencing column the change
    widens in [[also]] tables; `.text()` is the plan file. Reads the catalog only, and needs no
    control schema."""
    with session(dsn, schema=False) as db:
        return draft.new(db, draft.Request(table=table, columns=columns, partition=partition, name=name))


def resolve_plan(cur: psycopg.Cursor, plan: Plan) -> dict[str, Any]:
    """Check the plan against the catalog (every problem at once); return resolved names and the
    key. Changes nothing."""
    return register.resolve(cur, plan)


def check_plan(dsn: str, path: str | Path | Plan) -> dict[str, Any]:
    """`mover plan check PLAN`: each step and the SQL it will run, or for a registered plan its
    edits and the migration's status. `path`: a plan file, or a Plan (mover.plan.parse_plan)."""
    with session(dsn) as db:
        result, registered = register.check(db, path)
        if registered is not None:
            result["status"] = _status(db, registered.name)
        return result


def register_plan(dsn: str, plan: Plan) -> dict[str, Any]:
    """Register `plan` (or apply its changed settings to the migration registered under its name)
    without running a step; the migration's status. `mover run` registers the same way, then runs."""
    with session(dsn, plan.name) as db:
        m = commands.register_plan(db, plan)
        return _status(db, m.name)


# ---------------------------------------------------------------------------------------------
# Moving a migration (mover/runner/commands.py); each returns the migration's status after


def run(dsn: str, name_or_plan: str, *, one_step: bool = False, wait: bool = False,
        report: Reporter = log_reporter, stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover run PLAN|NAME` (`mover step` with `one_step`, `mover follow` with `wait`): register or
    update the plan, run every step that needs no decision; raises Waiting at the cutover gate."""
    with session(dsn, name_or_plan) as db:
        m = commands.run(db, name_or_plan, one_step=one_step, wait=wait, report=report, stop=stop)
        return _status(db, m.name)


def follow(dsn: str, name_or_plan: str, *, report: Reporter = log_reporter, stop: threading.Event | None = None,
           interval: float = INTERVAL_SECONDS) -> dict[str, Any]:
    """`mover follow NAME` (= `mover run NAME --wait`): run the steps that need no decision, then
    keep the log drained at the gate and in the window until the operator decides elsewhere."""
    with session(dsn, name_or_plan) as db:
        m = commands.follow(db, name_or_plan, report=report, stop=stop, interval=interval)
        return _status(db, m.name)


def cutover_now(dsn: str, name: str, *, report: Reporter = log_reporter,
                stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover cutover NAME`: preflight, then the swap under a short lock; the rollback window starts."""
    with session(dsn, name) as db:
        commands.cutover(db, name, report=report, stop=stop)
        return _status(db, name)


def rollback(dsn: str, name: str, *, give_up_rows: bool = False, report: Reporter = log_reporter,
             stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover rollback NAME`: during the window, swap the old table back, losing nothing."""
    with session(dsn, name) as db:
        commands.rollback(db, name, give_up_rows=give_up_rows, report=report, stop=stop)
        return _status(db, name)


def retire(dsn: str, name: str, *, force: bool = False, give_up_rows: bool = False, report: Reporter = log_reporter,
           stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover retire NAME`: after the window (before it with `force`), drop the old table and the
    reverse capture."""
    with session(dsn, name) as db:
        commands.retire(db, name, force=force, give_up_rows=give_up_rows, report=report, stop=stop)
        return _status(db, name)


def abort(dsn: str, name: str, *, give_up_rows: bool = False, report: Reporter = log_reporter,
          stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover abort NAME`: before the cutover, remove everything mover created."""
    with session(dsn, name) as db:
        commands.abort(db, name, give_up_rows=give_up_rows, report=report, stop=stop)
        return _status(db, name)


def reconcile(dsn: str, name: str, *, full: bool = False, report: Reporter = log_reporter,
              stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover reconcile NAME`: a reconcile pass now (all ranges with `full`); the pass and the status."""
    with session(dsn, name) as db:
        passed = commands.reconcile(db, name, full=full, report=report, stop=stop)
        return {"pass": passed, "status": _status(db, name)}


def repair(dsn: str, name: str, *, divergence_id: int | None = None, report: Reporter = log_reporter,
           stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover repair NAME`: re-sync the open divergences' rows from the source and check them again."""
    with session(dsn, name) as db:
        repaired = commands.repair(db, name, divergence_id=divergence_id, report=report, stop=stop)
        return {"repair": repaired, "status": _status(db, name)}


def accept(dsn: str, name: str, reason: str, *, divergence_id: int | None = None) -> dict[str, Any]:
    """`mover accept NAME --reason TEXT`: close open divergences (or one) as intended."""
    with session(dsn, name) as db:
        ids = commands.accept(db, name, reason, divergence_id=divergence_id)
        return {"accepted": ids, "status": _status(db, name)}


def adopt(dsn: str, name: str, *, report: Reporter = log_reporter,
          stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover adopt NAME`: apply an additive change of the live table's shape to the other table."""
    with session(dsn, name) as db:
        adopted = commands.adopt(db, name, report=report, stop=stop)
        return {"adopted": adopted, "status": _status(db, name)}


def recapture(dsn: str, name: str, *, report: Reporter = log_reporter,
              stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover recapture NAME`: logical capture from a new replication slot after the old one was
    lost, and the next reconcile pass over every range."""
    with session(dsn, name) as db:
        slot = commands.recapture(db, name, report=report, stop=stop)
        return {"slot": slot, "status": _status(db, name)}


def set_paused(dsn: str, name: str, paused: bool) -> dict[str, Any]:
    """`mover pause NAME` (paused True) and `mover unpause NAME` (False)."""
    with session(dsn, name) as db:
        commands.set_paused(db, name, paused)
        return _status(db, name)


def set_settings(dsn: str, name: str, assignments: list[str]) -> dict[str, Any]:
    """`mover set NAME section.key=value ...`: change settings of a running migration."""
    with session(dsn, name) as db:
        commands.set_settings(db, name, assignments)
        return _status(db, name)


def work(dsn: str, name: str, *, threads: int = 1, report: Reporter = log_reporter,
         stop: threading.Event | None = None) -> dict[str, Any]:
    """`mover worker NAME`: help an orchestrator from any host with the ranges of the backfill, then
    of a reconcile pass it has started; returns when there are none left to take."""
    with session(dsn, name) as db:
        workers.work(db, name, threads=threads, report=report, stop=stop or threading.Event())
        return _status(db, name)


def maintain_partitions(dsn: str, table: str | None = None, *, all_tables: bool = False,
                        dry_run: bool = False) -> list[dict[str, Any]]:
    """`mover partitions maintain [TABLE | --all]`: create partitions ahead, report the default
    partition's rows, apply the retention (mover/engines/partitioning/upkeep.py). Idempotent: safe from cron."""
    with session(dsn) as db:
        return commands.maintain_partitions(db, table, all_tables=all_tables, dry_run=dry_run)


# ---------------------------------------------------------------------------------------------
# Reading (mover/views/)


# One migration's status for a name, every migration's without: typed per call for the callers.
@overload
def status(dsn: str, name: str, *, db: Database | None = None) -> dict[str, Any]: ...
@overload
def status(dsn: str, name: None = None, *, db: Database | None = None) -> list[dict[str, Any]]: ...
@overload
def status(dsn: str, name: str | None, *, db: Database | None = None) -> dict[str, Any] | list[dict[str, Any]]: ...


def status(dsn: str, name: str | None = None, *, db: Database | None = None) -> Any:
    """`mover status [NAME]`: one migration's status, or a list of every one's."""
    if db is not None:
        return _status(db, name) if name is not None else db.transaction(status_view.every, label="status")
    with session(dsn) as db:
        return status(dsn, name, db=db)


def _status(db: Database, name: str) -> dict[str, Any]:
    return db.transaction(bind(status_view.named, name), label="status")


def rehearse(dsn: str, name: str, *, top: int | None = None) -> dict[str, Any]:
    """`mover rehearse NAME`: the statements pg_stat_statements recorded on the source, planned on
    the target under the source's name (mover/engines/swap/query_rehearsal.py)."""
    with session(dsn) as db:
        return rehearsal.rehearse(db, name, top=top)


def parity_report(dsn: str, name: str) -> dict[str, Any]:
    """`mover parity NAME`: the metadata differences (mover/engines/swap/parity.py), read-only."""
    with session(dsn) as db:
        return parity_view.report(db, name)


def history(dsn: str, name: str | None = None) -> list[dict[str, Any]]:
    """`mover history [NAME]`: every migration (or NAME and its aborted attempts) with its outcome
    and step durations."""
    with session(dsn) as db:
        return db.transaction(bind(history_view.history, name), label="history")


def divergences(dsn: str, name: str, *, include_resolved: bool = False) -> list[dict[str, Any]]:
    """`mover divergences NAME [--all]`: the open divergences (every one with `include_resolved`)."""
    with session(dsn) as db:
        return db.transaction(bind(status_view.divergences, name, include_resolved))


def events(dsn: str, name: str, limit: int = 50) -> list[dict[str, Any]]:
    """`mover events NAME`: the last `limit` events, oldest first."""
    with session(dsn) as db:
        return db.transaction(bind(status_view.events, name, limit))


def watch(dsn: str, name: str, show: Callable[[dict[str, Any]], None], *, interval: float,
          stop: threading.Event) -> dict[str, Any]:
    """Call show(snapshot) every `interval` seconds until the migration is done or aborted, or
    `stop` is set; returns the last snapshot (mover/views/watch.py)."""
    with session(dsn) as db:
        return watch_view.watch(db, name, show, interval=interval, stop=stop)


def report(dsn: str, name: str) -> dict[str, Any]:
    """Everything `mover report` shows, in one snapshot: the plan, the status, the whole event story,
    every sample, every divergence with its resolution."""
    with session(dsn) as db:
        return db.transaction(bind(report_view.gather, name), label="report")


# ---------------------------------------------------------------------------------------------
# Prometheus metrics (mover/views/metrics.py): no session, since an exporter starts, and keeps
# serving, while the database is unreachable (mover_up 0 says so).


@contextmanager
def serve_metrics(dsn: str, listen: str, *, timeout: float = 5.0) -> Iterator[str]:
    """`mover metrics --listen ADDR` (and `--metrics-listen` of follow and worker): every
    migration's metrics on /metrics until the block ends; yields the URL."""
    with exporter.serving(dsn, listen, timeout=timeout) as url:
        yield url


def write_metrics(dsn: str, path: str | Path, *, interval: float | None = None,
                  stop: threading.Event | None = None, timeout: float = 5.0) -> bool:
    """`mover metrics --textfile PATH [--interval S]`: the metrics written atomically to PATH, once
    or every S seconds until `stop`; whether the last write could read the control schema."""
    return exporter.write_textfile(dsn, Path(path), interval=interval, stop=stop or threading.Event(),
                                   timeout=timeout)
