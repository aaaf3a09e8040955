"""Wide tables (issue 34): rows/s of the backfill, a reconcile pass and the cutover's last check
for tables of 10, 100 and 1600 integer columns, side by side with another version of mover.

    .venv/bin/python -m bench.wide [--rows 1000] [--range-rows 100] [--columns 10 100 1600]
                                   [--baseline DIR] [--dsn DSN]

For each width, and for this checkout and the --baseline one (e.g. `git archive COMMIT | tar -x
-C DIR`, or another worktree) in turn, on the same server:

1. a fresh table `wide_<columns>` (`id int` primary key, columns c1... int, every value set),
   and a plan widening id to bigint with [backfill] and [reconcile] range_rows = --range-rows
   (small ranges, so that what a range costs beyond its rows shows) and the governor off
   ([throttle] max_latency_increase = "off": the figures are the engines', not the load's);
2. `mover run` to the cutover gate: the backfill step's rows/s (rows over the step's recorded
   duration: the copy, its index build and ANALYZE) and the full reconcile pass's (its own
   rows and seconds, the pass_done event);
3. one UPDATE of a column in every row of the source, then `mover cutover`: the last check is
   the incremental pass over every range (each holds a changed key), after the drain; its rows/s.

Every figure is a rate in source rows per second. A rate that falls from 10 to 1600 columns by
much more than the row's width grows means a cost per range or per statement that grows with the
columns (issue 34: 4 rows/s on 1600 columns). The script waits while another benchmark runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from psycopg import sql

from bench.common import connect, create_database, mover_cli, save, server, table
from bench.reconcile import wait_for_other_benchmarks

PLAN = """
[migration]
name = "{name}"
source = "{table}"
[target]
columns = {{ id = "bigint" }}
[backfill]
range_rows = {range_rows}
[reconcile]
range_rows = {range_rows}
[throttle]
max_latency_increase = "off"
[rollback]
window = "1h"
"""


def create(dsn: str, name: str, columns: int, rows: int) -> None:
    t = sql.Identifier(name)
    cols = [sql.Identifier(f"c{i}") for i in range(1, columns)]
    with connect(dsn) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(t))
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, {})").format(
            t, sql.SQL(", ").join(sql.SQL("{} int").format(c) for c in cols)))
        values = sql.SQL(", ").join(sql.SQL("g + {}").format(sql.Literal(i)) for i in range(1, columns))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g, {} FROM generate_series(1, %s) g").format(t, values), (rows,))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(t))


def _events(dsn: str, name: str) -> tuple[float | None, list[dict]]:
    """(the backfill step's duration in seconds, the reconcile passes' details in order)."""
    with connect(dsn) as conn:
        backfill = conn.execute(  # from the step's start to its end, as `mover history` shows it
            "SELECT extract(epoch FROM max(e.at) FILTER (WHERE e.kind = 'step_done')"
            "                        - max(e.at) FILTER (WHERE e.kind = 'step_started')) * 1000"
            " FROM mover.events e JOIN mover.migrations m ON m.id = e.migration_id"
            " WHERE m.name = %s AND e.step = 'backfill'", (name,)).fetchone()
        passes = conn.execute(
            "SELECT e.detail FROM mover.events e JOIN mover.migrations m ON m.id = e.migration_id"
            " WHERE m.name = %s AND e.kind = 'pass_done' ORDER BY e.id", (name,)).fetchall()
    return (float(backfill[0]) / 1000 if backfill and backfill[0] is not None else None), [p[0] for p in passes]


def one(dsn: str, columns: int, rows: int, range_rows: int, code: Path | None, label: str) -> dict:
    name = f"w{columns}_{label}"
    table_name = f"wide_{columns}_{label}"
    create(dsn, table_name, columns, rows)
    plan = Path(f"/tmp/bench-wide-{name}.toml")
    plan.write_text(PLAN.format(name=name, table=table_name, range_rows=range_rows))
    out: dict = {"columns": columns, "rows": rows, "version": label}
    started = time.perf_counter()
    proc, _ = mover_cli(dsn, "run", str(plan), code=code)
    out["run_s"] = round(time.perf_counter() - started, 2)
    if proc.returncode != 3:
        out["error"] = f"run exited {proc.returncode}: {proc.stderr[-500:]}"
        return out
    with connect(dsn) as conn:
        conn.execute(sql.SQL("UPDATE {} SET c1 = c1 + 1").format(sql.Identifier(table_name)))
    started = time.perf_counter()
    proc, _ = mover_cli(dsn, "cutover", name, code=code)
    out["cutover_s"] = round(time.perf_counter() - started, 2)
    if proc.returncode != 0:
        out["error"] = f"cutover exited {proc.returncode}: {proc.stderr[-500:]}"
    backfill_s, passes = _events(dsn, name)
    out["backfill_s"] = backfill_s
    out["backfill_rows_s"] = round(rows / backfill_s) if backfill_s else None
    full, last = (passes[0] if passes else None), (passes[-1] if len(passes) > 1 else None)
    for key, p in (("reconcile", full), ("last_check", last)):
        if p:
            out[f"{key}_s"] = p["seconds"]
            out[f"{key}_rows"] = p["rows"]
            out[f"{key}_ranges"] = p["ranges"]
            out[f"{key}_rows_s"] = round(p["rows"] / p["seconds"]) if p["seconds"] else None
    proc, _ = mover_cli(dsn, "retire", name, "--force", code=code)  # the next one starts clean
    if proc.returncode != 0:
        out["retire"] = proc.stderr[-300:]
    with connect(dsn) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table_name)))
    return out


def run(dsn: str, rows: int, range_rows: int, widths: list[int], baseline: Path | None) -> dict:
    db = create_database(dsn, "bench_wide")
    proc, _ = mover_cli(db, "init")
    assert proc.returncode == 0, proc.stderr
    if baseline is not None:  # an older control schema: init from that checkout too (idempotent)
        mover_cli(db, "init", code=baseline)
    versions: list[tuple[str, Path | None]] = [("this", None)] + ([("baseline", baseline)] if baseline else [])
    results = []
    for columns in widths:
        for label, code in versions:
            r = one(db, columns, rows, range_rows, code, label)
            print(json.dumps(r), file=sys.stderr, flush=True)
            results.append(r)
    return {"rows": rows, "range_rows": range_rows, "baseline": str(baseline) if baseline else None,
            "results": results}


def report(r: dict) -> str:
    rows = []
    for x in r["results"]:
        rows.append((x["columns"], x["version"], x.get("backfill_rows_s", "-"), x.get("reconcile_rows_s", "-"),
                     x.get("last_check_rows_s", "-"), x.get("run_s", "-"), x.get("cutover_s", "-"),
                     x.get("error", "")[:60]))
    head = (f"{r['rows']} rows, ranges of {r['range_rows']}; rows/s: source rows over the step's or the pass's own time"
            + (f"; baseline: {r['baseline']}" if r.get("baseline") else ""))
    return head + "\n\n" + table(rows, ("columns", "version", "backfill rows/s", "reconcile pass rows/s",
                                        "last check rows/s", "run s", "cutover s", "error"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--range-rows", type=int, default=100, help="[backfill] and [reconcile] range_rows (at least 100)")
    ap.add_argument("--columns", type=int, nargs="+", default=[10, 100, 1600], help="widths, each at most 1600")
    ap.add_argument("--baseline", type=Path, help="a checkout of another mover version, measured after this one")
    ap.add_argument("--dsn", help="use this server (a superuser DSN) instead of starting one")
    args = ap.parse_args()
    if any(not 2 <= c <= 1600 for c in args.columns):
        ap.error("--columns: each between 2 and 1600")
    wait_for_other_benchmarks()
    with server(args.dsn) as (dsn, _):
        results = run(dsn, args.rows, args.range_rows, args.columns, args.baseline)
    results["command"] = " ".join(["python -m bench.wide", *sys.argv[1:]])
    path = save("wide", results)
    print(report(results))
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    main()
