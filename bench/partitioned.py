"""Partitioned sources (issue 37): moving a table that is already range-partitioned, its layout
kept or changed, against the single statement that does the same, side by side in one run on one
server, pgbench writing at a fixed rate throughout:

    .venv/bin/python -m bench.partitioned [--rows 10000000] [--tps 200] [--lock-partitions 12,36,100,365]
                                          [--lock-rows 100000] [--lock-runs 3] [--skip keep|daily|lock] [--dsn DSN]
    .venv/bin/python -m bench.partitioned --rows 200000 --lock-rows 20000 --lock-runs 1   # a smoke run

The source, `events`: bench/common.py's narrow columns with `id integer` (a serial) and the key
(id, created_at), partitioned by range on created_at into 36 monthly partitions (events_pYYYY_MM,
the last one this month's, UTC), its rows spread evenly from the first month's start to now and
increasing with id (an events table); the two secondary indexes (created_at, account_id) on the
parent. Each part below runs on a fresh database with a freshly generated source, so that every
part starts from the same table.

The writers: pgbench at a fixed `--tps` (2 clients, a progress line a second), 60 % updates, 30 %
inserts (created_at now(): this month's partition), 10 % deletes, by random id up to --rows. The
generator makes created_at a function of id, and the writers name it beside the id, so that each
update and delete reaches one partition, as an application that knows its row's key would.

1. **Layout kept** (`[target] columns = { id = "bigint" }`, no `[target.partition]`):
   a. the single statement: `CREATE TABLE new (...) PARTITION BY RANGE (created_at)` with id
      bigint, the key, and the same 36 partitions; `INSERT INTO new SELECT * FROM events`; the
      two index builds on the parent (PostgreSQL builds each partition's and attaches it). Its
      create, copy and index build times; the copy dropped after;
   b. the source vacuumed and checkpointed (not timed), then `mover run PLAN` to the cutover gate
      (exit 3): its wall time, each step's (mover.steps), the rows copied, the governor's
      throttled time (mover.throttle), the peak RSS of the mover process (bench/common.py's
      wrapper);
   c. `mover cutover NAME`, the writers still on: the lock hold (mover.migrations.cutover_lock_ms)
      and where it went (the swap's event, as bench/cutover.py reads it), the changes drained
      under the lock; whether the partitions kept their names across the swap; then `mover retire
      --force` (a zero rollback window).
2. **Monthly to daily** (`[target.partition] by = "range", column = "created_at", interval =
   "1 day", accept_key_change = true`): the same three, the single statement's table partitioned
   by UTC day from the first row's day to 3 days past today (mover's default premake). 36 months
   hold about 1,100 days, more than the 1000 partitions a range layout has by default: the plan
   says `max_partitions = 1200`. `--daily-months` sets this part's monthly partitions (36); part 1
   records what `mover plan check` says of the daily plan over its months.
3. **The lock hold against the partition count**: for each count of `--lock-partitions`,
   `--lock-runs` times, a fresh source of `--lock-rows` rows over that many monthly partitions,
   the writers on, `mover run` to the gate, `mover cutover`, `mover retire --force`.

Goals (issue 37): mover's run to the gate within 1.1x of the single statement, layout kept and
re-partitioned (the backfill step alone is given beside it); the cutover's lock held under 100 ms
with 36 partitions and under 250 ms with 365. A part whose mover command fails is reported with
its command, exit code and error, and the run goes on with the next part. Raw figures:
bench/results/partitioned-<time>.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/partitioned.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from psycopg import sql

from bench.common import bindir, connect, create_database, drop_database, mover_cli, save, server, table, timed
from bench.cutover import PHASES
from bench.scaling import writers_figures

DATABASE = "bench_partitioned"
SOURCE = "events"
MONTHS = 36
PREMAKE_DAYS = 3  # [target.partition] premake's default: the daily single statement makes as many ahead
STEPS = ("create_target", "install_capture", "backfill", "reconcile", "cutover", "rollback_window", "retire")

# The narrow shape of bench/common.py, with id integer and the partition column in the key.
COLUMNS = """
    id {id_type} NOT NULL{default},
    created_at timestamptz NOT NULL,
    account_id integer NOT NULL,
    amount numeric(12,2) NOT NULL,
    status text NOT NULL,
    payload text,
    PRIMARY KEY (id, created_at)"""
INDEXES = (("created", "created_at"), ("account", "account_id"))

PLAN_HEAD = """
[migration]
name = "{name}"
source = "{source}"
"""
KEEP = """
[target]
columns = { id = "bigint" }
"""
DAILY = """
[target.partition]
by = "range"
column = "created_at"
interval = "1 day"
accept_key_change = true
max_partitions = 1200
"""
PLAN_TAIL = """
[rollback]
window = "0s"
"""

# created_at of a generated row is to_timestamp((base + step * id) / 1e6), the same expression
# here and in the generator, so that the writers reach one partition by the key.
WRITES = (
    ("update", 6, "\\set id random(1, :maxid)\n\\set ts :base + :step * :id\n"
                  "UPDATE {t} SET amount = amount + 1\n"
                  "  WHERE id = :id AND created_at = to_timestamp(:ts / 1000000.0);\n"),
    ("insert", 3, "\\set acc random(1, 100000)\nINSERT INTO {t} (created_at, account_id, amount, status, payload)"
                  " VALUES (now(), :acc, 1, 'new', repeat('x', 80));\n"),
    ("delete", 1, "\\set id random(1, :maxid)\n\\set ts :base + :step * :id\n"
                  "DELETE FROM {t} WHERE id = :id AND created_at = to_timestamp(:ts / 1000000.0);\n"),
)


def message(proc: subprocess.CompletedProcess) -> str:
    """What mover printed, the wrapper's RSS line (its last) left out, on one line per paragraph."""
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    if lines and lines[-1].isdigit():
        lines = lines[:-1]
    return "\n".join(lines).strip()[-3000:]


