"""The operator at 3 a.m. (issue 11): every error the CLI prints names the migration, the cause
and the next command; plan problems come all at once; the status never says what is not so;
`history`, completion and `--json` where a command prints a result. CLI runs, exit codes and
output checked; end states judged by plain SQL."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from mover import errors
from mover.demo.embedded import EmbeddedPostgres
from tests.workload import ROOT, Spawned, create_orders, mover, plan_text, write_plan


def plan_file(tmp_path: Path, name: str = "op", *, range_rows: int = 1_000, cap: int = 0, window: str = "1h",
              columns: dict | None = None) -> str:
    text = plan_text(name, columns=columns or {"id": "bigint"}, window=window,
                     backfill={"range_rows": range_rows, "min_rows": 100, "max_rows_per_second": cap})
    return write_plan(tmp_path / f"{name}-{abs(hash(text))}.toml", text)


def status(dsn: str, name: str) -> dict:
    r = mover(dsn, "status", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def has_next(stderr: str) -> bool:
    return any(line.startswith("next: ") and len(line) > len("next: ") for line in stderr.splitlines())


def exists(dsn: str, table: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]


# ---------------------------------------------------------------------------------------------
# Plan validation: every problem in one run, in text and in JSON


BROKEN = """
[migration]
name = "bad name!"
source = 'public."Orders"'

