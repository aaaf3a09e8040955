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
2. mover reconcile --full with 1 and 2 workers (wall time of the CLI, and the pass's own), the
   defaults (no fingerprints: the typed comparison alone), and 1 worker with
   `[reconcile] fingerprints = true` (the source side hashed for the stored fingerprints);
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
{range_rows}
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


def mover_pass(dsn: str, workers: int, injected, code: Path | None = None, fingerprints: bool = False) -> dict:
    settings = [f"reconcile.workers={workers}"] + ([f"reconcile.fingerprints={str(fingerprints).lower()}"]
                                                   if code is None else [])  # an older version knows no such key
    proc, _ = mover_cli(dsn, "set", NAME, *settings)
    assert proc.returncode == 0, proc.stderr
    started = time.perf_counter()
    proc, rss = mover_cli(dsn, "reconcile", NAME, "--full", "--json", code=code)
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
    from mover.catalog import conversion, introspect
    from mover.engines.bulk import reconcile
    from mover.names import QualifiedName
    with connect(dsn) as conn, conn.transaction(), conn.cursor() as cur:
        m = conversion.mapping(introspect.describe(cur, QualifiedName("public", SOURCE)),
                            introspect.describe(cur, QualifiedName("public", TARGET)), ("id",))
        return reconcile.spec_for(cur, m)


def lower_bound(dsn: str, s) -> dict:
    """The same row hash over each whole table, one sequential pass each: what any comparison by
    hash must at least read and compute. Without parallel query (one process, as mover's worker),
    with JIT as the server defaults it and off, the faster of the two: mover's range statements
    run with JIT off, and a floor must not be held back by a JIT that does not pay."""
    from mover.sql import compare
    stmts = {side: compare.range_fingerprint(s, side, None, None) for side in ("src", "dst")}

    def one(side, jit="default"):
        with connect(dsn) as conn:
            conn.execute("SET max_parallel_workers_per_gather = 0")
            if jit == "off":
                conn.execute("SET jit = off")
            conn.execute(*stmts[side]).fetchone()

    serial = {jit: timed(lambda jit=jit: (one("src", jit), one("dst", jit))) for jit in ("default", "off")}
    threads = [threading.Thread(target=one, args=(side,)) for side in ("src", "dst")]
    parallel = timed(lambda: ([t.start() for t in threads], [t.join() for t in threads]))
    return {"seconds": min(serial.values()), "jit_default_s": serial["default"], "jit_off_s": serial["off"],
            "two_connections_s": parallel}


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
    nanoseconds per row over the bare statement. The bare statements deform every column of both
    rows already (they test the last column for NULL, which needs no detoasting), as mover's
    statement does once for all: the difference is the column's comparison or hash alone, not
    the deforming of the columns stored before it."""
    from mover.sql import compare
    src, dst = s.mapping.src.ident, s.mapping.dst.ident
    last = sql.Identifier(s.columns[-1].name)

    def best(q: sql.Composable) -> float:
        with connect(dsn) as conn:
            conn.execute("SET max_parallel_workers_per_gather = 0")
            conn.execute("SET jit = off")  # as mover's range statements
            # the bare statements read the heap too, as every column's do
            conn.execute("SET enable_indexonlyscan = off")
            conn.execute(q, (rows,)).fetchone()  # warm
            return min(timed(lambda: conn.execute(q, (rows,)).fetchone()) for _ in range(3))

    deform = sql.SQL("(s.{0} IS NULL) <> (t.{0} IS NULL)").format(last)
    join = sql.SQL("SELECT count(*) FILTER (WHERE {} OR {}) FROM {} s JOIN {} t ON t.id = s.id WHERE s.id <= %s")
    hashed = sql.SQL("SELECT sum(hash_record_extended(ROW(s.id, s.{} IS NULL{}), 0)) FROM {} s WHERE s.id <= %s")
    bare_join = best(join.format(deform, sql.SQL("false"), src, dst))
    bare_hash = best(hashed.format(last, sql.SQL(""), src))
    out: dict = {"rows": rows, "bare_join_s": bare_join, "bare_hash_s": bare_hash, "columns": {}}
    for c in s.non_key:
        cmp_q = join.format(deform, sql.SQL("{} IS DISTINCT FROM {}").format(compare.compared(c, "s", "src"),
                                                                            compare.compared(c, "t", "dst")), src, dst)
        hash_q = hashed.format(last, sql.SQL(", {}").format(compare._hash_input(c, "s", "src")), src)
        with connect(dsn) as conn:
            type_name = conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                                     " WHERE attrelid = %s::regclass AND attname = %s", (SOURCE, c.name)).fetchone()[0]
        out["columns"][c.name] = {"type": type_name, "mode": c.mode,
                                  "compare_ns": (best(cmp_q) - bare_join) / rows * 1e9,
                                  "hash_ns": (best(hash_q) - bare_hash) / rows * 1e9}
    return out


def migration_id(dsn: str) -> int:
    with connect(dsn) as conn:
        return conn.execute("SELECT id FROM mover.migrations WHERE name = %s", (NAME,)).fetchone()[0]


def _plan_json(conn, q: sql.Composable, params: list) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS, SETTINGS, FORMAT JSON): the plan's nodes, its times, and JIT's."""
    doc = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, SETTINGS, FORMAT JSON) {}").format(q), params).fetchone()[0]
    top = doc[0]

    def nodes(n, depth=0):
        yield depth, n
        for c in n.get("Plans", ()):
            yield from nodes(c, depth + 1)
    shape = [f"{'  ' * d}{n['Node Type']}{' (' + n['Join Type'] + ')' if 'Join Type' in n else ''}"
             f"{' on ' + n['Relation Name'] if 'Relation Name' in n else ''}"
             f"{' using ' + n['Index Name'] if 'Index Name' in n else ''}: {n.get('Actual Total Time', 0):.1f} ms,"
             f" {n.get('Actual Rows', 0)} rows, workers {n.get('Workers Launched', '-')}"
             for d, n in nodes(top["Plan"])]
    jit = top.get("JIT")
    return {"execution_ms": top["Execution Time"], "planning_ms": top["Planning Time"],
            "jit_ms": jit["Timing"]["Total"] if jit else 0.0, "jit_functions": jit["Functions"] if jit else 0,
            "total_cost": top["Plan"]["Total Cost"], "plan": shape,
            "shared_hit": top["Plan"].get("Shared Hit Blocks", 0),
            "shared_read": top["Plan"].get("Shared Read Blocks", 0)}