class MoverFailed(Exception):
    """A mover command exited otherwise than the part expects: the part's figures stop there."""

    def __init__(self, command: str, code: int, text: str):
        super().__init__(f"`{command}` exited {code}")
        self.figures = {"command": command, "exit": code, "stderr": text}


def mover(dsn: str, *args: str, codes: tuple[int, ...] = (0,)) -> tuple[float, int]:
    """`mover ARGS` as a process: its wall time and peak RSS (KiB); MoverFailed on another exit."""
    started = time.perf_counter()
    proc, rss = mover_cli(dsn, *args)
    took = time.perf_counter() - started
    if proc.returncode not in codes:
        raise MoverFailed("mover " + " ".join(args), proc.returncode, message(proc))
    return took, rss


# ---------------------------------------------------------------------------------------------
# The source


def month_bounds(conn, table_name: str, months: int) -> list[tuple[str, str, str]]:
    """(partition name, from, to) of `months` UTC months, the last one the current month's."""
    return conn.execute(
        "SELECT %s || to_char(m, '\"_p\"YYYY_MM'), m::text || '+00', (m + interval '1 month')::text || '+00'"
        " FROM generate_series(date_trunc('month', now() AT TIME ZONE 'UTC') - (%s - 1) * interval '1 month',"
        " date_trunc('month', now() AT TIME ZONE 'UTC'), interval '1 month') m",
        (table_name, months)).fetchall()


def day_bounds(conn, table_name: str, source: str) -> list[tuple[str, str, str]]:
    """(partition name, from, to) of every UTC day from the source's first row's to PREMAKE_DAYS
    past today, as mover's daily layout covers them."""
    return conn.execute(sql.SQL(
        "SELECT %s || to_char(d, '\"_p\"YYYY_MM_DD'), d::text || '+00', (d + interval '1 day')::text || '+00'"
        " FROM generate_series((SELECT date_trunc('day', min(created_at) AT TIME ZONE 'UTC') FROM {}),"
        " date_trunc('day', now() AT TIME ZONE 'UTC') + %s * interval '1 day', interval '1 day') d").format(
            sql.Identifier(source)), (table_name, PREMAKE_DAYS)).fetchall()


