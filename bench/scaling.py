"""Scaling curve (issues #12, #36): a whole migration at several table sizes against the single
statement on the same table, each step's time, time per row, the capture backlog, the peak memory
of mover and the cutover's lock hold, drawn as an SVG chart.

    .venv/bin/python bench/scaling.py [--sizes 1000000,10000000,30000000] [--shape narrow|wide]
                                      [--tps 200] [--backlog-every 2] [--dsn DSN] [--chart bench/scaling.svg]

The 100 M-row figure (issue 36): `--sizes 1000000,10000000,100000000`, about 50 GiB of disk at
its peak (below); the wide shape at `--sizes 10000000 --shape wide`. Results go to
bench/results/scaling-SHAPE-TIME.json.

For each size, on a fresh database (the previous size's dropped first, and each size's dropped
once its figures are read, so the disk holds one size at a time):

1. the generated table (bench/common.py generate: one INSERT ... SELECT FROM generate_series on
   the server, nothing held in Python);
2. the single statement, the writers off (the bound): `INSERT INTO copy SELECT * FROM source`
   into a table with only the primary key, then the shape's secondary index builds one after the
   other (bench/common.py single_statement); the copy is dropped right after, before mover's
   target exists, so the disk holds the source and one copy at most (plus the WAL);
3. one `mover run PLAN` with `[cutover] auto = true` and a zero rollback window, so the one
   command goes create, capture, backfill, reconcile, cutover, retire, while pgbench writes to the
   table at a fixed rate (--tps, the same at every size: updates, inserts and deletes by random
   key), so the cutover has real changes to drain under its lock and the governor paces mover
   beside them. The writers' achieved tps over the migration is read from their per-second
   progress lines (and how late they ran against their schedule).

Each step's time is read from mover.steps (started_at..finished_at), the lock hold from
mover.migrations.cutover_lock_ms, the peak RSS of the mover process from a wrapper
(bench/common.py), the governor's throttled time from mover.throttle. The capture backlog (the
rows of the migration's change log, mover.m<id>_changes, not applied yet) is sampled by a thread
every --backlog-every seconds with mover's own count (mover/engines/capture/changelog.py pending,
what `mover status` shows), and once when each step starts, so the backlog at the start of the
cutover is exact; the sampler stays cheap however large the log (its interval grows to 50 times
its last count's duration) and does not read the log during the cutover step, whose lock takes
it. mover's own progress samples (the `sample` events its heartbeat records every 5 s) are read
after the run as well. Peak, the value at each step's start, and the series (thinned) are saved.

Reported per size: whole migration and backfill against the single statement (ratios), time per
row (µs/row) of each, so that flatness from 1 M to 100 M reads directly, rows/s of the backfill,
the backlog's peak and its value at the cutover's start, the writers' tps, peak RSS. The results
are saved after every size (a run stopped during a larger size keeps the smaller ones).

Disk: the server's (every database, the WAL, temporary files) is sampled every 5 s and its peak
saved per phase (generate, single statement, mover run). Narrow: about 0.19 GiB of table per
million rows (pg_total_relation_size: 5.6 GiB at 30 M), so about 19 GiB at 100 M; at most the
source and one copy of it exist at once (the single statement's copy, then mover's target), plus
the WAL (max_wal_size 8 GB, a soft limit) and the index builds' sort files: about 50 GiB at the
peak at 100 M (an estimate until a run measures it). generate_series's result is spilled to a
temporary file while the table is generated (a few GiB at 100 M). Wide: about 0.65 GiB of table
per million rows (1.33 GB at 2 M), so about 6.2 GiB at 10 M.

Time should grow linearly with rows and memory stay flat: the chart draws each series with
the line through the origin and the largest size's point, so a departure from linear shows as
the smaller points falling off that line.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/scaling.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import math
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Any

import psycopg

from bench.common import (
    ROOT,
    SHAPES,
    bindir,
    connect,
    create_database,
    drop_database,
    generate,
    mover_cli,
    pgbench_progress,
    save,
    server,
    single_statement,
    table,
    table_bytes,
    timed,
)

DATABASE = "bench_scaling"
SOURCE = "bench_source"
NAME = "bench_scale"
PLAN = """
[migration]
name = "{name}"
source = "{source}"
[cutover]
auto = true
[rollback]
window = "0s"
"""
WRITES = (
    ("update", 6, "\\set id random(1, :maxid)\nUPDATE {t} SET amount = amount + 1 WHERE id = :id;\n"),
    ("insert", 3, "\\set acc random(1, 100000)\nINSERT INTO {t} (created_at, account_id, amount, status, payload)"
                  " VALUES (now(), :acc, 1, 'new', repeat('x', 80));\n"),
    ("delete", 1, "\\set id random(1, :maxid)\nDELETE FROM {t} WHERE id = :id;\n"),
)
STEPS = ("create_target", "install_capture", "backfill", "reconcile", "cutover", "rollback_window", "retire")
# The steps during which the sampler reads the log every --backlog-every seconds; in the cutover
# it reads it once, when the step starts (the swap's lock takes the log too).
SAMPLED_STEPS = ("create_target", "install_capture", "backfill", "reconcile")
POLL_S = 0.2  # how often the sampler reads the migration's step (one row)
COST_FACTOR = 50  # the sampler's interval is at least this many times its last count's duration
SERIES_POINTS = 300  # a saved series is thinned to about this many points, its peak kept


def writers(dsn: str, workdir: Path, rows: int, tps: int) -> tuple[subprocess.Popen, Path]:
    """pgbench at a fixed rate, a progress line a second (wall-clock stamped) into a file: a pipe
    left unread would fill and stop it in a long run."""
    files = []
    for name, weight, script in WRITES:
        f = workdir / f"{name}.sql"
        f.write_text(script.format(t=SOURCE))
        files += ["-f", f"{f}@{weight}"]
    log = workdir / "pgbench.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(bindir() / "pgbench"), "-n", "-c", "2", "-j", "2", "-T", "86400", "-R", str(tps),
                                 "-P", "1", "--progress-timestamp", "-D", f"maxid={rows}", *files, dsn],
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, log


def writers_figures(log: Path, started_at: float, ended_at: float, tps: int) -> dict:
    """The writers' achieved tps over the migration (the whole 1 s intervals inside it) and how
    late they ran against their schedule."""
    text = log.read_text()
    inside = [(t, lag) for at, t, lag in pgbench_progress(text) if started_at + 1 <= at <= ended_at]
    lags = [lag for _, lag in inside if lag is not None]
    out: dict = {"writers_tps_target": tps, "writers_tps": statistics.fmean(t for t, _ in inside) if inside else None,
                 "writers_seconds": len(inside),
                 "writers_lag_ms_median": statistics.median(lags) if lags else None,
                 "writers_lag_ms_max": max(lags, default=None)}
    if not inside:
        out["writers_output"] = text[-2000:]
    return out


class Backlog(threading.Thread):
    """Samples the migration's capture backlog from its own connection while `mover run` runs:
    mover's count of the change log (what `mover status` shows), every `every` seconds in the
    steps before the cutover, and once when each step starts."""

    def __init__(self, dsn: str, name: str, every: float, t0: float) -> None:
        super().__init__(name="backlog", daemon=True)
        self.dsn, self.migration, self.every, self.t0 = dsn, name, every, t0
        self.stop = threading.Event()
        self.samples: list[tuple[float, int]] = []  # (seconds since t0, pending)
        self.at_step: dict[str, int] = {}  # the backlog when the step was first seen
        self.count_ms: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        from mover.engines.capture import changelog
        seen, last, interval = None, -math.inf, self.every
        conn = None
        while not self.stop.wait(POLL_S):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.dsn)
                row = conn.execute("SELECT id, step FROM mover.migrations WHERE name = %s",
                                   (self.migration,)).fetchone()
                if row is None:
                    continue
                mid, step = row
                new = step != seen
                seen = step
                if not ((step in SAMPLED_STEPS and (new or time.monotonic() - last >= interval))
                        or (new and step == "cutover")):
                    continue
                began = time.monotonic()
                with conn.cursor() as cur:
                    pending, _ = changelog.pending(cur, mid)
                took = time.monotonic() - began
                last, interval = began, max(self.every, took * COST_FACTOR)
                self.count_ms.append(took * 1000)
                self.samples.append((round(time.time() - self.t0, 2), pending))
                if new:
                    self.at_step.setdefault(step, pending)
            except psycopg.Error as exc:  # a sample lost, said in the results; the run goes on
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                if conn is not None and conn.broken:
                    conn = None
        if conn is not None:
            conn.close()


class Disk(threading.Thread):
    """The server's disk use every `every` seconds while a size runs: every database, the WAL,
    temporary files (sorts, generate_series's spilled result); the peak of each phase."""

    def __init__(self, dsn: str, every: float = 5.0) -> None:
        super().__init__(name="disk", daemon=True)
        self.dsn, self.every = dsn, every
        self.stop = threading.Event()
        self.phase = "generate"
        self.peaks: dict[str, dict[str, int]] = {}  # phase -> the sample with the largest total

    def run(self) -> None:
        with connect(self.dsn) as conn:
            while not self.stop.wait(self.every):
                try:
                    db, wal, tmp = conn.execute(
                        "SELECT (SELECT sum(pg_database_size(oid)) FROM pg_database WHERE datallowconn),"
                        " (SELECT coalesce(sum(size), 0) FROM pg_ls_waldir()),"
                        " (SELECT coalesce(sum(size), 0) FROM pg_ls_tmpdir())").fetchone()
                except psycopg.Error:  # a database dropped while it was sized: the next sample
                    continue
                got = {"total": int(db) + int(wal) + int(tmp), "databases": int(db), "wal": int(wal),
                       "temp": int(tmp)}
                if got["total"] > self.peaks.get(self.phase, {}).get("total", -1):
                    self.peaks[self.phase] = got


def thin(series: list[tuple[float, int]], points: int = SERIES_POINTS) -> list[tuple[float, int]]:
    """Every k-th point of a long series, and its peak."""
    if len(series) <= points:
        return series
    k = math.ceil(len(series) / points)
    peak = max(series, key=lambda p: p[1])
    return sorted({*series[::k], peak, series[-1]})


def migrate(db: str, rows: int, tps: int, backlog_every: float) -> dict:
    """One `mover run` of the whole lifecycle, the writers on, the backlog sampled; its figures."""
    assert mover_cli(db, "init")[0].returncode == 0
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "scale.toml"
        plan.write_text(PLAN.format(name=NAME, source=SOURCE))
        w = writers(db, Path(tmp), rows, tps) if tps else None
        started_at = time.time()
        sampler = Backlog(db, NAME, backlog_every, started_at)
        sampler.start()
        started = time.perf_counter()
        try:
            proc, rss = mover_cli(db, "run", str(plan))
        finally:
            out["migration_s"] = time.perf_counter() - started
            ended_at = time.time()
            sampler.stop.set()
            if w is not None:
                w[0].terminate()
                w[0].wait()
            sampler.join()
        if w is not None:
            out.update(writers_figures(w[1], started_at, ended_at, tps))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out["rss_kib"] = rss
    with connect(db) as conn:
        steps = conn.execute(
            "SELECT s.name, extract(epoch FROM s.finished_at - s.started_at), extract(epoch FROM s.started_at),"
            " extract(epoch FROM s.finished_at) FROM mover.steps s"
            " JOIN mover.migrations m ON m.id = s.migration_id WHERE m.name = %s", (NAME,)).fetchall()
        out["steps_s"] = {name: float(sec or 0) for name, sec, _, _ in steps}
        # each step's start and end in seconds from the run's start, to place the backlog series
        out["steps_at"] = {name: [round(float(a) - started_at, 2) if a is not None else None,
                                  round(float(b) - started_at, 2) if b is not None else None]
                           for name, _, a, b in steps}
        out["cutover_lock_ms"], out["state"] = conn.execute(
            "SELECT cutover_lock_ms, state FROM mover.migrations WHERE name = %s", (NAME,)).fetchone()
        out["copied_rows"] = int(conn.execute(
            "SELECT sum(c.rows) FROM mover.ranges c JOIN mover.migrations m ON m.id = c.migration_id"
            " WHERE m.name = %s AND c.kind = 'backfill'", (NAME,)).fetchone()[0] or 0)
        drained = conn.execute(
            "SELECT e.detail ->> 'drained' FROM mover.events e JOIN mover.migrations m ON m.id = e.migration_id"
            " WHERE m.name = %s AND e.kind = 'step_done' AND e.step = 'cutover' ORDER BY e.id DESC LIMIT 1",
            (NAME,)).fetchone()
        out["cutover_drained"] = int(drained[0]) if drained and drained[0] is not None else None
        # mover's own progress samples (its heartbeat's, every 5 s): the backlog as mover status saw it
        own = [(round(float(at) - started_at, 2), int(n)) for at, n in conn.execute(
            "SELECT extract(epoch FROM e.at), (e.detail ->> 'pending_forward')::bigint FROM mover.events e"
            " JOIN mover.migrations m ON m.id = e.migration_id WHERE m.name = %s AND e.kind = 'sample'"
            " AND e.detail ->> 'pending_forward' IS NOT NULL ORDER BY e.id", (NAME,)).fetchall()]
        throttled = conn.execute("SELECT t.throttled_seconds FROM mover.throttle t JOIN mover.migrations m"
                                 " ON m.id = t.migration_id WHERE m.name = %s", (NAME,)).fetchone()
        out["throttled_s"] = float(throttled[0]) if throttled and throttled[0] is not None else None
    out["target_bytes"] = table_bytes(db, SOURCE)  # the new table, under the source's name now
    ours = sampler.samples
    out["backlog_peak"] = max((n for _, n in [*ours, *own]), default=None)
    out["backlog_at_cutover"] = sampler.at_step.get("cutover")
    out["backlog_at_step_start"] = sampler.at_step
    out["backlog_series"] = thin(ours)
    out["backlog_mover_samples"] = thin(own)
    out["backlog_samples"] = len(ours)
    out["backlog_count_ms_max"] = max(sampler.count_ms, default=None)
    if sampler.errors:
        out["backlog_errors"] = sampler.errors[:10]
    return out


def one_size(dsn: str, rows: int, shape: str, tps: int, backlog_every: float) -> dict:
    db = create_database(dsn, DATABASE)  # the previous size's dropped first
    out: dict = {"rows": rows}
    disk = Disk(dsn)
    disk.start()
    try:
        out["generate_s"] = timed(lambda: generate(db, SOURCE, rows, shape))
        out["table_bytes"] = table_bytes(db, SOURCE)
        print(f"  generated in {out['generate_s']:.1f} s, {out['table_bytes'] / 2**30:.2f} GiB", flush=True)
        # The bound first, the writers off, on the table as generated; its copy is dropped before
        # mover's target exists.
        disk.phase = "single statement"
        out["single_statement"] = single_statement(db, SOURCE, shape)
        print(f"  single statement {out['single_statement']['total_s']:.1f} s", flush=True)
        disk.phase = "mover run"
        out.update(migrate(db, rows, tps, backlog_every))
    finally:
        disk.stop.set()
        disk.join()
    out["disk_peak"] = disk.peaks
    drop_database(dsn, DATABASE)  # the disk is free before the next size (or the end)
    return out


# ---------------------------------------------------------------------------------------------
# The chart: plain SVG, no plotting library


def _panel(x0: float, y0: float, w: float, h: float, title: str, ylabel: str, xs: list[float],
           series: list[tuple[str, str, list[float]]], linear: bool = True) -> list[str]:
    xmax = max(xs) * 1.05
    ymax = max(max(v) for _, _, v in series) * 1.15 or 1

    def px(x: float) -> float:
        return x0 + x / xmax * w

    def py(y: float) -> float:
        return y0 + h - y / ymax * h

    out = [f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
           f'<text x="{x0 + w / 2}" y="{y0 - 12}" text-anchor="middle" font-weight="bold">{title}</text>',
           f'<text x="{x0 - 48}" y="{y0 + h / 2}" text-anchor="middle" '
           f'transform="rotate(-90 {x0 - 48} {y0 + h / 2})">{ylabel}</text>',
           f'<text x="{x0 + w / 2}" y="{y0 + h + 36}" text-anchor="middle">million rows</text>']
    for i in range(5):
        yv = ymax * i / 4
        out.append(f'<line x1="{x0}" y1="{py(yv):.1f}" x2="{x0 + w}" y2="{py(yv):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 6}" y="{py(yv) + 4:.1f}" text-anchor="end" font-size="11">{yv:,.0f}</text>')
    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{x:g}</text>')
    for i, (name, color, ys) in enumerate(series):
        # the line through the origin and the largest point: linear growth puts every point on it
        if linear:
            out.append(f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(xs[-1]):.1f}" y2="{py(ys[-1]):.1f}" '
                       f'stroke="{color}" stroke-dasharray="4 4" stroke-opacity="0.6"/>')
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in zip(xs, ys, strict=True):
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}"/>')
            out.append(f'<text x="{px(x) + 5:.1f}" y="{py(y) - 6:.1f}" font-size="10" fill="{color}">{y:,.1f}</text>')
        out.append(f'<rect x="{x0 + 10}" y="{y0 + 10 + 16 * i}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x0 + 26}" y="{y0 + 19 + 16 * i}" font-size="12">{name}</text>')
    return out


