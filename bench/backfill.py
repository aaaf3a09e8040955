"""Backfill and capture benchmark (issues #3, #12), measured side by side on one server in one run.

    .venv/bin/python bench/backfill.py [--rows 10000000] [--runs 3] [--shape narrow|wide] [--dsn DSN]

1. the single-statement bound: INSERT INTO copy SELECT * FROM source (primary key only), then
   the shape's secondary index builds, one after the other;
2. mover's backfill step (copy + deferred index builds + ANALYZE) with 1 and 2 workers, and
   with synchronous_commit on for its range transactions (it is off by default);
3. the same while pgbench writes to the source: the backfill's rate, the writers' TPS over
   exactly the backfill step's window against their TPS with no migration, and the capture
   backlog over time: during the backfill, then while the next step (reconcile) drains it,
   until it is empty, before anything is dropped;
4. capture overhead alone (few runs; bench/changelog.py is the careful measurement): pgbench
   tpcb-like and simple-update on pgbench_accounts, with and without mover's trigger, interleaved;
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

from bench.common import (
    SHAPES,
    bindir,
    connect,
    create_database,
    generate,
    index_defs,
    median,
    mover_cli,
    pgbench_progress,
    save,
    server,
    table,
    table_bytes,
    timed,
)
from bench.common import single_statement as common_single_statement

SOURCE = "bench_source"


def single_statement(dsn: str, shape: str) -> dict:
    """The bound (bench/common.py single_statement), with the indexes also built CONCURRENTLY
    for the profile."""
    return common_single_statement(dsn, SOURCE, shape, concurrently=True)


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


def mover_backfill(dsn: str, workdir: Path, name: str, workers: int, sync: bool = False,
                   during=None, abort: bool = True, extra: str = "") -> dict:
    """`mover step NAME` at the backfill step, timed. `during(started_at, ended_at)` runs right
    after it, before the migration is aborted (the writes benchmark measures the drain there).
    `extra`: more plan text (a [throttle] section)."""
    plan = workdir / f"{name}.toml"
    plan.write_text(PLAN.format(name=name, source=SOURCE, workers=workers, sync=str(sync).lower()) + extra)
    for _ in range(2):  # create_target, install_capture
        proc, _ = mover_cli(dsn, "step", str(plan))
        assert proc.returncode == 0, proc.stderr
    started_at = time.time()
    started = time.perf_counter()
    proc, rss = mover_cli(dsn, "step", name)
    seconds = time.perf_counter() - started
    ended_at = time.time()
    assert proc.returncode == 0, proc.stderr
    with connect(dsn) as conn:
        ranges, rows, avg_rows = conn.execute(
            "SELECT count(*), sum(c.rows), avg(c.rows)::int FROM mover.ranges c JOIN mover.migrations m"
            " ON m.id = c.migration_id WHERE m.name = %s AND c.kind = 'backfill'", (name,)).fetchone()
        own = conn.execute(
            "SELECT extract(epoch FROM s.finished_at - s.started_at) FROM mover.steps s JOIN mover.migrations m"
            " ON m.id = s.migration_id WHERE m.name = %s AND s.name = 'backfill'", (name,)).fetchone()[0]
        indexes = conn.execute(
            "SELECT e.message, e.duration_ms FROM mover.events e JOIN mover.migrations m ON m.id = e.migration_id"
            " WHERE m.name = %s AND e.kind = 'index_built' ORDER BY e.id", (name,)).fetchall()
    extra = during(started_at, ended_at) if during else {}
    if abort:
        proc, _ = mover_cli(dsn, "abort", name)
        assert proc.returncode == 0, proc.stderr
    with connect(dsn) as conn:
        conn.execute("CHECKPOINT")
    # rows: what the ranges actually copied (mover.ranges), not the table's size
    return {"step_s": seconds, "step_own_s": float(own or 0), "rows": int(rows), "rss_kib": rss, "ranges": ranges,
            "avg_range_rows": avg_rows,
            "index_builds_ms": [float(ms or 0) for _, ms in indexes], **extra}


def _stats_reset(conn) -> bool:
    conn.execute("SELECT pg_stat_reset_shared('wal')")
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
        return True
    except Exception:  # not preloaded (the pgserver wheel): WAL figures only
        return False


def _stats_read(conn, pgss: bool) -> dict:
    wal = conn.execute("SELECT wal_records, wal_fpi, wal_bytes::bigint, wal_write_time, wal_sync_time"
                       " FROM pg_stat_wal").fetchone()
    out: dict = {"wal_records": wal[0], "wal_fpi": wal[1], "wal_bytes": wal[2]}
    if pgss:
        # Grouped by what the statement does: mover's statements are recognisable by their text.
        out["statements"] = [
            {"what": what, "calls": int(calls), "ms": float(ms), "wal_bytes": int(wal_b or 0),
             "blks_hit": int(hit), "blks_read": int(read), "blks_written": int(written)}
            for what, calls, ms, wal_b, hit, read, written in conn.execute("""
                SELECT CASE WHEN query ~* '^\\s*(UPDATE|DELETE FROM|INSERT INTO) bench_source\\M'
                                 THEN 'the application (pgbench)'
                            WHEN query ~* '^\\s*INSERT INTO .*SELECT' AND query !~* 'mover\\.'
                                 THEN 'copy (INSERT ... SELECT)'
                            WHEN query ~* 'OFFSET' THEN 'range bound (index-only OFFSET probe)'
                            WHEN query ~* '^\\s*SELECT \\S+ FROM .* ORDER BY .* LIMIT'
                                 THEN 'range bound (key above lo+span)'
                            WHEN query ~* 'UPDATE mover\\.ranges' THEN 'range claim / done mark (mover.ranges)'
                            WHEN query ~* 'CREATE INDEX' THEN 'index builds'
                            WHEN query ~* 'ATTACH PARTITION' THEN 'attach partition indexes'
                            WHEN query ~* '^\\s*ANALYZE' THEN 'ANALYZE'
                            WHEN query ~* '_changes' THEN 'change log (apply, count)'
                            WHEN query ~* 'COMMIT' THEN 'COMMIT'
                            WHEN query ~* '^\\s*(CHECKPOINT|DROP|CREATE TABLE|ALTER TABLE)' THEN 'DDL, CHECKPOINT'
                            ELSE 'other (control tables, catalog)' END AS what,
                       sum(calls), sum(total_exec_time), sum(wal_bytes), sum(shared_blks_hit),
                       sum(shared_blks_read), sum(shared_blks_written)
                FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                GROUP BY 1 ORDER BY 3 DESC""").fetchall()]
    return out


def explain_copy(dsn: str, rows: int) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS, WAL) of one range the size mover's ranges reach, into an empty
    copy, against the same rows by the single statement's plan: where a range's time goes."""
    with connect(dsn) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_copy")
        conn.execute(f"CREATE TABLE bench_copy (LIKE {SOURCE} INCLUDING DEFAULTS)")
        conn.execute("ALTER TABLE bench_copy ADD PRIMARY KEY (id)")
        n = min(rows, 200_000)
        plan = [r[0] for r in conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, WAL) INSERT INTO bench_copy SELECT * FROM {SOURCE} s"
            f" WHERE s.id > %s AND s.id <= %s", (rows // 2, rows // 2 + n)).fetchall()]
        probe = [r[0] for r in conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS) SELECT s.id::text FROM (SELECT s.id FROM {SOURCE} s WHERE s.id > %s"
            f" ORDER BY s.id OFFSET %s LIMIT 1) s", (rows // 4, n)).fetchall()]
        conn.execute("DROP TABLE bench_copy")
    return {"range_rows": n, "copy_plan": plan, "bound_probe_plan": probe}


def profile(dsn: str, workdir: Path, shape: str, rows: int) -> dict:
    """Where the time goes: statement times and WAL of the single statement and of mover's
    backfill step (1 worker), each from reset counters, and one range explained."""
    out: dict = {}
    with connect(dsn) as conn:
        pgss = _stats_reset(conn)
    out["single_statement"] = single_statement(dsn, shape)
    with connect(dsn) as conn:
        out["single_statement"].update(_stats_read(conn, pgss))
        _stats_reset(conn)
    out["mover_1w"] = mover_backfill(dsn, workdir, "bench_profile", 1, abort=False)
    with connect(dsn) as conn:
        out["mover_1w"].update(_stats_read(conn, pgss))
    proc, _ = mover_cli(dsn, "abort", "bench_profile")
    assert proc.returncode == 0, proc.stderr
    out["explain"] = explain_copy(dsn, rows)
    return out


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
    # --progress-timestamp: each 1 s sample stamped with the wall clock, so the samples inside
    # the backfill step's window can be picked exactly
    return subprocess.Popen([str(bindir() / "pgbench"), "-n", "-c", str(clients), "-j", str(clients), "-T",
                             str(seconds), "-P", "1", "--progress-timestamp", "-D", f"maxid={rows}", *files, dsn],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def progress_tps(stderr: str) -> list[tuple[float, float]]:
    """(wall-clock end of the 1 s interval, tps) of each progress line."""
    return [(at, tps) for at, tps, _ in pgbench_progress(stderr)]


def backlog_now(conn) -> int:
    """Captured changes not applied yet (every change log)."""
    logs = conn.execute("SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n"
                        " ON n.oid = c.relnamespace WHERE n.nspname = 'mover'"
                        " AND c.relname ~ '^m[0-9]+_changes$'").fetchall()
    return sum(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(t))).fetchone()[0] for (t,) in logs)


def sample_backlog(dsn: str, stop: threading.Event, samples: list[tuple[float, int]], every: float = 0.5) -> None:
    with connect(dsn) as conn:
        while True:
            samples.append((time.time(), backlog_now(conn)))
            if stop.wait(every):
                return


def writes_during_backfill(dsn: str, workdir: Path, rows: int, baseline_s: int = 20) -> dict:
    baseline = start_pgbench(dsn, workdir, rows, baseline_s)
    _, err = baseline.communicate()
    base = [tps for _, tps in progress_tps(err)[2:]]  # the first 2 s warm up
    writers = start_pgbench(dsn, workdir, rows, 3600)
    time.sleep(3)  # let the writers reach their steady state before the migration starts
    stop, backlog = threading.Event(), []
    sampler = threading.Thread(target=sample_backlog, args=(dsn, stop, backlog), daemon=True)
    sampler.start()

    def drain(started_at: float, ended_at: float) -> dict:
        # The writers stop with the backfill step, so the TPS window is that step alone; then the
        # next step (reconcile, which applies the log first) drains what is left, sampled until
        # the step ends and before abort drops the log.
        writers.terminate()  # SIGTERM: a background shell may have pgbench ignore SIGINT
        _, err = writers.communicate()
        stop.set()
        sampler.join()
        with connect(dsn) as conn:
            at_end = backlog_now(conn)
        drain_stop, drained = threading.Event(), []
        t = threading.Thread(target=sample_backlog, args=(dsn, drain_stop, drained, 0.1), daemon=True)
        t.start()
        began = time.time()
        proc, _ = mover_cli(dsn, "step", "bench_writes")
        step_s = time.time() - began
        drain_stop.set()
        t.join()
        assert proc.returncode in (0, 3), proc.stderr
        with connect(dsn) as conn:
            after = backlog_now(conn)
        empty_at = next((at - began for at, n in drained if n == 0), None)
        tps = progress_tps(err)
        inside = [v for at, v in tps if started_at + 1 <= at <= ended_at]  # whole 1 s intervals in the window
        return {"writer_tps_idle": median(base) if base else 0.0,
                "writer_tps_during": median(inside) if inside else 0.0,
                "writer_tps_samples": len(inside),
                "backlog_max": max((n for _, n in backlog), default=0),
                "backlog_series": [(round(at - started_at, 2), n) for at, n in backlog],
                "backlog_at_backfill_end": at_end, "drain_step_s": step_s, "drain_empty_after_s": empty_at,
                "drain_series": [(round(at - began, 2), n) for at, n in drained],
                "backlog_after_drain_step": after}

    return mover_backfill(dsn, workdir, "bench_writes", workers=1, during=drain)


def capture_overhead(dsn: str, runs: int, seconds: int, scale: int) -> dict:
    from mover import names
    from mover.db import Database
    from mover.engines.capture import changelog
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
            db.transaction(lambda cur: changelog.install(cur, 999999, accounts, ("aid",), "bench"))
            on.append(run(builtin))
            db.transaction(lambda cur: changelog.remove(cur, 999999, accounts))
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
    ap.add_argument("--shape", choices=SHAPES, default="narrow", help="the generated table (bench/common.py)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each short measurement (median)")
    ap.add_argument("--dsn", help="an existing server (superuser); default: start one")
    ap.add_argument("--pgbench-seconds", type=int, default=20)
    ap.add_argument("--pgbench-scale", type=int, default=20)
    ap.add_argument("--skip", action="append", default=[],
                    choices=["limit", "mover", "sync", "writes", "capture", "repack", "profile"])
    args = ap.parse_args()
    results: dict = {"rows": args.rows, "shape": args.shape, "runs": args.runs,
                     "command": " ".join(["bench/backfill.py", *sys.argv[1:]])}
    with server(args.dsn) as (dsn, pg), tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        db = create_database(dsn, "bench")
        from mover import api
        api.init(db)
        with connect(db) as conn:
            results["server"] = conn.execute("SELECT version()").fetchone()[0]
        print(f"generating {args.rows:,} rows ({args.shape}) ...", flush=True)
        results["generate_s"] = timed(lambda: generate(db, SOURCE, args.rows, args.shape))
        results["table_bytes"] = table_bytes(db, SOURCE)
        runs = args.runs if args.rows <= 2_000_000 else max(1, min(args.runs, 2))
        if "limit" not in args.skip:
            limit = [single_statement(db, args.shape) for _ in range(runs)]
            results["single_statement"] = {k: median([r[k] for r in limit]) for k in limit[0]}
            print("single statement", results["single_statement"], flush=True)
        if "mover" not in args.skip:
            for workers in (1, 2):
                one = [mover_backfill(db, workdir, f"bench_w{workers}", workers) for _ in range(runs)]
                results[f"mover_{workers}w"] = {k: (median([r[k] for r in one]) if k != "index_builds_ms"
                                                    else one[0][k]) for k in one[0]}
                results[f"mover_{workers}w_runs"] = [r["step_s"] for r in one]
                print(f"mover {workers}w", results[f"mover_{workers}w"], flush=True)
        if "profile" not in args.skip:
            results["profile"] = profile(db, workdir, args.shape, args.rows)
            print("profile", {k: v for k, v in results["profile"].items() if k != "explain"}, flush=True)
        if "sync" not in args.skip:
            results["mover_1w_sync_on"] = mover_backfill(db, workdir, "bench_sync", 1, sync=True)
            print("sync on", results["mover_1w_sync_on"], flush=True)
        if "writes" not in args.skip:
            results["writes"] = writes_during_backfill(db, workdir, args.rows, args.pgbench_seconds)
            print("writes", {k: v for k, v in results["writes"].items() if not k.endswith("_series")}, flush=True)
            generate(db, SOURCE, args.rows, args.shape)  # the writers changed it; later figures use a fresh one
        if "repack" not in args.skip:
            results["pg_repack"] = pg_repack(db)
            print("pg_repack", results["pg_repack"], flush=True)
        if "capture" not in args.skip:
            results["capture"] = capture_overhead(dsn, args.runs, args.pgbench_seconds, args.pgbench_scale)
            print("capture", results["capture"], flush=True)
    path = save(f"backfill-{args.shape}", results)
    print(report(results))
    print(f"\nresults: {path}")


def report(r: dict) -> str:
    out = []
    limit = r.get("single_statement", {}).get("total_s")

    def line(what, seconds, rows, note=""):
        ratio = f"{limit / seconds:.2f}" if limit and seconds else "-"
        out.append((what, f"{seconds:.1f}", f"{rows / seconds:,.0f}" if rows else "-", ratio, note))

    if "single_statement" in r:
        ss = r["single_statement"]
        line(f"single statement: INSERT ... SELECT (pk only) + {len(index_defs(r.get('shape', 'narrow'), 'x'))}"
             " index builds", limit, ss["rows"], f"copy {ss['copy_s']:.1f} s + indexes {ss['indexes_s']:.1f} s"
             + (f" (built CONCURRENTLY instead: {ss['indexes_concurrently_s']:.1f} s)"
                if "indexes_concurrently_s" in ss else ""))
    for key, label in (("mover_1w", "mover backfill, 1 worker"), ("mover_2w", "mover backfill, 2 workers"),
                       ("mover_1w_sync_on", "mover backfill, 1 worker, synchronous_commit on")):
        if key in r:
            m = r[key]
            line(label, m["step_s"], m["rows"],
                 f"step {m.get('step_own_s', 0):.1f} s without process start; "
                 f"{m['ranges']:.0f} ranges of ~{m['avg_range_rows']:,.0f} rows, index builds "
                 f"{sum(m['index_builds_ms']) / 1000:.1f} s, RSS {m['rss_kib'] / 1024:.0f} MiB")
    if "writes" in r:
        w = r["writes"]
        empty = (f"empty {w['drain_empty_after_s']:.1f} s into the reconcile step"
                 if w["drain_empty_after_s"] is not None else f"not empty: {w['backlog_after_drain_step']:,} left")
        line("mover backfill, 1 worker, pgbench writing", w["step_s"], w["rows"],
             f"writers {w['writer_tps_during']:.0f} tps over the step vs {w['writer_tps_idle']:.0f} idle "
             f"({w['writer_tps_during'] / max(w['writer_tps_idle'], 1):.2f}); capture backlog at most "
             f"{w['backlog_max']:,}, {w['backlog_at_backfill_end']:,} at the step's end, {empty}")
    if r.get("pg_repack", {}).get("seconds"):
        line("pg_repack -t (peer; one transaction, not resumable)", r["pg_repack"]["seconds"],
             r.get("single_statement", {}).get("rows"))
    text = table(out, ("what", "seconds", "rows/s", "single statement / this", "notes"))
    if "capture" in r:
        cap = [(k, f"{v['tps_without']:.0f}", f"{v['tps_with']:.0f}", f"{v['cost'] * 100:.1f} %")
               for k, v in r["capture"].items()]
        text += "\n\n" + table(cap, ("pgbench", "tps without capture", "tps with capture", "cost"))
    if "profile" in r:
        p = r["profile"]
        prof = []
        for side in ("single_statement", "mover_1w"):
            x = p[side]
            prof.append((side, "total", "", f"{x.get('step_s', x.get('total_s', 0)):.2f}",
                         f"{x['wal_bytes'] / 2**20:,.0f} MiB ({x['wal_fpi']:,} full pages)"))
            for st in x.get("statements", []):
                prof.append(("", st["what"], f"{st['calls']:,}", f"{st['ms'] / 1000:.2f}",
                             f"{st['wal_bytes'] / 2**20:,.1f} MiB"))
        text += "\n\nprofile (pg_stat_statements and pg_stat_wal from reset counters):\n" + table(
            prof, ("run", "statements", "calls", "seconds", "WAL"))
    return (f"{r['rows']:,} rows, {r.get('shape', 'narrow')} table ({r.get('table_bytes', 0) / 2**30:.2f} GiB); "
            f"{r['server']}\n\n" + text)


if __name__ == "__main__":
    main()