def create_partitioned(conn, table_name: str, id_type: str, bounds: list[tuple[str, str, str]],
                       serial: bool = False) -> None:
    """`table_name` partitioned by range on created_at with `bounds`, its key, no secondary index."""
    default = f" DEFAULT nextval('{table_name}_id_seq')" if serial else ""
    if serial:
        conn.execute(sql.SQL("CREATE SEQUENCE {} AS integer").format(sql.Identifier(f"{table_name}_id_seq")))
    # The column list is fixed text of this module; the names come in as identifiers.
    conn.execute(sql.SQL("CREATE TABLE {} (" + COLUMNS.format(id_type=id_type, default=default)
                         + ") PARTITION BY RANGE (created_at)").format(sql.Identifier(table_name)))
    if serial:
        conn.execute(sql.SQL("ALTER SEQUENCE {} OWNED BY {}.id").format(
            sql.Identifier(f"{table_name}_id_seq"), sql.Identifier(table_name)))
    for name, lo, hi in bounds:
        # Partition bounds are DDL: no parameters there, literals.
        conn.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
            sql.Identifier(name), sql.Identifier(table_name), sql.Literal(lo), sql.Literal(hi)))


def build_indexes(conn, table_name: str) -> None:
    for suffix, column in INDEXES:
        conn.execute(sql.SQL("CREATE INDEX {} ON {} ({})").format(
            sql.Identifier(f"{table_name}_{suffix}"), sql.Identifier(table_name), sql.Identifier(column)))


def generate(dsn: str, rows: int, months: int) -> dict[str, int]:
    """The source over `months` monthly partitions; returns the writers' pgbench variables: the
    first month's start and the step between two ids' created_at, in microseconds."""
    with connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        bounds = month_bounds(conn, SOURCE, months)
        create_partitioned(conn, SOURCE, "integer", bounds, serial=True)
        base, now = conn.execute("SELECT (extract(epoch FROM %s::timestamptz) * 1000000)::bigint,"
                                 " (extract(epoch FROM now()) * 1000000)::bigint", (bounds[0][1],)).fetchone()
        step = (now - base) // (rows + 1)
        conn.execute(sql.SQL("""
            INSERT INTO {} (id, created_at, account_id, amount, status, payload)
            SELECT g, to_timestamp((%(base)s::bigint + %(step)s::bigint * g) / 1000000.0),
                   (g::bigint * 7919) %% 100000, (g %% 1000000) / 100.0,
                   (ARRAY['new', 'paid', 'shipped', 'refunded'])[1 + g %% 4],
                   md5(g::text) || md5((g + 1)::text) || left(md5((g + 2)::text), 16)
            FROM generate_series(1, %(rows)s) g""").format(sql.Identifier(SOURCE)),
            {"base": base, "step": step, "rows": rows})
        conn.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", (SOURCE, rows))
        build_indexes(conn, SOURCE)
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(SOURCE)))
        conn.execute("CHECKPOINT")
    return {"base": base, "step": step}


def vacuum(dsn: str) -> None:
    """Before mover's run, not timed: the dead rows the single statement's writers left, pruned
    as autovacuum would."""
    with connect(dsn) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(SOURCE)))
        conn.execute("CHECKPOINT")


def partitions(dsn: str, table_name: str) -> list[str]:
    with connect(dsn) as conn:
        return [r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass ORDER BY 1", (table_name,)).fetchall()]


# ---------------------------------------------------------------------------------------------
# The writers


class Writers:
    """pgbench at `tps` on the source, a progress line a second into a file (a pipe left unread
    would fill and stop it), from start to stop; figures() over any window in between."""

    def __init__(self, dsn: str, workdir: Path, rows: int, tps: int, variables: dict[str, int]):
        self.tps, self.log = tps, workdir / "pgbench.log"
        files = []
        for name, weight, script in WRITES:
            f = workdir / f"{name}.sql"
            f.write_text(script.format(t=SOURCE))
            files += ["-f", f"{f}@{weight}"]
        defines = [f"-D{k}={v}" for k, v in {"maxid": rows, **variables}.items()]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(bindir() / "pgbench"), "-n", "-c", "2", "-j", "2", "-T", "86400", "-R", str(tps),
                 "-P", "1", "--progress-timestamp", *defines, *files, dsn],
                stdout=out, stderr=subprocess.STDOUT, text=True)
        time.sleep(2)  # the writers' steady state before a clock starts

    def figures(self, started_at: float, ended_at: float) -> dict[str, Any]:
        out = writers_figures(self.log, started_at, ended_at, self.tps)
        return {k: out[k] for k in ("writers_tps", "writers_lag_ms_median", "writers_lag_ms_max", "writers_output")
                if k in out}

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: a background shell may have pgbench ignore SIGINT
        self.proc.wait(60)
        return self.log.read_text()[-2000:]


