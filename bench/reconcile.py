"""Reconcile benchmark (issue #4), measured side by side on one server in one run.

    .venv/bin/python -m bench.reconcile [--rows 10000000] [--shape narrow|wide] [--dsn DSN]
                                        [--no-datadiff] [--range-rows N] [--type-rows N]

On the backfill benchmark's table of --shape (bench/common.py: narrow is id bigint pk,
created_at timestamptz, account_id int, amount numeric(12,2), status text, payload text ~80
bytes; wide adds text[], jsonb, float8 with NaN, NULLs and a TOASTed text), copied by mover's
own backfill, with 30 differences injected into the copy behind mover's back (10 changed
values, in a different column each for the wide shape, 10 rows missing, 10 extra):

1. the lower bound: one sequential pass per table computing the same row hash as mover's
   fingerprints (one connection, then one connection per table);
2. mover reconcile --full with 1 and 2 workers (wall time of the CLI, and the pass's own);
3. the two designs mover did not keep, on the same ranges: a join comparing one row hash per
   side, and per-range count + hash sum of each side with the mismatching ranges joined;
4. data-diff 0.11 (PyPI), hashdiff mode, key id, every column, in its own virtual environment
   (bench/.venv-datadiff, created on first use beside dbt-core<1.8 and pydantic<2);
5. the cost of each column's comparison and hash, type by type, on the first --type-rows keys:
   a join of both tables counting the rows whose column differs (mover's comparison of that
   column) and a pass hashing that column (mover's hash input), each against the same
   statement without the column, in nanoseconds per row.

Each reports seconds, source rows/s, the ratio to the lower bound, and whether it found all 30
differences (and nothing else). The server is mover.embedded.EmbeddedPostgres with the backfill
benchmark's settings (durable; bench/common.py), or --dsn. With more than 1 M rows the script
first waits until no other benchmark runs on this 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from psycopg import sql

from bench.common import ROOT, SHAPES, connect, create_database, generate, mover_cli, save, server, table, timed

SOURCE = "bench_source"
TARGET = "bench_source_new"
NAME = "bench_rec"
DATADIFF_VENV = ROOT / "bench" / ".venv-datadiff"
DATADIFF_REQUIREMENTS = ["data-diff[postgresql]==0.11.*", "dbt-core<1.8", "pydantic<2"]
COLUMNS = {"narrow": ("created_at", "account_id", "amount", "status", "payload"),
           "wide": ("created_at", "account_id", "amount", "status", "payload", "tags", "attrs", "score", "note",
                    "body")}
# the wide shape's 10 changed rows: one column each (the narrow one changes amount)
CHANGES = ("amount = amount + 0.01", "attrs = attrs || '{\"x\": 1}'", "tags = tags || 'x'::text", "score = -1",
           "note = coalesce(note, '') || 'x'", "body = body || 'x'", "status = 'changed'", "payload = payload || 'x'",
           "created_at = created_at + interval '1 microsecond'", "account_id = account_id + 1")

PLAN = """
[migration]
name = "{name}"
source = "{source}"
[backfill]
workers = 2
[reconcile]
range_rows = {range_rows}
[rollback]
window = "0s"
"""


def wait_for_other_benchmarks() -> None:
    """Two cores: a second benchmark would halve both results."""
    me = os.getpid()
    while True:
        out = subprocess.run(["pgrep", "-af", r"bench[./]"], capture_output=True, text=True).stdout
        others = [line for line in out.splitlines()
                  if line.split()[0] != str(me) and "pgrep" not in line and ".venv-datadiff" not in line]
        if not others:
            return
        print(f"waiting for other benchmarks to finish: {others[0][:120]}", file=sys.stderr, flush=True)
        time.sleep(30)


def inject(dsn: str, rows: int, shape: str) -> dict[str, set[str]]:
    """30 differences spread over the key space, written to the copy only."""
    step = rows // 31
    changed = [str(step * k) for k in range(1, 11)]
    missing = [str(step * k + step // 2) for k in range(1, 11)]
    extra = [str(rows + 1000 * k) for k in range(1, 6)] + [str(-k) for k in range(1, 6)]
    t = sql.Identifier(TARGET)
    with connect(dsn) as conn:
        for i, key in enumerate(changed):
            change = CHANGES[i] if shape == "wide" else CHANGES[0]
            conn.execute(sql.SQL("UPDATE {} SET {} WHERE id = %s").format(t, sql.SQL(change)), (int(key),))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s::bigint[])").format(t), (missing,))
        conn.execute(sql.SQL("INSERT INTO {} (id, created_at, account_id, amount, status, payload)"
                             " SELECT k, now(), 1, 1, 'extra', 'x' FROM unnest(%s::bigint[]) k").format(t), (extra,))
    return {"different": set(changed), "missing_in_target": set(missing), "extra_in_target": set(extra)}


def judge(found: dict[str, set[str]], injected: dict[str, set[str]]) -> dict:
    hits = sum(len(found.get(k, set()) & v) for k, v in injected.items())
    total = sum(len(v) for v in found.values())
    return {"found": hits, "extra": total - hits, "all": hits == 30 and total == 30}


def mover_pass(dsn: str, workers: int, injected) -> dict:
    proc, _ = mover_cli(dsn, "set", NAME, f"reconcile.workers={workers}")
    assert proc.returncode == 0, proc.stderr
    started = time.perf_counter()
    proc, rss = mover_cli(dsn, "reconcile", NAME, "--full", "--json")
    wall = time.perf_counter() - started
    assert proc.returncode in (0, 3), proc.stderr
    result = json.loads(proc.stdout)
    proc, _ = mover_cli(dsn, "divergences", NAME, "--json")
    found: dict[str, set[str]] = {}
    for d in json.loads(proc.stdout):
        found.setdefault(d["kind"], set()).add(d["key"][0])
    p = result["pass"]
    return {"seconds": wall, "pass_seconds": p["seconds"], "rows": p["rows"], "ranges": p["ranges"],
            "rss_kib": rss, **judge(found, injected)}


def spec(dsn: str):
    from mover import introspect, reconcile
    from mover.names import QualifiedName
    from mover.sql.mapping import Mapping
    with connect(dsn) as conn, conn.transaction(), conn.cursor() as cur:
        m = Mapping.between(introspect.describe(cur, QualifiedName("public", SOURCE)),
                            introspect.describe(cur, QualifiedName("public", TARGET)), ("id",))
        return reconcile.spec_for(cur, m)


def lower_bound(dsn: str, s) -> dict:
    """The same row hash over each whole table, one sequential pass each: what any comparison by
    hash must at least read and compute."""
    from mover.sql import compare
    stmts = {side: compare.range_fingerprint(s, side, None, None) for side in ("src", "dst")}

    def one(side):
        with connect(dsn) as conn:
            conn.execute("SET max_parallel_workers_per_gather = 0")
            conn.execute(*stmts[side]).fetchone()

    serial = timed(lambda: (one("src"), one("dst")))
    threads = [threading.Thread(target=one, args=(side,)) for side in ("src", "dst")]
    parallel = timed(lambda: ([t.start() for t in threads], [t.join() for t in threads]))
    return {"seconds": serial, "two_connections_s": parallel}


def mover_ranges(dsn: str) -> list[tuple]:
    with connect(dsn) as conn:
        return conn.execute("SELECT c.lo, c.hi FROM mover.ranges c JOIN mover.migrations m ON m.id = c.migration_id"
                            " WHERE m.name = %s AND c.kind = 'reconcile' ORDER BY c.range_no", (NAME,)).fetchall()


def _range(alias: str, lo, hi) -> tuple[sql.Composable, list]:
    parts, params = [], []
    if lo is not None:
        parts.append(sql.SQL("{}.id > %s").format(sql.Identifier(alias)))
        params.append(int(lo[0]))
    if hi is not None:
        parts.append(sql.SQL("{}.id <= %s").format(sql.Identifier(alias)))
        params.append(int(hi[0]))
    return (sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")), params


def hash_join(dsn: str, s, ranges, injected) -> dict:
    """Alternative 1: per range, FULL JOIN on the key comparing one row hash per side."""
    from mover.sql import compare
    found: dict[str, set[str]] = {}
    with connect(dsn) as conn:
        started = time.perf_counter()
        for lo, hi in ranges:
            sw, sp = _range("s", lo, hi)
            tw, tp = _range("t", lo, hi)
            q = sql.SQL("""
                SELECT coalesce(s.id, t.id)::text, CASE WHEN t.id IS NULL THEN 'missing_in_target'
                       WHEN s.id IS NULL THEN 'extra_in_target' ELSE 'different' END
                FROM (SELECT s.id, {hs} AS h FROM {src} s WHERE {sw}) s
                FULL JOIN (SELECT t.id, {ht} AS h FROM {dst} t WHERE {tw}) t ON s.id = t.id
                WHERE s.h IS DISTINCT FROM t.h""").format(
                hs=compare.row_hash(s, "s", "src"), ht=compare.row_hash(s, "t", "dst"), src=sql.Identifier(SOURCE),
                dst=sql.Identifier(TARGET), sw=sw, tw=tw)
            for key, kind in conn.execute(q, sp + tp).fetchall():
                found.setdefault(kind, set()).add(key)
        seconds = time.perf_counter() - started
    return {"seconds": seconds, **judge(found, injected)}


def typed_join(dsn: str, s, ranges, injected) -> dict:
    """For the comparison only: per range, the FULL JOIN comparing typed values (mover's test of
    a row, no hash at all), against the join comparing row hashes above."""
    from mover.sql import compare
    found: dict[str, set[str]] = {}
    with connect(dsn) as conn:
        started = time.perf_counter()
        for lo, hi in ranges:
            sw, sp = _range("s", lo, hi)
            tw, tp = _range("t", lo, hi)
            q = sql.SQL("""
                SELECT coalesce(s.id, t.id)::text, CASE WHEN t.id IS NULL THEN 'missing_in_target'
                       WHEN s.id IS NULL THEN 'extra_in_target' ELSE 'different' END
                FROM (SELECT * FROM {src} s WHERE {sw}) s
                FULL JOIN (SELECT * FROM {dst} t WHERE {tw}) t ON s.id = t.id
                WHERE {differs}""").format(src=sql.Identifier(SOURCE), dst=sql.Identifier(TARGET), sw=sw, tw=tw,
                                           differs=compare.differs(s))
            for key, kind in conn.execute(q, sp + tp).fetchall():
                found.setdefault(kind, set()).add(key)
        seconds = time.perf_counter() - started
    return {"seconds": seconds, **judge(found, injected)}


def bisect(dsn: str, s, ranges, injected) -> dict:
    """Alternative 2: per range, count + hash sum of each side in one statement; the ranges whose
    figures differ are then joined row by row (mover's own range statement)."""
    from mover.sql import compare
    found: dict[str, set[str]] = {}
    mismatched = 0
    with connect(dsn) as conn:
        started = time.perf_counter()
        for lo, hi in ranges:
            sq, sp = compare.range_fingerprint(s, "src", lo, hi)
            tq, tp = compare.range_fingerprint(s, "dst", lo, hi)
            # Both sides in one statement: one snapshot.
            a_rows, a_sum, b_rows, b_sum = conn.execute(sql.SQL("SELECT * FROM ({}) a, ({}) b").format(sq, tq),
                                                        sp + tp).fetchone()
            if (a_rows, a_sum) == (b_rows, b_sum):
                continue
            mismatched += 1
            q, params = compare.compare_range(s, None, None, lo, hi)
            for row in conn.execute(q, params).fetchall():
                if row[4] is not None:
                    found.setdefault(row[5], set()).add(row[4][0])
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "ranges_joined": mismatched, **judge(found, injected)}