def _best(conn, q: sql.Composable, params: list, runs: int = 3) -> float:
    conn.execute(q, params).fetchall()  # warm
    return min(timed(lambda: conn.execute(q, params).fetchall()) for _ in range(runs))


def statement_profile(dsn: str, s, n_ranges: int = 5) -> dict:
    """Range compare statements as mover runs them (middle ranges): the plan and buffers of one,
    JIT on (the server's default thresholds) against off; the lower bound's plan, with parallel
    query as the server defaults it and off, each with JIT on and off."""
    from mover import names
    from mover.sql import compare
    mid = migration_id(dsn)
    rs = mover_ranges(dsn)
    picked = rs[len(rs) // 2: len(rs) // 2 + n_ranges]
    out: dict = {"ranges_timed": len(picked)}
    with connect(dsn) as conn:
        out["settings"] = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN ('jit', 'jit_above_cost', 'jit_inline_above_cost',"
            " 'jit_optimize_above_cost', 'max_parallel_workers_per_gather', 'work_mem', 'random_page_cost',"
            " 'effective_cache_size', 'shared_buffers')").fetchall())
        out["jit_available"] = conn.execute("SELECT pg_jit_available()").fetchone()[0]
        stmts = [compare.compare_range(s, names.change_log(mid), names.applied_notes(mid), lo, hi) for lo, hi in picked]
        for jit in ("on", "off"):
            conn.execute(f"SET jit = {jit}")
            out[f"compare_jit_{jit}"] = _plan_json(conn, *stmts[0])
            out[f"compare_jit_{jit}_s"] = sum(_best(conn, q, p) for q, p in stmts)
        conn.execute("RESET jit")
        for gather in ("default", "0"):
            conn.execute("RESET max_parallel_workers_per_gather" if gather == "default"
                         else "SET max_parallel_workers_per_gather = 0")
            q, p = compare.range_fingerprint(s, "src", None, None)
            out[f"bound_src_gather_{gather}"] = _plan_json(conn, q, p)
            for jit in ("on", "off"):
                conn.execute(f"SET jit = {jit}")
                out[f"bound_gather_{gather}_jit_{jit}_s"] = sum(
                    timed(lambda side=side: conn.execute(*compare.range_fingerprint(s, side, None, None)).fetchall())
                    for side in ("src", "dst"))
            conn.execute("RESET jit")
    return out


