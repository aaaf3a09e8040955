"""`--log-format json` without a database: a failed command's stderr is JSON lines, masked, the
option works on either side of the command name, a bad value is a usage error naming the
choices, and a recorded event's log record becomes one line with its fields."""

from __future__ import annotations

import io
import json
import logging

from mover.views.json_log import JsonFormatter, handler
from tests.workload import mover

UNREACHABLE = "postgresql://u:pwJsonLog7@127.0.0.1:1/x"


def lines(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines()]  # every line parses, or this fails


def test_a_failed_command_is_one_masked_json_line_with_its_next_step_and_exit_code(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    before = mover(UNREACHABLE, "status", process=False)
    for args in (("--log-format", "json", "status"), ("status", "--log-format", "json"),
                 ("status", "--log-format=JSON")):
        r = mover(UNREACHABLE, *args, process=False)
        assert r.returncode == before.returncode == 1, (args, r)
        assert "pwJsonLog7" not in r.stderr + r.stdout and r.stdout == ""
        (line,) = lines(r.stderr)
        assert line["level"] == "error" and line["exit_code"] == 1 and line["logger"] == "mover", line
        assert "password=***" in line["message"] and line["next"].startswith("check --dsn"), line
        assert line["time"].endswith("Z") and "T" in line["time"], line
    # Text stays text: the message, then its next line.
    text = before.stderr.splitlines()
    assert text[0].startswith("cannot connect to user=u password=***") and text[-1].startswith("next: check --dsn"), \
        before.stderr


def test_with_debug_the_traceback_is_inside_the_line_masked(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    r = mover(UNREACHABLE, "--debug", "status", "--log-format", "json", process=False)
    (line,) = [ln for ln in lines(r.stderr) if ln.get("exit_code") is not None]
    assert "Traceback" in line["exception"] and "pwJsonLog7" not in r.stderr, line


def test_an_unknown_format_is_a_usage_error_naming_the_choices():
    r = mover(UNREACHABLE, "--log-format", "xml", "status", process=False)
    assert r.returncode == 2, r
    assert "xml" in r.stderr and "'text'" in r.stderr and "'json'" in r.stderr, r.stderr


def test_an_event_record_is_one_line_with_its_fields_masked():
    out = io.StringIO()
    log = logging.getLogger("mover.events.test_json_log_lines")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler(out))
    try:
        log.info("line one\nline two \u2028 Zürich", extra={
            "migration": "orders", "table": '"public"."Orders"', "step": "backfill", "event": "step_done",
            "fields": {"dsn": "host=h password=s3cret", "rows": 5, "list": ["user:pw9@h"]}, "event_id": 7})
    finally:
        log.removeHandler(log.handlers[0])
    text = out.getvalue()
    assert text.count("\n") == 1 and text.isascii(), text  # one line, whatever the message holds
    line = json.loads(text)
    assert {k: line[k] for k in ("level", "migration", "table", "step", "event", "event_id")} == {
        "level": "info", "migration": "orders", "table": '"public"."Orders"', "step": "backfill",
        "event": "step_done", "event_id": 7}
    assert line["message"] == "line one\nline two \u2028 Zürich"
    assert line["fields"] == {"dsn": "host=h password=***", "rows": 5, "list": ["user:***@h"]}, line


def test_the_formatter_leaves_out_what_a_record_does_not_carry():
    record = logging.LogRecord("mover.db", logging.WARNING, __file__, 1, "retrying %s", ("x",), None)
    assert set(json.loads(JsonFormatter().format(record))) == {"time", "level", "logger", "message"}
