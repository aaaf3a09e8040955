"""The console's view of a long run: engine reports turned into progress bars and log lines.
The console is the caller's (the CLI's stderr, the demo's), so that neither imports the other."""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Column

# Narrow enough that the figures beside the bar fit an 80-column terminal uncut.
BAR_WIDTH = 12


class ProgressReporter:
    """Turns engine reports into a live backfill progress bar (rows, rows/s, range size, workers,
    capture backlog, ETA) and log lines for the rest. Workers report from several threads."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        self.task = TaskID(0)  # the bar's own once a bar starts; unused while progress is None
        self.lock = threading.Lock()
        self.rows = 0
        self.estimate = 0
        self.started = time.monotonic()
        self.copied_here = 0
        self.index_bar = False

    def __call__(self, kind: str, **f: Any) -> None:
        with self.lock:
            if kind == "backfill_start":
                self.close()
                self.rows, self.estimate, self.copied_here = f["rows"], f["estimate"], 0
                self.started = time.monotonic()
                self.progress = Progress(
                    _label("backfill", f, self.console.width), BarColumn(bar_width=BAR_WIDTH), MofNCompleteColumn(),
                    # Workers and the range size are in `mover status` and `mover watch`.
                    TextColumn("{task.fields[rate]} rows/s, backlog {task.fields[backlog]}"),
                    TimeRemainingColumn(), console=self.console)
                self.progress.start()
                self.task = self.progress.add_task("backfill", total=max(self.estimate, self.rows, 1),
                                                   completed=self.rows, rate="-", backlog="-")
                return
            if kind == "backfill" and self.progress is not None:
                self.rows += f["rows"]
                self.copied_here += f["rows"]
                fields: dict[str, Any] = {"rate": _rate(self.copied_here, self.started)}
                if f.get("capture_pending") is not None:
                    fields["backlog"] = f"{f['capture_pending']:,}"
                self.progress.update(self.task, completed=self.rows, total=max(self.estimate, self.rows), **fields)
                return
            if kind.startswith("reconcile_") and self._reconcile(kind, f):
                return
            if kind == "window_sync":
                self.close()
                lag = "" if f["lag_seconds"] is None else f", lag {f['lag_seconds']:.1f}s"
                self.console.print(f"rollback window of {f['name']!r} open until {f['ends_at']}: keeping the old "
                                   f"table in sync ({f['pending']:,} changes pending{lag})", highlight=False,
                                   markup=False)
                return
            if kind == "index_builds":  # one bar for every build, not a line each
                self.close()
                self.progress = Progress(_label(f"index builds ({f['sessions']} at once)", f, self.console.width),
                                         BarColumn(bar_width=BAR_WIDTH), MofNCompleteColumn(), TimeRemainingColumn(),
                                         console=self.console)
                self.progress.start()
                self.task = self.progress.add_task("index builds", total=f["total"], completed=0)
                self.index_bar = True
                return
            if kind == "index" and self.index_bar and self.progress is not None:
                if f["state"] == "built":
                    self.progress.advance(self.task)
                return
            if kind == "follow":
                self.close()
                lag = "" if f["lag_s"] is None else f", oldest {f['lag_s']:.1f} s old"
                self.console.print(f"{f['step']}: {f['applied']:,} changes applied {f['direction']}, "
                                   f"{f['backlog']:,} pending{lag}", highlight=False, markup=False)
                return
            if kind in ("cutover", "rolled_back"):
                self.close()
                self.console.print(f"{'swapped in' if kind == 'cutover' else 'swapped back'}; lock held "
                                   f"{f['lock_ms']:.1f} ms", highlight=False, markup=False)
                return
            if kind == "index_waiting":  # a build (or ANALYZE) held before it starts, above the bar (kept)
                (self.progress.console if self.progress is not None else self.console).print(
                    f"[dim]{escape(f['what'])} wait[/dim]: {escape(f['reason'])}", highlight=False)
                return
            if kind == "throttle":  # the governor's changes of state, above any bar (kept)
                (self.progress.console if self.progress is not None else self.console).print(
                    f"[dim]throttle[/dim]: {escape(f['message'])}", highlight=False)
                return
            if kind in ("capture", "backfill"):
                return  # frequent and small; `mover status` shows the backlog
            self.close()
            self.console.print(f"[dim]{kind}[/dim] " + " ".join(f"{k}={v}" for k, v in f.items()))

    def _reconcile(self, kind: str, f: dict[str, Any]) -> bool:
        """Reconcile's bar: rows compared (of the source's estimate on a full pass), rows/s,
        differences found so far. Returns False for what should print as a line."""
        if kind == "reconcile_start":
            self.close()
            self.rows, self.estimate, self.copied_here = 0, f.get("estimate") or 0, 0
            self.started = time.monotonic()
            self.progress = Progress(
                _label(f"reconcile ({f['mode']})", f, self.console.width), BarColumn(bar_width=BAR_WIDTH),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]} rows/s, {task.fields[differences]} differ"),
                TimeRemainingColumn(), console=self.console)
            self.progress.start()
            self.task = self.progress.add_task("reconcile", total=self.estimate or None, completed=0, rate="-",
                                               ranges=0, differences=0)
            self.ranges = self.differences = 0
            return True
        if kind == "reconcile_range" and self.progress is not None:
            self.rows += f["rows"]
            self.ranges += 1
            self.differences += f["differences"]
            self.progress.update(self.task, completed=self.rows,
                                 total=max(self.estimate, self.rows) if self.estimate else None,
                                 rate=_rate(self.rows, self.started), ranges=self.ranges, differences=self.differences)
            return True
        if kind == "reconcile_waiting" and self.progress is not None:
            self.progress.console.print(f"[dim]reconcile waits[/dim]: {f['reason']}")  # above the bar, kept
            return True
        return kind == "reconcile_range"

    def close(self) -> None:
        self.index_bar = False
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


RATE_AFTER_SECONDS = 1.0


# What the figures beside a bar take (the bar, rows done of the total, rows/s, the backlog, the ETA).
FIGURES_WIDTH = 62


def _label(what: str, f: dict[str, Any], width: int) -> TextColumn:
    """A bar's name: what it counts, and the table it works on (a family's tables each have their
    turn). Cut with an ellipsis where the terminal is too narrow for it and the figures, which
    are never cut."""
    table = f.get("table")
    return TextColumn(escape(what + (f" {table}" if table else "")),
                      table_column=Column(no_wrap=True, overflow="ellipsis",
                                          max_width=max(len(what), width - FIGURES_WIDTH)))


def _rate(rows: int, started: float) -> str:
    """rows/s since `started`, or "-" within its first second: a rate over a few milliseconds says
    nothing and, in the billions, would push the bar past the terminal's width."""
    elapsed = time.monotonic() - started
    return f"{rows / elapsed:,.0f}" if elapsed >= RATE_AFTER_SECONDS else "-"