def _pgss_reset(conn) -> bool:
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
        return True
    except Exception:  # not preloaded (the pgserver wheel)
        return False


PGSS_GROUPS = r"""
SELECT CASE WHEN query ~ 'FULL JOIN' THEN 'compare (range statement)'
            WHEN query ~* 'OFFSET' THEN 'range bound probe (OFFSET)'
            WHEN query ~* '^\s*SELECT \S+ FROM .* ORDER BY .* LIMIT' THEN 'range bound (key above lo+span)'
            WHEN query ~ 'jsonb_build_object\(\s*.oid.' THEN 'shape check (catalog description)'
            WHEN query ~ 'mover\.ranges' THEN 'claim, hold, done mark (mover.ranges)'
            WHEN query ~ 'mover\.frontiers' THEN 'claim: frontier'
            WHEN query ~ '_changes' THEN 'change log (apply, drain)'
            WHEN query ~ '_applied|divergences|fingerprint' THEN 'notes, divergences, fingerprints'
            WHEN query ~ 'mover\.workers' THEN 'worker rows'
            WHEN query ~ 'set_config' THEN 'SET LOCAL timeouts'
            WHEN query ~* '^\s*(BEGIN|COMMIT)' THEN 'BEGIN / COMMIT (not the WAL flush)'
            WHEN query ~ 'mover\.migrations' THEN 'migration row (refresh, lease)'
            WHEN query ~ 'pg_catalog|pg_class|pg_attribute|pg_type' THEN 'catalog (spec, describe)'
            ELSE 'other' END, sum(calls), sum(total_exec_time)
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY 1 ORDER BY 3 DESC"""


def _pgss_read(conn) -> list[dict]:
    """mover's statements grouped by what they do, recognisable by their text."""
    return [{"what": w, "calls": int(c), "ms": round(float(ms), 1)} for w, c, ms in conn.execute(PGSS_GROUPS)]


PROFILED = {  # functions of a 1-worker pass whose cumulative time cProfile reports (file suffix, name)
    "the whole reconcile engine (reconcile.run)": ("mover/engines/bulk/reconcile.py", "run"),
    "one range: verify_range": ("mover/engines/bulk/reconcile.py", "verify_range"),
    "  the compare statement (_compare)": ("mover/engines/bulk/reconcile.py", "_compare"),
    "  recording (_record: divergences, notes, fingerprints)": ("mover/engines/bulk/reconcile.py", "_record"),
    "  done mark": ("mover/state/ranges.py", "mark_done"),
    "  range hold": ("mover/state/ranges.py", "hold"),
    "shape checks (shape.verify, every caller)": ("mover/catalog/shape.py", "verify"),
    "claim (frontier + bound probe)": ("mover/state/ranges.py", "claim"),
    "drain between ranges (capture.drain)": ("mover/engines/capture/changelog.py", "drain"),
    "migration row before each range (the range loop's _look)": ("mover/engines/bulk/rangework.py", "_look"),
    "throttle reason": ("mover/engines/governor/throttle.py", "reason"),
    "spec_for (column probes)": ("mover/engines/bulk/reconcile.py", "spec_for"),
    "start of the pass (_start_pass)": ("mover/engines/bulk/reconcile.py", "_start_pass"),
    "status printed at the end (api.status)": ("mover/api.py", "status"),
    "all transactions (Database.transaction)": ("mover/db.py", "transaction"),
    "commits (psycopg Transaction.__exit__)": ("psycopg/transaction.py", "__exit__"),
}


