"""What the Prometheus exporter costs (issue 39): mover's backfill step without a scrape, with a
scrape every 15 s (Prometheus' common interval) and with one every second (a visible figure),
side by side in one run on one server, and what each scrape takes.

    .venv/bin/python -m bench.metrics [--rows 1000000] [--runs 3] [--shape narrow|wide] [--dsn DSN]

One exporter process (`mover metrics --listen 127.0.0.1:0`, as an operator runs it) serves the
whole run; a scraper in this process GETs /metrics at the variant's interval while the backfill
step runs (bench/backfill.py mover_backfill: `mover step NAME` at the backfill, 1 worker, the
governor at its defaults; the migration aborted after). The variants take turns within each
round, so that drift hits them alike. Reported: each variant's median step time and its ratio to
the step without scrapes, the scrapes taken, and a scrape's own duration: the HTTP round trip as
the scraper saw it and the exporter's read of the control schema (mover_scrape_duration_seconds).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/metrics.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import os
import re
import subprocess
import tempfile
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from bench.backfill import SOURCE, mover_backfill
from bench.common import ROOT, connect, create_database, generate, median, save, server, table, timed

VARIANTS = {"no scrape": None, "every 15 s": 15.0, "every 1 s": 1.0}


class Scraper:
    """GETs `url` every `interval` seconds in a thread, from start() to stop(): each scrape's round
    trip and the exporter's own read time (mover_scrape_duration_seconds), and whether it read."""

    def __init__(self, url: str, interval: float):
        self.url, self.interval = url, interval
        self.round_trips: list[float] = []
        self.reads: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Scraper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while True:
            started = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=30) as response:
                text = response.read().decode()
            self.round_trips.append(time.perf_counter() - started)
            samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                       if not s.labels}
            self.reads.append(samples["mover_scrape_duration_seconds"])
            self.failed += samples["mover_up"] != 1
            if self._stop.wait(max(0.0, self.interval - (time.perf_counter() - started))):
                return


def start_exporter(dsn: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "mover", "--dsn", dsn, "metrics", "--listen", "127.0.0.1:0"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT,
                            env={**os.environ, "COLUMNS": "200"})
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"serving metrics on (\S+)", line):
            # Drain the rest, so a warning line never blocks the exporter on a full pipe.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, m.group(1)
    raise RuntimeError(f"the exporter did not start (exit {proc.wait()})")


def one_round(dsn: str, workdir: Path, url: str, i: int) -> dict:
    out: dict = {}
    for variant, interval in VARIANTS.items():
        scraper = Scraper(url, interval) if interval is not None else None

        def stop_scraping(_started: float, _ended: float, scraper: Scraper | None = scraper) -> dict:
            if scraper is None:
                return {}
            scraper.stop()
            return {"scrapes": len(scraper.round_trips), "round_trip_s": scraper.round_trips,
                    "read_s": scraper.reads, "scrapes_not_up": scraper.failed}

        # The scraper starts with the whole `mover step` run; only the backfill step is timed.
        name = f"metrics_{i}_{variant.replace(' ', '_')}"
        if scraper is not None:
            scraper.start()
        out[variant] = mover_backfill(dsn, workdir, name, 1, during=stop_scraping)
        print(i, variant, f"{out[variant]['step_s']:.2f} s", out[variant].get("scrapes", ""), flush=True)
    return out


def report(r: dict) -> str:
    base = median([x["no scrape"]["step_s"] for x in r["rounds"]])
    rows = []
    for variant in VARIANTS:
        runs = [x[variant] for x in r["rounds"]]
        step = median([x["step_s"] for x in runs])
        trips = [t for x in runs for t in x.get("round_trip_s", [])]
        reads = [t for x in runs for t in x.get("read_s", [])]
        paired = ", ".join(f"{x[variant]['step_s'] / x['no scrape']['step_s']:.3f}" for x in r["rounds"])
        rows.append((variant, f"{step:.2f}", f"{step / base:.3f} ({paired})", sum(x.get("scrapes", 0) for x in runs),
                     f"{median(trips) * 1000:.1f} / {max(trips) * 1000:.1f}" if trips else "-",
                     f"{median(reads) * 1000:.1f} / {max(reads) * 1000:.1f}" if reads else "-",
                     sum(x.get("scrapes_not_up", 0) for x in runs)))
    return (f"{r['server']}; {r['rows']:,} rows ({r['shape']}), medians of {len(r['rounds'])} rounds; mover's "
            f"backfill step (1 worker) wall time, one exporter process scraped over HTTP\n\n"
            + table(rows, ("scrapes", "backfill s", "ratio to no scrape (each round)", "scrapes taken",
                           "scrape round trip ms (median / max)", "schema read ms (median / max)", "not up")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--shape", default="narrow", choices=("narrow", "wide"))
    ap.add_argument("--dsn", help="an existing server (superuser); default: start one")
    args = ap.parse_args()
    results: dict = {"rows": args.rows, "shape": args.shape, "rounds": []}
    with server(args.dsn) as (dsn, _), tempfile.TemporaryDirectory() as tmp:
        with connect(dsn) as conn:
            results["server"] = conn.execute("SELECT version()").fetchone()[0]
        db = create_database(dsn, "bench_metrics")
        from mover import api
        api.init(db)
        results["generate_s"] = timed(lambda: generate(db, SOURCE, args.rows, args.shape))
        exporter, url = start_exporter(db)
        try:
            for i in range(args.runs):
                results["rounds"].append(one_round(db, Path(tmp), url, i))
        finally:
            exporter.terminate()
            exporter.wait(30)
    path = save("metrics", results)
    print(report(results))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
