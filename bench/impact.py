"""Application impact (issue 25): what an application writing the source at a fixed rate pays for
each of mover's bulk phases, governed (mover's defaults) and ungoverned
(`[throttle] max_latency_increase = "off"`), side by side in one run on one server.

    .venv/bin/python -m bench.impact [--rows 2000000] [--shape narrow] [--clients 2] [--share 0.5]
                                     [--skip burst] [--skip applier] [--dsn DSN]
    .venv/bin/python -m bench.impact --signals [--rows 2000000]
    .venv/bin/python -m bench.impact --versus-control --wal-ahead 3000 [--rows 2000000] [--versus-period 1]

1. The machine's capacity: pgbench (the writers of bench/backfill.py: 60 % updates, 30 % inserts,
   10 % deletes by random id, `--clients` clients) at full speed for `--capacity-seconds`; then
   the writers run at `--share` of it (`pgbench -R`) with a per-transaction log, whose latency
   counts from each transaction's scheduled start (queueing included: what the application
   waits).
2. For each mode (governed, then ungoverned; a fresh migration each, the source vacuumed before):
   the writers alone for `--idle-seconds` (the reference), then `mover step` through the
   backfill and reconcile. The phases' windows come from mover's own events: the copy (the step's
   start to its `drained` event; the applier replays beside it), the index builds and ANALYZE
   (`drained` to the step's end), reconcile (its step). For each window: the writers' TPS
   (transactions completed in it per second), their p50 and p99 latency, against the reference;
   and the backfill step's duration. `--waits`: what the writers waited on meanwhile
   (pg_stat_activity sampled every 4 ms, itself a load), for their transactions over 25 ms.
3. The applier alone (`--skip applier` leaves it out): another migration's backfill is paused at
   60 % for `--backlog-seconds` while the writers go on (the change log grows for the copied
   ranges), then its copy is capped to one row a second and unpaused: the backfill's applier
   replays the backlog nearly alone for `--applier-seconds`: that window's figures.
4. The burst (governed only; `--skip burst`): a third backfill, and at a third of it a second
   pgbench at full speed beside the first for `--burst-seconds`: the time from the burst's start
   to the governor's `throttled` event, from its end to `released`, and the copy's rows/s
   before, during and after.

5. The control (`--control`), no mover at all: the writers at `--share`; an idle spell; for
   `--control-seconds` a plain INSERT ... SELECT of `--control-rows` source rows into a table of
   the source's shape once a second (synchronous_commit off, as mover's ranges); an idle spell;
   the same duty of a statement that only spends CPU; an idle spell. What a bulk write that size
   costs the writers on this machine whoever runs it, and how far idle spells differ.

6. Side by side (`--side-by-side`), no mover at all: the writers at `--share`; on a copy of the
   source, a plain CREATE INDEX alone, then two at once, then a CPU-bound query alone and two at
   once, between idle spells. What a statement that cannot be paced costs the writers, and what
   a second beside it does.

7. mover against the best plain alternative (`--versus-control`, issue 36), instead of 2-6: one
   pgbench at `--share` throughout, five parts (b' included), each after VACUUM and CHECKPOINT of
   the source, `--idle-seconds / 2` for the writers' queue to drain, and an idle spell of
   `--idle-seconds`:
   a. mover's backfill step governed (the defaults), a fresh migration: its copy window (the
      step's start to `drained`), its index builds and ANALYZE (`drained` to the step's end), the
      rows copied and their average rate over the copy window;
   b. the control, no mover: the same rows (the source's first as many by key as mover copied)
      into an empty table of the target's shape (its key alone) by plain `INSERT INTO ... SELECT
      ... WHERE id > lo AND id <= hi`, synchronous_commit off as mover's ranges, a statement every
      `--versus-period` seconds (default 1) sized to mover's average rate; then the same secondary
      indexes one at a time by plain CREATE INDEX (not CONCURRENTLY: nobody writes that table, so
      CONCURRENTLY would only scan twice and wait on others' transactions), without parallel
      workers, and ANALYZE. `--versus-period` given more than once: one such part per period;
   b'. the live control (`--skip live-control` leaves it out): b again, with the capture mover
      installs (its change log, trigger function and triggers on the writers' table, installed
      by mover's own code after the idle spell, as mover's is) and a replay session beside the
      copy running mover's replay statement as its applier does (a batch of up to 5,000 logged
      keys at or below the copy's frontier a transaction, the next at once after a full one, else
      after 0.2 s); its copy window ends once the log is drained, as mover's does at `drained`;
      the trigger stays through the builds and is removed (by mover's code) after the tail, and
      the source's triggers are listed before and after. What mover's copy window carries and b
      does not, measured apart: mover governed over it, and it over b, by the worst second;
   c. one `INSERT ... SELECT` of the same rows at full speed (no builds), labelled apart: the same
      rows, not at the same rate;
   d. mover's backfill ungoverned (`--skip ungoverned` leaves it out): the governed step's
      duration over this one's.
   Each part's whole window runs from its copy's start to a second past its last statement.
   Per window, the writers' seconds (their transactions by the second of completion; a second
   with fewer than five is left out): the worst second by its mean latency (the headline: every
   transaction queued behind a stall counts in it) and by its p99, the median second's mean, TPS
   against the first idle spell; then mover governed's worst second over the gentlest paced
   control's (the lowest worst second over its whole window), copy, builds and whole. mover's
   windows include what its capture trigger costs the writers and its applier's replay, which
   the plain controls do not have and the live control has (`capture_share` in the results:
   the three side by side, mover over the live control and the live control over the plain).
   The committed run should use `--wal-ahead` (3000 MB for the 2 M-row table): without it each
   part finds only the segments the parts before it left recycled, and a new segment is written
   out whole while the writers' commits wait, so the order of the parts would weigh on the
   figures. Each part's count of segments ready is reported.

`--wal-ahead MB` keeps that much WAL recycled ahead (min_wal_size raised, the segments made once
at the start), as on a server that has run a while. `--waits --timeline PATH` also writes each
mode's transactions, wait samples, mover's statements and unwritten WAL / page cache / disk
writes to PATH-<mode>.json.

`--signals` instead measures what the governor's signal is worth: the writers at `--share`, and
every 250 ms a probe on a logged table (the governor's, mover/engines/governor/signals.py), one on an
unlogged table, and the count of active application sessions (all and waiting on Lock, LWLock
or IO), while an ungoverned migration copies, builds and reconciles between idle spells. Per
second: the writers' median and mean latency against each signal's median (Pearson's r).

The machine this runs on must be otherwise quiet: every figure here is a ratio of two windows of
one run, but a neighbour's load lands in one window and not the other.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/impact.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import contextlib
import itertools
import json
import math
import re
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bindir, connect, create_database, generate, index_defs, mover_cli, save, server, table

SOURCE = "bench_source"
SCRIPTS = {
    "update": f"\\set id random(1, :maxid)\nUPDATE {SOURCE} SET amount = amount + 1, status = 'paid' WHERE id = :id;\n",
    "insert": f"\\set acc random(1, 100000)\nINSERT INTO {SOURCE} (created_at, account_id, amount, status, payload)"
              f" VALUES (now(), :acc, 1, 'new', repeat('x', 80));\n",
    "delete": f"\\set id random(1, :maxid)\nDELETE FROM {SOURCE} WHERE id = :id;\n",
}

PLAN = """
[migration]
name = "{name}"
source = "{source}"

[target]
columns = {{ account_id = "bigint" }}

[rollback]
window = "1h"
{throttle}
"""

UNGOVERNED = '\n[throttle]\nmax_latency_increase = "off"\n'
PHASES = ("copy", "index builds", "reconcile", "applier")


# ---------------------------------------------------------------------------------------------
# The writers


class Writers:
    """pgbench writing the source: at full speed (rate None), or at `rate` tps with a
    per-transaction log, for `seconds` (or until stop())."""

    def __init__(self, dsn: str, workdir: Path, rows: int, clients: int, rate: float | None, seconds: int,
                 name: str):
        files = []
        for script, weight in (("update", 6), ("insert", 3), ("delete", 1)):
            f = workdir / f"{script}.sql"
            f.write_text(SCRIPTS[script])
            files += ["-f", f"{f}@{weight}"]
        self.logdir = workdir / name
        self.logdir.mkdir(exist_ok=True)
        extra = ["-R", str(rate), "--log", "--log-prefix", str(self.logdir / "log")] if rate else []
        self.proc = subprocess.Popen([str(bindir() / "pgbench"), "-n", "-c", str(clients), "-j", str(clients),
                                      "-T", str(seconds), "-D", f"maxid={rows}", *extra, *files, dsn],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.logdir)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: pgbench writes its logs and ends
        out, err = self.proc.communicate(timeout=120)
        return out + err

    def transactions(self) -> list[tuple[float, float]]:
        """(completion time as epoch seconds, latency ms) of every logged transaction."""
        out = []
        for path in self.logdir.glob("log*"):
            for line in path.read_text().splitlines():
                f = line.split()
                if len(f) >= 6 and f[2].isdigit():
                    out.append((int(f[4]) + int(f[5]) / 1e6, int(f[2]) / 1000))
        return sorted(out)


def capacity(dsn: str, workdir: Path, rows: int, clients: int, seconds: int) -> float:
    out = Writers(dsn, workdir, rows, clients, None, seconds, "capacity")
    out.proc.wait(seconds + 120)
    text = out.stop()
    got = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
    if not got:
        raise RuntimeError(f"pgbench printed no tps: {text[-500:]}")
    return float(got.group(1))


def _quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of a sorted, non-empty list (the nearest rank below)."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def window(txns: list[tuple[float, float]], a: float, b: float) -> dict[str, Any]:
    """The writers' figures over [a, b): TPS (completions per second), p50 and p99 latency."""
    lat = sorted(ms for at, ms in txns if a <= at < b)
    if not lat or b <= a:
        return {"seconds": round(max(b - a, 0), 2), "transactions": len(lat), "tps": None, "p50_ms": None,
                "p99_ms": None}
    return {"seconds": round(b - a, 2), "transactions": len(lat), "tps": round(len(lat) / (b - a), 1),
            "p50_ms": round(_quantile(lat, 0.5), 2), "p99_ms": round(_quantile(lat, 0.99), 2)}


