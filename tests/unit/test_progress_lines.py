"""The console's lines for engine reports: words and one number format, one bar for index builds."""

from __future__ import annotations

import io
import time

from rich.console import Console

from mover.views.progress import ProgressReporter


def said(*reports: tuple[str, dict]) -> str:
    buf = io.StringIO()
    reporter = ProgressReporter(Console(file=buf, width=200, color_system=None))
    for kind, fields in reports:
        reporter(kind, **fields)
    reporter.close()
    return buf.getvalue()


def test_index_builds_are_one_bar_not_a_line_each():
    builds = [("index", {"name": f"p{i}_idx", "state": s}) for i in range(20) for s in ("building", "built")]
    text = said(("index_builds", {"total": 20, "sessions": 2}), *builds)
    assert "state=" not in text and "p3_idx" not in text, text


def test_swap_follow_and_window_lines_read_as_words():
    text = said(("cutover", {"lock_ms": 17.61}), ("rolled_back", {"lock_ms": 47.5}),
                ("follow", {"step": "cutover", "direction": "forward", "applied": 9004, "backlog": 4572,
                            "lag_s": None}),
                ("window_sync", {"name": "m", "ends_at": "2026-12-02T05:00:00+00:00", "pending": 12345,
                                 "lag_seconds": 1.25}))
    assert "swapped in; lock held 17.6 ms" in text and "swapped back; lock held 47.5 ms" in text, text
    assert "cutover: 9,004 changes applied forward, 4,572 pending" in text and "None" not in text, text
    assert "12,345 changes pending" in text, text


def test_the_bars_fit_an_80_column_terminal_uncut():
    buf = io.StringIO()
    reporter = ProgressReporter(Console(file=buf, width=80, force_terminal=True, color_system=None))
    reporter("reconcile_start", mode="full", estimate=300_000)
    reporter("reconcile_range", rows=30_020, differences=0)
    reporter.close()
    reporter("backfill_start", estimate=2_000_000, rows=0, workers=2)
    reporter("backfill", rows=1_234_567, worker="w1", range_rows=134_465, capture_pending=12_345)
    reporter.close()
    text = buf.getvalue()
    assert "30020/300000" in text and "1234567/2000000" in text and "…" not in text, text


def test_a_rate_is_shown_only_after_its_first_second():
    from mover.views.progress import _rate
    assert _rate(1_234_567, time.monotonic()) == "-"  # microseconds in: no rate, whatever the rows
    assert _rate(3_000, time.monotonic() - 2) in ("1,500", "1,499")


def test_each_bar_names_its_table_and_the_figures_stay_uncut_at_80_columns():
    """A family's tables take their turns: each bar says whose rows it counts (issue 35)."""
    table = '"public"."auth_user_user_permissions"'
    wide = said(("backfill_start", {"estimate": 3000, "rows": 0, "workers": 1, "table": table}),
                ("backfill", {"rows": 1500}),
                ("index_builds", {"total": 2, "sessions": 1, "table": table}),
                ("reconcile_start", {"mode": "full", "estimate": 3000, "table": table}),
                ("reconcile_range", {"rows": 3000, "differences": 0}))
    for bar in ("backfill", "index builds (1 at once)", "reconcile (full)"):
        assert f"{bar} {table}" in wide, wide
    buf = io.StringIO()
    reporter = ProgressReporter(Console(file=buf, width=80, force_terminal=True, color_system=None))
    reporter("backfill_start", estimate=2_000_000, rows=0, workers=2, table=table)
    reporter("backfill", rows=1_234_567, capture_pending=12_345)
    reporter.close()
    assert "1234567/2000000" in buf.getvalue() and "backfill" in buf.getvalue(), buf.getvalue()