def type_costs(dsn: str, s, rows: int) -> dict:
    """Per column, on keys 1..rows: the time mover's comparison of that column adds to a join of
    both tables, and the time its hash input adds to a pass over the source; best of 3 each,
    nanoseconds per row over the bare statement."""
    from mover.sql import compare
    src, dst = s.mapping.src.ident, s.mapping.dst.ident

    def best(q: sql.Composable) -> float:
        with connect(dsn) as conn:
            conn.execute("SET max_parallel_workers_per_gather = 0")
            # the bare statements read the heap too, as every column's do: the difference is the
            # column's own cost (its deforming, comparison or hash)
            conn.execute("SET enable_indexonlyscan = off")
            conn.execute(q, (rows,)).fetchone()  # warm
            return min(timed(lambda: conn.execute(q, (rows,)).fetchone()) for _ in range(3))

    join = sql.SQL("SELECT count(*) FILTER (WHERE {}) FROM {} s JOIN {} t ON t.id = s.id WHERE s.id <= %s")
    hashed = sql.SQL("SELECT sum(hash_record_extended(ROW({}), 0)) FROM {} s WHERE s.id <= %s")
    bare_join = best(join.format(sql.SQL("s.id IS DISTINCT FROM t.id"), src, dst))
    bare_hash = best(hashed.format(sql.SQL("s.id"), src))
    out: dict = {"rows": rows, "bare_join_s": bare_join, "bare_hash_s": bare_hash, "columns": {}}
    for c in s.non_key:
        cmp_q = join.format(sql.SQL("{} IS DISTINCT FROM {}").format(compare.compared(c, "s", "src"),
                                                                    compare.compared(c, "t", "dst")), src, dst)
        hash_q = hashed.format(sql.SQL("s.id, {}").format(compare._hash_input(c, "s", "src")), src)
        with connect(dsn) as conn:
            type_name = conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                                     " WHERE attrelid = %s::regclass AND attname = %s", (SOURCE, c.name)).fetchone()[0]
        out["columns"][c.name] = {"type": type_name, "mode": c.mode,
                                  "compare_ns": (best(cmp_q) - bare_join) / rows * 1e9,
                                  "hash_ns": (best(hash_q) - bare_hash) / rows * 1e9}
    return out