def per_second(txns: list[tuple[float, float]], a: float, b: float = math.inf,
               least: int = 5) -> dict[int, list[float]]:
    """The latencies (ms) of the transactions completed in [a, b), by the second since `a`; a
    second with fewer than `least` of them is left out (too few for a mean or a tail)."""
    out: dict[int, list[float]] = {}
    for at, ms in txns:
        if a <= at < b:
            out.setdefault(int(at - a), []).append(ms)
    return {s: v for s, v in out.items() if len(v) >= least}


def seconds_window(txns: list[tuple[float, float]], a: float, b: float) -> dict[str, Any]:
    """window()'s figures over [a, b), and the writers' latency second by second from `a`: each
    second's mean and p99; the worst second by each, and the median second's mean. A stall shows
    in the mean of the seconds it spans (every transaction queued behind it counts, from its
    schedule), where a whole window's p99 blurs it with the calm seconds around it."""
    out = window(txns, a, b)
    secs = per_second(txns, a, b)
    if not secs:
        return {**out, "seconds_counted": 0, "median_second_mean_ms": None, "worst_second_mean_ms": None,
                "worst_second_mean_at_s": None, "worst_second_p99_ms": None, "worst_second_p99_at_s": None}
    means = {s: statistics.fmean(v) for s, v in secs.items()}
    p99s = {s: _quantile(sorted(v), 0.99) for s, v in secs.items()}
    worst_mean, worst_p99 = max(means, key=means.__getitem__), max(p99s, key=p99s.__getitem__)
    return {**out, "seconds_counted": len(secs), "median_second_mean_ms": round(statistics.median(means.values()), 2),
            "worst_second_mean_ms": round(means[worst_mean], 2), "worst_second_mean_at_s": worst_mean,
            "worst_second_p99_ms": round(p99s[worst_p99], 2), "worst_second_p99_at_s": worst_p99,
            "by_second": [(s, len(secs[s]), round(means[s], 2), round(p99s[s], 2)) for s in sorted(secs)]}


# ---------------------------------------------------------------------------------------------
# mover


def plan(workdir: Path, name: str, governed: bool, args, extra: str = "") -> Path:
    """The migration's plan; `args.plan_extra` (--plan-extra) appended to it."""
    p = workdir / f"{name}.toml"
    p.write_text(PLAN.format(name=name, source=SOURCE, throttle=("" if governed else UNGOVERNED) + extra)
                 + args.plan_extra.replace("\\n", "\n"))
    return p


