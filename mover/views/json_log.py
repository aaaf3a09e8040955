"""`--log-format json`: stderr as one JSON object per line, for a log pipeline (Loki, CloudWatch,
Datadog) rather than a person. Every line is a log record: the records mover logs, each recorded
event (mover/state/control.py `event`, once its transaction committed), the progress a long
command reports, what a command prints on stderr, and how it ended (views/console.py `failure`).
stdout is untouched: results and `--json` stay there, as in text mode.

Invariants: every line stderr receives is one whole JSON object (no progress bar, no markup, a
record's newlines escaped inside it, ASCII only so no line breaks in it either); every text in it
is masked (mover.db.mask), the event's fields included."""

from __future__ import annotations

import enum
import json
import logging
import threading
from datetime import UTC, datetime
from typing import IO, Any

from mover.db import mask


class LogFormat(enum.StrEnum):
    """The choices of `--log-format`."""

    text = "text"
    json = "json"


# What a record may carry besides its message (from `extra=`), in the order a line lists them:
# where it happened, the recorded event and its fields, a progress report's kind, and for the
# line that ends a failed command its next step and exit code.
CONTEXT = ("migration", "table", "step", "event", "progress", "fields", "event_id", "actor", "duration_ms",
           "next", "exit_code")


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON: time (ISO 8601, UTC), level, logger, message, then whichever
    of CONTEXT the record carries, and the exception's traceback if it has one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": mask(record.getMessage()),
        }
        for key in CONTEXT:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = _masked(value)
        if record.exc_info:
            line["exception"] = mask(self.formatException(record.exc_info))
        return json.dumps(line, default=lambda v: mask(str(v)))


def _masked(value: Any) -> Any:
    """Every text inside `value` masked: an event's fields may hold a plan, a hook's command, an
    error quoting a DSN."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {str(k): _masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(v) for v in value]
    return value


def handler(stream: IO[str]) -> logging.Handler:
    """The root logger's handler in json mode: a line per record on `stream` (stderr), each written
    whole under the handler's lock, however many threads log."""
    out = logging.StreamHandler(stream)
    out.setFormatter(JsonFormatter())
    return out


class LoggedLines:
    """A file for the stderr console in json mode: each line a view prints there (a note, a
    warning's `next:`, "Ctrl-C: stopping...") becomes a log record of `logger` instead of raw text
    between the JSON lines."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if line.strip():
                self.logger.info(line.rstrip())
        return len(text)

    def flush(self) -> None:
        """A line is logged when it ends; rich ends each print with one."""

    def isatty(self) -> bool:
        return False


class LogReporter:
    """A long command's progress in json mode: each report of the engines (a range copied, a
    reconcile range compared, index builds, the swap's lock time...) a record of logger
    `mover.progress` with its kind as `progress` and its figures as `fields`, where text mode
    draws a bar (rich's live bars would tear the JSON lines)."""

    log = logging.getLogger("mover.progress")

    def __call__(self, kind: str, **fields: Any) -> None:
        table = fields.get("table")
        self.log.info("%s %s", kind, " ".join(f"{k}={v}" for k, v in fields.items()),
                      extra={"progress": kind, "fields": fields, "table": table if isinstance(table, str) else None})

    def close(self) -> None:
        """Nothing drawn, nothing to close."""