def cli_profile(dsn: str, workdir: Path) -> dict:
    """`mover reconcile --full` with 1 worker under cProfile (worker 0 runs in the main thread):
    cumulative seconds of the functions above, the CLI's wall time, its statement times from
    pg_stat_statements, and the floor of any command (interpreter start and imports)."""
    import pstats
    proc, _ = mover_cli(dsn, "set", NAME, "reconcile.workers=1")
    assert proc.returncode == 0, proc.stderr
    prof = workdir / "reconcile.prof"
    with connect(dsn) as conn:
        pgss = _pgss_reset(conn)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "mover", "--dsn", dsn,
                           "reconcile", NAME, "--full", "--json"], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    assert proc.returncode in (0, 3), proc.stderr
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    functions: dict = {}
    for what, (suffix, fn) in PROFILED.items():
        hits = [(v[1], v[3]) for (f, _, name), v in stats.items() if f.endswith(suffix) and name == fn]
        functions[what] = {"calls": sum(h[0] for h in hits), "s": round(sum(h[1] for h in hits), 3)}
    out = {"wall_s": wall, "pass": json.loads(proc.stdout)["pass"], "functions": functions}
    with connect(dsn) as conn:
        if pgss:
            out["statements"] = _pgss_read(conn)
        out["ranges_ms"] = float(conn.execute(
            "SELECT sum(c.duration_ms) FROM mover.ranges c JOIN mover.migrations m ON m.id = c.migration_id"
            " WHERE m.name = %s AND c.kind = 'reconcile'", (NAME,)).fetchone()[0])
    out["python_bare_s"] = min(timed(lambda: subprocess.run([sys.executable, "-c", "pass"], capture_output=True))
                               for _ in range(3))
    out["cli_help_s"] = min(timed(lambda: subprocess.run([sys.executable, "-m", "mover", "--help"],
                                                         capture_output=True, cwd=ROOT)) for _ in range(3))
    out["cli_status_s"] = min(timed(lambda: mover_cli(dsn, "status", NAME, "--json")) for _ in range(3))
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


