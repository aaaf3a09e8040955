"""The pure parts of `mover watch` and `mover report`: sparklines, rates from samples, the SVG
chart, the sampling interval. No database."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

from mover.runner import sampler
from mover.state import samples
from mover.views import report, watch

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_sparkline_scales_to_its_maximum_and_keeps_the_last_values():
    assert watch.sparkline([]) == ""
    assert watch.sparkline([0, 4, 8]) == "▁▅█"
    assert watch.sparkline([0, 0]) == "▁▁"  # all zero: flat, not a division by zero
    assert watch.sparkline(list(range(100)), width=10) == watch.sparkline(list(range(90, 100)), width=10)


def test_rates_between_samples_skip_a_counter_that_restarts():
    points = [{"at": at(0), "reconcile_rows": 0}, {"at": at(5), "reconcile_rows": 500},
              {"at": at(10), "reconcile_rows": 100},  # a new pass counts from zero again
              {"at": at(15), "reconcile_rows": 1100}, {"at": at(15), "reconcile_rows": 1200}]
    assert samples.rates(points, "reconcile_rows") == [(at(5), 100.0), (at(15), 200.0)]


def test_sampling_interval_grows_with_the_run():
    s = sampler.Sampler(1, "me", min_seconds=5)
    assert s.due()  # nothing recorded yet
    s.last = time.monotonic()
    assert not s.due()
    s.last -= 6
    assert s.due()
    # After ten hours the interval is a thousandth of the age (36 s): 6 s since the last is not enough.
    s.started -= 36_000
    assert not s.due()
    s.last -= 31
    assert s.due()


class _Svg(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []
        self.text = ""

    def handle_starttag(self, tag, attrs):
        if tag == "path":
            self.paths.append(dict(attrs)["d"])

    def handle_data(self, data):
        self.text += data


def test_line_chart_draws_each_series_with_two_points_and_escapes_labels():
    chart = report.line_chart("rows/s <over> time", {
        "a&b": [(at(0).isoformat(), 0.0), (at(10).isoformat(), 50.0), (at(20).isoformat(), 100.0)],
        "lonely": [(at(5).isoformat(), 3.0)]}, "rows/s")
    p = _Svg()
    p.feed(chart)
    assert len(p.paths) == 1 and p.paths[0].startswith("M") and p.paths[0].count("L") == 2
    xs = [float(seg[1:].split(",")[0]) for seg in p.paths[0].split()]
    ys = [float(seg.split(",")[1]) for seg in p.paths[0].split()]
    assert xs == sorted(xs) and ys == sorted(ys, reverse=True)  # time rightwards, growth upwards
    assert "<over>" not in chart and "rows/s <over> time" in p.text and "a&b" in p.text
    assert "lonely (no data)" in p.text


def test_line_chart_without_samples_says_so():
    assert "no samples recorded" in report.line_chart("lag", {"forward": []}, "s")