def ensure_datadiff() -> tuple[Path | None, str | None]:
    exe = DATADIFF_VENV / "bin" / "data-diff"
    if exe.exists():
        return exe, None
    try:
        subprocess.run([sys.executable, "-m", "venv", str(DATADIFF_VENV)], check=True, capture_output=True, text=True)
        subprocess.run([str(DATADIFF_VENV / "bin" / "pip"), "install", "-q", *DATADIFF_REQUIREMENTS], check=True,
                       capture_output=True, text=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return None, f"installing {' '.join(DATADIFF_REQUIREMENTS)} failed: {detail.strip().splitlines()[-1:]}"
    return exe, None


def datadiff(dsn: str, injected, columns: tuple[str, ...]) -> dict:
    exe, problem = ensure_datadiff()
    if exe is None:
        return {"error": problem}
    # data-diff insists on a password in the URL; the embedded server trusts local connections.
    parts = urllib.parse.urlsplit(dsn)
    if parts.password is None and parts.username:
        parts = parts._replace(netloc=f"{parts.username}:bench@{parts.hostname}:{parts.port}")
    url = urllib.parse.urlunsplit(parts)
    args = [str(exe), url, SOURCE, TARGET, "-k", "id", *[a for c in columns for a in ("-c", c)],
            "--algorithm", "hashdiff", "--no-tracking", "--json"]
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "COLUMNS": "100000"})
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": f"data-diff exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}",
                "seconds": seconds}
    signs: dict[str, set[str]] = {}
    for sign, key in re.findall(r'\["([+-])",\s*\["([^"]*)"', proc.stdout):
        signs.setdefault(key, set()).add(sign)
    found: dict[str, set[str]] = {}
    for key, s in signs.items():
        kind = "different" if s == {"+", "-"} else "missing_in_target" if s == {"-"} else "extra_in_target"
        found.setdefault(kind, set()).add(key)
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout.strip()
    return {"seconds": seconds, "version": version, **judge(found, injected)}


