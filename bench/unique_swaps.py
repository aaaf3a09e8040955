"""Replay under unique swaps (issue 21, item 4): how fast the closure replay (race 7) keeps a
table with a UNIQUE e-mail in sync while the application swaps e-mails between rows, and the
highest swap rate at which `mover run` still reaches the cutover gate.

    .venv/bin/python -m bench.unique_swaps [--rows 20000] [--seconds 20] [--writers 3]
                                           [--rates 50,100,200,400,0] [--timeout 300]
                                           [--parts backlog,live,ladder] [--code DIR] [--dsn DSN]

The table: acct(id int PRIMARY KEY, email text UNIQUE, note text), --rows rows, migrated to a
bigint id. The application (issue 21's writer) runs on --writers connections a mix of
transactions: half of them two-row e-mail swaps through a temporary value (the UPDATE to
'tmp-' || id, then each row takes the other's), and updates of a note, inserts and deletes for
the rest; as fast as it can, or at a swap rate it is given. Three parts:

  backlog   `mover run` has reached the gate; the writer runs --seconds with no applier, then
            `mover run acct` drains what it logged (random swaps pile up into permutation
            cycles through many rows: the closure's worst case) and re-verifies the changed
            ranges. Replay throughput under swaps = logged changes (and swaps) / that run's
            time: the rate the applier alone sustains.
  live      the same writer again, and `mover run acct` started beside it at the gate: whether
            it reaches the gate while the writer runs, in how long, and the log left pending.
  ladder    the issue's scenario at rising swap rates (--rates, swaps/s over all connections;
            0 = as fast as the writers go): a fresh table, the writer running from before the
            migration is registered, `mover run PLAN` beside it until the gate or --timeout.
            The highest rate at which it reached the gate is reported.

--code DIR runs another checkout's mover (the code before a change) on the same server.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
from psycopg import sql

from bench import common
from mover import names

PLAN = """
[migration]
name = "acct"
source = "acct"

[target]
columns = {{ id = "bigint" }}

[backfill]
range_rows = 5000

[rollback]
window = "1h"
"""


class Mix:
    """The application: a loop on one connection per writer until told to stop (bench only; the
    tests use tests/workload.py's writers). `rate`: swaps per second over all writers (each
    writer paces its own share, the other transactions in proportion); 0: as fast as it goes."""

    def __init__(self, dsn: str, rows: int, seed: int = 1, writers: int = 1, rate: float = 0):
        self.dsn, self.rows, self.seed, self.writers, self.rate = dsn, rows, seed, writers, rate
        self.tx = self.swaps = 0
        self.stop = threading.Event()
        with common.connect(dsn) as conn:  # inserted rows take ids after every row so far
            self.next_id = conn.execute("SELECT max(id) FROM acct").fetchone()[0]
        self.lock = threading.Lock()
        self.started = time.monotonic()

    def start(self) -> Mix:
        for w in range(self.writers):
            threading.Thread(target=self.run, args=(w,), daemon=True).start()
        return self

    def run(self, w: int = 0) -> None:
        # Each connection its own random stream; ids of inserted rows from one shared counter.
        rnd = random.Random(self.seed * 100 + w)
        # Half the transactions are swaps: a writer's share of `rate` swaps/s is one transaction
        # every `interval` seconds.
        interval = self.writers / (2 * self.rate) if self.rate else 0.0
        due = time.monotonic()
        with common.connect(self.dsn) as conn:
            while not self.stop.is_set():
                if interval:
                    due += interval
                    if due > time.monotonic():
                        self.stop.wait(due - time.monotonic())
                r = rnd.random()
                try:
                    with conn.transaction():
                        if r < 0.5:
                            a, b = rnd.sample(range(1, self.rows + 1), 2)
                            got = conn.execute("SELECT id, email FROM acct WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
                                               ([a, b],)).fetchall()
                            if len(got) == 2:
                                (i, ei), (j, ej) = got
                                conn.execute("UPDATE acct SET email = 'tmp-' || id WHERE id = %s", (i,))
                                conn.execute("UPDATE acct SET email = %s WHERE id = %s", ("tmp2-" + str(j), j))
                                conn.execute("UPDATE acct SET email = %s WHERE id = %s", (ej, i))
                                conn.execute("UPDATE acct SET email = %s WHERE id = %s", (ei, j))
                                with self.lock:
                                    self.swaps += 1
                        elif r < 0.7:
                            conn.execute("UPDATE acct SET note = md5(random()::text) WHERE id = %s",
                                         (rnd.randint(1, self.rows),))
                        elif r < 0.85:
                            with self.lock:
                                self.next_id += 1
                                new = self.next_id
                            conn.execute("INSERT INTO acct VALUES (%s, %s, 'new')", (new, f"n{new}@x"))
                        else:
                            conn.execute("DELETE FROM acct WHERE id = %s", (rnd.randint(self.rows, self.next_id),))
                    with self.lock:
                        self.tx += 1
                except psycopg.errors.DeadlockDetected:  # two writers swapping crossed pairs
                    pass

    def swaps_per_s(self) -> float:
        return round(self.swaps / max(time.monotonic() - self.started, 1e-9), 1)


def pending(dsn: str) -> int:
    with common.connect(dsn) as conn:
        mid = conn.execute("SELECT id FROM mover.migrations WHERE name = 'acct'").fetchone()[0]
        return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.change_log(mid).ident)).fetchone()[0]


def fresh(dsn: str, rows: int, code: Path | None) -> str:
    db = common.create_database(dsn, "bench_swaps")
    with common.connect(db) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, email text NOT NULL UNIQUE, note text)")
        conn.execute("INSERT INTO acct SELECT g, 'u' || g || '@x', 'n' FROM generate_series(1, %s) g", (rows,))
    proc, _ = common.mover_cli(db, "init", code=code)
    assert proc.returncode == 0, proc.stderr
    return db


def run_until(db: str, target: str, timeout: float, code: Path | None) -> tuple[int | str, str, float]:
    """`mover run TARGET` until it exits or `timeout`: (exit code or "timeout", stderr, seconds)."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "mover", "--dsn", db, "run", target], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=code or common.ROOT,
                            env={**os.environ, "COLUMNS": "160"})
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err, time.perf_counter() - started
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        return "timeout", err, time.perf_counter() - started