def run(dsn: str, rows: int, range_rows: int | None, with_datadiff: bool, shape: str = "narrow",
        type_rows: int = 1_000_000, profile: bool = False, baseline: Path | None = None, repeat: int = 1) -> dict:
    results: dict = {"rows": rows, "range_rows": range_rows or "mover's default", "shape": shape}
    db = create_database(dsn, "bench_reconcile")
    with connect(db) as conn:
        results["server"] = conn.execute("SELECT version()").fetchone()[0]
    results["generate_s"] = timed(lambda: generate(db, SOURCE, rows, shape))
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "rec.toml"
        plan.write_text(PLAN.format(name=NAME, source=SOURCE,
                                    range_rows=f"range_rows = {range_rows}" if range_rows else ""))
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
    if profile:
        results["statement_profile"] = statement_profile(db, s)
        with tempfile.TemporaryDirectory() as tmp:
            results["cli_profile"] = cli_profile(db, Path(tmp))
    if baseline or repeat > 1:
        # this version and the baseline's, 1 worker, alternating: drift falls on both alike
        runs: dict[str, list] = {"this": [], "baseline": []}
        for _ in range(repeat):
            if baseline:
                runs["baseline"].append(mover_pass(db, 1, injected, code=baseline))
            runs["this"].append(mover_pass(db, 1, injected))
        results["side_by_side"] = {k: v for k, v in runs.items() if v}
        results["baseline_code"] = str(baseline) if baseline else None
        results["mover_1w"] = min(runs["this"], key=lambda m: m["seconds"])
    else:
        results["mover_1w"] = mover_pass(db, 1, injected)
    if not profile:
        results["mover_1w_fingerprints"] = mover_pass(db, 1, injected, fingerprints=True)
        results["mover_2w"] = mover_pass(db, 2, injected)
        ranges = mover_ranges(db)
        results["alt_hash_join"] = hash_join(db, s, ranges, injected)
        results["typed_join_only"] = typed_join(db, s, ranges, injected)
        results["alt_bisect"] = bisect(db, s, ranges, injected)
    results["lower_bound_again"] = lower_bound(db, s)
    if type_rows:
        results["type_costs"] = type_costs(db, s, min(type_rows, rows))
    if with_datadiff and not profile:
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

    def mover_line(what, m):
        line(what, m["seconds"], m, f"pass {m['pass_seconds']:.2f}s ({m['pass_seconds'] / lb1:.2f}x, "
                                    f"{m['pass_seconds'] / lb2:.2f}x the bounds), {m['ranges']} ranges, CLI wall time; "
                                    f"RSS {m['rss_kib'] / 1024:.0f} MiB")
    line("lower bound: same row hash, one pass per table, 1 connection", lb1)
    line("lower bound, one connection per table", lb2)
    if "side_by_side" in r:
        for who, runs in r["side_by_side"].items():
            for i, m in enumerate(runs, 1):
                mover_line(f"mover reconcile --full, 1 worker, {who} (run {i})", m)
    else:
        mover_line("mover reconcile --full, 1 worker", r["mover_1w"])
    if "mover_1w_fingerprints" in r:
        mover_line("mover reconcile --full, 1 worker, [reconcile] fingerprints = true", r["mover_1w_fingerprints"])
    if "mover_2w" in r:
        mover_line("mover reconcile --full, 2 workers", r["mover_2w"])
    if "alt_hash_join" in r:
        line("alternative: join comparing row hashes", r["alt_hash_join"]["seconds"], r["alt_hash_join"])
    if "typed_join_only" in r:
        line("for comparison: the typed join alone, no hash (not a design: no fingerprints)",
             r["typed_join_only"]["seconds"], r["typed_join_only"])
    if "alt_bisect" in r:
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
    if "statement_profile" in r:
        text += "\n\n" + statement_report(r["statement_profile"])
    if "cli_profile" in r:
        text += "\n\n" + cli_report(r["cli_profile"])
    if "type_costs" in r:
        tc = r["type_costs"]
        per = [(name, c["type"], c["mode"], f"{c['compare_ns']:.0f}", f"{c['hash_ns']:.0f}")
               for name, c in sorted(tc["columns"].items(), key=lambda kv: -(kv[1]["compare_ns"] + kv[1]["hash_ns"]))]
        text += (f"\n\nper-column cost on {tc['rows']:,} keys (ns per row over the bare join "
                 f"{tc['bare_join_s'] / tc['rows'] * 1e9:.0f} ns and the bare hash pass "
                 f"{tc['bare_hash_s'] / tc['rows'] * 1e9:.0f} ns):\n"
                 + table(per, ("column", "type", "mode", "compare ns/row", "hash ns/row")))
    size = r["range_rows"] if isinstance(r["range_rows"], str) else f"{r['range_rows']:,}-key ranges"
    return (f"{rows:,} rows per table, {r.get('shape', 'narrow')} table, {size}; {r['server']}\n"
            f"(mover run to the cutover gate, backfill and first pass included: {r['mover_run_to_gate_s']:.1f}s)\n\n"
            + text)