@contextmanager
def writing(dsn: str, workdir: Path, rows: int, tps: int, variables: dict[str, int]) -> Iterator[Writers]:
    w = Writers(dsn, workdir, rows, tps, variables)
    try:
        yield w
    finally:
        w.stop()


# ---------------------------------------------------------------------------------------------
# The measurements


def single_statement(dsn: str, layout: str, writers: Writers) -> dict[str, Any]:
    """The bound: the new table (id bigint with the layout kept; the layout daily otherwise) and
    its partitions, one INSERT ... SELECT of the whole source, the two index builds on the parent.
    The copy is dropped at the end."""
    target = f"{SOURCE}_copy"
    out: dict[str, Any] = {}
    started_at = time.time()
    with connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        if layout == "keep":
            bounds = month_bounds(conn, target, len(partitions(dsn, SOURCE)))
            out["create_s"] = timed(lambda: create_partitioned(conn, target, "bigint", bounds))
        else:
            bounds = day_bounds(conn, target, SOURCE)
            out["create_s"] = timed(lambda: create_partitioned(conn, target, "integer", bounds))
        out["partitions"] = len(bounds)
        out["copy_s"] = timed(lambda: conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(
            sql.Identifier(target), sql.Identifier(SOURCE))))
        out["indexes_s"] = timed(lambda: build_indexes(conn, target))
        out["total_s"] = out["create_s"] + out["copy_s"] + out["indexes_s"]
        out.update(writers.figures(started_at, time.time()))
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(target)))
        conn.execute("CHECKPOINT")
    return out


def migration_figures(dsn: str, name: str) -> dict[str, Any]:
    """Each step's time, the rows copied, the governor's throttled time, the lock hold and where
    it went: mover's own records."""
    out: dict[str, Any] = {}
    with connect(dsn) as conn:
        steps = conn.execute("SELECT s.name, extract(epoch FROM s.finished_at - s.started_at)::float8"
                             " FROM mover.steps s JOIN mover.migrations m ON m.id = s.migration_id"
                             " WHERE m.name = %s", (name,)).fetchall()
        out["steps_s"] = {step: sec for step, sec in sorted(steps, key=lambda r: STEPS.index(r[0])
                                                             if r[0] in STEPS else len(STEPS))}
        out["copied_rows"] = int(conn.execute(
            "SELECT coalesce(sum(r.rows), 0) FROM mover.ranges r JOIN mover.migrations m ON m.id = r.migration_id"
            " WHERE m.name = %s AND r.kind = 'backfill'", (name,)).fetchone()[0])
        throttled = conn.execute("SELECT t.throttled_seconds FROM mover.throttle t JOIN mover.migrations m"
                                 " ON m.id = t.migration_id WHERE m.name = %s", (name,)).fetchone()
        out["throttled_s"] = float(throttled[0]) if throttled and throttled[0] is not None else None
        lock = conn.execute("SELECT cutover_lock_ms FROM mover.migrations WHERE name = %s", (name,)).fetchone()
        out["lock_ms"] = lock[0] if lock else None
        row = conn.execute("SELECT (e.detail->>'drained')::int, (e.detail->>'attempt')::int,"
                           " (e.detail->>'statements')::int, (e.detail->>'round_trips')::int,"
                           + ", ".join(f"(e.detail->>'{p}_ms')::float8" for p in PHASES)
                           + " FROM mover.events e JOIN mover.migrations m ON m.id = e.migration_id"
                           " WHERE m.name = %s AND e.detail ? 'lock_ms' AND e.detail ? 'drained'"
                           " ORDER BY e.id DESC LIMIT 1", (name,)).fetchone()
    if row:
        out["drained_under_lock"], out["lock_attempt"] = row[0], row[1]
        # the swap's statements and round trips under the lock: what grows with the partitions
        out["lock_statements"], out["lock_round_trips"] = row[2], row[3]
        out["lock_phases_ms"] = {p: round(v, 1) for p, v in zip(PHASES, row[4:], strict=True) if v is not None}
    return out


def migration_state(dsn: str, name: str) -> str | None:
    with connect(dsn) as conn:
        row = conn.execute("SELECT state FROM mover.migrations WHERE name = %s", (name,)).fetchone()
    return row[0] if row else None


