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


def test_tables_print_messages_and_keys_as_they_are():
    """An event's message names settings as "[throttle] idle_after", and a key may be "[x]": rich
    markup would drop both."""
    from mover.views import divergences, history_text
    from mover.views.console import Consoles

    out, err = io.StringIO(), io.StringIO()
    con = Consoles(out=Console(file=out, width=400, color_system=None),
                   err=Console(file=err, width=400, color_system=None))
    history_text.events(con, [{"at": "t0", "table": '"public"."[t]"', "step": "reconcile", "kind": "throttle_quiet",
                               "message": "quiet over 10 s: [throttle] idle_after [bold]x[/bold]",
                               "duration_ms": None}], as_json=False)
    divergences.listed(con, [{"id": 1, "key": ["[red]k[/red]"], "kind": "missing", "columns": None,
                              "found_at": "t1", "resolved_at": None}], include_resolved=False, as_json=False)
    text = out.getvalue()
    for part in ("[throttle] idle_after [bold]x[/bold]", '"public"."[t]"', "[red]k[/red]"):
        assert part in text, text