def run(dsn: str, rows: int, range_rows: int, with_datadiff: bool, shape: str = "narrow",
        type_rows: int = 1_000_000) -> dict:
    results: dict = {"rows": rows, "range_rows": range_rows, "shape": shape}
    db = create_database(dsn, "bench_reconcile")
    with connect(db) as conn:
        results["server"] = conn.execute("SELECT version()").fetchone()[0]
    results["generate_s"] = timed(lambda: generate(db, SOURCE, rows, shape))
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "rec.toml"
        plan.write_text(PLAN.format(name=NAME, source=SOURCE, range_rows=range_rows))
        assert mover_cli(db, "init")[0].returncode == 0
        started = time.perf_counter()
        proc, _ = mover_cli(db, "run", str(plan))  # create, capture, copy, compare once: the cutover gate
        results["mover_run_to_gate_s"] = time.perf_counter() - started
        assert proc.returncode == 3, proc.stderr
    with connect(db) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(TARGET)))
        conn.execute("CHECKPOINT")
    injected = inject(db, rows, shape)
    s = spec(db)
    lower_bound(db, s)  # warm-up: both tables in the cache for everyone alike
    results["lower_bound"] = lower_bound(db, s)
    results["mover_1w"] = mover_pass(db, 1, injected)
    results["mover_2w"] = mover_pass(db, 2, injected)
    ranges = mover_ranges(db)
    results["alt_hash_join"] = hash_join(db, s, ranges, injected)
    results["typed_join_only"] = typed_join(db, s, ranges, injected)
    results["alt_bisect"] = bisect(db, s, ranges, injected)
    results["lower_bound_again"] = lower_bound(db, s)
    if type_rows:
        results["type_costs"] = type_costs(db, s, min(type_rows, rows))
    if with_datadiff:
        results["datadiff"] = datadiff(db, injected, COLUMNS[shape])
    return results