[backfill]
range_row = 5
workers = "4"
"""


def test_plan_file_problems_are_reported_together_each_with_a_next_step(db_dsn, tmp_path):
    plan = write_plan(tmp_path / "broken.toml", BROKEN)
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 2, r.stderr
    assert "the plan has 4 problems" in r.stderr, r.stderr
    for what in ("unknown key [backfill] range_row", "[backfill] workers must be an integer",
                 "[migration] name 'bad name!'", "missing required key [rollback] window"):
        line = next((ln for ln in r.stderr.splitlines() if what in ln), None)
        assert line is not None and "(next: " in line, (what, r.stderr)
    assert has_next(r.stderr)

    # --json stays JSON when the plan is invalid, on either side of the command name.
    for args in (("plan", "check", plan, "--json"), ("--json", "plan", "check", plan)):
        r = mover(db_dsn, *args)
        assert r.returncode == 2, r.stderr
        doc = json.loads(r.stdout)
        assert doc["ok"] is False and doc["exit_code"] == 2 and len(doc["problems"]) == 4, doc
        assert all(p["message"] and p["next"] for p in doc["problems"]), doc


def test_unknown_type_and_unknown_column_are_reported_together(db_dsn, tmp_path):
    create_orders(db_dsn, 100)
    plan = plan_file(tmp_path, columns={"id": "bigint", "amount": "numerc(12,2)", "nosuch": "text"})
    r = mover(db_dsn, "plan", "check", plan)
    assert r.returncode == 2, r.stderr
    assert "'numerc(12,2)'" in r.stderr and "is not a type this database knows" in r.stderr, r.stderr
    assert "nosuch" in r.stderr and "problems" in r.stderr, r.stderr
    typo = next(ln for ln in r.stderr.splitlines() if "numerc" in ln)
    assert "(next: " in typo, r.stderr
    assert has_next(r.stderr)


# ---------------------------------------------------------------------------------------------
# Every CLI error path carries next:


def test_input_and_connection_errors_carry_next(db_dsn, tmp_path):
    cases = [
        (("--dsn", "host=localhost port", "status"), 2, "DSN is malformed"),
        (("--dsn", "postgresql://127.0.0.1:1/nothing?connect_timeout=2", "status"), 1, "cannot connect"),
        (("status", "nosuch"), 2, "no migration named 'nosuch'"),
        (("plan", "check", str(tmp_path / "missing.toml")), 2, "cannot read plan file"),
        (("set", "nosuch", "backfill.workers=2"), 2, "nosuch"),
    ]
    for args, code, text in cases:
        r = subprocess.run([sys.executable, "-m", "mover", *args] if args[0] == "--dsn"
                           else [sys.executable, "-m", "mover", "--dsn", db_dsn, *args],
                           capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={**os.environ, "COLUMNS": "200"})
        assert r.returncode == code, (args, r.stderr)
        assert text in r.stderr and has_next(r.stderr), (args, r.stderr)


def test_mover_errors_are_raised_with_a_hint():
    # Every raise of a mover error in the package passes hint= (the CLI also prints a general
    # next: line for one without). Exempt: the demo's own checks of its embedded run, and the
    # fault injection of the tests.
    classes = {n for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, errors.MoverError)}
    missing = []
    for path in sorted((ROOT / "mover").rglob("*.py")):
        if path.name in ("demo.py", "faults.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name in classes and not any(k.arg == "hint" for k in node.keywords):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not missing, missing


# ---------------------------------------------------------------------------------------------
# At the gate: pause refused, abort that loses its lock wait, escaped hints, an honest status


def test_gate_pause_abort_lock_wait_and_status_after_abort(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    plan = plan_file(tmp_path, "gate")
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3 and "ready for cutover" in r.stderr and has_next(r.stderr), r.stderr

    # Pause means nothing at the cutover step: refused, saying why and what next.
    r = mover(db_dsn, "pause", "gate")
    assert r.returncode == 2 and "cannot pause migration 'gate' at step 'cutover'" in r.stderr, r.stderr
    assert has_next(r.stderr)
    # A paused flag left from before does not make the status say the backfill waits.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE mover.migrations SET paused = true WHERE name = 'gate'")
    r = mover(db_dsn, "status", "gate")
    assert r.returncode == 0 and "waiting: paused" not in r.stdout and "cutover / waiting" in r.stdout, r.stdout
    assert mover(db_dsn, "unpause", "gate").returncode == 0

    # A long-running query holds the table: abort cannot lock it and says so (exit 3), as cutover does.
    assert mover(db_dsn, "set", "gate", "cutover.lock_timeout=50ms", "cutover.attempts=2").returncode == 0
    with psycopg.connect(db_dsn) as holder:
        holder.execute('SELECT count(*) FROM "Orders"')  # ACCESS SHARE held until the transaction ends
        r = mover(db_dsn, "abort", "gate")
        assert r.returncode == 3, r.stderr
        assert "could not lock" in r.stderr and "to abort migration 'gate'" in r.stderr and has_next(r.stderr), \
            r.stderr
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            # The last event but the progress samples (the run's final one comes after its outcome).
            step = conn.execute("SELECT e.step FROM mover.events e JOIN mover.migrations m ON m.id = e.migration_id"
                                " WHERE m.name = 'gate' AND e.kind <> 'sample'"
                                " ORDER BY e.id DESC LIMIT 1").fetchone()[0]
        assert step == "abort"
        # The recorded error's hint names [cutover] lock_timeout: rich must not take it for markup.
        r = mover(db_dsn, "status", "gate")
        assert "raise [cutover]" in r.stdout, r.stdout
        holder.rollback()

    r = mover(db_dsn, "abort", "gate")
    assert r.returncode == 0, r.stderr
    st = status(db_dsn, "gate")
    assert st["state"] == "aborted" and st["error"] is None, st
    assert st["tables_present"] == ["source"], st
    r = mover(db_dsn, "status", "gate")
    assert "ready for cutover" not in r.stdout and "Orders_new" not in r.stdout and "aborted" in r.stdout, r.stdout
    assert not exists(db_dsn, 'public."Orders_new"')

    # History keeps the aborted attempt, with its outcome and its steps' durations.
    r = mover(db_dsn, "history", "gate", "--json")
    assert r.returncode == 0, r.stderr
    (h,) = json.loads(r.stdout)
    assert h["outcome"] == "aborted" and h["seconds"] is not None
    done = {s["name"]: s for s in h["steps"]}
    assert done["backfill"]["seconds"] is not None and done["backfill"]["seconds"] >= 0, h
    r = mover(db_dsn, "history")
    assert r.returncode == 0 and "gate  aborted in" in r.stdout and "backfill" in r.stdout, r.stdout


# ---------------------------------------------------------------------------------------------
# A whole migration: plan check's names are the run's, run --wait reports, finished vs retire,
# the changed plan's hint


def test_plan_check_names_wait_progress_and_finished_migration(db_dsn, tmp_path):
    create_orders(db_dsn, 1_000)
    plan = plan_file(tmp_path, "whole", window="6s")
    predicted = json.loads(mover(db_dsn, "plan", "check", plan, "--json").stdout)["migration_id"]
    for flags in ((), ("--sql",)):  # the summary and the steps' statements
        r = mover(db_dsn, "plan", "check", plan, *flags)
        assert r.returncode == 0, r.stderr
        assert "{'" not in r.stdout and "['" not in r.stdout, r.stdout
        assert f'"mover"."m{predicted}_changes"' in r.stdout, r.stdout

    assert mover(db_dsn, "run", plan).returncode == 3
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        mid = conn.execute("SELECT id FROM mover.migrations WHERE name = 'whole'").fetchone()[0]
        assert conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"mover.m{mid}_changes",)).fetchone()[0]
    assert mid == predicted
    r = mover(db_dsn, "cutover", "whole", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["step"] == "rollback_window"

    r = mover(db_dsn, "run", "whole", "--wait")
    assert r.returncode == 0, r.stderr
    assert "rollback window of 'whole' open until" in r.stderr and "keeping the old table in sync" in r.stderr, \
        r.stderr
    st = status(db_dsn, "whole")
    assert st["state"] == "done" and st["step"] == "retire" and st["error"] is None, st
    assert st["tables_present"] == ["source"], st
    r = mover(db_dsn, "status", "whole")
    assert "retire / done" in r.stdout and "Orders_new" not in r.stdout and "Orders_old" not in r.stdout, r.stdout

    # A changed plan for the finished migration: the hint says what works (not a refused abort).
    changed = plan_file(tmp_path, "whole", window="6s", columns={"id": "bigint", "Account": "bigint"})
    r = mover(db_dsn, "run", changed)
    assert r.returncode == 2 and "differs from the one registered" in r.stderr, r.stderr
    hint = next(ln for ln in r.stderr.splitlines() if ln.startswith("next: "))
    assert "abort" not in hint and "new [migration] name" in hint, hint

    r = mover(db_dsn, "--json", "history", "whole")
    assert r.returncode == 0, r.stderr
    (h,) = json.loads(r.stdout)
    assert h["outcome"] == "done" and h["step"] == "retire" and all(s["seconds"] is not None for s in h["steps"]), h


# ---------------------------------------------------------------------------------------------
# Signals and a dead process


def copied_ranges(dsn: str, name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM mover.ranges c JOIN mover.migrations m ON m.id = c.migration_id"
                            " WHERE m.name = %s AND c.status = 'done'", (name,)).fetchone()[0]


def wait_until_backfilling(dsn: str, name: str, proc: Spawned, before: int = 0) -> None:
    """Until this process copied a range (more than `before` are done)."""
    deadline = time.monotonic() + 60
    while True:
        assert proc.proc.poll() is None and time.monotonic() < deadline, "".join(proc.err)
        try:
            if copied_ranges(dsn, name) > before:
                return
        except psycopg.errors.UndefinedTable:
            pass  # a fresh server: `mover init` not applied yet
        time.sleep(0.05)


def test_kill_9_reads_failed_at_once_and_sigterm_is_named(db_dsn, tmp_path):
    create_orders(db_dsn, 5_000)
    plan = plan_file(tmp_path, "slow", range_rows=200, cap=400)
    p = Spawned(db_dsn, "run", plan, env={})
    wait_until_backfilling(db_dsn, "slow", p)
    pid = p.proc.pid
    assert p.kill()
    st = status(db_dsn, "slow")  # at once, not after the lease's 30 s
    assert st["state"] == "failed" and st["error"] == (f"process {pid} ended without finishing (killed, or it lost "
                                                      f"its connection to the server); `mover run slow` resumes"), st
    assert st["backfill"]["workers"] == 0 and st["backfill"]["eta_seconds"] is None, st
    # One state everywhere: the step it was running failed with it, and a stopped copy has no speed.
    assert [s["status"] for s in st["steps"] if s["name"] == "backfill"] == ["failed"], st["steps"]
    assert "running" not in [s["status"] for s in st["steps"]] and st["backfill"]["rows_per_second"] is None, st
    assert "ETA" not in mover(db_dsn, "status", "slow").stdout

    before = copied_ranges(db_dsn, "slow")
    p = Spawned(db_dsn, "run", "slow", env={})
    wait_until_backfilling(db_dsn, "slow", p, before)
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait(60) == 130
    err = "".join(p.err)
    assert "SIGTERM" in err and "Ctrl-C" not in err and has_next(err), err
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        message = conn.execute("SELECT e.message FROM mover.events e JOIN mover.migrations m ON m.id = e.migration_id"
                               " WHERE m.name = 'slow' AND e.kind = 'interrupted' ORDER BY e.id DESC LIMIT 1"
                               ).fetchone()[0]
    assert message == "stopped by the operator (SIGTERM)"


# ---------------------------------------------------------------------------------------------
# The server going away mid-run (a server of its own: the suite's must stay up)


def test_server_going_away_names_the_migration_and_the_next_command(tmp_path):
    server = EmbeddedPostgres(fast=True)
    dsn = server.start()
    try:
        assert mover(dsn, "init").returncode == 0
        create_orders(dsn, 20_000)
        plan = plan_file(tmp_path, "downed", range_rows=200, cap=1_000)
        p = Spawned(dsn, "run", plan, env={})
        wait_until_backfilling(dsn, "downed", p)
        server.stop()
        assert p.wait(120) == 1
        err = "".join(p.err)
        assert "migration 'downed': lost the connection to the database server" in err, err
        assert "next: once the server is back, `mover run downed` resumes" in err, err
        # Said once per transaction (attempt 1), not on every attempt: one line per session that
        # was in a transaction (the worker, the applier beside it, the orchestrator) and the heartbeat's.
        assert not re.search(r"retrying .*\(attempt [2-9]", err), err
        assert err.count("retrying") <= 6, err
        assert "Traceback" not in err
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# The command line itself


def test_help_flags_global_options_and_completion(db_dsn, tmp_path):
    r = mover(db_dsn, "--help")
    assert r.returncode == 0 and "<bool>" not in r.stdout and "--debug" in r.stdout, r.stdout
    assert "<bool>" not in mover(db_dsn, "status", "--help").stdout
    # --debug takes no value and works after the command name too.
    r = mover(db_dsn, "status", "nosuch", "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr and has_next(r.stderr), r.stderr
    r = mover(db_dsn, "--debug", "status", "nosuch")
    assert r.returncode == 2 and "Traceback" in r.stderr, r.stderr

    create_orders(db_dsn, 200)
    assert mover(db_dsn, "run", plan_file(tmp_path, "completed_one")).returncode == 3
    env = {**os.environ, "DATABASE_URL": db_dsn, "_MOVER_COMPLETE": "complete_bash"}

    def complete(words: str) -> list[str]:
        n = len(words.split()) - (0 if words.endswith(" ") else 1)
        r = subprocess.run([sys.executable, "-c", "from mover.cli import main; main()"], capture_output=True,
                           text=True, timeout=60, cwd=ROOT,
                           env={**env, "COMP_WORDS": words, "COMP_CWORD": str(n)})
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert "status" in complete("mover sta") and "history" in complete("mover hi")
    assert complete("mover status ") == ["completed_one"]
    assert complete("mover cutover comp") == ["completed_one"]
    # No server: no names, no error.
    env["DATABASE_URL"] = "postgresql://127.0.0.1:1/nothing?connect_timeout=1"
    assert complete("mover status ") == []


@pytest.mark.parametrize("command", ["init", "run", "step", "status", "cutover", "rollback", "retire", "adopt",
                                     "abort", "pause", "unpause", "set", "worker", "divergences", "reconcile",
                                     "repair", "accept", "events", "history", "report"])
def test_every_result_command_takes_json(command):
    r = mover("", command, "--help")
    assert r.returncode == 0 and "--json" in r.stdout, r.stdout


def test_after_a_rollback_the_error_no_longer_says_the_window_is_open(db_dsn, tmp_path):
    create_orders(db_dsn, 500)
    plan = plan_file(tmp_path, "back")
    assert mover(db_dsn, "run", plan).returncode == 3
    assert mover(db_dsn, "cutover", "back").returncode == 0
    r = mover(db_dsn, "run", "back")
    assert r.returncode == 3 and "rollback window of 'back' is open" in r.stderr and has_next(r.stderr), r.stderr
    assert "is open" in status(db_dsn, "back")["error"]
    r = mover(db_dsn, "rollback", "back", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["step"] == "reconcile" and st["error"] is None, st
    assert "window" not in mover(db_dsn, "status", "back").stdout
    # The original is back under its name, with every row.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute('SELECT count(*) FROM "Orders"').fetchone()[0] == 500
        assert conn.execute("SELECT to_regclass('public.\"Orders_old\"') IS NULL").fetchone()[0]
