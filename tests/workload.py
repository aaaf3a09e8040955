"""Test helpers: the CLI (in this process or as a subprocess), a plan builder, a hostile
concurrent writer with its mirror, independent comparisons."""

from __future__ import annotations

import io
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from mover import threads

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# The CLI
#
# `mover(dsn, *args)` runs the command line's own entry point (mover.cli.main) in this process:
# the same argv normalisation, cli -> api path, error-to-exit-code map and printed text as
# `python -m mover`, without an interpreter start and the imports per call (0.5-1 s each).
# A real process is used where the process itself is under test or differs: with `env=` (fault
# points kill or stop the process; PG*, locale and console-width variables are read at start),
# from any thread but the main one (signal handlers and sys.stdout are process-wide), or when
# asked with `process=True` (exit codes and streams of a real process, terminals, signals).


# MOVER_TEST_PROCESS=1: every call a subprocess, as before the in-process runner (to tell whether
# a failure has to do with it).
_ALWAYS_PROCESS = os.environ.get("MOVER_TEST_PROCESS") == "1"


def mover(dsn: str, *args: str, env: dict | None = None, timeout: float = 300,
          process: bool | None = None) -> subprocess.CompletedProcess:
    """Run the CLI as a user would; returns the completed process (never raises on exit code).
    In this process unless `env`, a thread other than the main one, or `process=True` ask for a
    real one (see above); `timeout` holds either way (in this process it is checked at the end)."""
    if process is None:
        process = bool(env) or threading.current_thread() is not threading.main_thread() or _ALWAYS_PROCESS
    if not process:
        if env:
            raise TypeError("mover(..., env=...) runs a process: the variables are read at its start "
                            "(MOVER_FAULT, PG*, COLUMNS); drop process=False")
        return _in_process(dsn, args, timeout)
    return mover_process(dsn, *args, env=env, timeout=timeout)


