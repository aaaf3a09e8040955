"""Print the tables of bench/README.md from the committed raw results, the newest of each kind.

    .venv/bin/python -m bench.report [bench/results/NAME.json ...]

Every figure in bench/README.md and the README's benchmark section comes from a file in
bench/results/, written by the run that measured it (its command is in the file); this script
renders them again, so a figure can be traced to its run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import RESULTS

KINDS = {"backfill": "bench.backfill", "reconcile": "bench.reconcile", "capture": "bench.capture",
         "scaling": "bench.scaling", "partition": "bench.partition", "cutover": "bench.cutover",
         "impact": "bench.impact", "wide": "bench.wide", "idle": "bench.idle", "metrics": "bench.metrics",
         "partitioned": "bench.partitioned", "fleet": "bench.fleet"}


def newest() -> list[Path]:
    """The newest file of each kind and shape (names: KIND[-SHAPE]-YYYYmmdd-HHMMSS.json)."""
    latest: dict[str, Path] = {}
    # A name without its time (partition.json, from before results were stamped) counts as oldest.
    for p in sorted(RESULTS.glob("*.json"), key=lambda p: (p.stem.count("-") >= 2, p.name)):
        latest[p.stem.rsplit("-", 2)[0]] = p  # sorted by time within a kind: the last one wins
    return list(latest.values())


def render(path: Path) -> str:
    import importlib
    kind = path.stem.split("-")[0]
    if kind not in KINDS:
        return f"## {path.name}\n\n(no renderer for {kind})"
    r = json.loads(path.read_text())
    module = importlib.import_module(KINDS[kind])
    if not hasattr(module, "report"):
        return f"## {path.name}\n\n(no renderer in {KINDS[kind]}; the raw figures are in the file)"
    text = module.report(r)
    return f"## {path.name}\n\n`{r.get('command', kind)}`\n\n{text}"


def _load(prefix: str) -> tuple[str, dict] | None:
    for p in newest():
        if p.stem.rsplit("-", 2)[0] == prefix or p.stem == prefix:
            return p.name, json.loads(p.read_text())
    return None


def summary(compact: bool = False) -> str:
    """The README's short tables: the headline ratios of the newest results, each file named.
    compact: the narrow shape and mover's own trigger only (the front page's length)."""
    from bench.common import table
    out: list[str] = []
    shapes = ("narrow",) if compact else ("narrow", "wide")
    for shape in shapes:
        got = _load(f"backfill-{shape}")
        if got is None:
            continue
        name, r = got
        lim = r["single_statement"]["total_s"]
        rows = []

        def add(what, sec, n, rows=rows, lim=lim):
            rows.append((what, f"{sec:.1f}", f"{n / sec:,.0f}", f"{lim / sec:.2f}"))
        add("single statement: `INSERT ... SELECT` (pk only) + index builds", lim, r["single_statement"]["rows"])
        for key, what in (("mover_1w", "mover backfill, 1 worker"), ("mover_2w", "mover backfill, 2 workers")):
            if key in r:
                add(what, r[key]["step_s"], r[key]["rows"])
        if "writes" in r:
            w = r["writes"]
            add(f"mover backfill, 1 worker, pgbench writing (writers keep "
                f"{w['writer_tps_during'] / max(w['writer_tps_idle'], 1):.2f} of their TPS)", w["step_s"], w["rows"])
        if r.get("pg_repack", {}).get("seconds"):
            add("pg_repack -t", r["pg_repack"]["seconds"], r["single_statement"]["rows"])
        out.append(f"**Backfill, {shape} table, {r['rows']:,} rows** (`{r['command']}`, "
                   f"[{name}](bench/results/{name}))\n\n"
                   + table(rows, ("what", "seconds", "rows/s", "single statement / this")))
    got = _load("capture")
    if got:
        name, r = got
        rows = [(w, v, f"{r[w][v]['cost'] * 100:.1f} %", f"{r[w][v]['paired_cost'] * 100:.1f} %",
                 f"{r[w][v]['min']:,.0f}..{r[w][v]['max']:,.0f}")
                for w in ("tpcb-like", "simple-update") for v in r[w] if v != "none" and (v == "mover" or not compact)]
        out.append(f"**Capture trigger cost**, pgbench scale {r['scale']}, {r['clients']} clients, {r['runs']} "
                   f"interleaved rounds of {r['seconds']} s (`{r['command']}`, [{name}](bench/results/{name}))\n\n"
                   + table(rows, ("workload", "trigger design", "cost (medians)", "cost (paired)", "tps min..max")))
    for shape in shapes:
        got = _load(f"reconcile-{shape}")
        if got is None:
            continue
        name, r = got
        lb1 = min(r["lower_bound"]["seconds"], r["lower_bound_again"]["seconds"])
        lb2 = min(r["lower_bound"]["two_connections_s"], r["lower_bound_again"]["two_connections_s"])
        rows = [("lower bound: the row hash over both tables, 1 connection", f"{lb1:.2f}", "1.00", f"{lb1 / lb2:.2f}",
                 ""),
                ("lower bound, one connection per table", f"{lb2:.2f}", f"{lb2 / lb1:.2f}", "1.00", "")]
        for key, what in (("mover_1w", "`mover reconcile --full`, 1 worker"), ("mover_2w", "... 2 workers")):
            m = r[key]
            rows.append((what, f"{m['seconds']:.2f}", f"{m['seconds'] / lb1:.2f}", f"{m['seconds'] / lb2:.2f}",
                         "yes" if m["all"] else "no"))
        d = r.get("datadiff", {})
        if d.get("seconds") and "error" not in d:
            rows.append(("data-diff 0.11.2 hashdiff, every column", f"{d['seconds']:.2f}", f"{d['seconds'] / lb1:.2f}",
                         f"{d['seconds'] / lb2:.2f}", "yes" if d["all"] else "no"))
        out.append(f"**Reconcile, {shape} table, {r['rows']:,} rows per table** (`{r['command']}`, "
                   f"[{name}](bench/results/{name}))\n\n"
                   + table(rows, ("what", "seconds", "x bound (1 conn)", "x bound (2 conns)", "found all 30")))
    got = _load("scaling-narrow") or _load("scaling")  # named by shape since issue 36
    if got:
        name, r = got
        rows = [(f"{s['rows']:,}", f"{s['migration_s']:.1f}", f"{s['steps_s'].get('backfill', 0):.1f}",
                 f"{s['steps_s'].get('reconcile', 0):.1f}", f"{float(s['cutover_lock_ms'] or 0):.0f}",
                 f"{s['rss_kib'] / 1024:.0f}") for s in r["sizes"]]
        out.append(f"**Scaling**, whole migration under {r['tps']} tps of writes (`{r['command']}`, "
                   f"[{name}](bench/results/{name}), chart: [bench/scaling.svg](bench/scaling.svg))\n\n"
                   + table(rows, ("rows", "whole migration s", "backfill s", "reconcile s", "cutover lock ms",
                                  "peak RSS MiB")))
    got = _load("partition")
    if got:
        name, r = got
        limit = r["limit"]["total_s"]
        partman = r.get("pg_partman", {}).get("total_s")
        rows = [("single statement: `INSERT INTO partitioned SELECT *` + index builds", f"{limit:.1f}", "1.00", "")]
        for key in ("mover_1w", "mover_1w_1i", "mover_1w_2i", "mover_2w"):
            if key in r:
                t, w, i = r[key]["step_s"], r[key]["workers"], r[key]["index_builds"]
                what = f"mover, {w} worker{'s' if w > 1 else ''}, {i} index build session{'s' if i > 1 else ''}"
                rows.append((what, f"{t:.1f}", f"{t / limit:.2f}", f"{partman / t:.1f}x" if partman else ""))
        if partman:
            rows.append(("pg_partman `partition_data_proc`", f"{partman:.1f}", f"{partman / limit:.2f}", ""))
        out.append(f"**Converting {r['rows']:,} rows to monthly partitions**, pgbench writing (`{r['command']}`, "
                   f"[{name}](bench/results/{name}))\n\n"
                   + table(rows, ("what", "seconds", "this / single statement", "faster than pg_partman")))
    rows = []
    for schema in ("plain", "scenario"):
        got = _load(f"cutover-{schema}")
        if got is None:
            continue
        name, r = got
        ok = [run for run in r["runs"] if not run.get("refused") and run["cutover_exit"] == 0]
        if ok:
            held = " / ".join(f"{run['lock_ms']:.1f}" for run in ok)
            rows.append((f"[{schema}](bench/results/{name})", len(ok), held,
                         f"{max(run['worst_beyond_p99_ms'] for run in ok):.1f}"))
    if rows:
        out.append("**Cutover under pgbench -c 8**, 1 M rows (`bench/cutover.py --schema plain|scenario`)\n\n"
                   + table(rows, ("schema", "runs", "lock held ms", "worst stall beyond p99 ms")))
    return "\n\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--summary", action="store_true", help="the README's short tables")
    ap.add_argument("--compact", action="store_true", help="with --summary: narrow shape, mover's trigger only")
    args = ap.parse_args()
    if args.summary:
        print(summary(args.compact))
        return
    for path in args.files or newest():
        print(render(path) + "\n")


if __name__ == "__main__":
    main()
