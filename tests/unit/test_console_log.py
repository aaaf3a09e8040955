"""Log records reach the operator through the CLI's console: a warning once, with its next line."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from mover.views.console import ConsoleLog


def test_a_warning_is_said_once_with_its_next_line_and_masked():
    buf = io.StringIO()
    handler = ConsoleLog(Console(file=buf, width=200, color_system=None))
    handler.setFormatter(logging.Formatter())
    log = logging.getLogger("mover.test_console_log")
    log.propagate = False
    log.addHandler(handler)
    try:
        for _ in range(3):  # every worker meets the same condition
            log.warning("lag is not checked (dsn postgresql://u:s3cr3t-pw@h/db)", extra={"next": "grant it"})
        log.warning("another condition")
    finally:
        log.removeHandler(handler)
    lines = buf.getvalue().splitlines()
    assert lines == ["warning: lag is not checked (dsn postgresql://u:***@h/db)", "next: grant it",
                     "warning: another condition"], lines