def backlog_and_live(args: argparse.Namespace, dsn: str, plan: Path) -> dict:
    db = fresh(dsn, args.rows, args.code)
    proc, _ = common.mover_cli(db, "run", str(plan), code=args.code)
    assert proc.returncode == 3, proc.stderr
    out: dict = {}
    if "backlog" in args.parts:
        mix = Mix(db, args.rows, seed=1, writers=args.writers).start()
        mix.stop.wait(args.seconds)
        mix.stop.set()
        time.sleep(0.2)  # its last transaction
        logged = pending(db)
        code, _, took = run_until(db, "acct", args.timeout, args.code)
        out["backlog"] = {"transactions": mix.tx, "swaps": mix.swaps, "logged": logged, "run_s": round(took, 1),
                          "exit": code, "replay_rows_per_s": round(logged / took),
                          "swaps_per_s": round(mix.swaps / took, 1),
                          "writer_swaps_per_s": round(mix.swaps / args.seconds, 1)}
    if "live" in args.parts:
        mix = Mix(db, args.rows, seed=2, writers=args.writers).start()
        timer = threading.Timer(args.seconds, mix.stop.set)
        timer.start()
        code, err, took = run_until(db, "acct", args.timeout, args.code)
        out["live"] = {"exit": code, "gate": "ready for cutover" in err, "run_s": round(took, 1),
                       "writer_still_running": not mix.stop.is_set(), "pending_after": pending(db)}
        mix.stop.wait()
        timer.cancel()
        out["live"].update(transactions=mix.tx, swaps=mix.swaps,
                           writer_swaps_per_s=round(mix.swaps / args.seconds, 1))
    return out


def ladder(args: argparse.Namespace, dsn: str, plan: Path) -> dict:
    """The issue's scenario at each rate: the writer from before registration, `mover run PLAN`
    beside it; the writer stops once mover has exited (or timed out)."""
    steps = []
    for rate in args.rates:
        db = fresh(dsn, args.rows, args.code)
        mix = Mix(db, args.rows, seed=3, writers=args.writers, rate=rate).start()
        time.sleep(1)  # the writer is going before the migration is registered
        code, err, took = run_until(db, str(plan), args.timeout, args.code)
        achieved = mix.swaps_per_s()
        mix.stop.set()
        step = {"rate": rate or "max", "writer_swaps_per_s": achieved, "exit": code,
                "gate": code == 3 and "ready for cutover" in err, "run_s": round(took, 1),
                "pending_after": pending(db)}
        print(step, flush=True)
        steps.append(step)
    reached = [s["writer_swaps_per_s"] for s in steps if s["gate"]]
    return {"ladder": steps, "highest_swaps_per_s_reaching_gate": max(reached) if reached else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[50, 100, 200, 400, 0],
                    help="swaps/s of the ladder's rungs over all writers; 0: as fast as they go")
    ap.add_argument("--timeout", type=float, default=300, help="seconds `mover run` gets to reach the gate")
    ap.add_argument("--parts", type=lambda s: s.split(","), default=["backlog", "live", "ladder"])
    ap.add_argument("--code", type=Path)
    ap.add_argument("--dsn")
    args = ap.parse_args()
    with common.server(args.dsn) as (dsn, _):
        plan = Path("/tmp") / f"bench-swaps-{time.time_ns()}.toml"
        plan.write_text(PLAN.format())
        results: dict = {"rows": args.rows, "seconds": args.seconds, "writers": args.writers,
                         "timeout": args.timeout, "code": str(args.code or "this checkout")}
        if {"backlog", "live"} & set(args.parts):
            results.update(backlog_and_live(args, dsn, plan))
        if "ladder" in args.parts:
            results.update(ladder(args, dsn, plan))
        print(results)
        print("saved", common.save("unique_swaps", results))


if __name__ == "__main__":
    main()
