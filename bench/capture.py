"""Capture overhead (issue #12): what the application pays for mover's trigger, trigger design
by trigger design, measured side by side on one server in one run.

    .venv/bin/python bench/changelog.py [--runs 10] [--seconds 5] [--scale 20] [--clients 4]
                                      [--variant NAME ...] [--dsn DSN]

pgbench's built-in tpcb-like and simple-update on pgbench_accounts (the trigger sits on that
table only: one logged key per transaction for both scripts), each variant installed,
measured for --seconds and removed again. Every round runs every variant once, in an order
shuffled per round (seeded), so drift over the run (table bloat, checkpoints, the history
table growing) falls on all variants alike. Reported per variant: the median TPS, its spread
(min..max and the interquartile range), the cost against no trigger from the medians, and the
median of the per-round paired ratios (variant / no trigger in the same round), which drift
between rounds cannot move.

Variants (names for --variant):
  none        no trigger: the baseline
  mover       mover's trigger as shipped: a plpgsql row trigger, SECURITY DEFINER without a SET
              clause (its body fully qualified), appending the key to a log with a bigint
              identity seq and a plain (not unique) index on it (mover/sql/changelog.py)
  invoker     the design before issue 20: the same function SECURITY INVOKER (the log granted to
              PUBLIC), the log's seq its primary key
  statement   statement-level triggers with transition tables, one per event (PostgreSQL
              allows transition tables only on single-event triggers), each one INSERT ... SELECT
              of the keys into the same log
  definer_set mover's function with SET search_path = pg_catalog, pg_temp (a GUC save and
              restore on every call): what a pinned search_path would cost instead of the
              qualified body
  log_pk      mover's trigger, the log's seq a primary key instead of a plain index (what the
              unique check costs)
  no_log_index  mover's trigger, the log without any index on seq
  unlogged    mover's trigger, the log UNLOGGED: what the log's WAL costs (not shippable: an
              unlogged log is empty after a crash, losing changes)
  fillfactor  mover's trigger, the log at fillfactor 50
  seq_cache   mover's trigger, the log's identity sequence with CACHE 64: each backend takes its
              keys from its own block of numbers instead of the sequence's one shared page
  partitioned_log  mover's trigger, the log partitioned by range of seq (what a log emptied by
              TRUNCATE of applied partitions would cost the application: the routing of each row)
  logical     no trigger: mover's logical capture ([capture] method = "logical"), a migration of
              pgbench_accounts through install_capture (its publication, its replication slot,
              the TRUNCATE trigger alone), and its feeder reading the slot into the change log
              while pgbench runs (mover/engines/capture/logical.py; the applier does not run, as for the
              trigger variants). Reported beside it: the CPU the decoding took (the feeder's
              server backend, read from /proc when the server is local, and the feeder's own
              Python thread), the WAL per transaction (every variant's), and how long the
              feeder took to catch up once pgbench stopped.
With the logical variant the server runs with wal_level = logical, for every variant alike (the
WAL per transaction of `none` then says what that level itself costs).
A trigger function in LANGUAGE sql is not a variant: PostgreSQL refuses it ("SQL functions
cannot return type trigger"); the script asks the server and records its answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/changelog.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import os
import random
import re
import statistics
import subprocess
import tempfile
import threading
import time

import psycopg
from psycopg import sql

from bench.common import bindir, connect, create_database, save, server, table

MID = 999999
VARIANTS = ("none", "mover", "invoker", "statement", "definer_set", "log_pk", "no_log_index", "unlogged",
            "fillfactor", "seq_cache", "partitioned_log", "logical")
DEFAULT_VARIANTS = ("none", "mover", "invoker", "definer_set", "log_pk")
WORKLOADS = ("tpcb-like", "simple-update")


def _names():
    from mover import names
    return (names.QualifiedName("public", "pgbench_accounts"), names.change_log(MID), names.capture_function(MID),
            names.capture_trigger(MID))


def install(cur: psycopg.Cursor, variant: str) -> None:
    from mover.engines.capture import changelog
    from mover.sql import capture as q
    accounts, log, fn, trigger = _names()
    if variant == "none":
        return
    if variant == "statement":
        for stmt in q.create_log(log, ("aid",), ("integer",)):
            cur.execute(stmt)
        for event, refs, body in (
                ("INSERT", "NEW TABLE AS n", "INSERT INTO {log} (aid) SELECT aid FROM n"),
                ("DELETE", "OLD TABLE AS o", "INSERT INTO {log} (aid) SELECT aid FROM o"),
                # the new keys, and the old ones an UPDATE moved away from (rows are not paired)
                ("UPDATE", "OLD TABLE AS o NEW TABLE AS n",
                 "INSERT INTO {log} (aid) SELECT aid FROM n UNION ALL (SELECT aid FROM o EXCEPT SELECT aid FROM n)")):
            f = sql.Identifier(fn.schema, f"{fn.name}_{event.lower()}")
            text = sql.SQL("BEGIN " + body + "; RETURN NULL; END").format(log=log.ident).as_string(cur)
            cur.execute(sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS {}").format(
                f, sql.Literal(text)))  # a function body is a literal: PostgreSQL takes no parameter there
            cur.execute(sql.SQL("CREATE TRIGGER {} AFTER {} ON {} REFERENCING {} FOR EACH STATEMENT"
                                " EXECUTE FUNCTION {}()").format(
                sql.Identifier(f"{trigger}_{event.lower()}"), sql.SQL(event), accounts.ident, sql.SQL(refs), f))
        return
    changelog.install(cur, MID, accounts, ("aid",), "bench")
    seq_index = sql.Identifier(log.schema, f"{log.name}_seq")
    if variant == "definer_set":
        cur.execute(sql.SQL("ALTER FUNCTION {}() SET search_path = pg_catalog, pg_temp").format(fn.ident))
    elif variant in ("log_pk", "invoker"):
        cur.execute(sql.SQL("DROP INDEX {}").format(seq_index))
        cur.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (seq)").format(log.ident))
        if variant == "invoker":
            cur.execute(sql.SQL("ALTER FUNCTION {}() SECURITY INVOKER").format(fn.ident))
            cur.execute(sql.SQL("GRANT INSERT ON {} TO PUBLIC").format(log.ident))
    elif variant == "no_log_index":
        cur.execute(sql.SQL("DROP INDEX {}").format(seq_index))
    elif variant == "unlogged":
        cur.execute(sql.SQL("ALTER TABLE {} SET UNLOGGED").format(log.ident))
    elif variant == "fillfactor":
        cur.execute(sql.SQL("ALTER TABLE {} SET (fillfactor = 50)").format(log.ident))
    elif variant == "partitioned_log":
        # The same columns, partitioned by range of seq; the trigger finds it by name.
        cur.execute(sql.SQL("DROP TABLE {}").format(log.ident))
        cur.execute(sql.SQL("CREATE TABLE {} (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, aid integer,"
                            " logged_at timestamptz NOT NULL DEFAULT now())"
                            " PARTITION BY RANGE (seq)").format(log.ident))
        for i, (lo, hi) in enumerate((("MINVALUE", "10000000"), ("10000000", "MAXVALUE"))):
            cur.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(log.schema, f"{log.name}_{i}"), log.ident, sql.SQL(lo), sql.SQL(hi)))
    elif variant == "seq_cache":
        cur.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN seq SET CACHE 64").format(log.ident))


def remove(cur: psycopg.Cursor, variant: str) -> None:
    from mover.engines.capture import changelog
    accounts, log, fn, trigger = _names()
    if variant == "none":
        return
    if variant == "statement":
        for event in ("insert", "update", "delete"):
            cur.execute(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(f"{trigger}_{event}"), accounts.ident))
            cur.execute(sql.SQL("DROP FUNCTION {}()").format(sql.Identifier(fn.schema, f"{fn.name}_{event}")))
        cur.execute(sql.SQL("DROP TABLE {}").format(log.ident))
        return
    changelog.remove(cur, MID, accounts)


def sql_trigger_answer(dsn: str) -> str:
    """What the server says to a trigger function in LANGUAGE sql."""
    with connect(dsn) as conn:
        try:
            conn.execute("CREATE FUNCTION bench_sql_trigger() RETURNS trigger LANGUAGE sql AS 'SELECT NULL'")
        except psycopg.Error as exc:
            return str(exc).splitlines()[0]
        conn.execute("DROP FUNCTION bench_sql_trigger()")
        return "accepted"


LOGICAL_PLAN = """
[migration]
name = "bench_logical"
source = "public.pgbench_accounts"