def step(dsn: str, *args: str, codes: tuple[int, ...] = (0,)) -> float:
    started = time.time()
    proc, _ = mover_cli(dsn, "step", *args)
    if proc.returncode not in codes:
        raise RuntimeError(f"mover step {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return time.time() - started


def cli(dsn: str, *args: str) -> None:
    proc, _ = mover_cli(dsn, *args)
    if proc.returncode != 0:
        raise RuntimeError(f"mover {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")


def event_times(dsn: str, name: str) -> list[tuple[float, str, str, Any]]:
    with connect(dsn) as conn:
        return conn.execute(
            "SELECT extract(epoch FROM e.at)::float8, e.kind, e.message, e.detail FROM mover.events e"
            " JOIN mover.migrations m ON m.id = e.migration_id WHERE m.name = %s AND e.kind <> 'sample'"
            " ORDER BY e.id", (name,)).fetchall()


def first(evs: list[tuple[float, str, str, Any]], kind: str, after: float = 0.0, step: str | None = None) -> float:
    for at, k, message, _ in evs:
        if k == kind and at >= after and (step is None or message.startswith(step)):
            return at
    raise RuntimeError(f"no {kind} event after {after}")


def backfill_spans(evs: list[tuple[float, str, str, Any]]) -> tuple[float, float, float]:
    """The backfill step's start, its `drained` event (the copy's end, the applier caught up) and
    its end (the index builds and ANALYZE between the last two), from mover's events."""
    started = first(evs, "step_started", step="backfill")
    drained = first(evs, "drained", after=started)
    return started, drained, first(evs, "step_done", after=drained)


def rows_copied(dsn: str, name: str) -> int:
    with connect(dsn) as conn:
        return int(conn.execute("SELECT coalesce(sum(r.rows), 0) FROM mover.ranges r JOIN mover.migrations m"
                                " ON m.id = r.migration_id WHERE m.name = %s AND r.kind = 'backfill'"
                                " AND r.status = 'done'", (name,)).fetchone()[0])


def wal_ahead(dsn: str, mb: int) -> None:
    """Leave `mb` of WAL segments recycled ahead of the insert position, as a server that has run a
    while holds them (the server keeps them at each checkpoint up to min_wal_size, which main()
    raises). Without them every 16 MB of WAL the phases write is a new segment, written out whole
    while it holds WALWriteLock, and the writers' commits wait for it."""
    with connect(dsn) as conn:
        conn.execute("CREATE TABLE bench_wal_ahead (pad text)")
        for _ in range(max(1, mb // 100)):  # about 100 MB of WAL a round
            conn.execute("INSERT INTO bench_wal_ahead SELECT repeat('x', 200) FROM generate_series(1, 400000)")
            conn.execute("TRUNCATE bench_wal_ahead")
        conn.execute("DROP TABLE bench_wal_ahead")
        conn.execute("CHECKPOINT")
        conn.execute("CHECKPOINT")  # the first's redo point passes the fill: the second recycles it


def segments_ahead(dsn: str) -> int | None:
    """WAL segment files past the one being written, as plan check counts them."""
    from mover.engines.bulk import preflight
    with connect(dsn) as conn:
        return preflight.wal_segments(conn.cursor(), 0)["wal_segments_ahead"]


def fresh(dsn: str, name: str) -> None:
    """Abort the migration of that name if there is one, vacuum the source (as autovacuum keeps a
    live table), and checkpoint, so that each mode starts alike."""
    mover_cli(dsn, "abort", name)
    vacuum_checkpoint(dsn)


def vacuum_checkpoint(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute(f"VACUUM ANALYZE {SOURCE}")
        conn.execute("CHECKPOINT")


def _disk_written() -> int:
    """Sectors (512 bytes) written to the whole disks so far (/proc/diskstats; 0 where there is none)."""
    try:
        lines = Path("/proc/diskstats").read_text().splitlines()
    except OSError:
        return 0
    disk = re.compile(r"(sd[a-z]+|vd[a-z]+|xvd[a-z]+|nvme\d+n\d+)")  # whole disks, not their partitions
    return sum(int(f[9]) for f in (line.split() for line in lines) if len(f) > 9 and disk.fullmatch(f[2]))


def _page_cache() -> tuple[int, int]:
    """The kernel's Dirty and Writeback, kB (0, 0 where there is no /proc/meminfo)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return 0, 0
    got = dict(re.findall(r"^(Dirty|Writeback):\s+(\d+)", text, re.M))
    return int(got.get("Dirty", 0)), int(got.get("Writeback", 0))


SLOW_MS = 25.0  # a writer's transaction this slow is looked at: what the writers waited on meanwhile


class Waits:
    """What the writers' backends wait on (pg_stat_activity's wait_event_type:wait_event, "cpu" for
    none), sampled every few milliseconds on a connection of its own while it runs; per window,
    the share of each among the samples taken while a transaction slower than SLOW_MS ran. Beside
    each sample, what the server and the kernel hold unwritten: the WAL inserted but not yet
    flushed, and the page cache's Dirty and Writeback (/proc/meminfo)."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.samples: list[tuple[float, list[str]]] = []
        # at, WAL bytes unflushed, Dirty kB, Writeback kB, sectors written to disk so far
        self.backlog: list[tuple[float, int, int, int, int]] = []
        self.mover: list[tuple[float, list[str]]] = []  # at, the statements mover's sessions run
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with connect(self.dsn) as conn:
            while not self.stop.is_set():
                events, unflushed, movers = conn.execute(
                    "SELECT array(SELECT coalesce(wait_event_type || ':' || wait_event, 'cpu') FROM pg_stat_activity"
                    " WHERE application_name = 'pgbench' AND state = 'active'),"
                    " pg_wal_lsn_diff(pg_current_wal_insert_lsn(), pg_current_wal_flush_lsn())::bigint,"
                    " array(SELECT state || ' ' || coalesce(wait_event, '-') || ' ' || left(query, 30)"
                    " FROM pg_stat_activity WHERE application_name LIKE 'mover%%'"
                    " AND state <> 'idle' AND query NOT LIKE 'UPDATE mover.throttle%%')").fetchone()
                at = time.time()
                self.samples.append((at, events))
                self.mover.append((at, movers))
                self.backlog.append((at, unflushed, *_page_cache(), _disk_written()))
                self.stop.wait(0.004)
    def __enter__(self) -> Waits:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def of_slow(self, txns: list[tuple[float, float]], a: float, b: float) -> dict[str, Any]:
        slow = [(at, ms) for at, ms in txns if a <= at < b and ms > SLOW_MS]
        seen: dict[str, int] = {}
        i = 0
        for at, ms in slow:  # both sorted by time
            began = at - ms / 1000
            while i < len(self.samples) and self.samples[i][0] < began - 1:
                i += 1
            for t, events in self.samples[i:]:
                if t > at:
                    break
                if t >= began:
                    for e in events:
                        seen[e] = seen.get(e, 0) + 1
        total = sum(seen.values()) or 1
        top = sorted(seen.items(), key=lambda kv: -kv[1])[:5]
        return {"slow": len(slow), "waits": {k: round(v / total, 2) for k, v in top},
                "unwritten": self.unwritten(slow, a, b)}

    def unwritten(self, slow: list[tuple[float, float]], a: float, b: float) -> dict[str, Any]:
        """The WAL inserted but not flushed (kB), the page cache's Dirty and Writeback (MB) and what the
        disks wrote (MB/s): their median and maximum over [a, b), and their median while a slow
        transaction ran."""
        spans = [(at - ms / 1000, at) for at, ms in slow]
        inside = [x for x in self.backlog if a <= x[0] < b]
        during = [x for x in inside if any(lo <= x[0] <= hi for lo, hi in spans)]
        out: dict[str, Any] = {}
        rate = {x[0]: (y[4] - x[4]) * 512 / 2**20 / (y[0] - x[0]) for x, y in itertools.pairwise(self.backlog)
                if y[0] > x[0]}  # MB/s written to disk from each sample to the next
        for i, name in enumerate(("wal_unflushed_kB", "dirty_MB", "writeback_MB", "disk_write_MB/s"), 1):
            col = [x[i] / 1024 if i < 4 else rate.get(x[0], 0.0) for x in inside]  # bytes to kB, kB to MB
            slow_col = [x[i] / 1024 if i < 4 else rate.get(x[0], 0.0) for x in during]
            out[name] = {"median": _r(statistics.median(col)) if col else None, "max": _r(max(col)) if col else None,
                         "slow_median": _r(statistics.median(slow_col)) if slow_col else None}
        return out


def phases(dsn: str, workdir: Path, args, rate: float, governed: bool) -> dict[str, Any]:
    """The writers at `rate`; idle, then backfill and reconcile: each phase's window."""
    mode = "governed" if governed else "ungoverned"
    name = f"impact_{mode}"
    fresh(dsn, name)
    p = plan(workdir, name, governed, args)
    ahead = segments_ahead(dsn)
    writers = Writers(dsn, workdir, args.rows, args.clients, rate, 36_000, f"phases_{mode}")
    try:
        with Waits(dsn) if args.waits else contextlib.nullcontext() as waits:
            time.sleep(2)  # the writers reach their rate
            idle_from = time.time()
            time.sleep(args.idle_seconds)
            idle_to = time.time()
            step(dsn, str(p))
            step(dsn, str(p))  # create_target, install_capture
            backfill_s = step(dsn, name)
            time.sleep(2)
            reconcile_s = step(dsn, name)
            time.sleep(1)
    finally:
        writers.stop()
    txns = writers.transactions()
    evs = event_times(dsn, name)
    started, drained, done = backfill_spans(evs)
    r_start = first(evs, "step_started", after=done, step="reconcile")
    r_done = first(evs, "step_done", after=r_start)
    out = {"mode": mode, "segments_ahead": ahead, "backfill_s": round(backfill_s, 2),
           "copy_s": round(drained - started, 2),
           "index_builds_s": round(done - drained, 2), "reconcile_s": round(reconcile_s, 2),
           "idle": window(txns, idle_from, idle_to), "copy": window(txns, started, drained),
           "index builds": window(txns, drained, done), "reconcile": window(txns, r_start, r_done),
           "throttle_events": [(round(at - started, 2), k, m) for at, k, m, _ in evs
                               if k in ("throttle_baseline", "throttled", "released", "throttle_floor",
                                        "throttle_waiting", "throttle_resumed")],
           "throttled_seconds": _throttled_seconds(dsn, name),
           "slow_waits": {k: waits.of_slow(txns, a, b) for k, (a, b) in
                          (("idle", (idle_from, idle_to)), ("copy", (started, drained)),
                           ("index builds", (drained, done)), ("reconcile", (r_start, r_done)))} if waits else {}}
    if waits and args.timeline:
        Path(f"{args.timeline}-{mode}.json").write_text(json.dumps(
            {"txns": txns, "backlog": waits.backlog, "mover": waits.mover, "waits": waits.samples,
             "events": [(at, k, m) for at, k, m, _ in evs]}))
    cli(dsn, "abort", name)
    return out


def _throttled_seconds(dsn: str, name: str) -> float | None:
    with connect(dsn) as conn:
        row = conn.execute("SELECT t.throttled_seconds FROM mover.throttle t JOIN mover.migrations m"
                           " ON m.id = t.migration_id WHERE m.name = %s", (name,)).fetchone()
    return None if row is None else round(float(row[0]), 1)


def applier(dsn: str, workdir: Path, args, rate: float, governed: bool) -> dict[str, Any]:
    """The backfill's applier replaying a backlog nearly alone (the copy held to a row a second)."""
    mode = "governed" if governed else "ungoverned"
    name = f"impact_applier_{mode}"
    fresh(dsn, name)
    # The copy capped to last about ten seconds, so that it is still copying when paused at 60 %.
    p = plan(workdir, name, governed, args, f"\n[backfill]\nmax_rows_per_second = {max(args.rows // 10, 1)}\n")
    writers = Writers(dsn, workdir, args.rows, args.clients, rate, 36_000, f"applier_{mode}")
    proc = None
    try:
        step(dsn, str(p))
        step(dsn, str(p))
        proc = subprocess.Popen([sys.executable, "-m", "mover", "--dsn", dsn, "step", name],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while rows_copied(dsn, name) < args.rows * 0.6:
            if proc.poll() is not None:
                raise RuntimeError(f"the backfill ended before 60 %: {proc.stderr.read() if proc.stderr else ''}")
            time.sleep(0.2)
        cli(dsn, "pause", name)
        time.sleep(args.backlog_seconds)
        with connect(dsn) as conn:
            applied_before = _applied(conn, name)
        cli(dsn, "set", name, "backfill.max_rows_per_second=1")
        cli(dsn, "unpause", name)
        started = time.time()
        time.sleep(args.applier_seconds)
        ended = time.time()
        with connect(dsn) as conn:
            applied = _applied(conn, name) - applied_before
        cli(dsn, "set", name, "backfill.max_rows_per_second=0")
        proc.communicate(timeout=3600)
    finally:
        writers.stop()
        if proc is not None and proc.poll() is None:
            proc.kill()
    txns = writers.transactions()
    out = {"mode": mode, "applier": window(txns, started, ended), "replayed": applied,
           "idle": window(txns, started - args.backlog_seconds + 1, started - 1)}
    cli(dsn, "abort", name)
    return out


def _applied(conn: psycopg.Connection, name: str) -> int:
    return int(conn.execute("SELECT coalesce(sum(s.applied), 0) FROM mover.capture_stats s JOIN mover.migrations m"
                            " ON m.id = s.migration_id WHERE m.name = %s", (name,)).fetchone()[0])


def burst(dsn: str, workdir: Path, args, rate: float) -> dict[str, Any]:
    """A governed backfill; at a third of it, a second pgbench at full speed for burst_seconds."""
    name = "impact_burst"
    fresh(dsn, name)
    p = plan(workdir, name, True, args)
    writers = Writers(dsn, workdir, args.rows, args.clients, rate, 36_000, "burst_base")
    extra = None
    try:
        step(dsn, str(p))
        step(dsn, str(p))
        proc = subprocess.Popen([sys.executable, "-m", "mover", "--dsn", dsn, "step", name],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while rows_copied(dsn, name) < args.rows / 3 and proc.poll() is None:
            time.sleep(0.1)
        burst_from = time.time()
        rows_from = rows_copied(dsn, name)
        extra = Writers(dsn, workdir, args.rows, args.clients, None, args.burst_seconds, "burst_full")
        extra.proc.wait(args.burst_seconds + 60)
        burst_to = time.time()
        rows_to = rows_copied(dsn, name)
        proc.communicate(timeout=3600)
    finally:
        if extra is not None:
            extra.stop()
        writers.stop()
    evs = event_times(dsn, name)
    started = first(evs, "step_started", step="backfill")
    drained = first(evs, "drained", after=started)
    # Throttled already when the burst began (the base writers alone can take the probe over its
    # budget): backed off at 0 s. Else the first "throttled" after the burst's start.
    state = [k for at, k, _, _ in evs if k in ("throttled", "released") and at < burst_from]
    throttled = [burst_from] if state and state[-1] == "throttled" else \
        [at for at, k, _, _ in evs if k == "throttled" and at >= burst_from]
    released = [at for at, k, _, _ in evs if k == "released" and at >= burst_to]
    if drained < burst_to:
        cli(dsn, "abort", name)
        return {"error": "the copy ended before the burst did: measure the burst with more --rows"}
    out = {"backed_off_after_s": round(throttled[0] - burst_from, 2) if throttled else None,
           "throttled_at_start": bool(state and state[-1] == "throttled"),
           "released_after_s": round(released[0] - burst_to, 2) if released else None,
           "rows_per_second_before": round(rows_from / max(burst_from - started, 1e-3)),
           "rows_per_second_during": round((rows_to - rows_from) / max(burst_to - burst_from, 1e-3)),
           "rows_per_second_after": round((args.rows - rows_to) / max(drained - burst_to, 1e-3)),
           "events": [(round(at - burst_from, 2), k, m) for at, k, m, _ in evs
                      if k in ("throttled", "released", "throttle_floor")]}
    cli(dsn, "abort", name)
    return out


# ---------------------------------------------------------------------------------------------
# Signals


def signals_run(dsn: str, workdir: Path, args, rate: float) -> dict[str, Any]:
    """What tracks the application's latency: the logged probe, an unlogged one, session counts."""
    from mover.engines.governor import signals

    with connect(dsn) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_probe_logged, bench_probe_unlogged")
        conn.execute("CREATE TABLE bench_probe_logged (id int PRIMARY KEY, n bigint)")
        conn.execute("CREATE UNLOGGED TABLE bench_probe_unlogged (id int PRIMARY KEY, n bigint)")
        conn.execute("INSERT INTO bench_probe_logged VALUES (1, 0)")
        conn.execute("INSERT INTO bench_probe_unlogged VALUES (1, 0)")
    stop = threading.Event()
    series: dict[str, list[tuple[float, float]]] = {"probe_logged": [], "probe_unlogged": [], "sessions_active": [],
                                                     "sessions_waiting": []}

    def probe(table_name: str, key: str) -> None:
        conn = psycopg.connect(dsn, autocommit=True, application_name=f"mover-bench-{key}")
        statement = f"UPDATE {table_name} SET n = n + 1 WHERE id = 1"
        while not stop.wait(0.25):
            ms, _ = signals.probe(conn, lambda cur: cur.execute(statement))
            series[key].append((time.time(), ms))
        conn.close()

    def sessions() -> None:
        with psycopg.connect(dsn, autocommit=True, application_name="mover-bench-sessions") as conn:
            while not stop.wait(0.25):
                active, waiting = conn.execute(
                    "SELECT count(*), count(*) FILTER (WHERE wait_event_type IN ('Lock', 'LWLock', 'IO'))"
                    " FROM pg_stat_activity WHERE backend_type = 'client backend' AND state = 'active'"
                    " AND pid <> pg_backend_pid() AND application_name !~ '^mover'").fetchone()
                now = time.time()
                series["sessions_active"].append((now, float(active)))
                series["sessions_waiting"].append((now, float(waiting)))

    threads = [threading.Thread(target=probe, args=("bench_probe_logged", "probe_logged"), daemon=True),
               threading.Thread(target=probe, args=("bench_probe_unlogged", "probe_unlogged"), daemon=True),
               threading.Thread(target=sessions, daemon=True)]
    name = "impact_signals"
    fresh(dsn, name)
    p = plan(workdir, name, False, args)
    writers = Writers(dsn, workdir, args.rows, args.clients, rate, 36_000, "signals")
    for t in threads:
        t.start()
    try:
        time.sleep(args.idle_seconds)
        step(dsn, str(p))
        step(dsn, str(p))
        step(dsn, name)
        time.sleep(args.idle_seconds)
        step(dsn, name)
        time.sleep(args.idle_seconds)
    finally:
        stop.set()
        writers.stop()
        for t in threads:
            t.join(10)
    txns = writers.transactions()
    evs = event_times(dsn, name)
    cli(dsn, "abort", name)
    # The phases: idle before, the copy, the index builds (mover busy) against the first idle spell.
    started, drained, built = backfill_spans(evs)
    spans = {"idle": (started - args.idle_seconds, started - 1), "copy": (started, drained),
             "index builds": (drained, built)}
    t0 = txns[0][0] if txns else time.time()
    by_second = per_second(txns, t0)
    seconds = sorted(by_second)
    app_p50 = {s: statistics.median(by_second[s]) for s in seconds}
    app_mean = {s: statistics.fmean(by_second[s]) for s in seconds}
    out: dict[str, Any] = {"seconds": len(seconds), "correlation": {}}
    for key, values in series.items():
        per: dict[int, list[float]] = {}
        for at, v in values:
            per.setdefault(int(at - t0), []).append(v)
        common = [s for s in seconds if s in per]
        if len(common) < 3:
            continue
        sig = [statistics.median(per[s]) for s in common]
        out["correlation"][key] = {
            "p50": _r(statistics.correlation([app_p50[s] for s in common], sig)) if len(set(sig)) > 1 else None,
            "mean": _r(statistics.correlation([app_mean[s] for s in common], sig)) if len(set(sig)) > 1 else None,
            "median_idle": round(statistics.median(sig[: max(1, args.idle_seconds - 2)]), 3),
            "median_all": round(statistics.median(sig), 3)}
    # Does a signal rise when, and as much as, the writers' latency does? Each one's median in the
    # copy and in the index builds over its median idle, beside the writers' p50 the same way.
    def ratio(values: list[tuple[float, float]], span: str) -> float | None:
        a, b = spans[span]
        idle = [v for at, v in values if spans["idle"][0] <= at < spans["idle"][1]]
        busy = [v for at, v in values if a <= at < b]
        if not idle or not busy or statistics.median(idle) == 0:
            return None
        return round(statistics.median(busy) / statistics.median(idle), 2)
    out["rise"] = {key: {span: ratio(values, span) for span in ("copy", "index builds")}
                   for key, values in {"writers_p50": txns, **series}.items()}
    out["series"] = {"app_p50": [(s, round(app_p50[s], 2)) for s in seconds]}
    return out


def _r(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 3)


# ---------------------------------------------------------------------------------------------
# Controls: the same writers, no mover


def control(dsn: str, workdir: Path, args, rate: float) -> dict[str, Any]:
    """No mover at all: the writers at `rate`; an idle spell; `--control-seconds` of one plain
    INSERT ... SELECT of `--control-rows` source rows into a table of the source's shape (its key
    alone) every second, committed with synchronous_commit off as mover's ranges are; an idle
    spell; the same duty of a statement that only spends CPU (a count over generate_series, sized
    to the insert's mean time); an idle spell. What a bulk write of that size, and what the same
    CPU alone, cost the writers on this machine, and how far idle spells differ among themselves."""
    with connect(dsn) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_control")
        conn.execute(f"CREATE TABLE bench_control (LIKE {SOURCE} INCLUDING DEFAULTS)")
        conn.execute("ALTER TABLE bench_control ADD PRIMARY KEY (id)")
        conn.execute("CHECKPOINT")
    writers = Writers(dsn, workdir, args.rows, args.clients, rate, 36_000, "control")
    spells: dict[str, tuple[float, float]] = {}
    took: dict[str, list[float]] = {"insert": [], "cpu": []}

    def every_second(name: str, run: Callable[[], None]) -> None:
        start = time.time()
        for i in range(args.control_seconds):
            t = time.perf_counter()
            run()
            took[name].append((time.perf_counter() - t) * 1000)
            time.sleep(max(0.0, start + i + 1 - time.time()))
        spells[name] = (start, time.time())

    def idle(name: str) -> None:
        start = time.time()
        time.sleep(args.idle_seconds)
        spells[name] = (start, time.time())

    try:
        with connect(dsn) as conn:
            conn.execute("SET synchronous_commit = off")
            time.sleep(2)  # the writers reach their rate
            idle("idle")
            lo = [0]

            def insert() -> None:
                conn.execute(f"INSERT INTO bench_control SELECT * FROM {SOURCE} WHERE id > %s AND id <= %s",
                             (lo[0], lo[0] + args.control_rows))
                lo[0] += args.control_rows

            every_second("insert", insert)
            idle("idle 2")
            t = time.perf_counter()
            conn.execute("SELECT count(*) FROM generate_series(1, 1000000)")
            per_million = (time.perf_counter() - t) * 1000
            n = max(1, int(statistics.mean(took["insert"]) / per_million * 1_000_000))
            every_second("cpu", lambda: conn.execute("SELECT count(*) FROM generate_series(1, %s)", (n,)))
            idle("idle 3")
    finally:
        writers.stop()
    txns = writers.transactions()
    with connect(dsn) as conn:
        conn.execute("DROP TABLE bench_control")
    return {"rows_per_second": args.control_rows, **{k: window(txns, a, b) for k, (a, b) in spells.items()},
            "statement_ms": {k: round(statistics.median(v), 1) for k, v in took.items()}}


SIDE_BY_SIDE = {  # what --side-by-side runs on a copy of the source, alone and two at once
    "CREATE INDEX": ("CREATE INDEX ON bench_side (created_at)", "CREATE INDEX ON bench_side (account_id)"),
    "a CPU-bound query": ("SELECT count(*) FROM generate_series(1, 30000000)",) * 2,
}


def side_by_side(dsn: str, workdir: Path, args, rate: float) -> dict[str, Any]:
    """No mover at all: the writers at `rate`; an idle spell; then for each statement of
    SIDE_BY_SIDE, one alone, an idle spell, two at once (each in a session of its own, without
    parallel workers), an idle spell. What one statement that cannot be paced costs the writers
    on this machine, and what a second beside it does."""
    with connect(dsn) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_side")
        conn.execute(f"CREATE TABLE bench_side AS SELECT * FROM {SOURCE}")
        conn.execute("VACUUM ANALYZE bench_side")
        conn.execute("CHECKPOINT")
    writers = Writers(dsn, workdir, args.rows, args.clients, rate, 36_000, "side_by_side")
    spells: dict[str, tuple[float, float]] = {}

    def run(statement: str) -> None:
        with connect(dsn) as conn:
            conn.execute("SET max_parallel_maintenance_workers = 0")
            conn.execute("SET max_parallel_workers_per_gather = 0")
            conn.execute(statement)

    def spell(name: str, statements: tuple[str, ...]) -> None:
        threads = [threading.Thread(target=run, args=(st,)) for st in statements]
        start = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        spells[name] = (start, time.time())
        time.sleep(args.idle_seconds / 2)  # the writers' queue drains before the next spell

    try:
        time.sleep(2)  # the writers reach their rate
        start = time.time()
        time.sleep(args.idle_seconds)
        spells["idle"] = (start, time.time())
        for what, (first, second) in SIDE_BY_SIDE.items():
            spell(f"{what}, one", (first,))
            with connect(dsn) as conn:
                conn.execute("DROP INDEX IF EXISTS bench_side_created_at_idx")
            spell(f"{what}, two at once", (first, second))
            with connect(dsn) as conn:
                conn.execute("DROP INDEX IF EXISTS bench_side_created_at_idx, bench_side_account_id_idx")
    finally:
        writers.stop()
    txns = writers.transactions()
    with connect(dsn) as conn:
        conn.execute("DROP TABLE bench_side")
    # A statement's cost lands on the transactions that complete during it and just after it.
    return {k: {**window(txns, a, b + 0.5), "statement_s": round(b - a, 2)} for k, (a, b) in spells.items()}


# ---------------------------------------------------------------------------------------------
# mover against the best plain alternative, second by second

VERSUS_TABLE = "bench_versus"  # the controls' copy
# A part's whole window runs this long past its last statement (the writers queued behind it
# complete then); nothing else runs in it.
TAIL = 1.0


# The live control's capture is named as a migration of this id would be (mover.m999999_changes):
# no migration of a bench run gets it.
LIVE_CONTROL_MID = 999_999


class LiveCapture:
    """mover's capture of the source for a copy mover does not make (the live control), so that the
    copy carries what mover's does: the change log, trigger function and ENABLE ALWAYS triggers
    installed by mover's own code (changelog.install, as install_capture runs it), and a replay
    session beside the copy that runs mover's replay statement (sql.capture.replay: claim up to
    changelog.BATCH logged keys at or below the copy's committed frontier, delete or upsert each by
    the source's state) as mover's applier runs it (engines/bulk/backfill.py Applier): a
    transaction a batch under the applier lock, through mover's Database (its SET LOCALs, its
    retries), the next batch at once after a full one, else after APPLY_IDLE_SECONDS. Left out:
    the applier's bookkeeping around each batch (its migration row, the capture's catalog probe,
    the applied count, the range watermark's read), a few index reads a batch."""

    def __init__(self, dsn: str, target: str):
        from mover import names
        from mover.db import Database
        self.source = names.QualifiedName("public", SOURCE)
        self.target = names.QualifiedName("public", target)
        self.log = names.change_log(LIVE_CONTROL_MID)
        self.db = Database(dsn, role="mover-applier")  # the name mover's applier shows
        self.frontier: int | None = None  # the copy's committed high key: replay touches nothing above it
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="live-control-replay", daemon=True)
        self.failed: BaseException | None = None
        self.replayed = {"claimed": 0, "deleted": 0, "upserted": 0, "batches": 0}
        self.statements: dict[bool, tuple[str, str]] = {}  # covers everything: (probe, replay)

    def install(self) -> list[str]:
        """The capture, in one transaction; returns the triggers the source had before it."""
        from mover.catalog import conversion, introspect
        from mover.engines.capture import changelog
        from mover.sql import capture as q
        from mover.sql.copy import covered_by

        def go(cur: psycopg.Cursor) -> list[str]:
            before = self.triggers(cur)
            changelog.install(cur, LIVE_CONTROL_MID, self.source, ("id",), "bench live control")
            m = conversion.mapping(introspect.describe(cur, self.source), introspect.describe(cur, self.target),
                                   ("id",))
            # Composed once, as mover's applier caches them: texts psycopg prepares after a few runs.
            # Covered: the keys at or below the copy's frontier while it copies, all of them after.
            for everything in (False, True):
                covered = sql.SQL("true") if everything else covered_by("c", m, "wm")
                probe = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} c WHERE {})").format(self.log.ident, covered)
                self.statements[everything] = (probe.as_string(cur),
                                               q.replay(m, self.log, covered=covered, skip_locked=True).as_string(cur))
            return before

        return self.db.transaction(go, label="install the live control's capture")

    def triggers(self, cur: psycopg.Cursor) -> list[str]:
        cur.execute("SELECT tgname FROM pg_catalog.pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal"
                    " ORDER BY tgname", (str(self.source),))
        return [r[0] for r in cur.fetchall()]

    def _batch(self, everything: bool) -> int:
        from mover.engines.capture import changelog
        from mover.sql.mapping import named_bound
        frontier = self.frontier

        def go(cur: psycopg.Cursor) -> tuple[int, int, int]:
            changelog.lock_applier(cur, LIVE_CONTROL_MID, False)
            if not everything and frontier is None:
                return 0, 0, 0  # nothing copied yet: nothing covered (mover's applier stops here too)
            params = {} if everything else named_bound("wm", [str(frontier)])
            probe, replay = self.statements[everything]
            cur.execute(probe, params)  # most batches find nothing: an index probe first, as mover's _apply
            if not cur.fetchone()[0]:
                return 0, 0, 0
            cur.execute("SAVEPOINT mover_replay")
            cur.execute(replay, {**params, "limit": changelog.BATCH})
            claimed, deleted, upserted = cur.fetchone()
            cur.execute("RELEASE SAVEPOINT mover_replay")
            return int(claimed), int(deleted), int(upserted)

        got = self.db.transaction(go, statement_timeout="120s", label="apply")  # as mover's drain runs a batch
        for k, n in zip(("claimed", "deleted", "upserted"), got, strict=True):
            self.replayed[k] += n
        self.replayed["batches"] += 1
        return got[0]

    def _run(self) -> None:
        from mover.engines.bulk.backfill import APPLY_IDLE_SECONDS
        from mover.engines.capture import changelog
        try:
            while not self.stop.is_set():
                if self._batch(everything=False) < changelog.BATCH:
                    self.stop.wait(APPLY_IDLE_SECONDS)  # caught up: let the writers' changes gather
        except BaseException as exc:  # raised to the copy at its end (finish)
            self.failed = exc

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        """The copy is done: the replay session stops, then every logged change is replayed (mover's
        drain after its copy, the `drained` event that ends its copy window)."""
        from mover.engines.capture import changelog
        self.stop.set()
        self.thread.join()
        if self.failed is not None:
            raise RuntimeError(f"the live control's replay failed: {self.failed}") from self.failed
        while self._batch(everything=True) >= changelog.BATCH:
            pass

    def remove(self) -> list[str]:
        """mover's removal of the capture (changelog.remove: triggers, function, log); returns the
        source's triggers after it, and refuses if anything of the capture is left."""
        from mover import names
        from mover.engines.capture import changelog
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()

        def go(cur: psycopg.Cursor) -> list[str]:
            changelog.remove(cur, LIVE_CONTROL_MID, self.source)
            return self.triggers(cur)

        try:
            after = self.db.transaction(go, label="remove the live control's capture")
            left = self.db.transaction(lambda cur: cur.execute(
                "SELECT to_regclass(%s), to_regprocedure(%s)",
                (str(self.log), str(names.capture_function(LIVE_CONTROL_MID)) + "()")).fetchone())
        finally:
            self.db.close()
        mine = names.capture_trigger(LIVE_CONTROL_MID)
        if any(t.startswith(mine) for t in after) or any(left):
            raise RuntimeError(f"the live control's capture was not removed: triggers {after}, log and function {left}")
        return after


def versus(dsn: str, workdir: Path, args, rate: float) -> dict[str, Any]:
    """One pgbench at `rate` throughout, five parts, each after VACUUM and CHECKPOINT of the source
    and an idle spell: mover's backfill governed (a fresh migration); the control at mover's average
    copy rate (plain INSERT ... SELECT of key ranges every --versus-period seconds, then the
    secondary indexes one at a time and ANALYZE); the live control (the same with mover's capture
    and replay beside it, LiveCapture); one INSERT ... SELECT of the same rows at full speed;
    mover's backfill ungoverned. Per window, the writers' seconds (seconds_window())."""
    spans: dict[str, tuple[float, float]] = {}
    out: dict[str, Any] = {"periods_s": args.versus_period or [1.0], "segments_ahead": {}, "tail_s": TAIL}
    settle = args.idle_seconds / 2  # the writers' queue drains after the maintenance before a spell

    def idle(name: str) -> None:
        time.sleep(settle)
        start = time.time()
        time.sleep(args.idle_seconds)
        spans[name] = (start, time.time())

    def backfill(governed: bool) -> None:
        mode = "governed" if governed else "ungoverned"
        name = f"impact_versus_{mode}"
        fresh(dsn, name)
        out["segments_ahead"][f"mover {mode}"] = segments_ahead(dsn)
        idle(f"idle before mover {mode}")
        p = plan(workdir, name, governed, args)
        step(dsn, str(p))
        step(dsn, str(p))  # create_target, install_capture: outside the windows
        time.sleep(settle)
        out[f"mover {mode}"] = {"backfill_s": round(step(dsn, name), 2)}
        time.sleep(TAIL)
        started, drained, done = backfill_spans(event_times(dsn, name))
        rows = rows_copied(dsn, name)
        with connect(dsn) as conn:
            applied = _applied(conn, name)  # the writers' changes its applier replayed, the drain's included
        out[f"mover {mode}"].update(rows=rows, copy_s=round(drained - started, 2),
                                    index_builds_s=round(done - drained, 2),
                                    rows_per_second=round(rows / max(drained - started, 1e-3)),
                                    throttled_seconds=_throttled_seconds(dsn, name), applied=applied,
                                    applied_per_second=round(applied / max(drained - started, 1e-3)))
        spans[f"mover {mode}: copy"] = (started, drained)
        spans[f"mover {mode}: index builds"] = (drained, done)
        spans[f"mover {mode}: whole"] = (started, done + TAIL)
        cli(dsn, "abort", name)

    def target(conn: psycopg.Connection) -> None:
        """An empty table of mover's target's shape (the source's, account_id widened, its key alone)."""
        conn.execute(f"DROP TABLE IF EXISTS {VERSUS_TABLE}")
        conn.execute(f"CREATE TABLE {VERSUS_TABLE} (LIKE {SOURCE} INCLUDING DEFAULTS)")
        conn.execute(f"ALTER TABLE {VERSUS_TABLE} ALTER account_id TYPE bigint, ADD PRIMARY KEY (id)")

    def same_rows() -> tuple[int, int]:
        """mover's rows and the key under which the source holds as many now: the same rows."""
        rows = out["mover governed"]["rows"]
        if not rows:
            raise RuntimeError("mover's governed backfill copied no rows: nothing to pace a control by")
        with connect(dsn) as conn:
            got = conn.execute(f"SELECT id FROM {SOURCE} ORDER BY id OFFSET %s LIMIT 1", (rows - 1,)).fetchone()
            hi = int(got[0]) if got else int(conn.execute(f"SELECT max(id) FROM {SOURCE}").fetchone()[0])
        return rows, hi

    def control_part(period: float, live: bool = False) -> None:
        """The paced control; `live`: with mover's capture on the source and its replay beside the
        copy (LiveCapture), the capture installed after the idle spell as mover's is, the copy
        window ending once the replay has drained (as mover's ends at `drained`), the trigger kept
        through the builds (as mover's is) and removed after the part's tail."""
        rows, hi = same_rows()
        per_s = out["mover governed"]["rows_per_second"]
        part = f"{'live ' if live else ''}control every {period:g} s"
        vacuum_checkpoint(dsn)
        with connect(dsn) as conn:
            target(conn)
        out["segments_ahead"][part] = segments_ahead(dsn)
        idle(f"idle before {part}")
        capture = LiveCapture(dsn, VERSUS_TABLE) if live else None
        extra: dict[str, Any] = {}
        try:
            if capture is not None:
                extra["triggers_before"] = capture.install()
                time.sleep(settle)  # as mover's backfill step starts a settle after install_capture
                capture.start()
            width = max(1, math.ceil(per_s * period * hi / rows))  # ids a statement: rows_per_second * period rows
            took: list[float] = []
            copied, lo = 0, 0
            with connect(dsn) as conn:
                conn.execute("SET synchronous_commit = off")  # as mover's ranges commit
                start = time.time()
                while lo < hi:
                    time.sleep(max(0.0, start + len(took) * period - time.time()))  # behind: the next at once
                    t = time.perf_counter()
                    cur = conn.execute(f"INSERT INTO {VERSUS_TABLE} SELECT * FROM {SOURCE} WHERE id > %s AND id <= %s",
                                       (lo, min(lo + width, hi)))
                    took.append((time.perf_counter() - t) * 1000)
                    copied += cur.rowcount
                    lo += width
                    if capture is not None:
                        capture.frontier = min(lo, hi)  # committed (autocommit): its keys may be replayed
                copied_at = time.time()
                if capture is not None:
                    capture.finish()
                    drained = time.time()
                    extra.update(drain_s=round(drained - copied_at, 2), replayed=dict(capture.replayed),
                                 replayed_per_second=round(capture.replayed["claimed"] / max(drained - start, 1e-3)))
                    copied_at = drained  # the copy window ends drained, as mover's does
                # The builds as a person would run them on a table nobody uses yet: plain CREATE INDEX
                # (CONCURRENTLY spares a table's writers, and this one has none: it would only scan
                # twice and wait for others' transactions), one at a time, without parallel workers
                # (on two cores a worker takes the last core), then ANALYZE: what mover governed runs.
                conn.execute("RESET synchronous_commit")
                conn.execute("SET max_parallel_maintenance_workers = 0")
                for statement in index_defs(args.shape, VERSUS_TABLE):
                    conn.execute(statement)
                conn.execute(f"ANALYZE {VERSUS_TABLE}")
                done = time.time()
            time.sleep(TAIL)
        finally:
            if capture is not None:
                extra["triggers_after"] = capture.remove()
        spans[f"{part}: copy"] = (start, copied_at)
        spans[f"{part}: index builds"] = (copied_at, done)
        spans[f"{part}: whole"] = (start, done + TAIL)
        out[part] = {"rows_per_second_aimed": per_s, "hi": hi, "rows": copied, "statements": len(took),
                     "rows_per_statement": round(copied / len(took)), "copy_s": round(copied_at - start, 2),
                     "rows_per_second": round(copied / max(copied_at - start, 1e-3)),
                     "statement_ms_median": round(statistics.median(took), 1), "statement_ms_max": round(max(took), 1),
                     "index_builds_s": round(done - copied_at, 2), **extra}
        with connect(dsn) as conn:
            conn.execute(f"DROP TABLE {VERSUS_TABLE}")

    def single() -> None:
        _, hi = same_rows()
        vacuum_checkpoint(dsn)
        with connect(dsn) as conn:
            target(conn)
        out["segments_ahead"]["single statement"] = segments_ahead(dsn)
        idle("idle before single statement")
        with connect(dsn) as conn:
            conn.execute("SET synchronous_commit = off")
            start = time.time()
            cur = conn.execute(f"INSERT INTO {VERSUS_TABLE} SELECT * FROM {SOURCE} WHERE id > 0 AND id <= %s", (hi,))
            ended = time.time()
        time.sleep(TAIL)
        spans["single statement: copy"] = (start, ended)
        spans["single statement: whole"] = (start, ended + TAIL)
        out["single statement"] = {"rows": cur.rowcount, "copy_s": round(ended - start, 2),
                                   "rows_per_second": round(cur.rowcount / max(ended - start, 1e-3))}
        with connect(dsn) as conn:
            conn.execute(f"DROP TABLE {VERSUS_TABLE}")

    writers = Writers(dsn, workdir, args.rows, args.clients, rate, 36_000, "versus")
    try:
        time.sleep(2)  # the writers reach their rate
        backfill(True)
        for period in out["periods_s"]:
            control_part(period)
        if "live-control" not in args.skip:
            for period in out["periods_s"]:
                control_part(period, live=True)
        single()
        if "ungoverned" not in args.skip:
            backfill(False)
    finally:
        writers.stop()
    txns = writers.transactions()
    out["windows"] = {k: seconds_window(txns, a, b) for k, (a, b) in spans.items()}
    # The whole run second by second (count, mean ms), and the windows on the same clock: what
    # happened between them (the maintenance, mover's other steps) is there to read.
    out["capture_share"] = capture_share(out["windows"], out["periods_s"])
    t0 = txns[0][0] if txns else 0.0
    secs = sorted(per_second(txns, t0, least=1).items())
    out["timeline"] = [(s, len(v), round(statistics.fmean(v), 2)) for s, v in secs]
    out["spans"] = {k: (round(a - t0, 2), round(b - t0, 2)) for k, (a, b) in spans.items()}
    return out


STATS = (("worst second's mean", "worst_second_mean_ms"), ("worst second's p99", "worst_second_p99_ms"))
# The figures of a window the live control is compared by: the worst second's mean (the headline),
# the median second's mean, the whole window's p99 and the worst second's p99.
SHARE_STATS = ("worst_second_mean_ms", "median_second_mean_ms", "p99_ms", "worst_second_p99_ms")
PHASES_VERSUS = ("copy", "index builds", "whole")


def capture_share(windows: dict[str, Any], periods: list[float]) -> dict[str, Any]:
    """Per live control run: per phase, mover governed's, the plain control's (the same period) and
    the live control's SHARE_STATS, and the ratios of their worst seconds (by the mean): mover over
    the live control (at most 1: mover's copy costs the writers no more than a plain copy that
    carries the same capture and replay) and the live control over the plain one (what the
    capture and its replay cost the writers on their own)."""
    out: dict[str, Any] = {}
    for period in periods:
        plain, live = f"control every {period:g} s", f"live control every {period:g} s"
        if f"{live}: whole" not in windows:
            continue
        out[live] = {}
        for phase in PHASES_VERSUS:
            got = {who: {k: (windows.get(f"{who}: {phase}") or {}).get(k) for k in SHARE_STATS}
                   for who in ("mover governed", plain, live)}
            mover_ms, plain_ms, live_ms = (got[who]["worst_second_mean_ms"] for who in ("mover governed", plain, live))
            out[live][phase] = {**got, "mover_over_live": _quotient(mover_ms, live_ms),
                                "live_over_plain": _quotient(live_ms, plain_ms)}
    return out


def _quotient(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def versus_report(v: dict[str, Any]) -> str:
    """The windows of --versus-control side by side, and mover's worst second against the controls'."""
    ws = v["windows"]
    ref = ws.get("idle before mover governed") or {}
    rows = []
    for name, w in ws.items():
        part, _, phase = name.partition(": ")
        per_s = (v.get(part) or {}).get("rows_per_second") if phase == "copy" else None
        tps = f"{w['tps'] / ref['tps']:.2f}" if w.get("tps") and ref.get("tps") else "-"
        rows.append(("idle (reference)" if w is ref else name, w["seconds"], f"{per_s:,}" if per_s else "", w["tps"],
                     tps, w["p50_ms"], w["p99_ms"], w["median_second_mean_ms"], w["worst_second_mean_ms"],
                     w["worst_second_p99_ms"]))
    text = table(rows, ("window", "seconds", "rows/s", "writers tps", "tps / idle", "p50 ms", "p99 ms",
                        "median second's mean ms", "worst second's mean ms", "worst second's p99 ms"))
    ahead = v.get("segments_ahead") or {}
    if ahead:
        text += "\n\nWAL segments recycled ahead at each part's start: " + ", ".join(
            f"{k} {n}" for k, n in ahead.items())
    g = v.get("mover governed") or {}
    paced = [f"control every {period:g} s" for period in v.get("periods_s", [])]
    paced = [c for c in paced if f"{c}: whole" in ws]
    if g and paced:
        # The gentlest paced control: the lowest worst second (by its mean) over its whole window.
        best = min(paced, key=lambda c: ws[f"{c}: whole"]["worst_second_mean_ms"] or math.inf)
        c = v[best]
        text += (f"\n\nmover governed copied {g['rows']:,} rows at {g['rows_per_second']:,} rows/s over its copy "
                 f"window ({g['copy_s']} s; throttled {g['throttled_seconds']} s), then built its indexes and "
                 f"ANALYZEd in {g['index_builds_s']} s. {best}: {c['statements']} INSERT ... SELECT of "
                 f"{c['rows_per_statement']:,} rows ({c['statement_ms_median']} ms each, at most "
                 f"{c['statement_ms_max']}), {c['rows']:,} rows at {c['rows_per_second']:,} rows/s, then the same "
                 f"builds and ANALYZE in {c['index_builds_s']} s. The worst second: the one second of a window "
                 f"whose transactions had the highest mean latency (counted from their schedule); the highest "
                 f"per-second p99 beside it.\n\nmover governed / {best} (the gentlest paced control):")
        for phase in ("copy", "index builds", "whole"):
            mine, theirs = ws.get(f"mover governed: {phase}") or {}, ws.get(f"{best}: {phase}") or {}
            text += f"\n  {phase}: " + ", ".join(f"{stat} {_ratio(mine.get(key), theirs.get(key))}"
                                                  for stat, key in STATS)
        one = ws.get("single statement: whole")
        if one and "mover governed: whole" in ws:
            text += ("\nmover governed's whole / one INSERT ... SELECT of the same rows at full speed (no builds): "
                     + ", ".join(f"{stat} {_ratio(ws['mover governed: whole'].get(key), one.get(key))}"
                                 for stat, key in STATS))
    text += share_report(v)
    u = v.get("mover ungoverned")
    if g and u:
        text += (f"\n\nbackfill step: governed {g['backfill_s']} s, ungoverned {u['backfill_s']} s: "
                 f"{g['backfill_s'] / u['backfill_s']:.2f}x (goal <= 1.5)")
    return text


def share_report(v: dict[str, Any]) -> str:
    """The live controls beside mover governed and the plain control (capture_share)."""
    text = ""
    g = v.get("mover governed") or {}
    for live, phases in (v.get("capture_share") or {}).items():
        c = v.get(live) or {}
        r = c.get("replayed") or {}
        plain = live.removeprefix("live ")
        text += (f"\n\n{live}: the paced copy of {plain} ({c.get('rows', 0):,} rows at {c.get('rows_per_second', 0):,}"
                 f" rows/s), with mover's capture on the source and its replay beside it: {r.get('claimed', 0):,}"
                 f" logged changes replayed ({c.get('replayed_per_second', 0):,}/s; mover governed's applier "
                 f"{g.get('applied', 0):,}, {g.get('applied_per_second', 0):,}/s) in {r.get('batches', 0):,} "
                 f"transactions, the last drained in {c.get('drain_s')} s; the source's triggers before it "
                 f"{c.get('triggers_before')}, after it {c.get('triggers_after')}.\n\n")
        rows = [(f"{who}: {phase}", *(got.get(k) for k in SHARE_STATS))
                for phase, figures in phases.items()
                for who, got in figures.items() if isinstance(got, dict)]
        text += table(rows, ("window", "worst second's mean ms", "median second's mean ms", "p99 ms",
                             "worst second's p99 ms"))
        text += "\n\nworst second's mean, mover governed / live control: " + ", ".join(
            f"{phase} {_times(f['mover_over_live'])}" for phase, f in phases.items())
        text += "\nworst second's mean, live control / plain control: " + ", ".join(
            f"{phase} {_times(f['live_over_plain'])}" for phase, f in phases.items())
    return text


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x ({a:g} / {b:g} ms)" if a is not None and b else "-"


# ---------------------------------------------------------------------------------------------
# Report


def ratios(run: dict[str, Any], phase: str) -> tuple[str, str]:
    ref, got = run["idle"], run.get(phase) or {}
    if not got.get("tps") or not ref.get("tps"):
        return "-", "-"
    tps = got["tps"] / ref["tps"]
    p99 = got["p99_ms"] / ref["p99_ms"] if ref["p99_ms"] else float("nan")
    return f"{tps:.2f}", f"{p99:.2f}"


def report(r: dict[str, Any]) -> str:
    """The tables of one result file (also `python -m bench.report`)."""
    head = (f"{r['rows']:,} rows, {r['shape']} table; writers: {r['clients']} clients at {r['rate']:.0f} tps "
            f"({r['share']:.0%} of the {r['capacity_tps']:.0f} tps measured); {r.get('server', '')}\n")
    ahead = [f"{run['mode']} {run['segments_ahead']}" for run in r.get("runs", []) if "segments_ahead" in run]
    if ahead:
        head += (f"WAL segments recycled ahead when each mode began (--wal-ahead {r.get('wal_ahead_mb', 0)} MB): "
                 f"{', '.join(ahead)}\n")
    head += "\n"
    if "versus" in r:
        return head + versus_report(r["versus"])
    if "signals" in r:
        s = r["signals"]
        rows = [(k, v["p50"], v["mean"], v["median_idle"], v["median_all"]) for k, v in s["correlation"].items()]
        rise = s.get("rise", {})
        rows = [(*row, (rise.get(row[0]) or {}).get("copy"), (rise.get(row[0]) or {}).get("index builds"))
                for row in rows]
        w = rise.get("writers_p50") or {}
        return head + f"{s['seconds']} seconds compared; the writers' p50 rose {w.get('copy')}x in the copy and " \
            f"{w.get('index builds')}x in the index builds\n\n" + table(
                rows, ("signal", "r with the writers' p50 per second", "r with their mean", "median idle",
                       "median over the run", "copy / idle", "index builds / idle"))
    rows = []
    for spell, got in (r.get("side_by_side") or {}).items():
        ref = r["side_by_side"]["idle"]
        rows.append(("side by side, no mover", spell, got["statement_s"], got["tps"],
                     f"{got['tps'] / ref['tps']:.2f}", got["p50_ms"], got["p99_ms"],
                     f"{got['p99_ms'] / ref['p99_ms']:.2f}"))
    c = r.get("control")
    if c:
        for spell in ("idle", "insert", "idle 2", "cpu", "idle 3"):
            got = c[spell]
            what = {"insert": f"INSERT ... SELECT of {c['rows_per_second']:,} rows once a second "
                              f"({c['statement_ms']['insert']} ms each)",
                    "cpu": f"the same CPU alone once a second ({c['statement_ms']['cpu']} ms each)"}.get(spell, spell)
            rows.append(("control, no mover", what, got["seconds"], got["tps"],
                         f"{got['tps'] / c['idle']['tps']:.2f}", got["p50_ms"], got["p99_ms"],
                         f"{got['p99_ms'] / c['idle']['p99_ms']:.2f}"))
    for run in r.get("runs", []):
        for phase in ("copy", "index builds", "reconcile"):
            got = run[phase]
            tps, p99 = ratios(run, phase)
            rows.append((run["mode"], phase, got["seconds"], got["tps"], tps, got["p50_ms"], got["p99_ms"], p99))
        rows.append((run["mode"], "idle (reference)", run["idle"]["seconds"], run["idle"]["tps"], "1.00",
                     run["idle"]["p50_ms"], run["idle"]["p99_ms"], "1.00"))
    for run in r.get("applier", []):
        if not run["replayed"]:
            continue  # the copy ended before the pause: nothing to replay (more --rows)
        tps, p99 = ratios(run, "applier")
        a = run["applier"]
        rows.append((run["mode"], f"applier alone ({run['replayed']:,} replayed)", a["seconds"], a["tps"], tps,
                     a["p50_ms"], a["p99_ms"], p99))
    text = head + table(rows, ("mode", "phase", "seconds", "writers tps", "tps / idle", "p50 ms", "p99 ms",
                               "p99 / idle"))
    for run in r.get("runs", []):
        for phase, w in (run.get("slow_waits") or {}).items():
            if w["slow"]:
                text += (f"\n{run['mode']}, {phase}: {w['slow']:,} writers' transactions over {SLOW_MS:.0f} ms,"
                         " waiting " + ", ".join(f"{k} {v:.0%}" for k, v in w["waits"].items()))
                u = w.get("unwritten") or {}
                text += "" if not u else "; unwritten (median / max / median while slow): " + ", ".join(
                    f"{k} {v['median']} / {v['max']} / {v['slow_median']}" for k, v in u.items())
    by = {run["mode"]: run for run in r.get("runs", [])}
    if "governed" in by and "ungoverned" in by:
        g, u = by["governed"], by["ungoverned"]
        text += (f"\n\nbackfill step: governed {g['backfill_s']} s (copy {g['copy_s']} s, throttled "
                 f"{g['throttled_seconds']} s), ungoverned {u['backfill_s']} s: "
                 f"{g['backfill_s'] / u['backfill_s']:.2f}x (goal <= 1.8)")
    b = r.get("burst")
    if b and "error" in b:
        text += f"\n\nburst: {b['error']}"
    elif b:
        text += (f"\n\nburst (a second pgbench at full speed for {r['burst_seconds']} s at a third of a governed "
                 f"backfill): throttled {b['backed_off_after_s']} s after it began (goal <= 2"
                 f"{'; throttled already when it began' if b.get('throttled_at_start') else ''}), released "
                 f"{b['released_after_s']} s after it ended; copy rows/s before {b['rows_per_second_before']:,}, "
                 f"during {b['rows_per_second_during']:,}, after {b['rows_per_second_after']:,}")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--shape", choices=["narrow", "wide"], default="narrow")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--share", type=float, default=0.5, help="of the measured capacity, for the writers' -R")
    ap.add_argument("--capacity-seconds", type=int, default=15)
    ap.add_argument("--idle-seconds", type=int, default=10)
    ap.add_argument("--backlog-seconds", type=int, default=20)
    ap.add_argument("--applier-seconds", type=int, default=10)
    ap.add_argument("--burst-seconds", type=int, default=10)
    ap.add_argument("--skip", action="append", default=[],
                    choices=["burst", "applier", "ungoverned", "governed", "live-control"])
    ap.add_argument("--signals", action="store_true", help="measure how the signals track the writers' latency")
    ap.add_argument("--plan-extra", default="", help="TOML appended to every plan, e.g. a [backfill] section "
                    "(with --skip applier --skip burst, whose plans have one)")
    ap.add_argument("--waits", action="store_true",
                    help=f"sample what the writers wait on (pg_stat_activity every 4 ms: a load of its own) and report"
                         f" it for their transactions over {SLOW_MS:.0f} ms, phase by phase")
    ap.add_argument("--timeline", help="with --waits: write each mode's transactions, samples and events to"
                    " TIMELINE-<mode>.json")
    ap.add_argument("--control", action="store_true",
                    help="also the control without mover: a plain INSERT ... SELECT of --control-rows once a"
                         " second, then the same CPU alone, between idle spells")
    ap.add_argument("--side-by-side", action="store_true",
                    help="also, without mover: a plain CREATE INDEX and a CPU-bound query, each alone and two at"
                         " once, between idle spells")
    ap.add_argument("--versus-control", action="store_true",
                    help="instead: mover's backfill governed, the same rows copied by plain INSERT ... SELECT at"
                         " its average rate and then the same index builds, the same again with mover's capture and"
                         " replay beside it (--skip live-control leaves it out), one INSERT ... SELECT at full speed,"
                         " mover ungoverned; the writers' worst second in each, side by side")
    ap.add_argument("--versus-period", type=float, action="append", metavar="SECONDS",
                    help="with --versus-control: the paced control runs a statement every SECONDS (default 1);"
                         " given more than once, one paced control per period")
    ap.add_argument("--control-rows", type=int, default=25_000)
    ap.add_argument("--control-seconds", type=int, default=20)
    ap.add_argument("--wal-ahead", type=int, default=0, metavar="MB",
                    help="keep this much WAL recycled ahead (min_wal_size raised to it, the segments made once at"
                         " the start), as on a server that has run a while; default: a new server's few")
    ap.add_argument("--dsn", help="an existing server (superuser); default: start one")
    args = ap.parse_args()
    if args.versus_control and "governed" in args.skip:
        ap.error("--versus-control paces its control by mover's governed backfill: it cannot skip it")
    results: dict[str, Any] = {"rows": args.rows, "shape": args.shape, "clients": args.clients, "share": args.share,
                               "burst_seconds": args.burst_seconds}
    settings = {"min_wal_size": f"{args.wal_ahead + 512}MB"} if args.wal_ahead else {}
    results["wal_ahead_mb"] = args.wal_ahead
    with server(args.dsn, settings) as (dsn, _), tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        db = create_database(dsn, "bench_impact")
        from mover import api
        api.init(db)
        generate(db, SOURCE, args.rows, args.shape)
        with connect(db) as conn:
            results["server"] = conn.execute("SELECT version()").fetchone()[0]
        if args.wal_ahead:
            wal_ahead(db, args.wal_ahead)
        results["capacity_tps"] = capacity(db, workdir, args.rows, args.clients, args.capacity_seconds)
        rate = results["rate"] = results["capacity_tps"] * args.share
        print(f"capacity {results['capacity_tps']:.0f} tps; writers at {rate:.0f} tps", flush=True)
        if args.signals:
            results["signals"] = signals_run(db, workdir, args, rate)
        elif args.versus_control:
            results["versus"] = versus(db, workdir, args, rate)
        else:
            modes = [m for m in (True, False) if ("governed" if m else "ungoverned") not in args.skip]
            results["runs"] = []
            for governed in modes:
                results["runs"].append(phases(db, workdir, args, rate, governed))
                print(json.dumps(results["runs"][-1], default=str), flush=True)
            if "applier" not in args.skip:
                results["applier"] = [applier(db, workdir, args, rate, governed) for governed in modes]
            if "burst" not in args.skip and True in modes:
                results["burst"] = burst(db, workdir, args, rate)
            if args.control:
                results["control"] = control(db, workdir, args, rate)
            if args.side_by_side:
                results["side_by_side"] = side_by_side(db, workdir, args, rate)
    path = save("impact" + ("-signals" if args.signals else "-versus" if args.versus_control else ""), results)
    print(report(results))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