def _single_s(s: dict) -> float | None:
    return (s.get("single_statement") or {}).get("total_s")


def chart(r: dict) -> str:
    """Three panels: time (the migration, its backfill and reconcile, the single statement),
    memory and lock, the capture backlog. A result from before issue 36 (no single statement, no
    backlog) draws those series at 0."""
    sizes = r["sizes"]
    xs = [s["rows"] / 1e6 for s in sizes]
    time_series = [
        ("whole migration (mover run)", "#1f77b4", [s["migration_s"] for s in sizes]),
        ("backfill step", "#2ca02c", [s["steps_s"].get("backfill", 0) for s in sizes]),
        ("reconcile step", "#d62728", [s["steps_s"].get("reconcile", 0) for s in sizes])]
    if any(_single_s(s) for s in sizes):
        time_series.append(("single statement + index builds (bound)", "#7f7f7f",
                            [_single_s(s) or 0 for s in sizes]))
    left = _panel(80, 50, 420, 300, "time", "seconds", xs, time_series)
    middle = _panel(620, 50, 420, 300, "memory and lock", "MiB / ms", xs, [
        ("peak RSS of mover, MiB", "#9467bd", [s["rss_kib"] / 1024 for s in sizes]),
        ("cutover lock hold, ms", "#ff7f0e", [float(s["cutover_lock_ms"] or 0) for s in sizes])], linear=False)
    right = _panel(1160, 50, 420, 300, "capture backlog", "changes not applied", xs, [
        ("peak during the run", "#8c564b", [float(s.get("backlog_peak") or 0) for s in sizes]),
        ("at the cutover's start", "#e377c2", [float(s.get("backlog_at_cutover") or 0) for s in sizes])],
        linear=False)
    caption = (f"{r['shape']} table, pgbench writing {r['tps']} tps throughout each migration (not during the "
               f"single statement); {r['server'].split(' on ')[0]}; dashed (time): the line through the origin "
               "and the largest size")
    body = "\n".join([*left, *middle, *right, f'<text x="80" y="420" font-size="12">{caption}</text>'])
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="1620" height="440" font-family="sans-serif" '
            f'font-size="13">\n<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n')


