"""A whole migration under pgbench with mover killed (SIGKILL) at random moments, for each capture
method: nothing may be lost.

    .venv/bin/python bench/crash.py [--method trigger --method logical] [--scale 10] [--clients 4]
                                    [--kills 8] [--seed 1] [--dsn DSN]

For each method: `pgbench -i -s SCALE`, then pgbench's tpcb-like (`--clients` clients) runs for the
whole migration while `pgbench_accounts` has its key `aid` widened to bigint. `mover run` is killed
at random moments of the backfill and reconcile (`--kills` times, each after 0.2-3 s) and resumed
until it waits at the gate; `mover cutover` is killed in the first second a few times, each crash
followed by `mover run`, until the swap is recorded; in the rollback window `mover run` (the
reverse sync) is killed again. Then pgbench stops, the window's sync runs once more, and the
judgement is independent of mover: TPC-B's sums (accounts, branches, tellers and history, each
delta applied once) agree on the live table and on the old one, and the two tables hold the same
rows (EXCEPT ALL both ways empty). Not a timing benchmark: what it reports is the kills, the exits,
and whether anything was lost.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/crash.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import random
import signal
import subprocess
import tempfile
import time

from psycopg import sql

from bench.common import ROOT, bindir, connect, create_database, save, server, table

PLAN = """
[migration]
name = "{name}"
source = "pgbench_accounts"

[target]
columns = {{ aid = "bigint" }}

[capture]
method = "{method}"

[backfill]
range_rows = 20000

[cutover]
lock_timeout = "200ms"
attempts = 30

[rollback]
window = "1h"
"""


def cli(dsn: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "mover", "--dsn", dsn, *args]


def status(dsn: str, name: str) -> dict:
    r = subprocess.run(cli(dsn, "status", name, "--json"), capture_output=True, text=True, cwd=ROOT)
    return json.loads(r.stdout)


def killed_run(dsn: str, args: list[str], rnd: random.Random, lo: float, hi: float) -> tuple[int, bool]:
    """Run mover; SIGKILL it after a random delay if it is still running. (exit code, killed)"""
    proc = subprocess.Popen(cli(dsn, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        proc.wait(timeout=rnd.uniform(lo, hi))
        return proc.returncode, False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return -9, True


def tpcb_sums(dsn: str, accounts: str) -> dict:
    with connect(dsn) as conn:
        row = conn.execute(sql.SQL(
            "SELECT (SELECT sum(abalance) FROM {}), (SELECT sum(bbalance) FROM pgbench_branches),"
            " (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT sum(delta) FROM pgbench_history),"
            " (SELECT count(*) FROM {})").format(sql.Identifier(accounts), sql.Identifier(accounts))).fetchone()
    return {"accounts": row[0], "branches": row[1], "tellers": row[2], "history": row[3], "rows": row[4]}


def except_all(dsn: str, a: str, b: str) -> int:
    with connect(dsn) as conn:
        return conn.execute(sql.SQL("SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b}) d").format(
            a=sql.Identifier(a), b=sql.Identifier(b))).fetchone()[0]


def one_method(dsn: str, workdir: Path, method: str, args) -> dict:
    rnd = random.Random(f"{args.seed}-{method}")
    db = create_database(dsn, f"crash_{method}")
    subprocess.run([str(bindir() / "pgbench"), "-i", "-q", "-s", str(args.scale), db], check=True,
                   capture_output=True)
    name = f"crash-{method}"
    plan = workdir / f"{name}.toml"
    plan.write_text(PLAN.format(name=name, method=method))
    subprocess.run(cli(db, "init"), check=True, capture_output=True, cwd=ROOT)
    bench = subprocess.Popen([str(bindir() / "pgbench"), "-n", "-c", str(args.clients), "-j", "2", "-T", "3600",
                              "-b", "tpcb-like", db], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kills = {"run": 0, "cutover": 0, "window": 0}
    exits: list[int] = []
    started = time.time()
    try:
        # The backfill and reconcile, killed at random, resumed until the gate.
        while True:
            lo, hi = (0.2, 3.0) if kills["run"] < args.kills else (600, 900)  # then let it reach the gate
            code, killed = killed_run(db, ["run", str(plan)], rnd, lo, hi)
            kills["run"] += killed
            exits.append(code)
            if not killed and code == 3 and status(db, name)["step"] == "cutover":
                break
            if not killed and code not in (0, 3):
                raise SystemExit(f"mover run exited {code} ({method})")
        # The cutover, killed within its first second, then resumed by `mover run`.
        while status(db, name)["step"] not in ("rollback_window", "retire"):
            if kills["cutover"] < max(1, args.kills // 3):
                code, killed = killed_run(db, ["cutover", name], rnd, 0.05, 1.0)
                kills["cutover"] += killed
            else:
                code, killed = killed_run(db, ["cutover", name], rnd, 600, 900)
            exits.append(code)
            if killed:
                exits.append(subprocess.run(cli(db, "run", name), capture_output=True, cwd=ROOT).returncode)
        # The rollback window's reverse sync, killed too.
        for _ in range(max(1, args.kills // 3)):
            code, killed = killed_run(db, ["run", name], rnd, 0.1, 1.5)
            kills["window"] += killed
            exits.append(code)
    finally:
        bench.terminate()  # SIGTERM: a SIGINT may be ignored (a background job of a script inherits that)
        bench.communicate(timeout=120)
    sync = subprocess.run(cli(db, "run", name), capture_output=True, text=True, cwd=ROOT)
    st = status(db, name)
    old = st["tables"]["old"].split(".")[-1].strip('"')
    live = tpcb_sums(db, "pgbench_accounts")
    behind = tpcb_sums(db, old)
    lost = {"live_except_old": except_all(db, "pgbench_accounts", old),
            "old_except_live": except_all(db, old, "pgbench_accounts")}
    balanced = all(v == live["history"] for k, v in live.items() if k not in ("rows",)) \
        and behind["accounts"] == live["accounts"] and behind["rows"] == live["rows"]
    return {"method": method, "kills": kills, "exits": exits, "window_sync_exit": sync.returncode,
            "seconds": round(time.time() - started, 1), "state": [st["step"], st["state"]],
            "sums_live": live, "sums_old": behind, **lost,
            "nothing_lost": balanced and not any(lost.values()) and st["step"] == "rollback_window"}


def report(r: dict) -> str:
    rows = [(m["method"], m["kills"]["run"], m["kills"]["cutover"], m["kills"]["window"], m["sums_live"]["rows"],
             m["sums_live"]["accounts"], m["sums_live"]["history"], m["live_except_old"], m["old_except_live"],
             "yes" if m["nothing_lost"] else "NO") for m in r["methods"]]
    return table(rows, ("method", "kills (run)", "kills (cutover)", "kills (window)", "rows", "sum(abalance)",
                        "sum(delta)", "live EXCEPT ALL old", "old EXCEPT ALL live", "nothing lost"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", action="append", choices=("trigger", "logical"))
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--kills", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dsn")
    args = p.parse_args()
    results: dict = {"scale": args.scale, "clients": args.clients, "methods": []}
    logical = {"wal_level": "logical", "max_wal_senders": "10", "max_replication_slots": "10"}
    with server(args.dsn, logical) as (dsn, _), tempfile.TemporaryDirectory() as tmp:
        for method in args.method or ["trigger", "logical"]:
            results["methods"].append(one_method(dsn, Path(tmp), method, args))
            print(json.dumps(results["methods"][-1]), flush=True)
    print(report(results))
    print("saved", save("crash", results))
    if not all(m["nothing_lost"] for m in results["methods"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
