"""Scaling curve (issue #12): a whole migration at several table sizes, each step's time, the
peak memory of mover, and the cutover's lock hold, drawn as an SVG chart.

    .venv/bin/python bench/scaling.py [--sizes 1000000,10000000,30000000] [--shape narrow|wide]
                                      [--tps 200] [--dsn DSN] [--chart bench/scaling.svg]

For each size, on a fresh database: the generated table (bench/common.py), then one
`mover run PLAN` with `[cutover] auto = true` and a zero rollback window, so the one command
goes create, capture, backfill, reconcile, cutover, retire, while pgbench writes to the table at
a fixed rate (--tps, the same at every size: updates, inserts and deletes by random key), so the
cutover has real changes to drain under its lock. Each step's time is read from mover.steps
(started_at..finished_at), the lock hold from mover.migrations.cutover_lock_ms, the peak RSS of
the mover process from a wrapper (bench/common.py). 100 million rows is a documented manual
run (`--sizes 100000000`, about 17 GiB of table and 30 minutes here); the default stops at 30 M.

Time should grow linearly with rows and memory stay flat: the chart draws each series with
the line through the origin and the largest size's point, so a departure from linear shows as
the smaller points falling off that line.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/scaling.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import subprocess
import tempfile
import time

from bench.common import (
    ROOT,
    SHAPES,
    bindir,
    connect,
    create_database,
    generate,
    mover_cli,
    save,
    server,
    table,
    table_bytes,
    timed,
)

SOURCE = "bench_source"
NAME = "bench_scale"
PLAN = """
[migration]
name = "{name}"
source = "{source}"
[cutover]
auto = true
[rollback]
window = "0s"
"""
WRITES = (
    ("update", 6, "\\set id random(1, :maxid)\nUPDATE {t} SET amount = amount + 1 WHERE id = :id;\n"),
    ("insert", 3, "\\set acc random(1, 100000)\nINSERT INTO {t} (created_at, account_id, amount, status, payload)"
                  " VALUES (now(), :acc, 1, 'new', repeat('x', 80));\n"),
    ("delete", 1, "\\set id random(1, :maxid)\nDELETE FROM {t} WHERE id = :id;\n"),
)
STEPS = ("create_target", "install_capture", "backfill", "reconcile", "cutover", "rollback_window", "retire")


def writers(dsn: str, workdir: Path, rows: int, tps: int) -> subprocess.Popen:
    files = []
    for name, weight, script in WRITES:
        f = workdir / f"{name}.sql"
        f.write_text(script.format(t=SOURCE))
        files += ["-f", f"{f}@{weight}"]
    return subprocess.Popen([str(bindir() / "pgbench"), "-n", "-c", "2", "-j", "2", "-T", "86400", "-R", str(tps),
                             "-D", f"maxid={rows}", *files, dsn],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def one_size(dsn: str, rows: int, shape: str, tps: int) -> dict:
    db = create_database(dsn, "bench_scaling")
    out: dict = {"rows": rows}
    out["generate_s"] = timed(lambda: generate(db, SOURCE, rows, shape))
    out["table_bytes"] = table_bytes(db, SOURCE)
    assert mover_cli(db, "init")[0].returncode == 0
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "scale.toml"
        plan.write_text(PLAN.format(name=NAME, source=SOURCE))
        w = writers(db, Path(tmp), rows, tps) if tps else None
        started = time.perf_counter()
        try:
            proc, rss = mover_cli(db, "run", str(plan))
        finally:
            if w is not None:
                w.terminate()
                w.communicate()
        out["migration_s"] = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    out["rss_kib"] = rss
    with connect(db) as conn:
        steps = conn.execute(
            "SELECT s.name, extract(epoch FROM s.finished_at - s.started_at) FROM mover.steps s"
            " JOIN mover.migrations m ON m.id = s.migration_id WHERE m.name = %s", (NAME,)).fetchall()
        out["steps_s"] = {name: float(sec or 0) for name, sec in steps}
        out["cutover_lock_ms"], out["state"] = conn.execute(
            "SELECT cutover_lock_ms, state FROM mover.migrations WHERE name = %s", (NAME,)).fetchone()
        out["copied_rows"] = int(conn.execute(
            "SELECT sum(c.rows) FROM mover.ranges c JOIN mover.migrations m ON m.id = c.migration_id"
            " WHERE m.name = %s AND c.kind = 'backfill'", (NAME,)).fetchone()[0] or 0)
    return out


# ---------------------------------------------------------------------------------------------
# The chart: plain SVG, no plotting library


def _panel(x0: float, y0: float, w: float, h: float, title: str, ylabel: str, xs: list[float],
           series: list[tuple[str, str, list[float]]], linear: bool = True) -> list[str]:
    xmax = max(xs) * 1.05
    ymax = max(max(v) for _, _, v in series) * 1.15 or 1

    def px(x: float) -> float:
        return x0 + x / xmax * w

    def py(y: float) -> float:
        return y0 + h - y / ymax * h

    out = [f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
           f'<text x="{x0 + w / 2}" y="{y0 - 12}" text-anchor="middle" font-weight="bold">{title}</text>',
           f'<text x="{x0 - 48}" y="{y0 + h / 2}" text-anchor="middle" '
           f'transform="rotate(-90 {x0 - 48} {y0 + h / 2})">{ylabel}</text>',
           f'<text x="{x0 + w / 2}" y="{y0 + h + 36}" text-anchor="middle">million rows</text>']
    for i in range(5):
        yv = ymax * i / 4
        out.append(f'<line x1="{x0}" y1="{py(yv):.1f}" x2="{x0 + w}" y2="{py(yv):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 6}" y="{py(yv) + 4:.1f}" text-anchor="end" font-size="11">{yv:,.0f}</text>')
    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{x:g}</text>')
    for i, (name, color, ys) in enumerate(series):
        # the line through the origin and the largest point: linear growth puts every point on it
        if linear:
            out.append(f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(xs[-1]):.1f}" y2="{py(ys[-1]):.1f}" '
                       f'stroke="{color}" stroke-dasharray="4 4" stroke-opacity="0.6"/>')
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in zip(xs, ys, strict=True):
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}"/>')
            out.append(f'<text x="{px(x) + 5:.1f}" y="{py(y) - 6:.1f}" font-size="10" fill="{color}">{y:,.1f}</text>')
        out.append(f'<rect x="{x0 + 10}" y="{y0 + 10 + 16 * i}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x0 + 26}" y="{y0 + 19 + 16 * i}" font-size="12">{name}</text>')
    return out


def chart(r: dict) -> str:
    sizes = r["sizes"]
    xs = [s["rows"] / 1e6 for s in sizes]
    left = _panel(80, 50, 420, 300, "time", "seconds", xs, [
        ("whole migration (mover run)", "#1f77b4", [s["migration_s"] for s in sizes]),
        ("backfill step", "#2ca02c", [s["steps_s"].get("backfill", 0) for s in sizes]),
        ("reconcile step", "#d62728", [s["steps_s"].get("reconcile", 0) for s in sizes])])
    right = _panel(620, 50, 420, 300, "memory and lock", "MiB / ms", xs, [
        ("peak RSS of mover, MiB", "#9467bd", [s["rss_kib"] / 1024 for s in sizes]),
        ("cutover lock hold, ms", "#ff7f0e", [float(s["cutover_lock_ms"] or 0) for s in sizes])], linear=False)
    caption = (f"{r['shape']} table, pgbench writing {r['tps']} tps throughout; {r['server'].split(' on ')[0]}; "
               "dashed (time): the line through the origin and the largest size")
    body = "\n".join([*left, *right, f'<text x="80" y="420" font-size="12">{caption}</text>'])
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="1080" height="440" font-family="sans-serif" '
            f'font-size="13">\n<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n')


def report(r: dict) -> str:
    out = []
    for s in r["sizes"]:
        st = s["steps_s"]
        out.append((f"{s['rows']:,}", f"{s['table_bytes'] / 2**30:.2f}", f"{s['migration_s']:.1f}",
                    f"{st.get('backfill', 0):.1f}", f"{s['copied_rows'] / max(st.get('backfill', 0), 1e-9):,.0f}",
                    f"{st.get('reconcile', 0):.1f}", f"{float(s['cutover_lock_ms'] or 0):.1f}",
                    f"{s['rss_kib'] / 1024:.0f}"))
    return (f"{r['shape']} table, pgbench {r['tps']} tps during each migration; {r['server']}\n\n"
            + table(out, ("rows", "GiB", "whole migration s", "backfill s", "backfill rows/s", "reconcile s",
                          "cutover lock ms", "peak RSS MiB")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,10000000,30000000")
    ap.add_argument("--shape", choices=SHAPES, default="narrow")
    ap.add_argument("--tps", type=int, default=200, help="pgbench's fixed write rate during each migration (0: none)")
    ap.add_argument("--dsn", help="an existing server (superuser); default: start one")
    ap.add_argument("--chart", default=str(ROOT / "bench" / "scaling.svg"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict = {"shape": args.shape, "tps": args.tps, "sizes": [],
                     "command": " ".join(["bench/scaling.py", *sys.argv[1:]])}
    with server(args.dsn) as (dsn, _):
        with connect(dsn) as conn:
            results["server"] = conn.execute("SELECT version()").fetchone()[0]
        path = None
        for rows in sizes:
            print(f"{rows:,} rows ...", flush=True)
            results["sizes"].append(one_size(dsn, rows, args.shape, args.tps))
            print(results["sizes"][-1], flush=True)
            # after every size: a run stopped during a larger one keeps the smaller ones
            if path is not None:
                path.unlink()
            path = save("scaling", results)
            Path(args.chart).write_text(chart(results))
    print(report(results))
    print(f"\nresults: {path}\nchart: {args.chart}")


if __name__ == "__main__":
    main()