def _f(value: Any, fmt: str, scale: float = 1) -> str:
    return "-" if value is None else format(value * scale, fmt)


def report(r: dict) -> str:
    """The table per size; a result from before issue 36 shows "-" where it has no figure."""
    out = []
    for s in r["sizes"]:
        st = s["steps_s"]
        backfill = st.get("backfill", 0)
        single = _single_s(s)
        per_row = 1e6 / s["rows"]
        out.append((f"{s['rows']:,}", f"{s['table_bytes'] / 2**30:.2f}", _f(single, ".1f"),
                     f"{s['migration_s']:.1f}", _f(s["migration_s"] / single if single else None, ".2f"),
                     f"{s['migration_s'] * per_row:.2f}",
                     f"{backfill:.1f}", _f(backfill / single if single else None, ".2f"), f"{backfill * per_row:.2f}",
                     f"{s['copied_rows'] / max(backfill, 1e-9):,.0f}", f"{st.get('reconcile', 0):.1f}",
                     f"{st.get('cutover', 0):.1f}", f"{float(s['cutover_lock_ms'] or 0):.1f}",
                     _f(s.get("backlog_peak"), ","), _f(s.get("backlog_at_cutover"), ","),
                     _f(s.get("writers_tps"), ".0f"), f"{s['rss_kib'] / 1024:.0f}"))
    notes = []
    for s in r["sizes"]:
        if "single_statement" in s:
            ss = s["single_statement"]
            notes.append(f"- {s['rows']:,} rows: single statement copy {ss['copy_s']:.1f} s + index builds "
                         f"{ss['indexes_s']:.1f} s; governor throttled {_f(s.get('throttled_s'), '.1f')} s; "
                         f"backlog {_f(s.get('backlog_at_step_start', {}).get('reconcile'), ',')} at the backfill's "
                         f"end, {_f(s.get('cutover_drained'), ',')} drained under the lock; writers "
                         f"{_f(s.get('writers_tps'), '.0f')} of {s.get('writers_tps_target', r['tps'])} tps, "
                         f"schedule lag median {_f(s.get('writers_lag_ms_median'), '.1f')} ms, "
                         f"max {_f(s.get('writers_lag_ms_max'), '.1f')} ms; disk at most "
                         + ", ".join(f"{d['total'] / 2**30:.1f} GiB ({phase}; WAL {d['wal'] / 2**30:.1f})"
                                     for phase, d in s.get("disk_peak", {}).items()))
    return (f"{r['shape']} table, pgbench {r['tps']} tps during each migration (the single statement: writers off); "
            f"{r['server']}\n\n"
            + table(out, ("rows", "GiB", "single statement s", "whole migration s", "whole / single",
                          "whole µs/row", "backfill s", "backfill / single", "backfill µs/row", "backfill rows/s",
                          "reconcile s", "cutover s", "cutover lock ms", "backlog peak", "backlog at cutover",
                          "writers tps", "peak RSS MiB"))
            + ("\n\n" + "\n".join(notes) if notes else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,10000000,30000000")
    ap.add_argument("--shape", choices=SHAPES, default="narrow")
    ap.add_argument("--tps", type=int, default=200, help="pgbench's fixed write rate during each migration (0: none)")
    ap.add_argument("--backlog-every", type=float, default=2.0,
                    help="seconds between the sampler's counts of the change log (longer if a count is slow)")
    ap.add_argument("--dsn", help="an existing server (superuser); default: start one")
    ap.add_argument("--chart", default=str(ROOT / "bench" / "scaling.svg"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict = {"shape": args.shape, "tps": args.tps, "sizes": [],
                     "command": " ".join(["bench/scaling.py", *sys.argv[1:]])}
    with server(args.dsn) as (dsn, _):
        with connect(dsn) as conn:
            results["server"] = conn.execute("SELECT version()").fetchone()[0]
        path = None
        for rows in sizes:
            print(f"{rows:,} rows ...", flush=True)
            results["sizes"].append(one_size(dsn, rows, args.shape, args.tps, args.backlog_every))
            print({k: v for k, v in results["sizes"][-1].items() if not k.startswith("backlog_series")
                   and k != "backlog_mover_samples"}, flush=True)
            # after every size: a run stopped during a larger one keeps the smaller ones
            if path is not None:
                path.unlink()
            path = save(f"scaling-{args.shape}", results)
            Path(args.chart).write_text(chart(results))
    print(report(results))
    print(f"\nresults: {path}\nchart: {args.chart}")


if __name__ == "__main__":
    main()
