"""Range sizing and the rows/s cap, without a database: the adaptive range size, the cap's
budget per range and the wait after each range."""

from __future__ import annotations

import pytest

from mover.engines.bulk.backfill import limits, next_range_rows
from mover.engines.governor import throttle
from mover.plan import BackfillSettings


def Throttle(settings: BackfillSettings, workers: int = 1) -> throttle.Throttle:  # noqa: N802 (reads as the class)
    """The backfill's throttle for these settings."""
    return throttle.Throttle(limits(settings), workers)

S = BackfillSettings(target_range_ms=500, min_rows=1_000, max_rows=200_000)


def test_next_range_moves_halfway_toward_the_target_time():
    # 10k rows took 1000 ms: 5k would take 500 ms; halfway from 10k is 7.5k.
    assert next_range_rows(10_000, 10_000, 1000, S) == 7_500
    # Fast range: 10k in 100 ms aims at 50k; halfway is 30k.
    assert next_range_rows(10_000, 10_000, 100, S) == 30_000


def test_next_range_stays_within_min_and_max_rows():
    assert next_range_rows(1_000, 1_000, 60_000, S) == 1_000
    assert next_range_rows(200_000, 200_000, 1, S) == 200_000


@pytest.mark.parametrize("rows, ms", [(0, 100), (100, 0), (-1, 5)])
def test_an_empty_or_unmeasured_range_keeps_the_size(rows, ms):
    assert next_range_rows(12_345, rows, ms, S) == 12_345


def test_range_rows_without_a_cap_is_the_hint_within_max_rows():
    t = Throttle(S)
    assert t.range_rows(5_000) == 5_000
    assert t.range_rows(10**9) == 200_000


def test_range_rows_fits_the_cap_within_target_time_shared_by_workers():
    capped = BackfillSettings(target_range_ms=500, min_rows=1_000, max_rows=200_000, max_rows_per_second=4_000)
    assert Throttle(capped, workers=1).range_rows(50_000) == 2_000  # 4000 rows/s * 0.5 s
    assert Throttle(capped, workers=4).range_rows(50_000) == 500  # the cap wins over min_rows
    slow = BackfillSettings(target_range_ms=5_000, max_rows_per_second=4_000)
    assert Throttle(slow).range_rows(50_000) == 4_000  # a range is one burst: at most a second's worth
    tiny = BackfillSettings(max_rows_per_second=1)
    assert Throttle(tiny, workers=8).range_rows(50_000) == 1  # never zero


def test_pace_waits_out_the_rest_of_the_cap():
    t = Throttle(BackfillSettings(max_rows_per_second=1_000), workers=2)  # 500 rows/s per worker
    assert t.pace(1_000, 0.5) == (pytest.approx(1.5), "rows/s cap 1000")
    assert t.pace(1_000, 3.0) == (0.0, None)  # already slower than the cap
    assert Throttle(BackfillSettings(max_rows_per_second=0)).pace(10**6, 0.001) == (0.0, None)


def test_the_gate_before_a_range_waits_while_paused_else_sizes_the_range():
    # The one question the range loop asks before each claim (mover/engines/bulk/rangework.py).
    capped = Throttle(BackfillSettings(target_range_ms=500, max_rows_per_second=4_000))
    paused = capped.gate(paused=True, hint=50_000)
    assert (paused.wait, paused.seconds > 0, paused.rows) == ("paused (mover unpause)", True, 0)
    go = capped.gate(paused=False, hint=50_000)
    assert (go.wait, go.rows) == (None, 2_000)  # the cap's budget of one range
