"""Backfill and capture benchmark (issue #3), measured side by side on one server in one run.

    .venv/bin/python bench/backfill.py [--rows 10000000] [--runs 3] [--dsn DSN]

1. the physical limit: INSERT INTO copy SELECT * FROM source (primary key only), then the two
   secondary index builds;
2. mover's backfill step (copy + deferred index builds + ANALYZE) with 1 and 2 workers, and
   with synchronous_commit on for its range transactions (it is off by default);
3. the same while pgbench writes to the source: the backfill's rate, and the writers' TPS
   against their TPS with no migration;
4. capture overhead alone: pgbench tpcb-like and simple-update on pgbench_accounts, with and
   without mover's capture trigger, interleaved;
5. peak RSS of the mover process;
6. the peer: pg_repack -t of the same table, idle.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/backfill.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from psycopg import sql

from bench.common import bindir, connect, create_database, generate, median, mover_cli, save, server, table, timed

SOURCE = "bench_source"


def physical_limit(dsn: str) -> dict:
    with connect(dsn) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_copy")
        conn.execute(f"CREATE TABLE bench_copy (LIKE {SOURCE} INCLUDING DEFAULTS)")
        conn.execute("ALTER TABLE bench_copy ADD PRIMARY KEY (id)")
        copy = timed(lambda: conn.execute(f"INSERT INTO bench_copy SELECT * FROM {SOURCE}"))
        idx = timed(lambda: (conn.execute("CREATE INDEX ON bench_copy (created_at)"),
                             conn.execute("CREATE INDEX ON bench_copy (account_id)")))
        conn.execute("DROP TABLE bench_copy")
        conn.execute("CHECKPOINT")
    return {"copy_s": copy, "indexes_s": idx, "total_s": copy + idx}


PLAN = """
[migration]
name = "{name}"
source = "{source}"
[backfill]
workers = {workers}
synchronous_commit = {sync}
[rollback]
window = "0s"
"""


def mover_backfill(dsn: str, workdir: Path, name: str, workers: int, sync: bool = False) -> dict:
    plan = workdir / f"{name}.toml"
    plan.write_text(PLAN.format(name=name, source=SOURCE, workers=workers, sync=str(sync).lower()))
    for _ in range(2):  # create_target, install_capture
        proc, _ = mover_cli(dsn, "step", str(plan))
        assert proc.returncode == 0, proc.stderr
    started = time.perf_counter()
    proc, rss = mover_cli(dsn, "step", name)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr
    with connect(dsn) as conn:
        rows, copy_ms = conn.execute(
            "SELECT sum(c.rows), extract(epoch FROM max(c.finished_at) - min(c.finished_at)) * 1000 FROM mover.ranges c"
            " JOIN mover.migrations m ON m.id = c.migration_id WHERE m.name = %s AND c.kind = 'backfill'",
            (name,)).fetchone()
        ranges = conn.execute("SELECT count(*), avg(c.rows)::int FROM mover.ranges c JOIN mover.migrations m"
                              " ON m.id = c.migration_id WHERE m.name = %s AND c.kind = 'backfill'", (name,)).fetchone()
    proc, _ = mover_cli(dsn, "abort", name)
    assert proc.returncode == 0, proc.stderr
    with connect(dsn) as conn:
        conn.execute("CHECKPOINT")
    return {"step_s": seconds, "rows": int(rows), "rss_kib": rss, "ranges": ranges[0], "avg_range_rows": ranges[1]}


WRITE_SCRIPTS = {
    "update": f"\\set id random(1, :maxid)\nUPDATE {SOURCE} SET amount = amount + 1, status = 'paid' WHERE id = :id;\n",
    "insert": f"\\set acc random(1, 100000)\nINSERT INTO {SOURCE} (created_at, account_id, amount, status, payload)"
              f" VALUES (now(), :acc, 1, 'new', repeat('x', 80));\n",
    "delete": f"\\set id random(1, :maxid)\nDELETE FROM {SOURCE} WHERE id = :id;\n",
}


def start_pgbench(dsn: str, workdir: Path, rows: int, seconds: int, clients: int = 2) -> subprocess.Popen:
    files = []
    for name, weight in (("update", 6), ("insert", 3), ("delete", 1)):
        f = workdir / f"{name}.sql"
        f.write_text(WRITE_SCRIPTS[name])
        files += ["-f", f"{f}@{weight}"]
    return subprocess.Popen([str(bindir() / "pgbench"), "-n", "-c", str(clients), "-j", str(clients), "-T",
                             str(seconds), "-P", "1", "-D", f"maxid={rows}", *files, dsn],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def progress_tps(stderr: str) -> list[float]:
    return [float(m) for m in re.findall(r"progress: [\d.]+ s, ([\d.]+) tps", stderr)]


def sample_backlog(dsn: str, stop: threading.Event, samples: list[int]) -> None:
    """Every 0.5 s, the number of captured changes not applied yet (all change logs)."""
    with connect(dsn) as conn:
        while not stop.wait(0.5):
            logs = conn.execute("SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n"
                                " ON n.oid = c.relnamespace WHERE n.nspname = 'mover'"
                                " AND c.relname ~ '^m[0-9]+_changes$'").fetchall()
            samples.append(sum(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(t))).fetchone()[0]
                               for (t,) in logs))


def writes_during_backfill(dsn: str, workdir: Path, rows: int) -> dict:
    baseline = start_pgbench(dsn, workdir, rows, 20)
    _, err = baseline.communicate()
    base_tps = median(progress_tps(err)[2:]) if progress_tps(err) else 0.0
    writers = start_pgbench(dsn, workdir, rows, 3600)
    time.sleep(3)  # let the writers reach their steady state before the migration starts
    stop, backlog = threading.Event(), []
    sampler = threading.Thread(target=sample_backlog, args=(dsn, stop, backlog), daemon=True)
    sampler.start()
    result = mover_backfill(dsn, workdir, "bench_writes", workers=1)
    stop.set()
    sampler.join()
    writers.terminate()  # SIGTERM: a background shell may have pgbench ignore SIGINT
    _, err = writers.communicate()
    tps = progress_tps(err)
    during = median(tps[3:3 + int(result["step_s"])]) if len(tps) > 3 else 0.0
    return {**result, "writer_tps_idle": base_tps, "writer_tps_during": during,
            "backlog_max": max(backlog, default=0), "backlog_last": backlog[-1] if backlog else 0}


def capture_overhead(dsn: str, runs: int, seconds: int, scale: int) -> dict:
    from mover import capture, names
    from mover.db import Database
    pgdsn = create_database(dsn, "bench_pgbench")
    pgbench = str(bindir() / "pgbench")
    subprocess.run([pgbench, "-i", "-q", "-s", str(scale), pgdsn], check=True, capture_output=True)
    from mover import api
    api.init(pgdsn)
    db = Database(pgdsn)
    accounts = names.QualifiedName("public", "pgbench_accounts")

    def run(builtin: str) -> float:
        out = subprocess.run([pgbench, "-n", "-c", "4", "-j", "2", "-T", str(seconds), "-b", builtin, pgdsn],
                             check=True, capture_output=True, text=True).stdout
        return float(re.search(r"tps = ([\d.]+)", out).group(1))

    results: dict = {}
    for builtin in ("tpcb-like", "simple-update"):
        off, on = [], []
        for _ in range(runs):  # interleaved, so drift hits both sides alike
            off.append(run(builtin))
            db.transaction(lambda cur: capture.install(cur, 999999, accounts, ("aid",), "bench"))
            on.append(run(builtin))
            db.transaction(lambda cur: capture.remove(cur, 999999, accounts))
        results[builtin] = {"tps_without": median(off), "tps_with": median(on),
                            "cost": 1 - median(on) / median(off), "runs_without": off, "runs_with": on}
    db.close()
    return results


def pg_repack(dsn: str) -> dict:
    exe = shutil.which("pg_repack") or (str(bindir() / "pg_repack") if (bindir() / "pg_repack").exists() else None)
    if exe is None:
        return {"error": "pg_repack not installed (apt-get install postgresql-15-repack)"}
    with connect(dsn) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_repack")
        except Exception as exc:  # the pgserver wheel's PostgreSQL has no pg_repack
            return {"error": f"CREATE EXTENSION pg_repack failed: {exc}"}
        conn.execute("CHECKPOINT")
    from psycopg.conninfo import conninfo_to_dict
    info = conninfo_to_dict(dsn)
    started = time.perf_counter()
    proc = subprocess.run([exe, "-h", info.get("host", "127.0.0.1"), "-p", str(info.get("port", 5432)),
                           "-U", info.get("user", "postgres"), "-d", info["dbname"], "-t", SOURCE],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-500:]}
    return {"seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=3, help="runs of each short measurement (median)")
    ap.add_argument("--dsn", help="an existing server (superuser); default: start one")
    ap.add_argument("--pgbench-seconds", type=int, default=20)
    ap.add_argument("--pgbench-scale", type=int, default=20)
    ap.add_argument("--skip", action="append", default=[],
                    choices=["limit", "mover", "sync", "writes", "capture", "repack"])
    args = ap.parse_args()
    results: dict = {"rows": args.rows, "runs": args.runs}
    with server(args.dsn) as (dsn, pg), tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        db = create_database(dsn, "bench")
        from mover import api
        api.init(db)
        with connect(db) as conn:
            results["server"] = conn.execute("SELECT version()").fetchone()[0]
        print(f"generating {args.rows:,} rows ...", flush=True)
        results["generate_s"] = timed(lambda: generate(db, SOURCE, args.rows))
        runs = args.runs if args.rows <= 2_000_000 else max(1, min(args.runs, 2))
        if "limit" not in args.skip:
            limit = [physical_limit(db) for _ in range(runs)]
            results["limit"] = {k: median([r[k] for r in limit]) for k in limit[0]}
            print("limit", results["limit"], flush=True)
        if "mover" not in args.skip:
            for workers in (1, 2):
                one = [mover_backfill(db, workdir, f"bench_w{workers}", workers) for _ in range(runs)]
                results[f"mover_{workers}w"] = {k: median([r[k] for r in one]) for k in one[0]}
                print(f"mover {workers}w", results[f"mover_{workers}w"], flush=True)
        if "sync" not in args.skip:
            results["mover_1w_sync_on"] = mover_backfill(db, workdir, "bench_sync", 1, sync=True)
            print("sync on", results["mover_1w_sync_on"], flush=True)
        if "writes" not in args.skip:
            results["writes"] = writes_during_backfill(db, workdir, args.rows)
            print("writes", results["writes"], flush=True)
            generate(db, SOURCE, args.rows)  # the writers changed it; later figures use a fresh one
        if "repack" not in args.skip:
            results["pg_repack"] = pg_repack(db)
            print("pg_repack", results["pg_repack"], flush=True)
        if "capture" not in args.skip:
            results["capture"] = capture_overhead(dsn, args.runs, args.pgbench_seconds, args.pgbench_scale)
            print("capture", results["capture"], flush=True)
    path = save("backfill", results)
    print(report(results))
    print(f"\nresults: {path}")


def report(r: dict) -> str:
    rows = r["rows"]
    out = []
    limit = r.get("limit", {}).get("total_s")

    def line(what, seconds, note=""):
        ratio = f"{limit / seconds:.2f}" if limit and seconds else "-"
        out.append((what, f"{seconds:.1f}", f"{rows / seconds:,.0f}", ratio, note))

    if "limit" in r:
        line("physical limit: INSERT ... SELECT (pk only) + 2 index builds", limit,
             f"copy {r['limit']['copy_s']:.1f} s + indexes {r['limit']['indexes_s']:.1f} s")
    for key, label in (("mover_1w", "mover backfill, 1 worker"), ("mover_2w", "mover backfill, 2 workers"),
                       ("mover_1w_sync_on", "mover backfill, 1 worker, synchronous_commit on")):
        if key in r:
            m = r[key]
            line(label, m["step_s"],
                 f"{m['ranges']:.0f} ranges of ~{m['avg_range_rows']:,.0f} rows, RSS {m['rss_kib'] / 1024:.0f} MiB")
    if "writes" in r:
        w = r["writes"]
        line("mover backfill, 1 worker, pgbench writing", w["step_s"],
             f"writers {w['writer_tps_during']:.0f} tps vs {w['writer_tps_idle']:.0f} idle "
             f"({w['writer_tps_during'] / max(w['writer_tps_idle'], 1):.2f}); capture backlog at most "
             f"{w['backlog_max']:,} changes")
    if r.get("pg_repack", {}).get("seconds"):
        line("pg_repack -t (peer; one transaction, not resumable)", r["pg_repack"]["seconds"])
    text = table(out, ("what", "seconds", "rows/s", "limit / this", "notes"))
    if "capture" in r:
        cap = [(k, f"{v['tps_without']:.0f}", f"{v['tps_with']:.0f}", f"{v['cost'] * 100:.1f} %")
               for k, v in r["capture"].items()]
        text += "\n\n" + table(cap, ("pgbench", "tps without capture", "tps with capture", "cost"))
    return text


if __name__ == "__main__":
    main()