[rollback]
window = "1h"

[capture]
method = "logical"
"""


class Feeder:
    """The logical variant: a migration of pgbench_accounts through install_capture, and mover's
    feeder reading its slot in a thread while pgbench runs; stop() says what it cost."""

    def __init__(self, dsn: str, plan_path: Path):
        from mover import api
        self.dsn, self.plan = dsn, str(plan_path)
        plan_path.write_text(LOGICAL_PLAN)
        api.run(dsn, self.plan, one_step=True)  # create_target
        api.run(dsn, self.plan, one_step=True)  # install_capture: publication, slot, TRUNCATE trigger
        self.stop_event = threading.Event()
        self.thread_cpu = 0.0
        self.errors: list[str] = []

    def __enter__(self) -> Feeder:
        from mover.db import Database
        from mover.runner.lease import leased
        from mover.state import control
        self.db = Database(self.dsn)
        m = self.db.transaction(lambda cur: control.get(cur, "bench_logical"))
        self.lease = leased(self.db, m, control.new_owner_id())
        self.ctx = self.lease.__enter__()
        self.backend = self.db.connection().info.backend_pid
        self.cpu_before = backend_cpu(self.backend)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def _loop(self) -> None:
        from mover.engines.bulk import backfill
        from mover.engines.capture import changelog, logical
        started = time.thread_time()
        try:
            while not self.stop_event.is_set():
                # As the backfill's applier feeds: a round, then a pause unless a full batch came.
                if logical.feed(self.ctx, catch_up=False).keys < changelog.BATCH:
                    self.stop_event.wait(backfill.APPLY_IDLE_SECONDS)
        except Exception as exc:  # reported with the results: a feeder that failed measured nothing
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            self.thread_cpu = time.thread_time() - started

    def stop(self) -> dict:
        """Stop feeding; then one catch-up feed (what pgbench left unfed), timed."""
        from mover.engines.capture import logical
        self.stop_event.set()
        self.thread.join(60)
        started = time.monotonic()
        fed = logical.feed(self.ctx, catch_up=True)
        catch_up_s = time.monotonic() - started
        cpu = backend_cpu(self.backend)
        return {"feeder_thread_cpu_s": self.thread_cpu, "catch_up_s": catch_up_s, "catch_up_keys": fed.keys,
                "backend_cpu_s": None if cpu is None or self.cpu_before is None else cpu - self.cpu_before,
                "errors": self.errors}

    def __exit__(self, *exc: object) -> None:
        from mover import api
        self.lease.__exit__(None, None, None)
        self.db.close()
        api.abort(self.dsn, "bench_logical")  # drops the publication, the slot, the log


def backend_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a server process, from /proc (None when the server is not
    on this host)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wal_lsn(dsn: str) -> int:
    with connect(dsn) as conn:
        (diff,) = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone()
    return int(diff)


def logged_keys(dsn: str, variant: str) -> int | None:
    if variant in ("none", "logical"):
        return None
    _, log, _, _ = _names()
    with connect(dsn) as conn:
        conn.autocommit = False
        cur = conn.cursor()
        cur.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")
        cur.execute("UPDATE pgbench_accounts SET aid = -aid WHERE aid = 2")  # a key change: old and new key
        n = cur.execute(sql.SQL("SELECT count(*) FROM {}").format(log.ident)).fetchone()[0]
        conn.rollback()
    return n


def pgbench(dsn: str, builtin: str, seconds: int, clients: int) -> float:
    out = subprocess.run([str(bindir() / "pgbench"), "-n", "-c", str(clients), "-j", str(min(clients, 2)),
                          "-T", str(seconds), "-b", builtin, dsn], check=True, capture_output=True, text=True).stdout
    m = re.search(r"tps = ([\d.]+)", out)
    assert m, out
    return float(m.group(1))


def summary(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "q1": q[0], "q3": q[2],
            "runs": values}


def run(dsn: str, runs: int, seconds: int, scale: int, clients: int, variants: tuple[str, ...], seed: int) -> dict:
    from mover import api
    from mover.db import Database
    pgdsn = create_database(dsn, "bench_capture")
    subprocess.run([str(bindir() / "pgbench"), "-i", "-q", "-s", str(scale), pgdsn], check=True, capture_output=True)
    api.init(pgdsn)
    db = Database(pgdsn)
    results: dict = {"sql_trigger_function": sql_trigger_answer(pgdsn), "logged_keys_check": {}}
    for v in variants:  # each variant logs what mover's does for an update and a key change: 3 keys
        if v == "logical":
            continue
        db.transaction(lambda cur, v=v: install(cur, v))
        results["logged_keys_check"][v] = logged_keys(pgdsn, v)
        db.transaction(lambda cur, v=v: remove(cur, v))
    rng = random.Random(seed)
    plan_path = Path(tempfile.mkdtemp(prefix="bench-capture-")) / "logical.toml"
    for builtin in WORKLOADS:
        tps: dict[str, list[float]] = {v: [] for v in variants}
        wal: dict[str, list[float]] = {v: [] for v in variants}
        decoding: list[dict] = []
        for r in range(runs):
            order = list(variants)
            rng.shuffle(order)
            for v in order:
                if v == "logical":
                    with Feeder(pgdsn, plan_path) as feeder:
                        before = wal_lsn(pgdsn)
                        tps[v].append(pgbench(pgdsn, builtin, seconds, clients))
                        wal[v].append((wal_lsn(pgdsn) - before) / (tps[v][-1] * seconds))
                        decoding.append(feeder.stop())
                    continue
                db.transaction(lambda cur, v=v: install(cur, v))
                before = wal_lsn(pgdsn)
                tps[v].append(pgbench(pgdsn, builtin, seconds, clients))
                wal[v].append((wal_lsn(pgdsn) - before) / (tps[v][-1] * seconds))
                db.transaction(lambda cur, v=v: remove(cur, v))
            print(f"{builtin} round {r + 1}/{runs}: " + ", ".join(f"{v} {tps[v][-1]:.0f}" for v in variants),
                  flush=True)
        base = tps["none"]
        results[builtin] = {v: {**summary(tps[v]), "cost": 1 - statistics.median(tps[v]) / statistics.median(base),
                                "paired_cost": 1 - statistics.median(a / b for a, b in zip(tps[v], base, strict=True)),
                                "wal_bytes_per_transaction": statistics.median(wal[v])}
                            for v in variants}
        if decoding:
            results[builtin]["logical"]["decoding"] = {
                k: statistics.median(d[k] for d in decoding if d[k] is not None)
                if any(d[k] is not None for d in decoding) else None
                for k in ("feeder_thread_cpu_s", "backend_cpu_s", "catch_up_s", "catch_up_keys")}
            results[builtin]["logical"]["decoding"]["errors"] = [e for d in decoding for e in d["errors"]]
    db.close()
    return results


def report(r: dict) -> str:
    out = []
    decoding = []
    for builtin in WORKLOADS:
        for v, x in r[builtin].items():
            wal = x.get("wal_bytes_per_transaction")
            out.append((builtin, v, f"{x['median']:,.0f}", f"{x['min']:,.0f}..{x['max']:,.0f}",
                        f"{x['q1']:,.0f}..{x['q3']:,.0f}", "" if v == "none" else f"{x['cost'] * 100:.1f} %",
                        "" if v == "none" else f"{x['paired_cost'] * 100:.1f} %",
                        "" if wal is None else f"{wal:,.0f}"))
            if "decoding" in x:
                d = x["decoding"]
                seconds = r["seconds"]
                decoding.append((builtin, _share(d["backend_cpu_s"], seconds),
                                 _share(d["feeder_thread_cpu_s"], seconds),
                                 f"{d['catch_up_s']:.2f} s ({d['catch_up_keys']:,.0f} keys)",
                                 "; ".join(d["errors"][:2]) or "none"))
    text = (f"pgbench scale {r['scale']}, {r['clients']} clients, {r['seconds']} s per run, {r['runs']} interleaved"
            f" rounds; {r['server']}\n\n"
            + table(out, ("workload", "variant", "median tps", "min..max", "q1..q3", "cost (medians)",
                          "cost (paired, median)", "WAL bytes / transaction (mover's own included)")))
    if decoding:
        text += "\n\nlogical capture, medians per run:\n\n" + table(decoding, (
            "workload", "decoding backend CPU", "feeder thread CPU", "catch-up after pgbench", "feeder errors"))
    return (text
            + f"\n\nLANGUAGE sql trigger function: {r['sql_trigger_function']}"
            + f"\nkeys logged for one update and one key change: {r['logged_keys_check']}")


def _share(cpu_s: float | None, seconds: int) -> str:
    return "n/a (server not local)" if cpu_s is None else f"{cpu_s:.2f} s ({cpu_s / seconds * 100:.0f} % of a core)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="interleaved rounds (every variant once per round)")
    ap.add_argument("--seconds", type=int, default=5, help="length of each pgbench run")
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--variant", action="append", choices=VARIANTS, help="default: " + " ".join(DEFAULT_VARIANTS))
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--dsn", help="an existing server (superuser); default: start one")
    args = ap.parse_args()
    variants = tuple(dict.fromkeys(["none", *(args.variant or DEFAULT_VARIANTS)]))
    started = time.time()
    # Logical capture needs wal_level = logical: then the server runs with it for every variant.
    with server(args.dsn, {"wal_level": "logical"} if "logical" in variants else None) as (dsn, _):
        results = run(dsn, args.runs, args.seconds, args.scale, args.clients, variants, args.seed)
        with connect(dsn) as conn:
            results["server"] = conn.execute("SELECT version()").fetchone()[0]
    results.update(runs=args.runs, seconds=args.seconds, scale=args.scale, clients=args.clients, seed=args.seed,
                   variants=variants, wall_s=time.time() - started,
                   command=" ".join(["bench/changelog.py", *sys.argv[1:]]))
    path = save("capture", results)
    print(report(results))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