def plan_file(workdir: Path, name: str, layout: str) -> Path:
    plan = workdir / f"{name}.toml"
    plan.write_text(PLAN_HEAD.format(name=name, source=SOURCE) + (KEEP if layout == "keep" else DAILY) + PLAN_TAIL)
    return plan


def daily_check(dsn: str, workdir: Path) -> dict[str, Any]:
    """`mover plan check` of the daily plan on the source as it stands: what mover says of a daily
    layout over the 36 months (more days than a range layout's default 1000 partitions)."""
    proc, _ = mover_cli(dsn, "plan", "check", str(plan_file(workdir, "psrc_daily_check", "daily")))
    return {"command": "mover plan check psrc_daily_check.toml", "exit": proc.returncode, "output": message(proc)}


def migrate(dsn: str, workdir: Path, name: str, layout: str, writers: Writers) -> dict[str, Any]:
    """mover run to the gate, cutover and retire, the writers on; what each took. A failed command
    ends the part: the figures so far and the failure are returned."""
    plan = plan_file(workdir, name, layout)
    before = partitions(dsn, SOURCE)
    out: dict[str, Any] = {"source_partitions": len(before)}
    rss: list[int] = []
    try:
        started_at = time.time()
        out["to_gate_s"], got = mover(dsn, "run", str(plan), codes=(3,))  # 3: waiting at the cutover gate
        rss.append(got)
        out["to_gate_writers"] = writers.figures(started_at, time.time())
        out["rss_to_gate_kib"] = got
        with connect(dsn) as conn:
            out["target_partitions"] = conn.execute(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(%s)", (f"{SOURCE}_new",)).fetchone()[0]
        started_at = time.time()
        out["cutover_s"], got = mover(dsn, "cutover", name)
        rss.append(got)
        out["cutover_writers"] = writers.figures(started_at, time.time())
        after = partitions(dsn, SOURCE)
        out["partitions_after"] = len(after)
        if layout == "keep":
            out["partition_names_kept"] = after == before
        if migration_state(dsn, name) != "done":  # a zero window retires within the cutover already
            out["retire_s"], got = mover(dsn, "retire", name, "--force")
            rss.append(got)
    except MoverFailed as exc:
        out["failed"] = exc.figures
        print(f"  FAILED: {exc.figures['command']} (exit {exc.figures['exit']}):\n{exc.figures['stderr']}", flush=True)
    out["rss_kib"] = max(rss, default=None)
    out.update(migration_figures(dsn, name))
    return out


def part(dsn: str, rows: int, layout: str, tps: int, months: int) -> dict[str, Any]:
    """One layout on a fresh database: the source over `months` monthly partitions, the single
    statement, mover; the writers on from the single statement to mover's retire."""
    db = create_database(dsn, DATABASE)
    from mover import api
    api.init(db)
    out: dict[str, Any] = {"rows": rows, "layout": layout, "months": months}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            out["variables"] = generate(db, rows, months)
            out["generate_s"] = time.perf_counter() - started
            print(f"  generated in {out['generate_s']:.1f} s", flush=True)
            if layout == "keep":
                out["daily_check"] = daily_check(db, Path(tmp))
                print(f"  daily over {months} months, plan check: exit {out['daily_check']['exit']}", flush=True)
            with writing(db, Path(tmp), rows, tps, out["variables"]) as writers:
                out["single_statement"] = single_statement(db, layout, writers)
                print(f"  single statement {out['single_statement']['total_s']:.1f} s", flush=True)
                vacuum(db)
                out["mover"] = migrate(db, Path(tmp), f"psrc_{layout}", layout, writers)
    finally:
        drop_database(dsn, DATABASE)
    return out


def lock_hold(dsn: str, rows: int, counts: list[int], runs: int, tps: int) -> list[dict[str, Any]]:
    """The cutover's lock hold with each count of monthly partitions, `runs` times each, on a
    small source: the hold is catalog work, not rows."""
    out = []
    for count in counts:
        for i in range(runs):
            db = create_database(dsn, DATABASE)
            from mover import api
            api.init(db)
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    variables = generate(db, rows, count)
                    with writing(db, Path(tmp), rows, tps, variables) as writers:
                        got = migrate(db, Path(tmp), f"psrc_lock_{count}_{i}", "keep", writers)
            finally:
                drop_database(dsn, DATABASE)
            run = {"partitions": count, "run": i, **{k: got.get(k) for k in (
                "lock_ms", "drained_under_lock", "lock_attempt", "lock_statements", "lock_round_trips",
                "lock_phases_ms", "cutover_s", "to_gate_s",
                "partition_names_kept", "rss_kib", "failed") if k in got}}
            print(f"  {count} partitions, run {i}: lock held {run.get('lock_ms')} ms"
                  + (f"; FAILED {run['failed']['command']}" if "failed" in run else ""), flush=True)
            out.append(run)
            if "failed" in run:
                return out  # the next counts would fail alike
    return out


# ---------------------------------------------------------------------------------------------
# The report


def ratios(r: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for layout in ("keep", "daily"):
        p = r.get(layout) or {}
        single = (p.get("single_statement") or {}).get("total_s")
        m = p.get("mover") or {}
        gate, backfill = m.get("to_gate_s"), (m.get("steps_s") or {}).get("backfill")
        out[f"{layout}_to_gate_over_single"] = gate / single if gate and single and "failed" not in m else None
        out[f"{layout}_backfill_over_single"] = backfill / single if backfill and single else None
    return out


def lock_summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per partition count: the median and max lock hold, and the median of each of its phases."""
    out = []
    for count in sorted({run["partitions"] for run in runs}):
        held = [run["lock_ms"] for run in runs if run["partitions"] == count and run.get("lock_ms") is not None]
        if not held:
            continue
        phases = {p: statistics.median(ph) for p in PHASES
                  if (ph := [run["lock_phases_ms"][p] for run in runs if run["partitions"] == count
                             and p in (run.get("lock_phases_ms") or {})])}
        statements = [run["lock_statements"] for run in runs if run["partitions"] == count
                      and run.get("lock_statements") is not None]
        out.append({"partitions": count, "runs": len(held), "lock_ms_median": statistics.median(held),
                    "lock_ms_max": max(held), "phases_ms_median": phases,
                    "statements": max(statements) if statements else None})
    return out


def _f(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def report(r: dict[str, Any]) -> str:
    """The summary of one result file (also `python -m bench.report`)."""
    rows = []
    words = {"keep": "layout kept, id int -> bigint", "daily": "monthly -> daily"}
    rat = r.get("ratios") or ratios(r)
    fails = []
    for layout in ("keep", "daily"):
        p = r.get(layout)
        if not p:
            continue
        s, m = p["single_statement"], p.get("mover") or {}
        st = m.get("steps_s") or {}
        rows.append((words[layout], f"{m.get('source_partitions', '-')} -> {m.get('target_partitions', '-')}",
                     f"{s['total_s']:.1f} ({s['create_s']:.1f} + {s['copy_s']:.1f} + {s['indexes_s']:.1f})",
                     _f(m.get("to_gate_s"), ".1f"), _f(rat.get(f"{layout}_to_gate_over_single"), ".2f"),
                     _f(st.get("backfill"), ".1f"), _f(rat.get(f"{layout}_backfill_over_single"), ".2f"),
                     _f(st.get("reconcile"), ".1f"), _f(st.get("cutover"), ".1f"), _f(m.get("lock_ms"), ".1f"),
                     _f((m.get("cutover_writers") or {}).get("writers_lag_ms_max"), ".0f"),
                     _f(m.get("throttled_s"), ".0f"), _f(m["rss_kib"] / 1024 if m.get("rss_kib") else None, ".0f")))
        if "failed" in m:
            fails.append(f"- {words[layout]}: `{m['failed']['command']}` exited {m['failed']['exit']}:\n\n"
                         f"```\n{m['failed']['stderr']}\n```")
    text = (f"{r['rows']:,} rows over {MONTHS} monthly partitions (layout kept) and over "
            f"{r.get('daily_months', MONTHS)} (to daily), pgbench {r['tps']} tps throughout (the single statement's "
            f"too); {r.get('server', '')}\n\n")
    if rows:
        text += table(rows, ("migration", "partitions", "single statement s (create + copy + indexes)",
                             "mover run to gate s", "gate / single", "backfill s", "backfill / single",
                             "reconcile s", "cutover step s", "lock held ms", "writers' worst lag in the cutover ms",
                             "throttled s", "peak RSS MiB"))
        for layout in ("keep", "daily"):
            m = (r.get(layout) or {}).get("mover") or {}
            if m.get("steps_s"):
                text += (f"\n\n{words[layout]}: steps " + ", ".join(f"{k} {v:.1f} s" for k, v in m["steps_s"].items()
                                                                   if v is not None)
                         + f"; {m.get('copied_rows', 0):,} rows copied"
                         + (f"; partition names kept across the swap: {m['partition_names_kept']}"
                            if "partition_names_kept" in m else "")
                         + f"; writers {_f((m.get('to_gate_writers') or {}).get('writers_tps'), '.0f')} tps"
                           " to the gate")
    check = (r.get("keep") or {}).get("daily_check")
    if check:
        said = check["output"] if check["exit"] else "accepted"
        text += f"\n\ndaily over {MONTHS} months, `{check['command']}`: exit {check['exit']}:\n\n```\n{said}\n```"
    locks = lock_summary(r.get("lock") or [])
    if locks:
        text += (f"\n\nlock hold against the partition count ({r.get('lock_rows', 0):,} rows, "
                 f"{r.get('lock_runs', 1)} run(s) each, pgbench {r['tps']} tps):\n\n")
        text += table([(x["partitions"], x["runs"], f"{x['lock_ms_median']:.1f}", f"{x['lock_ms_max']:.1f}",
                        _f(x.get("statements"), ","),
                        ", ".join(f"{p} {v:.1f}" for p, v in x["phases_ms_median"].items()))
                       for x in locks], ("partitions", "runs", "lock held ms, median", "max",
                                         "statements under the lock", "phases ms, median"))
        text += "\n"
    for x in locks:
        goal = {36: 100, 365: 250}.get(x["partitions"])
        if goal:
            text += f"\nlock held with {x['partitions']} partitions: max {x['lock_ms_max']:.1f} ms (goal < {goal})"
    for layout in ("keep", "daily"):
        if rat.get(f"{layout}_to_gate_over_single") is not None:
            text += f"\n{words[layout]}: run to gate / single statement {rat[f'{layout}_to_gate_over_single']:.2f}" \
                    " (goal <= 1.1)"
    lock_fail = [run for run in r.get("lock") or [] if "failed" in run]
    for run in lock_fail:
        fails.append(f"- lock hold, {run['partitions']} partitions: `{run['failed']['command']}` exited "
                     f"{run['failed']['exit']}:\n\n```\n{run['failed']['stderr']}\n```")
    if fails:
        text += "\n\nfailures:\n" + "\n".join(fails)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--tps", type=int, default=200, help="pgbench's fixed write rate throughout")
    ap.add_argument("--daily-months", type=int, default=MONTHS,
                    help="the monthly partitions of the daily part's source (its plan allows 1200 daily ones)")
    ap.add_argument("--lock-partitions", default="12,36,100,365",
                    help="the partition counts of the lock-hold part, comma-separated")
    ap.add_argument("--lock-rows", type=int, default=100_000)
    ap.add_argument("--lock-runs", type=int, default=3)
    ap.add_argument("--skip", action="append", default=[], choices=["keep", "daily", "lock"])
    ap.add_argument("--dsn", help="an existing server (superuser); default: start one")
    args = ap.parse_args()
    counts = [int(c) for c in args.lock_partitions.split(",") if c]
    results: dict[str, Any] = {"rows": args.rows, "months": MONTHS, "tps": args.tps, "lock_rows": args.lock_rows,
                               "lock_runs": args.lock_runs, "daily_months": args.daily_months}
    with server(args.dsn) as (dsn, _):
        with connect(dsn) as conn:
            results["server"] = conn.execute("SELECT version()").fetchone()[0]
        for layout in ("keep", "daily"):
            if layout not in args.skip:
                print(f"{layout}: {args.rows:,} rows ...", flush=True)
                results[layout] = part(dsn, args.rows, layout, args.tps,
                                       MONTHS if layout == "keep" else args.daily_months)
                print({k: v for k, v in results[layout]["mover"].items() if k != "lock_phases_ms"}, flush=True)
        if "lock" not in args.skip:
            print(f"lock hold: {counts} partitions, {args.lock_rows:,} rows ...", flush=True)
            results["lock"] = lock_hold(dsn, args.lock_rows, counts, args.lock_runs, args.tps)
    results["ratios"] = ratios(results)
    path = save("partitioned", results)
    print(report(results))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
