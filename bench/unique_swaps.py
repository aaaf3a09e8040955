"""Replay under unique swaps (issue 21, item 4): how fast the closure replay (race 7) keeps a
table with a UNIQUE e-mail in sync while the application swaps e-mails between rows.

    .venv/bin/python -m bench.unique_swaps [--rows 20000] [--seconds 20] [--writers 3] [--code DIR]
                                           [--dsn DSN]

The table: acct(id int PRIMARY KEY, email text UNIQUE, note text), --rows rows, migrated to a
bigint id. Once `mover run` has reached the gate, one application connection runs, as fast as
it can for --seconds on --writers connections, a mix of transactions: half of them two-row e-mail swaps through a
temporary value (the UPDATE to 'tmp-' || id, then each row takes the other's), and updates of
a note, inserts and deletes for the rest. Then:

  backlog   the writer ran with no applier: `mover run acct` then drains what it logged and
            re-verifies the changed ranges. Replay rate = logged changes / that run's time;
            swaps/s = the swaps in it / that time: the swap rate the applier alone sustains.
  live      the same writer again, and `mover run acct` started beside it: whether it reaches
            the gate while the writer runs, in how long, and the log left pending.

--code DIR runs another checkout's mover (the code before a change) on the same server.
"""

from __future__ import annotations

import argparse
import random
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
    """The application: a loop on one connection until told to stop (bench only; the tests use
    tests/workload.py's writers)."""

    def __init__(self, dsn: str, rows: int, seed: int = 1, writers: int = 1):
        self.dsn, self.rows, self.seed, self.writers = dsn, rows, seed, writers
        self.tx = self.swaps = 0
        self.stop = threading.Event()
        with common.connect(dsn) as conn:  # inserted rows take ids after every row so far
            self.next_id = conn.execute("SELECT max(id) FROM acct").fetchone()[0]
        self.lock = threading.Lock()

    def run(self, w: int = 0) -> None:
        # Each connection its own random stream; ids of inserted rows from one shared counter.
        self.rnd = rnd = random.Random(self.seed * 100 + w)
        with common.connect(self.dsn) as conn:
            while not self.stop.is_set():
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


def pending(dsn: str) -> int:
    with common.connect(dsn) as conn:
        mid = conn.execute("SELECT id FROM mover.migrations WHERE name = 'acct'").fetchone()[0]
        return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.change_log(mid).ident)).fetchone()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--code", type=Path)
    ap.add_argument("--dsn")
    args = ap.parse_args()
    with common.server(args.dsn) as (dsn, _):
        db = common.create_database(dsn, "bench_swaps")
        with common.connect(db) as conn:
            conn.execute("CREATE TABLE acct (id int PRIMARY KEY, email text NOT NULL UNIQUE, note text)")
            conn.execute("INSERT INTO acct SELECT g, 'u' || g || '@x', 'n' FROM generate_series(1, %s) g",
                         (args.rows,))
        proc, _ = common.mover_cli(db, "init", code=args.code)
        assert proc.returncode == 0, proc.stderr
        plan = Path("/tmp") / f"bench-swaps-{time.time_ns()}.toml"
        plan.write_text(PLAN.format())
        proc, _ = common.mover_cli(db, "run", str(plan), code=args.code)
        assert proc.returncode == 3, proc.stderr

        def writer_for(seconds: float) -> Mix:
            mix = Mix(db, args.rows, seed=int(seconds * 10), writers=args.writers)
            for w in range(args.writers):
                threading.Thread(target=mix.run, args=(w,), daemon=True).start()
            timer = threading.Timer(seconds, mix.stop.set)
            timer.start()
            return mix

        results: dict = {"rows": args.rows, "seconds": args.seconds, "writers": args.writers,
                         "code": str(args.code or "this checkout"),
                         "machine": "2 cores shared with other engineers' test runs: a busy machine"}
        mix = writer_for(args.seconds)
        mix.stop.wait()
        time.sleep(0.2)  # its last transaction
        logged = pending(db)
        started = time.perf_counter()
        proc, _ = common.mover_cli(db, "run", "acct", code=args.code)
        took = time.perf_counter() - started
        results["backlog"] = {"transactions": mix.tx, "swaps": mix.swaps, "logged": logged,
                              "run_s": round(took, 1), "exit": proc.returncode,
                              "replay_rows_per_s": round(logged / took), "swaps_per_s": round(mix.swaps / took, 1),
                              "writer_swaps_per_s": round(mix.swaps / args.seconds, 1)}
        mix = writer_for(args.seconds)
        started = time.perf_counter()
        proc, _ = common.mover_cli(db, "run", "acct", code=args.code)
        took = time.perf_counter() - started
        results["live"] = {"exit": proc.returncode, "gate": "ready for cutover" in proc.stderr,
                           "run_s": round(took, 1), "writer_still_running": not mix.stop.is_set(),
                           "pending_after": pending(db)}
        mix.stop.wait()
        results["live"].update(transactions=mix.tx, swaps=mix.swaps,
                               writer_swaps_per_s=round(mix.swaps / args.seconds, 1))
        print(results)
        print("saved", common.save("unique_swaps", results))


if __name__ == "__main__":
    main()
