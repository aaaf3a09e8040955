"""Nothing to protect (issue 36, item 1): the backfill on a server where no application runs,
with the governor at its defaults against the governor off and against the single statement,
side by side in one run on one server.

    .venv/bin/python -m bench.idle [--rows 2000000] [--shapes narrow,wide] [--runs 3] [--dsn DSN]

For each shape, on a fresh generated table (bench/common.py), `--runs` rounds, each in turn:
1. the single statement (bench/common.py single_statement: INSERT ... SELECT into a table with
   only the primary key, then the shape's secondary indexes one after the other);
2. mover's backfill step with the defaults (`mover step` at the backfill, 1 worker: copy, index
   builds, ANALYZE), and what the governor did meanwhile: its states (events) and the seconds it
   spent throttled;
3. the same with `[throttle] max_latency_increase = "off"` (the guards stay, nothing paces).
Reported: each one's median seconds, governed / ungoverned (the goal: at least 0.9 of its speed,
i.e. governed time at most 1/0.9 of ungoverned) and the single statement / governed. Nothing but
mover and this script may use the server meanwhile: that is the point.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/idle.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import tempfile

from bench.backfill import SOURCE, mover_backfill
from bench.common import connect, create_database, generate, median, save, server, single_statement, table, timed

OFF = '\n[throttle]\nmax_latency_increase = "off"\n'


def governor_figures(dsn: str, name: str) -> dict:
    """What the governor of migration `name` did: its events' kinds in order (consecutive repeats
    folded) and the seconds it spent throttled."""
    with connect(dsn) as conn:
        kinds = [k for (k,) in conn.execute(
            "SELECT e.kind FROM mover.events e JOIN mover.migrations m ON m.id = e.migration_id"
            " WHERE m.name = %s AND e.kind IN ('throttle_quiet', 'throttle_busy', 'throttled', 'released',"
            " 'throttle_floor') ORDER BY e.id", (name,)).fetchall()]
        row = conn.execute("SELECT t.throttled_seconds FROM mover.throttle t JOIN mover.migrations m"
                           " ON m.id = t.migration_id WHERE m.name = %s", (name,)).fetchone()
    folded = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    return {"governor_events": folded, "throttled_s": float(row[0]) if row else 0.0}


def one_shape(dsn: str, workdir: Path, shape: str, rows: int, runs: int) -> dict:
    db = create_database(dsn, f"bench_idle_{shape}")
    from mover import api
    api.init(db)
    out: dict = {"shape": shape, "rows": rows, "generate_s": timed(lambda: generate(db, SOURCE, rows, shape)),
                 "single": [], "governed": [], "ungoverned": []}
    for i in range(runs):
        out["single"].append(single_statement(db, SOURCE, shape))
        name = f"idle_gov_{i}"
        gov = mover_backfill(db, workdir, name, 1, during=lambda _a, _b, n=name: governor_figures(db, n))
        out["governed"].append(gov)
        out["ungoverned"].append(mover_backfill(db, workdir, f"idle_off_{i}", 1, extra=OFF))
        print(shape, i, {k: (v[-1].get("total_s") or v[-1].get("step_s")) for k, v in out.items()
                         if isinstance(v, list)}, gov["governor_events"], flush=True)
    return out


def report(r: dict) -> str:
    rows = []
    for s in r["shapes"]:
        single = median([x["total_s"] for x in s["single"]])
        gov = median([x["step_s"] for x in s["governed"]])
        off = median([x["step_s"] for x in s["ungoverned"]])
        throttled = median([x["throttled_s"] for x in s["governed"]])
        paired = ", ".join(f"{o['step_s'] / g['step_s']:.2f}" for g, o in zip(s["governed"], s["ungoverned"],
                                                                              strict=True))
        rows.append((s["shape"], f"{s['rows']:,}", f"{single:.2f}", f"{gov:.2f}", f"{off:.2f}",
                     f"{off / gov:.2f} ({paired})", f"{single / gov:.2f}", f"{throttled:.1f}",
                     " ".join(s["governed"][-1]["governor_events"]) or "-"))
    return (f"{r['server']}; medians of {r['runs']} rounds; mover's backfill step (1 worker) wall time\n\n"
            + table(rows, ("shape", "rows", "single statement s", "governed s", "ungoverned s",
                           "speed governed / ungoverned (each round)", "single / governed", "throttled s",
                           "governor events (last run)")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--shapes", default="narrow,wide")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dsn", help="an existing server (superuser); default: start one")
    args = ap.parse_args()
    results: dict = {"runs": args.runs, "shapes": [], "command": " ".join(["bench/idle.py", *sys.argv[1:]])}
    with server(args.dsn) as (dsn, _), tempfile.TemporaryDirectory() as tmp:
        with connect(dsn) as conn:
            results["server"] = conn.execute("SELECT version()").fetchone()[0]
        for shape in args.shapes.split(","):
            results["shapes"].append(one_shape(dsn, Path(tmp), shape, args.rows, args.runs))
    path = save("idle", results)
    print(report(results))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