def statement_report(p: dict) -> str:
    lines = [f"statements (server settings {p['settings']}; JIT available: {p['jit_available']}):"]
    for jit in ("on", "off"):
        e = p[f"compare_jit_{jit}"]
        lines.append(f"- compare, one range, jit {jit}: {e['execution_ms']:.1f} ms (planning {e['planning_ms']:.1f} ms,"
                     f" JIT {e['jit_ms']:.1f} ms over {e['jit_functions']} functions, cost {e['total_cost']:.0f},"
                     f" buffers hit {e['shared_hit']} read {e['shared_read']}); {p['ranges_timed']} ranges, best of 3"
                     f" each: {p[f'compare_jit_{jit}_s']:.3f} s")
    lines += ["  plan (jit off):", *("    " + x for x in p["compare_jit_off"]["plan"])]
    for gather in ("default", "0"):
        e = p[f"bound_src_gather_{gather}"]
        on, off = p[f"bound_gather_{gather}_jit_on_s"], p[f"bound_gather_{gather}_jit_off_s"]
        lines.append(f"- lower bound, max_parallel_workers_per_gather {gather}: jit on {on:.2f} s, jit off {off:.2f}"
                     f" s (both tables); source pass JIT {e['jit_ms']:.0f} ms, plan: "
                     + " / ".join(x.strip() for x in e["plan"]))
    return "\n".join(lines)


def cli_report(p: dict) -> str:
    rows = [(what, f["calls"], f"{f['s']:.3f}") for what, f in p["functions"].items()]
    text = (f"1-worker CLI under cProfile: wall {p['wall_s']:.2f} s, pass {p['pass']['seconds']:.2f} s, sum of the"
            f" ranges' own time {p['ranges_ms'] / 1000:.2f} s; python -c pass {p['python_bare_s']:.3f} s,"
            f" mover --help {p['cli_help_s']:.3f} s, mover status {p['cli_status_s']:.3f} s\n"
            + table(rows, ("function (cumulative, main thread)", "calls", "seconds")))
    if "statements" in p:
        text += "\n\nits statements (pg_stat_statements, every connection):\n" + table(
            [(s["what"], s["calls"], f"{s['ms']:.1f}") for s in p["statements"]], ("what", "calls", "ms"))
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--shape", choices=SHAPES, default="narrow", help="the generated table (bench/common.py)")
    ap.add_argument("--range-rows", type=int, help="[reconcile] range_rows of the plan (default: mover's)")
    ap.add_argument("--type-rows", type=int, default=1_000_000, help="keys of the per-column cost (0: skip it)")
    ap.add_argument("--dsn", help="use this server (a superuser DSN) instead of starting one")
    ap.add_argument("--no-datadiff", action="store_true", help="skip data-diff")
    ap.add_argument("--profile", action="store_true",
                    help="where a 1-worker pass spends its time (plans, JIT, cProfile, pg_stat_statements) instead"
                         " of the alternatives and data-diff")
    ap.add_argument("--baseline", type=Path, help="a checkout of another mover version: its 1-worker pass is"
                                                  " measured alternately with this one's")
    ap.add_argument("--repeat", type=int, default=1, help="1-worker passes of each version, alternating")
    args = ap.parse_args()
    if args.rows > 1_000_000:
        wait_for_other_benchmarks()
    with server(args.dsn) as (dsn, _):
        results = run(dsn, args.rows, args.range_rows, not args.no_datadiff, args.shape, args.type_rows,
                      profile=args.profile, baseline=args.baseline, repeat=args.repeat)
    results["command"] = " ".join(["python -m bench.reconcile", *sys.argv[1:]])
    path = save(f"reconcile-{args.shape}", results)
    print(report(results))
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    main()
