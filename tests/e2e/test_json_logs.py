"""`--log-format json` through a whole migration: every stderr line is a JSON object, every event
the run recorded (as `mover events --json` lists them) is one line with its migration, table,
step, kind and fields, progress comes as lines (no bars), stdout is unchanged, and text mode
says nothing of the events even with -v."""

from __future__ import annotations

import json

from tests.workload import create_orders, mover, plan_file

NAME = "orders_json"


def json_lines(stderr: str) -> list[dict]:
    out = [json.loads(line) for line in stderr.splitlines()]  # every line parses, or this fails
    assert all(isinstance(line, dict) and {"time", "level", "logger", "message"} <= set(line) for line in out), out
    return out


def test_every_event_of_a_run_is_a_json_line(db_dsn, tmp_path):
    create_orders(db_dsn, 3000)
    plan = plan_file(tmp_path, NAME, columns={"id": "bigint"}, backfill={"range_rows": 1000})

    to_gate = mover(db_dsn, "--log-format", "json", "run", plan)
    assert to_gate.returncode == 3, to_gate.stderr
    swap = mover(db_dsn, "cutover", NAME, "--log-format", "json")  # the option after the command name
    assert swap.returncode == 0, swap.stderr
    assert swap.stdout.lstrip().startswith(f"migration {NAME}"), swap.stdout  # the status table, as in text mode
    lines = json_lines(to_gate.stderr) + json_lines(swap.stderr)

    recorded = json.loads(mover(db_dsn, "events", NAME, "--json", "--limit", "1000").stdout)
    logged = {line["event_id"]: line for line in lines if line["logger"] == "mover.events"}
    assert len(recorded) > 10 and sorted(logged) == [e["id"] for e in recorded], (recorded, logged)
    for e in recorded:
        line = logged[e["id"]]
        assert (line["migration"], line["table"], line.get("step"), line["event"], line["message"],
                line.get("duration_ms"), line["actor"]) == \
            (NAME, e["table"], e["step"], e["kind"], e["message"], e["duration_ms"], e["actor"]), (line, e)
        assert isinstance(line["fields"], dict) and line["level"] in ("info", "error"), line
    steps_done = [line["step"] for line in logged.values() if line["event"] == "step_done"]
    assert steps_done == ["create_target", "install_capture", "backfill", "reconcile", "cutover"], steps_done
    assert {line["table"] for line in logged.values()} == {'"public"."Orders"'}
    # The event's fields: the pass's figures, as the events table holds them.
    passed = next(line for line in logged.values() if line["event"] == "pass_done")
    assert (passed["fields"]["rows"], passed["fields"]["still_open"]) == (3000, 0) and passed["duration_ms"] > 0, passed

    # Progress as lines where text mode draws bars; the swap's lock time among them.
    progress = {line["progress"]: line for line in lines if line["logger"] == "mover.progress"}
    assert {"backfill_start", "backfill", "cutover"} <= set(progress), sorted(progress)
    assert progress["cutover"]["fields"]["lock_ms"] > 0, progress["cutover"]
    assert "━" not in to_gate.stderr + swap.stderr  # no bar
    # How the run ended: one line, its next step the command that goes on.
    gate = json_lines(to_gate.stderr)[-1]
    assert (gate["level"], gate["exit_code"]) == ("warning", 3) and f"mover cutover {NAME}" in gate["next"], gate

    # Text, even with -v: the events stay in `mover events`, not on the console.
    paused = mover(db_dsn, "-v", "unpause", NAME)
    assert paused.returncode == 0 and "mover.events" not in paused.stderr and "{" not in paused.stderr, paused.stderr
    unpaused = json_lines(mover(db_dsn, "unpause", NAME, "--log-format", "json").stderr)
    assert [line["event"] for line in unpaused if line["logger"] == "mover.events"] == ["unpaused"], unpaused