def mover_process(dsn: str, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m mover --dsn DSN ARGS` as a subprocess (MOVER_FAULT only when `env` sets it)."""
    full_env = {**os.environ, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1", **(env or {})}
    if not (env and "MOVER_FAULT" in env):
        full_env.pop("MOVER_FAULT", None)
    return subprocess.run([sys.executable, "-m", "mover", "--dsn", dsn, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def _in_process(dsn: str, args: tuple[str, ...], timeout: float) -> subprocess.CompletedProcess:
    """mover.cli.main() with argv, stdin, stdout, stderr, a console width and a working directory
    of its own, as a new process would have them. What the command sets for the whole process
    (signal handlers, logging, the remembered passwords, typer's excepthook) main() puts back
    itself (tests/unit/test_cli_calls.py). Its threads must have ended when it returns."""
    from mover import cli, faults

    # A fault point in this process would kill or stop the test run itself.
    assert not faults._SPEC, f"MOVER_FAULT={faults._SPEC!r} is set in the test process"
    argv = ["mover", "--dsn", dsn, *args]
    out, err = io.BytesIO(), io.BytesIO()
    before = set(threading.enumerate())
    saved = dict(argv=sys.argv, stdin=sys.stdin, stdout=sys.stdout, stderr=sys.stderr,
                 columns=os.environ.get("COLUMNS"), cwd=os.getcwd())
    started = time.monotonic()
    try:
        os.environ["COLUMNS"] = "200"  # what mover_process gives its consoles
        os.chdir(ROOT)
        sys.argv = argv
        sys.stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
        sys.stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:  # sys.exit("text"): the interpreter prints it and exits 1
                print(exc.code, file=sys.stderr)
                code = 1
        except Exception:  # uncaught: the interpreter prints the traceback and exits 1
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        # As subprocess.run(text=True) reads a pipe: universal newlines.
        stdout, stderr = (b.getvalue().decode().replace("\r\n", "\n").replace("\r", "\n") for b in (out, err))
    finally:
        sys.argv, sys.stdin = saved["argv"], saved["stdin"]
        sys.stdout, sys.stderr = saved["stdout"], saved["stderr"]
        if saved["columns"] is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved["columns"]
        os.chdir(saved["cwd"])
    _threads_ended(before, argv)
    if time.monotonic() - started > timeout:
        raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def _threads_ended(before: set[threading.Thread], argv: list[str]) -> None:
    """A command's threads (heartbeat, workers, applier, a progress bar's refresh) end before it
    returns; one left running would write into the next test. The signal relay is the process's."""
    left = [t for t in threading.enumerate() if t not in before and t.name != threads.RELAY_THREAD]
    deadline = time.monotonic() + 30
    for t in left:
        t.join(max(deadline - time.monotonic(), 0.01))
    alive = [t.name for t in left if t.is_alive()]
    assert not alive, f"`{' '.join(argv[3:])}` returned with threads still running: {alive}"


def spawn(dsn: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "mover", "--dsn", dsn, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env, cwd=ROOT)


def hung_at(proc: subprocess.Popen, point: str) -> bool:
    """Whether a mover spawned with MOVER_FAULT=hang@POINT reached it: its stderr lines up to the
    fault's own (progress lines may come before it); False if the process ended first."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if f"hanging at {point}" in line:
            return True
    return False


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Wait for a spawned mover while draining its pipes (a full pipe would block it forever);
    returns (exit code, stderr)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # A hang: SIGABRT makes faulthandler (PYTHONFAULTHANDLER, set by spawn) print every thread's stack.
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"mover did not end within {timeout} s; its threads then:\n{err[-6000:]}") from None
    return proc.returncode, err


def cutover_with_change_before_lock(dsn: str, name: str, tmp_path: Path, *statements: str) -> tuple[int, str]:
    """`mover cutover NAME`, with `statements` run while it waits at the last point before the
    lock (after it read the catalog and built the swap); returns (exit code, stderr)."""
    release = tmp_path / "release"
    proc = spawn(dsn, "cutover", name,
                 env={"MOVER_FAULT": "hang@swap:before_lock", "MOVER_FAULT_RELEASE": str(release)})
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "hanging at swap:before_lock" in line:
            break
    else:
        raise AssertionError(f"cutover never reached the lock: {''.join(seen)}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)
    release.touch()
    return finish(proc, 120)


class Spawned:
    """A mover process whose stderr is read line by line as it comes (to kill it at a moment it
    announces), and kept in `err`. With `stdout=True`, what it prints on stdout too (one stream,
    as a terminal shows both)."""

    def __init__(self, dsn, *args, env, stdout: bool = False):
        full_env = {**os.environ, "COLUMNS": "200", **env}
        self.proc = subprocess.Popen([sys.executable, "-m", "mover", "--dsn", dsn, *args],
                                     stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT if stdout else subprocess.PIPE, text=True,
                                     env=full_env, cwd=ROOT)
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr or self.proc.stdout:
            self.err.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text, timeout=120) -> bool:
        """True once a stderr line contains text; False if the process ended first."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            if line is None:
                return False
            if text in line:
                return True

    def wait(self, timeout: float) -> int:
        """The exit code, once the process ended and `err` holds all it wrote."""
        code = self.proc.wait(timeout)
        self.reader.join(timeout)
        return code

    def kill(self) -> bool:
        """SIGKILL; True if the process was still running (the kill landed)."""
        alive = self.proc.poll() is None
        self.proc.kill()
        self.proc.wait(60)
        return alive


# ---------------------------------------------------------------------------------------------
# Plans

ORDERS = 'public."Orders"'  # the source of create_orders, as a plan names it


def plan_text(name: str, source: str = ORDERS, *, columns: dict | None = None, window: str | None = "1h",
              **sections: dict) -> str:
    """A plan as TOML text: [migration] name and source, [target] columns, [rollback] window
    ("1h" unless given; None leaves it out), and each other keyword a section of that name:
    `backfill={"range_rows": 500}`, `target={"accept_lossy": ["code"]}`, `migration=`, `rollback=`
    and `hooks=` merge with what the arguments above put there. Values are written as TOML: a
    dict is an inline table, the same to the parser as a [section.sub] table
    (`target={"partition": {"by": "hash", ...}}`, `hooks={"before_rollback": {...}}`)."""
    doc: dict[str, dict] = {"migration": {"name": name, "source": source}}
    if columns is not None:
        doc["target"] = {"columns": columns}
    for section, values in sections.items():
        doc[section] = {**doc.get(section, {}), **values}
    if window is not None:
        doc["rollback"] = {"window": window, **doc.get("rollback", {})}
    return "".join(f"[{section}]\n" + "".join(f"{_toml_key(k)} = {toml_value(v)}\n" for k, v in values.items())
                   + "\n" for section, values in doc.items())


def plan_file(where: Path, name: str, source: str = ORDERS, **kwargs) -> str:
    """plan_text(...) written to `where` (a .toml path, or a directory: NAME.toml in it); the path."""
    path = where if where.suffix == ".toml" else where / f"{name}.toml"
    return write_plan(path, plan_text(name, source, **kwargs))


def toml_value(value) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):  # a basic string: JSON's escapes are TOML's (DEL must be escaped too)
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"no TOML for {value!r}")


def _toml_key(key: str) -> str:
    return key if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key) else toml_value(key)


def write_plan(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


ORDERS_DDL = """
CREATE TABLE "Orders" (
    id serial PRIMARY KEY,
    "Account" integer NOT NULL,
    amount numeric(12,2),
    status text,
    payload jsonb,
    note text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX "Orders by account" ON "Orders" ("Account", created_at);
"""


def create_orders(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ORDERS_DDL)
        conn.execute(
            """INSERT INTO "Orders" ("Account", amount, status, payload, note)
               SELECT g %% 1000, (g %% 100000) / 100.0, (ARRAY['new','paid','shipped'])[1 + g %% 3],
                      jsonb_build_object('g', g), CASE WHEN g %% 7 = 0 THEN NULL ELSE md5(g::text) END
               FROM generate_series(1, %s) g""",
            (rows,),
        )
        conn.execute('ANALYZE "Orders"')
        create_mirror(conn)


MIRROR = "Orders_mirror"


def create_mirror(conn: psycopg.Connection, table: str = "Orders", mirror: str = MIRROR) -> None:
    """The oracle: a plain copy of `table` that the application (Writer, app_execute) keeps in step
    in its own transactions. Not migrated, not touched by mover, no trigger: what every committed
    write should have produced. id is bigint so that values past the int range fit too."""
    t, m = sql.Identifier(table), sql.Identifier(mirror)
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {})").format(m, t))
    conn.execute(sql.SQL("ALTER TABLE {} ALTER id TYPE bigint, ADD PRIMARY KEY (id)").format(m))
    conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(m, t))
    # Whichever role the test's application writes as (tests of privileges use a plain one).
    conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO PUBLIC").format(m))


ORDERS_COLUMNS = ('id', 'Account', 'amount', 'status', 'payload', 'note', 'created_at')
_COLS = sql.SQL(", ").join(sql.Identifier(c) for c in ORDERS_COLUMNS)
_W_COLS = sql.SQL(", ").join(sql.Identifier("w", c) for c in ORDERS_COLUMNS)


def _mirrored(statement: sql.Composable, mirror: str, *, old_key: bool = False) -> sql.Composed:
    """The application's statement (ending in RETURNING all of ORDERS_COLUMNS) and its effect on
    the mirror, one statement: both commit or neither."""
    m = sql.Identifier(mirror)
    if old_key:  # an UPDATE of the row whose id was %(k)s (the key may change)
        tail = sql.SQL("UPDATE {m} SET ({c}) = ROW({wc}) FROM w WHERE {m}.id = %(k)s").format(m=m, c=_COLS, wc=_W_COLS)
    else:
        tail = sql.SQL("INSERT INTO {m} ({c}) SELECT {wc} FROM w").format(m=m, c=_COLS, wc=_W_COLS)
    return sql.SQL("WITH w AS ({}) {}").format(statement, tail)


def _mirrored_delete(statement: sql.Composable, mirror: str) -> sql.Composed:
    return sql.SQL("WITH w AS ({}), md AS (DELETE FROM {m} USING w WHERE {m}.id = w.id) SELECT * FROM w").format(
        statement, m=sql.Identifier(mirror))


def app_execute(conn: psycopg.Connection, statement: sql.Composable, params=None, *, table: str = "Orders",
                mirror: str = MIRROR) -> None:
    """A test's own application write to `table` (`{t}` in `statement`; no key changes), mirrored in
    the same transaction: the rows it touched are copied to the mirror as the application left
    them (the live table by that name is written by the application only)."""
    t, m = sql.Identifier(table), sql.Identifier(mirror)
    statement = sql.SQL(statement) if isinstance(statement, str) else statement
    with conn.transaction():
        cur = conn.execute(sql.SQL("{} RETURNING id").format(statement.format(t=t)), params)
        keys = [r[0] for r in cur.fetchall()]
        # The mirror rows are changed IN PLACE (an upsert; a delete only of the rows gone), never
        # deleted and inserted again: a Writer's statement on one of these rows that took its
        # snapshot before this commit and waited for the row's lock follows the mirror row's
        # update chain to this version, as it follows the table's; a new row it cannot see, and a
        # deleted one it skips, would lose its own mirror write (a row it deleted kept in the
        # mirror: the "lost row" of tests/integration/test_workload_oracle.py).
        conn.execute(sql.SQL("DELETE FROM {m} WHERE id = ANY(%s)"
                             " AND NOT EXISTS (SELECT 1 FROM {t} WHERE {t}.id = {m}.id)").format(m=m, t=t), (keys,))
        conn.execute(sql.SQL("INSERT INTO {m} ({c}) SELECT {c} FROM {t} WHERE id = ANY(%s)"
                             " ON CONFLICT (id) DO UPDATE SET ({c}) = ROW({x})").format(
            m=m, c=_COLS, t=t, x=sql.SQL(", ").join(sql.Identifier("excluded", c) for c in ORDERS_COLUMNS)), (keys,))


class WriterThread:
    """Start, pause, resume and halt of a background application writer: the class provides
    `_loop` (run in the thread) and the events `stop`, `paused` and `idle`. AppWriter below is
    the one to build on; this stays for writers that need a loop of their own."""

    stop: threading.Event
    paused: threading.Event
    idle: threading.Event
    thread: threading.Thread

    def _loop(self) -> None:
        raise NotImplementedError

    def start(self):
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def pause(self) -> None:
        """Stop writing (returns once the writer is idle between operations)."""
        self.paused.set()
        assert self.idle.wait(30), "writer did not pause"

    def resume(self) -> None:
        self.paused.clear()

    def halt(self) -> None:
        self.stop.set()
        if hasattr(self, "thread"):  # a test's cleanup may halt a writer it never started
            self.thread.join(30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.halt()


@dataclass(eq=False, kw_only=True)
class AppWriter(WriterThread):
    """An application on its own connection: `write(conn, rnd)` is one of its operations (a
    statement, or a transaction of several), repeated until halt() with `delay` seconds between
    them; pause() returns once it is idle between two. Subclass it and define `write`, or pass
    `each=` (a function of the same arguments). Whatever an operation raises is recorded in
    `errors` (mover must never make the application fail): a database error as its class and
    text, after which a broken connection is opened again (the crash tests restart the server);
    any other exception ends the writer. Only the classes in `tolerate` are the application's
    own business (a unique violation of its own making) and not recorded. `ops` counts the
    operations done; wait_for_ops(n) returns once there were n."""

    dsn: str = field(kw_only=False)
    seed: int = 1
    delay: float = 0.0  # seconds between operations (a rate: keys that must settle at times, a shared machine)
    each: Callable[[psycopg.Connection, random.Random], object] | None = None
    tolerate: tuple[type[BaseException], ...] = ()
    # None: no server-side prepared statements. A statement prepared before the swap whose
    # result type changes (int -> bigint) fails once with 0A000 "cached plan must not change
    # result type": PostgreSQL's behaviour for any type change, documented in docs/operating.md.
    prepare_threshold: int | None = None
    ops: int = 0
    errors: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    paused: threading.Event = field(default_factory=threading.Event)
    idle: threading.Event = field(default_factory=threading.Event)
    done: threading.Condition = field(default_factory=threading.Condition)

    def write(self, conn: psycopg.Connection, rnd: random.Random) -> object:
        if self.each is None:
            raise NotImplementedError("define write() or pass each=")
        return self.each(conn, rnd)

    def connected(self, conn: psycopg.Connection) -> None:
        """Called once the connection is open, before the first operation."""

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True, prepare_threshold=self.prepare_threshold)

    def wait_for_ops(self, n: int, timeout: float = 60) -> None:
        """Returns once the writer has done n operations in all."""
        with self.done:
            assert self.done.wait_for(lambda: self.ops >= n, timeout), f"writer stuck at {self.ops} operations"

    def _loop(self) -> None:
        rnd = random.Random(self.seed)
        conn = self.connect()
        try:
            self.connected(conn)
            while not self.stop.is_set():
                if self.paused.is_set():
                    self.idle.set()
                    self.stop.wait(0.01)
                    continue
                self.idle.clear()
                try:
                    self.write(conn, rnd)
                    with self.done:
                        self.ops += 1
                        self.done.notify_all()
                except self.tolerate:
                    pass
                except psycopg.Error as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    if conn.broken:
                        conn = self._reconnect()
                if self.delay:
                    self.stop.wait(self.delay)
        except Exception as exc:  # a bug in the writer, or a server that never came back: the test sees it
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()
            self.idle.set()

    def _reconnect(self) -> psycopg.Connection:
        """After a server restart (only the crash tests do that): wait for it to come back."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return self.connect()
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                self.stop.wait(0.1)


@dataclass(eq=False, kw_only=True)
class Writer(AppWriter):
    """The application of "Orders" (create_orders): inserts, updates, deletes, key changes, and
    delete-then-reinsert of one key in one transaction, against the table by name (it follows
    the swap), each statement with its mirror write (the oracle, create_mirror) in one statement.
    `hot=(lo, hi)`: only updates, only of keys in that id range."""

    table: str = field(default="Orders", kw_only=False)  # Writer(dsn, table), as before AppWriter
    mirror: str | None = None  # the oracle table (create_mirror); default "<table>_mirror", if it exists
    hot: tuple | None = None

    def connected(self, conn: psycopg.Connection) -> None:
        self.mirror = self.mirror or f"{self.table}_mirror"
        self._mirror_on = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{self.mirror}"',)).fetchone()[0]

    def write(self, conn: psycopg.Connection, rnd: random.Random) -> None:
        t = sql.Identifier(self.table)
        op = rnd.random()
        (max_id,) = conn.execute(sql.SQL("SELECT coalesce(max(id), 1) FROM {}").format(t)).fetchone()
        k = rnd.randint(1, max_id) if self.hot is None else rnd.randint(*self.hot)
        if self.hot is not None:
            op = 0.3 + 0.3 * rnd.random()  # updates only, and only of the hot keys
        ret = sql.SQL(" RETURNING {}").format(_COLS)
        if op < 0.3:
            stmt = sql.SQL("INSERT INTO {} (\"Account\", amount, status, payload, note) VALUES "
                           "(%(a)s, %(m)s, 'new', %(p)s, 'w')").format(t) + ret
            params = {"a": rnd.randint(0, 999), "m": rnd.randint(0, 10**6) / 100, "p": '{"w": 1}'}
            self._run(conn, stmt, params)
        elif op < 0.6:
            stmt = sql.SQL("UPDATE {} SET amount = amount + 1, status = 'paid', note = NULL,"
                           " payload = payload || %(p)s::jsonb WHERE id = %(k)s").format(t) + ret
            self._run(conn, stmt, {"p": '{"u": 1}', "k": k}, old_key=True)
        elif op < 0.75:
            self._run(conn, sql.SQL("DELETE FROM {} WHERE id = %(k)s RETURNING id").format(t), {"k": k}, delete=True)
        elif op < 0.85:
            # The key changes: the old key disappears and a new one appears.
            stmt = sql.SQL("UPDATE {} SET id = nextval(pg_get_serial_sequence(%(t)s, 'id'))"
                           " WHERE id = %(k)s").format(t) + ret
            self._run(conn, stmt, {"t": f'"{self.table}"', "k": k}, old_key=True)
        else:
            with conn.transaction():
                row = self._run(conn, sql.SQL("DELETE FROM {} WHERE id = %(k)s RETURNING id, \"Account\"")
                                .format(t), {"k": k}, delete=True)
                if row:
                    stmt = sql.SQL("INSERT INTO {} (id, \"Account\", amount, status, note)"
                                   " VALUES (%(k)s, %(a)s, 0, 'reinserted', 'r')").format(t) + ret
                    self._run(conn, stmt, {"k": k, "a": row[1]})

    def _run(self, conn, stmt: sql.Composable, params: dict, *, old_key: bool = False, delete: bool = False):
        """One application statement, with its mirror write in the same statement when there is a mirror."""
        if self._mirror_on:
            stmt = _mirrored_delete(stmt, self.mirror) if delete else _mirrored(stmt, self.mirror, old_key=old_key)
        cur = conn.execute(stmt, params)
        return cur.fetchone() if cur.description else None


def differences(dsn: str, a: str, b: str, columns=ORDERS_COLUMNS) -> tuple[int, int]:
    """Rows in a but not b, and in b but not a: an independent EXCEPT query, both ways."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        q = "SELECT count(*) FROM (SELECT {c} FROM {x} EXCEPT ALL SELECT {c} FROM {y}) d"
        ab = conn.execute(sql.SQL(q).format(c=cols, x=sql.Identifier(a), y=sql.Identifier(b))).fetchone()[0]
        ba = conn.execute(sql.SQL(q).format(c=cols, x=sql.Identifier(b), y=sql.Identifier(a))).fetchone()[0]
    return ab, ba


def mismatches(dsn: str, a: str, b: str, columns=ORDERS_COLUMNS, key: tuple[str, ...] = ("id",)) -> dict:
    """Independent plain-SQL comparison, per column, in one snapshot: for each column (and '*' for
    whole rows), the (key, column) pairs only in a and only in b (EXCEPT ALL both ways), with a
    few keys as examples. Empty when the tables hold the same rows."""
    ta, tb = sql.Identifier(a), sql.Identifier(b)
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    q = sql.SQL("SELECT count(*), (array_agg(row_to_json(d)::text))[1:3] FROM"
                " (SELECT {c} FROM {x} EXCEPT ALL SELECT {c} FROM {y}) d")
    found = {}
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for col in ("*", *(c for c in columns if c not in key)):
            cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns) if col == "*" else \
                sql.SQL("{}, {}").format(keys, sql.Identifier(col))
            ab, ab_ex = conn.execute(q.format(c=cols, x=ta, y=tb)).fetchone()
            ba, ba_ex = conn.execute(q.format(c=cols, x=tb, y=ta)).fetchone()
            if ab or ba:
                found[col] = {f"only in {a}": ab, f"only in {b}": ba, "e.g.": (ab_ex or []) + (ba_ex or [])}
    return found


def assert_oracle(dsn: str, *tables: str, mirror: str = MIRROR, columns=ORDERS_COLUMNS) -> None:
    """Each table holds exactly what the application committed (the mirror), column by column."""
    assert tables
    for table in tables:
        diff = mismatches(dsn, table, mirror, columns)
        assert diff == {}, f"{table} differs from what the application committed ({mirror}): {diff}"


def count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()[0]


def catalog_snapshot(dsn: str) -> dict:
    """Everything in the user's schemas that a migration could touch."""
    snap: dict = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        snap["relations"] = conn.execute(
            "SELECT n.nspname, c.relname, c.relkind, c.reltuples >= 0 FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
            " AND n.nspname NOT LIKE 'pg_temp%%' AND n.nspname <> 'mover' ORDER BY 1, 2").fetchall()
        snap["mover_objects"] = conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'mover'::regnamespace"
            " AND c.relname ~ '^m[0-9]' ORDER BY 1").fetchall()
        snap["columns"] = conn.execute(
            "SELECT attrelid::regclass::text, attname, format_type(atttypid, atttypmod), attnotnull"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " WHERE c.relnamespace = 'public'::regnamespace AND attnum > 0 AND NOT attisdropped"
            " ORDER BY 1, 2").fetchall()
        snap["triggers"] = conn.execute("SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal"
                                        " ORDER BY 1, 2").fetchall()
        snap["functions"] = conn.execute(
            "SELECT n.nspname, p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2").fetchall()
        snap["indexes"] = conn.execute("SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index"
                                       " WHERE indrelid::regclass::text NOT LIKE 'pg_%%' AND"
                                       " indrelid::regclass::text NOT LIKE 'mover.%%' ORDER BY 1").fetchall()
        snap["sequences"] = conn.execute(
            "SELECT d.objid::regclass::text, d.refobjid::regclass::text, d.deptype FROM pg_depend d JOIN pg_class c"
            " ON c.oid = d.objid AND c.relkind = 'S' WHERE d.refclassid = 'pg_class'::regclass ORDER BY 1").fetchall()
    # The oracle tables (create_mirror) belong to the tests, not to the application's schema.
    return {k: [r for r in rows if not any(isinstance(v, str) and "_mirror" in v for v in r)]
            for k, rows in snap.items()}
