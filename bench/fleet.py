"""Fleets (issue 38): one plan over many small databases, on one server and over three.

    .venv/bin/python -m bench.fleet [--members 100] [--rows 200] [--servers 1,3] [--concurrency 1,4,8]

For each layout (all members on one server; the same number spread round-robin over three servers,
all on this machine), on fresh databases each time (cloned from one template that holds mover's
control schema and a table of `--rows` rows):
1. by hand: each member one after the other, as an operator's script would call mover (the api, in
   this process: no interpreter start counted): register, run to the gate, cutover, retire --force;
2. the fleet (mover/fleet/rollout.py, in this process): `fleet run`, `fleet cutover`, `fleet retire
   --force`, with concurrency 1 (the fleet's own overhead per member: (fleet - by hand) / members),
   then each other `--concurrency` (per_server = concurrency: the servers' cores are the bound).
Reported: seconds for each, per member, and the speed-up over concurrency 1; where it stops scaling
is where the speed-up flattens (this machine has 2 cores). Servers: EmbeddedPostgres(fast=True).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/fleet.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import logging
import os
import tempfile
import time

from psycopg import sql

from bench.common import connect, save, table
from mover import api
from mover.demo.embedded import EmbeddedPostgres
from mover.errors import FleetHeld, Waiting
from mover.fleet import rollout
from mover.fleet.file import load_fleet
from tests.conftest import dsn_with_dbname

PLAN = """[migration]
name = "items_bigint"
source = "public.items"

[target]
columns = { id = "bigint" }

[throttle]
max_latency_increase = "off"

[rollback]
window = "1h"
"""
TEMPLATE = "fleet_template"


def prepare_template(dsn: str, rows: int) -> None:
    with connect(dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    db = dsn_with_dbname(dsn, TEMPLATE)
    api.init(db)
    with connect(db) as conn:
        conn.execute("CREATE TABLE items (id serial PRIMARY KEY, v text NOT NULL, at timestamptz DEFAULT now())")
        conn.execute("INSERT INTO items (v) SELECT md5(g::text) FROM generate_series(1, %s) g", (rows,))
        conn.execute("ANALYZE items")
    with connect(dsn) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                     " AND pid <> pg_backend_pid()", (TEMPLATE,))


def fresh_members(servers: list[str], members: int) -> list[tuple[str, str]]:
    """`members` databases cloned from the template, round-robin over the servers: (name, dsn)."""
    out = []
    for i in range(members):
        server = servers[i % len(servers)]
        name = f"m{i:03d}"
        with connect(server) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                           sql.Identifier(TEMPLATE)))
        out.append((name, dsn_with_dbname(server, name)))
    return out


def by_hand(members: list[tuple[str, str]], plan_path: Path) -> float:
    from mover.plan import load_plan
    plan = load_plan(plan_path)
    started = time.perf_counter()
    for _, dsn in members:
        api.register_plan(dsn, plan)
        try:
            api.run(dsn, plan.name)
        except Waiting:
            pass
        api.cutover_now(dsn, plan.name)
        api.retire(dsn, plan.name, force=True)
    return time.perf_counter() - started


def fleet(members: list[tuple[str, str]], work: Path, concurrency: int) -> float:
    path = work / f"fleet-{concurrency}.toml"
    lines = ["[fleet]", f'name = "bench-{concurrency}-{time.monotonic_ns()}"', 'plan = "plan.toml"', ""]
    for name, dsn in members:
        lines += ["[[members]]", f'name = "{name}"', f'dsn = "{dsn}"', ""]
    lines += ["[rollout]", f"canary = [\"{members[0][0]}\"]", f"wave_size = {max(len(members) // 4, 1)}",
              f"concurrency = {concurrency}", f"per_server = {concurrency}"]
    path.write_text("\n".join(lines) + "\n")
    f = load_fleet(path)
    started = time.perf_counter()
    try:
        rollout.run(f)
    except FleetHeld:
        pass
    rollout.cutover(f)
    result = rollout.retire(f, force=True)
    elapsed = time.perf_counter() - started
    assert result["states"] == {"retired": len(members)}, result
    return elapsed


def report(r: dict) -> str:
    """The table of a result file: each layout, by hand and the fleet at each concurrency."""
    members = r["members"]
    rows = []
    for n, layout in r["layouts"].items():
        hand = layout["by_hand_s"]
        rows.append((n, "by hand", "-", f"{hand:.1f}", f"{hand / members:.3f}", "-"))
        levels = sorted(int(k[len("fleet_c"):-2]) for k in layout if k.startswith("fleet_c"))
        base = layout[f"fleet_c{levels[0]}_s"]
        for c in levels:
            took = layout[f"fleet_c{c}_s"]
            note = f"{base / took:.2f}x"
            if c == 1:
                note += f" (fleet overhead {layout['overhead_per_member_s'] * 1000:+.0f} ms/member)"
            rows.append((n, "fleet", c, f"{took:.1f}", f"{took / members:.3f}", note))
    return (f"{members} databases of {r['rows']} rows, {r['cpus']} cores: register, run to the gate, cutover, "
            f"retire --force\n\n" + table(rows, ("servers", "how", "concurrency", "seconds", "s/member",
                                                 "speed-up over the fleet at c=1")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=100)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--servers", default="1,3")
    ap.add_argument("--concurrency", default="1,4,8")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    layouts = [int(x) for x in args.servers.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")]
    results: dict = {"members": args.members, "rows": args.rows, "cpus": os.cpu_count(), "layouts": {}}
    rows_out = []
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    (work / "plan.toml").write_text(PLAN)
    pgs = [EmbeddedPostgres(fast=True, settings={"max_connections": "300"}) for _ in range(max(layouts))]
    try:
        dsns = [pg.start() for pg in pgs]
        for dsn in dsns:
            prepare_template(dsn, args.rows)
        for n in layouts:
            servers = dsns[:n]
            layout: dict = {}
            hand = by_hand(fresh_members(servers, args.members), work / "plan.toml")
            layout["by_hand_s"] = round(hand, 2)
            rows_out.append((n, "by hand", "-", f"{hand:.1f}", f"{hand / args.members:.3f}", "-"))
            print(f"{n} server(s), by hand: {hand:.1f} s", flush=True)
            base = None
            for c in levels:
                took = fleet(fresh_members(servers, args.members), work, c)
                base = base or took
                layout[f"fleet_c{c}_s"] = round(took, 2)
                overhead = (took - hand) / args.members if c == 1 else None
                if overhead is not None:
                    layout["overhead_per_member_s"] = round(overhead, 4)
                rows_out.append((n, "fleet", c, f"{took:.1f}", f"{took / args.members:.3f}",
                                 f"{base / took:.2f}x" + (f" (overhead {overhead * 1000:+.0f} ms/member)"
                                                           if overhead is not None else "")))
                print(f"{n} server(s), fleet, concurrency {c}: {took:.1f} s", flush=True)
            results["layouts"][str(n)] = layout
    finally:
        for pg in pgs:
            pg.stop()
    print(table(rows_out, ("servers", "how", "concurrency", "seconds", "s/member", "speed-up over c=1")))
    print(f"saved {save('fleet', results)}")


if __name__ == "__main__":
    main()
