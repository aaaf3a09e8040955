"""Connections and the one retry policy.

Every transaction mover runs goes through `Database.transaction`: it opens a short
transaction, sets `lock_timeout` and `statement_timeout` with SET LOCAL semantics
(set_config(..., true), which, unlike SET, takes bind parameters), runs one function and
commits. On 40001 / 40P01 / 55P03, or a lost connection, the *whole* function runs again in a
new transaction (never a single statement with values read in the failed attempt), bounded,
with exponential backoff and jitter, logging one line per retry.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql
from tenacity import (
    RetryCallState,
    Retrying,
    before_nothing,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from mover.errors import BadInput, CatalogMoved, Failed

log = logging.getLogger("mover.db")

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

# What a whole-transaction retry cures, by psycopg's error classes (one per SQLSTATE): another
# transaction was in the way (40001, 40P01, 55P03), or the server went away or is restarting
# (class 08 but 08P01, 57P01..57P03). Everything else means the same on every attempt.
RETRYABLE = (pgerrors.SerializationFailure, pgerrors.DeadlockDetected, pgerrors.LockNotAvailable)
CONNECTION_LOST = (
    # class 08 (psycopg's classes for it have no common base of their own). Not 08P01,
    # protocol_violation: the server understood the client and refused what it sent (a bind message
    # whose parameters do not match the statement, a malformed message); the same statement fails
    # the same way on a new connection, so it is a failure to report, not a server that went away.
    pgerrors.ConnectionException, pgerrors.SqlclientUnableToEstablishSqlconnection,
    pgerrors.ConnectionDoesNotExist, pgerrors.SqlserverRejectedEstablishmentOfSqlconnection,
    pgerrors.ConnectionFailure, pgerrors.TransactionResolutionUnknown,
    # the server shuts down or is starting up
    pgerrors.AdminShutdown, pgerrors.CrashShutdown, pgerrors.CannotConnectNow,
)
RETRYABLE_SQLSTATES = frozenset(c.sqlstate for c in RETRYABLE if c.sqlstate)  # for messages and SQL


# Passwords must never be printed, logged or stored, whatever the DSN's shape. Masking works on
# text, not on a parsed DSN, because the texts that leak one (libpq's parse errors, tracebacks) are
# exactly those of DSNs that do not parse.
_PASSWORD_KV = re.compile(r"""(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&'"]*)""", re.IGNORECASE)
_URL_USERINFO = re.compile(r"""(//[^\s:/@"']*):([^\s"']*)@""")
# Also after a "/": a URL with one slash too few (postgresql:/user:password@host) is not a URL.
_BARE_USERINFO = re.compile(r"""((?:^|(?<=[\s"'=(/]))[^\s:/@"'=()]+):([^\s"'/]*)@""")
MASK = "***"
_known_secrets: set[str] = set()


def _passwords(dsn: str) -> set[str]:
    """Every password-like value in a DSN: parsed where libpq can, else found in the text."""
    found: set[str] = set()
    try:
        value = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
        if value:
            found.add(str(value))
    except psycopg.Error:
        pass
    for m in _PASSWORD_KV.finditer(dsn):
        found.add(m.group(2).strip("'"))
    for pattern in (_URL_USERINFO, _BARE_USERINFO):
        for m in pattern.finditer(dsn):
            found.add(m.group(2))
            found.add(urllib.parse.unquote(m.group(2)))
    return {p for p in found if p}


def remember_secrets(dsn: str | None) -> None:
    """Note the passwords of a DSN this process uses, so that `mask` removes them from any text."""
    if dsn:
        _known_secrets.update(_passwords(dsn))


@contextmanager
def own_secrets() -> Iterator[None]:
    """Within: the passwords remembered are those remembered within, as in a new process; after:
    those remembered before, again. The command line's entry point runs in it, so that a process
    that runs one command after another (the tests' does) masks each with its own, and one that
    an earlier command remembered cannot hide a leak."""
    before = set(_known_secrets)
    _known_secrets.clear()
    try:
        yield
    finally:
        _known_secrets.clear()
        _known_secrets.update(before)


def mask(text: str) -> str:
    """`text` with every password removed: those of the DSNs seen, PGPASSWORD's, and anything
    shaped like one (password=..., user:password@ in a URL)."""
    secrets = set(_known_secrets)
    if os.environ.get("PGPASSWORD"):
        secrets.add(os.environ["PGPASSWORD"])
    # Longest first, so that a secret containing another is masked whole.
    for secret in sorted(secrets, key=len, reverse=True):
        for form in {secret, urllib.parse.quote(secret, safe=""), repr(secret)[1:-1]}:
            if len(form) >= 4:
                text = text.replace(form, MASK)
            else:  # a very short one only where it stands alone, or every such letter would go
                text = re.sub(rf"(?<![\w%]){re.escape(form)}(?![\w%])", MASK, text)
    text = _PASSWORD_KV.sub(lambda m: m.group(1) + MASK, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", text)
    return _BARE_USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", text)


def redact(dsn: str) -> str:
    """A DSN fit for printing: the password replaced by ***."""
    remember_secrets(dsn)
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return mask(dsn)
    if "password" in info:
        info["password"] = MASK
    return mask(psycopg.conninfo.make_conninfo("", **info))


def dsn_problem(dsn: str) -> str | None:
    """Why libpq cannot parse `dsn` (passwords masked), or None when it can."""
    remember_secrets(dsn)
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
        return None
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
    scheme = re.match(r"^\s*([A-Za-z][A-Za-z0-9+.-]*):?//", dsn)
    if scheme and not re.match(r"^\s*postgres(ql)?://", dsn):
        if dsn.lstrip().startswith(scheme.group(1) + "://"):
            return f"invalid URI scheme {scheme.group(1)!r} (a URL starts with postgresql:// or postgres://)"
        return f"missing \":\" after the URI scheme {scheme.group(1)!r} (a URL starts with postgresql://)"
    return mask(reason)


def bind(fn: Callable[Concatenate[psycopg.Cursor, P], T], *args: P.args, **kwargs: P.kwargs
         ) -> Callable[[psycopg.Cursor], T]:
    """fn(cur, ...) with its arguments taken now: a transaction body built in a loop keeps this iteration's values."""
    return lambda cur: fn(cur, *args, **kwargs)


def one(cur: psycopg.Cursor[R]) -> R:
    """The row of a statement that always returns one (an aggregate, a catalog lookup by oid, RETURNING)."""
    row = cur.fetchone()
    if row is None:
        raise AssertionError("the statement returned no row")
    return row


def application_name(role: str = "mover") -> str:
    return f"{role}:{socket.gethostname()}:{os.getpid()}"[:63]


# What every mover session runs with, whoever the client is (docs/operating.md "Security"):
# - row_security off: a read that a policy would filter raises instead (42501), so a backfill or a
#   reconcile sees every row or fails, never a tenant's share of the table (invariant 1);
# - search_path pg_catalog, pg_temp (pg_temp last, as pg_dump pins it): no schema another role can
#   write decides what an unqualified name or operator in mover's SQL means (invariant 11,
#   CVE-2018-1058). mover's own objects are always schema-qualified.
PINNED: dict[str, str] = {"row_security": "off", "search_path": "pg_catalog, pg_temp"}

# The settings that change what a conversion or a comparison yields: timestamp <-> timestamptz and
# date/interval text (TimeZone, DateStyle, IntervalStyle), float and bytea text (extra_float_digits,
# bytea_output), money and to_char (lc_monetary, lc_numeric, lc_time). Read from the registering
# session, stored with the migration (mover.migrations.session_settings) and set in every
# transaction of it, whatever the client's PGTZ, PGDATESTYLE or PGOPTIONS (invariant 8).
# Before a migration's settings are known (and under them): dates are written in ISO, the only
# style psycopg reads timestamptz in. "ISO" alone leaves DateStyle's field order (DMY, MDY, which
# decides how text converts to a date) as the session had it, and registration records that.
OUTPUT_STYLE: dict[str, str] = {"DateStyle": "ISO"}

CONVERSION_SETTINGS = ("TimeZone", "DateStyle", "IntervalStyle", "extra_float_digits", "bytea_output",
                       "lc_monetary", "lc_numeric", "lc_time")


def search_path(schemas: list[str]) -> str:
    """PINNED's search_path with `schemas` (checked writable by no other role) after pg_catalog."""
    quoted = ['"' + s.replace('"', '""') + '"' for s in schemas]
    return ", ".join(["pg_catalog", *quoted, "pg_temp"])


def conversion_settings(cur: psycopg.Cursor) -> dict[str, str]:
    """This session's values of CONVERSION_SETTINGS: what registration records."""
    cur.execute("SELECT s, current_setting(s) FROM unnest(%s::text[]) s", (list(CONVERSION_SETTINGS),))
    return {name: value for name, value in cur.fetchall()}


def _apply(cur: psycopg.Cursor, settings: dict[str, str], *, local: bool, direct_pid: int | None = None) -> None:
    """set_config for each setting in one statement; with direct_pid, only when the server session
    is that pid (not behind a transaction-mode pooler, where a session setting would stay behind
    for the pooler's other clients)."""
    # Qualified throughout: this statement may be parsed under a search_path mover did not set yet.
    names, values = list(settings), list(settings.values())
    query = ("SELECT pg_catalog.set_config(n, v, %s) FROM pg_catalog.unnest(%s::pg_catalog.text[])"
             " WITH ORDINALITY AS a(n, i) JOIN pg_catalog.unnest(%s::pg_catalog.text[]) WITH ORDINALITY AS b(v, i)"
             " USING (i)")
    if direct_pid is None:
        cur.execute(query, (local, names, values))
    else:
        cur.execute(query + " WHERE pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) %s",
                    (local, names, values, direct_pid))


def pin_session(conn: psycopg.Connection) -> None:
    """PINNED for a connection mover did not open through `connect` (Alembic's), on a direct one."""
    with conn.cursor() as cur:
        _apply(cur, PINNED, local=False, direct_pid=conn.info.backend_pid)


class RowSecurityApplies(Failed):
    """A row-level security policy applies to mover's role on a table it read (42501 under
    row_security = off): the step stopped instead of seeing a filtered share of the rows."""


def row_security_hint(cur: psycopg.Cursor, role: str) -> str:
    who = sql.Identifier(role).as_string(cur)
    return (f"as a superuser run `ALTER ROLE {who} BYPASSRLS` (or make no policy apply to {who}: "
            f"`ALTER TABLE ... NO FORCE ROW LEVEL SECURITY` when it owns the table), then run the same mover "
            f"command again; see docs/operating.md \"Security\"")


def _row_security_error(exc: psycopg.Error, conn: psycopg.Connection) -> RowSecurityApplies:
    role = conn.info.parameter_status("session_authorization") or conn.info.user or "mover's role"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else "row-level security"
    return RowSecurityApplies(
        f"{message} (mover's role {role}; mover's sessions run with row_security = off, so that a policy "
        f"made after plan check stops the step instead of hiding rows from it)",
        hint=row_security_hint(conn.cursor(), role))


def connect(dsn: str, *, role: str = "mover", settings: dict[str, str] | None = None,
            connect_timeout: int | None = None) -> psycopg.Connection:
    """An autocommit connection: transactions are explicit (`conn.transaction()`), so no
    implicit transaction is ever left idle.

    The session gets PINNED and `settings` (a migration's conversion settings) on a direct
    connection, for the statements that run outside a transaction (Database.autocommit: index
    builds, ANALYZE); `Database.transaction` sets them again with SET LOCAL semantics, which is
    what holds behind a transaction-mode pooler.

    prepare_threshold=None: psycopg would otherwise prepare a statement run 5 times on the
    server session; behind a transaction-mode pooler (PgBouncer) that session is shared by other
    clients, which then meet "prepared statement _pg3_0 already exists / does not exist".

    `connect_timeout` (seconds) over the DSN's own: for a reader that must answer while the server
    is unreachable (`mover metrics`)."""
    if connect_timeout is not None:
        dsn = psycopg.conninfo.make_conninfo(dsn, connect_timeout=connect_timeout)
    conn = psycopg.connect(dsn, autocommit=True, application_name=application_name(role), prepare_threshold=None)
    try:
        with conn.cursor() as cur:
            _apply(cur, {**OUTPUT_STYLE, **PINNED, **(settings or {})}, local=False,
                   direct_pid=conn.info.backend_pid)
    except BaseException:
        conn.close()
        raise
    return conn


def is_connection_lost(exc: BaseException) -> bool:
    """The server went away (restart, shutdown, network), or the client lost the socket (no SQLSTATE)."""
    if isinstance(exc, CONNECTION_LOST):
        return True
    return isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None


def is_retryable(exc: BaseException) -> bool:
    """Worth running the whole transaction again: a conflict with another transaction, a lost
    connection (reconnect and rerun), or a catalog read that met an object another session's DDL
    dropped meanwhile (a new transaction's snapshot no longer finds it: race 10)."""
    return isinstance(exc, (*RETRYABLE, CatalogMoved)) or is_connection_lost(exc)


def _retry_logger(label: str | None) -> Callable[[RetryCallState], None]:
    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        sqlstate = getattr(exc, "sqlstate", None)
        # A server that went away fails every retry the same way: said once per transaction, the
        # further attempts only with -v (the command's own error names the migration at the end).
        level = logging.INFO if exc is not None and is_connection_lost(exc) and state.attempt_number > 1 \
            else logging.WARNING
        log.log(level, "retrying %s (attempt %d) after %s%s", label or "transaction", state.attempt_number,
                    type(exc).__name__, f" [{sqlstate}]" if sqlstate else "")
    return log_retry


# What waits for the commit of a transaction Database.transaction runs (after_commit), per thread:
# the transactions open in this thread, innermost last (a function may open another Database's).
_open_transactions = threading.local()


def _opened() -> list[tuple[psycopg.Connection, list[Callable[[], None]]]]:
    stack: list[tuple[psycopg.Connection, list[Callable[[], None]]]] = \
        _open_transactions.__dict__.setdefault("stack", [])
    return stack


def after_commit(cur: psycopg.Cursor, callback: Callable[[], None]) -> None:
    """Call `callback` once the transaction `cur` is in has committed, and never if it rolls back:
    what it says (a log line of a recorded event) is then true, and said once however many
    attempts the retry policy made. On a cursor outside Database.transaction, at once."""
    for conn, waiting in reversed(_opened()):
        if conn is cur.connection:
            waiting.append(callback)
            return
    callback()


class Database:
    """One lazily (re)opened connection plus the transaction runner."""

    def __init__(self, dsn: str, *, role: str = "mover", attempts: int = 8, settings: dict[str, str] | None = None,
                 connect_timeout: int | None = None):
        self.dsn = dsn
        self.role = role
        self.attempts = attempts
        self.connect_timeout = connect_timeout
        self.settings: dict[str, str] = {**OUTPUT_STYLE, **PINNED, **(settings or {})}
        self._conn: psycopg.Connection | None = None
        self._pooled: tuple[psycopg.Connection, bool] | None = None

    def connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
            self._conn = connect(self.dsn, role=self.role, settings=self.settings,
                                 connect_timeout=self.connect_timeout)
        return self._conn

    def pin(self, settings: dict[str, str]) -> None:
        """From now on every transaction and session of this Database runs with `settings` (a
        migration's recorded conversion settings) besides PINNED; the open session gets them now."""
        # A migration's search_path (db.search_path: pg_catalog first, pg_temp last, in between only
        # schemas no other role can write) replaces PINNED's; row_security stays off whatever it says.
        merged = {**self.settings, **settings, "row_security": PINNED["row_security"]}
        if merged == self.settings:
            return
        self.settings = merged
        if self._conn is not None and not (self._conn.closed or self._conn.broken):
            with self._conn.cursor() as cur:
                _apply(cur, merged, local=False, direct_pid=self._conn.info.backend_pid)

    def pin_local(self, cur: psycopg.Cursor, settings: dict[str, str] | None = None) -> None:
        """This Database's settings (and `settings` over them) for the transaction `cur` is in."""
        _apply(cur, {**self.settings, **(settings or {}), "row_security": PINNED["row_security"]}, local=True)

    def startup_search_path(self) -> str:
        """The search_path this connection started with (the role's, the database's, the client's)."""
        with self.connection().cursor() as cur:
            cur.execute("SELECT reset_val FROM pg_catalog.pg_settings WHERE name OPERATOR(pg_catalog.=) 'search_path'")
            return str(one(cur)[0])

    def sibling(self, role: str | None = None) -> Database:
        """Another Database on the same DSN with the same settings: for a thread of its own."""
        return Database(self.dsn, role=role or self.role, attempts=self.attempts, settings=self.settings)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def transaction(
        self,
        fn: Callable[[psycopg.Cursor], T],
        *,
        lock_timeout: str = "2s",
        statement_timeout: str = "60s",
        synchronous_commit: bool = True,
        attempts: int | None = None,
        label: str | None = None,
        repeatable_read: bool = False,
        before_attempt: Callable[[], None] | None = None,
    ) -> T:
        """Run fn(cursor) in one short transaction, retried whole on transient failures.
        `repeatable_read`: one snapshot for the whole transaction, taken at its first statement
        (a write that meets a newer version of its row fails with 40001 and is retried whole).
        `before_attempt`: run before every attempt, outside the transaction (after the backoff)."""
        retrying = Retrying(
            before=(lambda _state: before_attempt()) if before_attempt is not None else before_nothing,
            retry=retry_if_exception(is_retryable),
            stop=stop_after_attempt(attempts or self.attempts),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.2),
            before_sleep=_retry_logger(label),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                conn = self.connection()
                committed: list[Callable[[], None]] = []  # after_commit's, of this attempt only
                opened = _opened()
                opened.append((conn, committed))
                try:
                    with conn.transaction(), conn.cursor() as cur:
                        if repeatable_read:
                            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        # The session's settings again, SET LOCAL: behind a transaction-mode pooler
                        # this transaction may run on a server session mover never configured.
                        _apply(cur, {**self.settings, "lock_timeout": lock_timeout,
                                     "statement_timeout": statement_timeout}, local=True)
                        if not synchronous_commit:
                            # Safe only where a crash loses the effect and its done mark together.
                            cur.execute("SET LOCAL synchronous_commit = off")
                        result = fn(cur)
                except pgerrors.InsufficientPrivilege as exc:
                    if "row-level security" in str(exc):
                        raise _row_security_error(exc, conn) from exc
                    raise
                except psycopg.OperationalError:
                    if conn.broken or conn.closed:
                        self._conn = None
                    raise
                finally:
                    opened.pop()
                for callback in committed:
                    callback()
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    def pooled(self) -> bool:
        """Whether a pooler (PgBouncer, ...) stands between us and the server: a pooler hands the
        client its own BackendKeyData, so the pid libpq was told differs from the server's."""
        conn = self.connection()
        if self._pooled is None or self._pooled[0] is not conn:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                self._pooled = (conn, one(cur)[0] != conn.info.backend_pid)
        return self._pooled[1]

    def autocommit(self, statement: sql.SQL | sql.Composed | str, params: Any = None, *, statement_timeout: str = "0",
                   lock_timeout: str = "2s") -> None:
        """A statement that cannot run in a transaction block (CREATE INDEX CONCURRENTLY).

        On a direct connection the timeouts are set for the session and reset afterwards. Behind
        a pooler they are not set at all: in transaction mode each statement may run on another
        server connection, so a session SET would stay behind for other clients and the RESET
        would miss it. The statement then runs under the server's defaults, which must not
        cancel it: a non-zero default statement_timeout where none is wanted is refused."""
        conn = self.connection()
        if self.pooled():
            with conn.cursor() as cur:
                cur.execute("SELECT current_setting('statement_timeout')")
                current = one(cur)[0]
                if statement_timeout == "0" and current != "0":
                    raise BadInput(
                        f"this connection goes through a connection pooler and the server's statement_timeout "
                        f"is {current}, which would cancel a long statement that cannot run in a transaction "
                        f"(and so cannot SET LOCAL a longer one): {_first_words(statement, conn)}",
                        hint="run this step through a direct or session-mode connection (--dsn to the server "
                             "itself), or `ALTER ROLE <mover's role> SET statement_timeout = 0`; "
                             "then `mover run NAME` again")
                cur.execute(statement, params)
            return
        with conn.cursor() as cur:
            cur.execute("SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
                        (lock_timeout, statement_timeout))
            try:
                cur.execute(statement, params)
            finally:
                if not conn.broken:
                    cur.execute("RESET lock_timeout; RESET statement_timeout")


def open_database(dsn: str) -> Database:
    """A Database whose DSN parses and whose server answers: the commands' first step, so that a
    bad DSN is bad input (exit 2, nothing changed) and an unreachable server names the DSN, masked."""
    problem = dsn_problem(dsn) if dsn else None
    if problem:
        raise BadInput(f"the DSN is malformed: {problem}",
                       hint="fix --dsn or DATABASE_URL: a URL such as postgresql://user@host:5432/dbname, or "
                            "key=value pairs such as 'host=... dbname=... user=...'; give the password through "
                            "PGPASSWORD or ~/.pgpass rather than in the DSN")
    db = Database(dsn)
    try:
        db.connection()
    except psycopg.OperationalError as exc:
        raise Failed(f"cannot connect to {redact(dsn) or 'the database given by the PG* variables'}: "
                     f"{mask(_one_line(exc))}",
                     hint="check --dsn, DATABASE_URL or the PG* variables") from exc
    return db


def _one_line(exc: BaseException) -> str:
    """libpq's message on one line, every part kept (the cause, "Connection refused", is on the
    first line and the advice on the next), single-spaced."""
    return "; ".join(" ".join(part.split()) for part in str(exc).strip().splitlines() if part.strip()) or repr(exc)


def _first_words(statement: sql.SQL | sql.Composed | str, conn: psycopg.Connection) -> str:
    text = statement if isinstance(statement, str) else statement.as_string(conn)
    return text if len(text) <= 120 else text[:117] + "..."


def sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None)


__all__ = ["Database", "open_database", "after_commit", "connect", "redact", "mask", "dsn_problem", "remember_secrets",
           "is_retryable", "RowSecurityApplies", "row_security_hint", "is_connection_lost", "pgerrors",
           "sqlstate"]