def report(r: dict) -> str:
    rows = r["rows"]
    # the best of the two measurements (before and after the others) of each bound
    lb1 = min(r["lower_bound"]["seconds"], r["lower_bound_again"]["seconds"])
    lb2 = min(r["lower_bound"]["two_connections_s"], r["lower_bound_again"]["two_connections_s"])
    dd = r.get("datadiff", {}).get("seconds") if "error" not in r.get("datadiff", {}) else None
    out = []

    def line(what, seconds, found=None, note=""):
        ratio_dd = f"{dd / seconds:.1f}x faster" if dd and seconds and what.startswith("mover") else ""
        out.append((what, f"{seconds:.2f}", f"{rows / seconds:,.0f}", f"{seconds / lb1:.2f}", f"{seconds / lb2:.2f}",
                    ratio_dd, "" if found is None else ("yes" if found["all"] else f"no ({found['found']}/30, "
                                                                                    f"{found['extra']} extra)"),
                    note))
    line("lower bound: same row hash, one pass per table, 1 connection", lb1)
    line("lower bound, one connection per table", lb2)
    for key, what in (("mover_1w", "mover reconcile --full, 1 worker"),
                      ("mover_2w", "mover reconcile --full, 2 workers")):
        m = r[key]
        line(what, m["seconds"], m, f"pass {m['pass_seconds']:.2f}s ({m['pass_seconds'] / lb1:.2f}x, "
                                    f"{m['pass_seconds'] / lb2:.2f}x the bounds), {m['ranges']} ranges, CLI wall time; "
                                    f"RSS {m['rss_kib'] / 1024:.0f} MiB")
    line("alternative: join comparing row hashes", r["alt_hash_join"]["seconds"], r["alt_hash_join"])
    if "typed_join_only" in r:
        line("for comparison: the typed join alone, no hash (not a design: no fingerprints)",
             r["typed_join_only"]["seconds"], r["typed_join_only"])
    line("alternative: per-range count + hash sums, then join", r["alt_bisect"]["seconds"], r["alt_bisect"],
         f"{r['alt_bisect']['ranges_joined']} ranges joined")
    d = r.get("datadiff")
    if d is not None:
        if "error" in d:
            out.append(("data-diff 0.11 hashdiff", "-", "-", "-", "-", "-", "-", d["error"]))
        else:
            line(f"data-diff {d['version'].split()[-1]} hashdiff, -k id, all columns", d["seconds"], d)
    text = table(out, ("what", "seconds", "rows/s", "x bound (1 conn)", "x bound (2 conns)", "vs data-diff",
                       "found all 30", "notes"))
    if "type_costs" in r:
        tc = r["type_costs"]
        per = [(name, c["type"], c["mode"], f"{c['compare_ns']:.0f}", f"{c['hash_ns']:.0f}")
               for name, c in sorted(tc["columns"].items(), key=lambda kv: -(kv[1]["compare_ns"] + kv[1]["hash_ns"]))]
        text += (f"\n\nper-column cost on {tc['rows']:,} keys (ns per row over the bare join "
                 f"{tc['bare_join_s'] / tc['rows'] * 1e9:.0f} ns and the bare hash pass "
                 f"{tc['bare_hash_s'] / tc['rows'] * 1e9:.0f} ns):\n"
                 + table(per, ("column", "type", "mode", "compare ns/row", "hash ns/row")))
    return (f"{rows:,} rows per table, {r.get('shape', 'narrow')} table, {r['range_rows']:,}-key ranges; "
            f"{r['server']}\n"
            f"(mover run to the cutover gate, backfill and first pass included: {r['mover_run_to_gate_s']:.1f}s)\n\n"
            + text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--shape", choices=SHAPES, default="narrow", help="the generated table (bench/common.py)")
    ap.add_argument("--range-rows", type=int, default=100_000)
    ap.add_argument("--type-rows", type=int, default=1_000_000, help="keys of the per-column cost (0: skip it)")
    ap.add_argument("--dsn", help="use this server (a superuser DSN) instead of starting one")
    ap.add_argument("--no-datadiff", action="store_true", help="skip data-diff")
    args = ap.parse_args()
    if args.rows > 1_000_000:
        wait_for_other_benchmarks()
    with server(args.dsn) as (dsn, _):
        results = run(dsn, args.rows, args.range_rows, not args.no_datadiff, args.shape, args.type_rows)
    results["command"] = " ".join(["python -m bench.reconcile", *sys.argv[1:]])
    path = save(f"reconcile-{args.shape}", results)
    print(report(results))
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    main()
