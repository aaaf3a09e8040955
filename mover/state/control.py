"""mover's control schema: its Alembic revisions, the migration state machine, the lease, events
and divergences.

The only code that writes mover.migrations and mover.steps. The step order is STEPS, and
COMMANDS (derived from it) says which operator command is legal at which step. Every change of
a migration's step or state is a named transition (start_step, finish_step, mark_swapped,
mark_swapped_back, mark_retired, mark_aborted, record_outcome, wait_at_gate, set_paused...): an UPDATE
guarded by the lease, and by the step it leaves where that matters, that must hit exactly one row
(else LeaseLost), with an events row in the same transaction. A process that lost its lease, or
that works from a stale idea of the step, changes nothing.

The work tables belong to their owners: mover.ranges, mover.frontiers and mover.workers to
mover/state/ranges.py (the only code that writes them), the change logs and mover.capture_stats
to mover/engines/capture/changelog.py.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from mover.db import after_commit, one
from mover.errors import BadInput, Failed, LeaseHeld, LeaseLost, NotFound
from mover.names import CONTROL_SCHEMA, QualifiedName

log = logging.getLogger("mover.control")
# Every recorded event is also a log record here, once its transaction committed (event()).
events_log = logging.getLogger("mover.events")

STEPS = ("create_target", "install_capture", "backfill", "reconcile", "cutover", "rollback_window", "retire")
LEASE_SECONDS = 30


@dataclass
class Migration:
    id: int
    name: str
    plan: dict[str, Any]
    plan_hash: str
    source: QualifiedName
    target: QualifiedName
    old: QualifiedName
    key_columns: list[str]
    step: str
    state: str
    paused: bool
    error: str | None
    created_at: datetime
    updated_at: datetime
    cutover_at: datetime | None
    cutover_lock_ms: float | None
    window_ends_at: datetime | None
    finished_at: datetime | None
    lease_owner: str | None
    lease_host: str | None
    lease_pid: int | None
    lease_expires_at: datetime | None
    # The conversion settings fixed at registration (mover/db.py CONVERSION_SETTINGS); empty for a
    # migration registered before they were recorded.
    settings: dict[str, str] = field(default_factory=dict)
    # A table of a family (issue 27): the head's id (the head's own row included) and the table's
    # place in the plan (0: the head, [migration] source; then the [[also]] tables); None for a
    # migration of one table.
    family_id: int | None = None
    family_position: int | None = None

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> Migration:
        return cls(
            id=r["id"], name=r["name"], plan=r["plan"], plan_hash=r["plan_hash"],
            source=QualifiedName(r["source_schema"], r["source_table"]),
            target=QualifiedName(r["target_schema"], r["target_table"]),
            old=QualifiedName(r["old_schema"], r["old_table"]),
            key_columns=list(r["key_columns"]), step=r["step"], state=r["state"], paused=r["paused"],
            error=r["error"], created_at=r["created_at"], updated_at=r["updated_at"],
            cutover_at=r["cutover_at"], cutover_lock_ms=r["cutover_lock_ms"],
            window_ends_at=r["window_ends_at"], finished_at=r["finished_at"],
            lease_owner=r["lease_owner"], lease_host=r["lease_host"], lease_pid=r["lease_pid"],
            lease_expires_at=r["lease_expires_at"], settings=dict(r.get("session_settings") or {}),
            family_id=r.get("family_id"), family_position=r.get("family_position"),
        )

    @property
    def head(self) -> bool:
        """The row the operator names: a migration of one table, or a family's head."""
        return self.family_id is None or self.family_id == self.id

    @property
    def live(self) -> QualifiedName:
        """The table the application uses now: the source before cutover, the target after it
        (which then carries the source's name)."""
        return self.source


def new_owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------
# Schema (Alembic)


def alembic_dir() -> Path:
    """Revisions ship inside the wheel as mover/_alembic; in a source checkout they are the
    top-level alembic/ folder."""
    packaged = resources.files("mover") / "_alembic"
    if packaged.is_dir():
        return Path(str(packaged))
    here = Path(__file__).resolve().parents[2] / "alembic"  # mover/state/control.py
    if here.is_dir():
        return here
    raise Failed("mover's control-schema revisions are missing from this installation",
                 hint="reinstall mover")


def init_schema(dsn: str) -> str:
    """Create or upgrade the control schema; idempotent; returns the revision in force."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.pool import NullPool

    from mover.db import application_name, pin_session

    _check_init_privileges(dsn)

    # A creator keeps libpq's own DSN handling (URLs, key=value, PG* variables, passfile); no
    # server-side prepared statements, and the pinned search_path and row_security, as on all of
    # mover's connections (see db.connect).
    def creator() -> psycopg.Connection:
        conn = psycopg.connect(dsn, application_name=application_name("mover-init"), prepare_threshold=None)
        pin_session(conn)
        conn.commit()
        return conn

    engine = create_engine("postgresql+psycopg://", creator=creator, poolclass=NullPool)
    cfg = Config()
    cfg.set_main_option("script_location", str(alembic_dir()))
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        with engine.connect() as conn:
            from sqlalchemy import text
            rev: str = conn.execute(text("SELECT version_num FROM mover.alembic_version")).scalar_one()
    except DBAPIError as exc:
        # SQLAlchemy wraps the driver's error; the CLI maps psycopg's own classes.
        if isinstance(exc.orig, psycopg.errors.InsufficientPrivilege):
            raise BadInput(f"`mover init` lacks a privilege: {str(exc.orig).strip().splitlines()[0]}",
                           hint="see docs/operating.md \"Privileges\": let the migrating role own schema \"mover\" "
                                "(setup A), or run `mover init` as a superuser and grant what it lists (setup B)"
                           ) from exc.orig
        if isinstance(exc.orig, psycopg.Error):
            raise exc.orig from None
        raise
    finally:
        engine.dispose()
    return rev


def _check_init_privileges(dsn: str) -> None:
    """The one-line refusal for the common case: no schema "mover" yet, and no CREATE on the database."""
    from mover.db import connect

    with connect(dsn, role="mover-init") as conn, conn.cursor() as cur:
        cur.execute("SELECT current_user, current_database(), to_regnamespace(%s) IS NOT NULL,"
                    " has_database_privilege(current_database(), 'CREATE')", (CONTROL_SCHEMA,))
        user, dbname, exists, can_create = one(cur)
        if not exists and not can_create:
            who, db = sql.Identifier(user).as_string(cur), sql.Identifier(dbname).as_string(cur)
            raise BadInput(
                f"`mover init` cannot create schema \"mover\": role {who} lacks CREATE on database {db}",
                hint=f"as a superuser run `GRANT CREATE ON DATABASE {db} TO {who}` (or `CREATE SCHEMA mover "
                     f"AUTHORIZATION {who}`), then `mover init`; or run `mover init` as a superuser and grant "
                     f"what docs/operating.md \"Privileges\" (setup B) lists")


def schema_ready(cur: psycopg.Cursor) -> bool:
    cur.execute("SELECT to_regclass('mover.migrations') IS NOT NULL")
    return bool(one(cur)[0])


def schema_revision(cur: psycopg.Cursor) -> str | None:
    """The control schema's revision in force (None before Alembic kept one)."""
    cur.execute("SELECT to_regclass('mover.alembic_version') IS NOT NULL")
    if not one(cur)[0]:
        return None
    cur.execute("SELECT max(version_num) FROM mover.alembic_version")
    return one(cur)[0]  # type: ignore[no-any-return]


def newest_revision() -> str:
    """The newest revision this installation ships (its file names start with the revision)."""
    return max(p.name.split("_", 1)[0] for p in (alembic_dir() / "versions").glob("[0-9]*_*.py"))


# ---------------------------------------------------------------------------------------------
# Migrations


def _fetch(cur: psycopg.Cursor, where: sql.Composable, params: tuple[Any, ...], lock: bool = False) -> list[Migration]:
    # Without the recorded shapes (Migration has no use for them): on a wide table they are
    # hundreds of kilobytes of JSON, and the row is read again for every range (issue 34).
    q = sql.SQL("SELECT r.* FROM (SELECT * FROM mover.migrations WHERE {} ORDER BY id{}) m,"
                " LATERAL jsonb_populate_record(CAST(m AS mover.migrations),"
                "                               '{{\"source_shape\": null, \"target_shape\": null}}') r"
                " ORDER BY r.id").format(where, sql.SQL(" FOR UPDATE") if lock else sql.SQL(""))
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute(q, params)
        return [Migration.from_row(r) for r in dcur.fetchall()]


def get(cur: psycopg.Cursor, name: str, *, lock: bool = False) -> Migration:
    rows = _fetch(cur, sql.SQL("name = %s"), (name,), lock)
    if not rows:
        raise NotFound(f"no migration named {name!r}", hint="`mover status` lists them; `mover run PLAN` registers one")
    return rows[0]


def find(cur: psycopg.Cursor, name: str) -> Migration | None:
    rows = _fetch(cur, sql.SQL("name = %s"), (name,))
    return rows[0] if rows else None


def get_by_id(cur: psycopg.Cursor, mid: int, *, lock: bool = False) -> Migration:
    return _fetch(cur, sql.SQL("id = %s"), (mid,), lock)[0]


def find_by_id(cur: psycopg.Cursor, mid: int) -> Migration | None:
    rows = _fetch(cur, sql.SQL("id = %s"), (mid,))
    return rows[0] if rows else None


def list_all(cur: psycopg.Cursor) -> list[Migration]:
    return _fetch(cur, sql.SQL("true"), ())


def active_on_source(cur: psycopg.Cursor, source: QualifiedName) -> Migration | None:
    rows = _fetch(cur, sql.SQL("source_schema = %s AND source_table = %s AND state NOT IN ('done', 'aborted')"),
                  (source.schema, source.name))
    return rows[0] if rows else None


def next_id(cur: psycopg.Cursor) -> int:
    """The id registration gives the next migration, so that `plan check` shows the names (which
    carry it: mover.m7_changes...) the run will use. Peeked, not taken: a registration by someone
    else in between would take it, and the names shift by one."""
    cur.execute("SELECT pg_sequence_last_value(pg_get_serial_sequence('mover.migrations', 'id'))")
    last = one(cur)[0]
    return 1 if last is None else int(last) + 1


def register(cur: psycopg.Cursor, *, name: str, plan: dict[str, Any], plan_hash: str, source: QualifiedName,
             target: QualifiedName, old: QualifiedName, key: list[str], actor: str,
             settings: dict[str, str], family: Migration | None = None, position: int | None = None) -> Migration:
    """A new migration row with its steps. A family's tables: the head with position 0 (its
    family_id is its own id), then each other table with the head as `family`."""
    family_id = None if position is None else family.id if family is not None else None
    cur.execute(
        """
        INSERT INTO mover.migrations (name, plan, plan_hash, source_schema, source_table, target_schema,
                                      target_table, old_schema, old_table, key_columns, session_settings)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id
        """,
        (name, json.dumps(plan), plan_hash, source.schema, source.name, target.schema, target.name,
         old.schema, old.name, key, json.dumps(settings)),
    )
    mid = one(cur)[0]
    if position is not None:
        cur.execute("UPDATE mover.migrations SET family_id = %s, family_position = %s WHERE id = %s",
                    (family_id if family_id is not None else mid, position, mid))
    cur.executemany("INSERT INTO mover.steps (migration_id, name, position) VALUES (%s, %s, %s)",
                    [(mid, s, i) for i, s in enumerate(STEPS)])
    event(cur, mid, actor, None, "registered", f"migration {name!r} registered"
          + (f" (table {position + 1} of family {family.name!r})" if family is not None and position else ""),
          {"plan": plan, "settings": settings})
    return get_by_id(cur, mid)


def family(cur: psycopg.Cursor, m: Migration) -> list[Migration]:
    """The tables `m` moves together, in the plan's order (the head first): [m] for a migration
    of one table."""
    if m.family_id is None:
        return [m]
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT * FROM mover.migrations WHERE family_id = %s ORDER BY family_position", (m.family_id,))
        return [Migration.from_row(r) for r in dcur.fetchall()]


def head_of(cur: psycopg.Cursor, m: Migration) -> Migration:
    """The row the operator's commands act on: the family's head, or `m` itself."""
    return m if m.head else get_by_id(cur, m.family_id)  # type: ignore[arg-type]


def other_tables(rows: Sequence[Migration]) -> dict[int, list[Migration]]:
    """Of every head among `rows`, the rows of its other tables among them, in the plan's order
    (none for a migration of one table)."""
    return {h.id: sorted((r for r in rows if r.family_id == h.id and r.id != h.id),
                         key=lambda r: r.family_position or 0) for h in rows if h.head}


def step_of(rows: Sequence[Migration]) -> str:
    """A migration's step: the earliest of its tables' (each table's own row says where it is)."""
    order = [*STEPS, FINISHED]
    return min((r.step for r in rows), key=order.index)


def as_one(rows: Sequence[Migration]) -> Migration:
    """The head's row (rows[0]) with the migration's step: what the operator's commands are checked
    against, for one table or many."""
    head, step = rows[0], step_of(rows)
    return head if step == head.step else replace(head, step=step)


def update_plan(cur: psycopg.Cursor, mid: int, plan: dict[str, Any], actor: str,
                changes: Sequence[str] = ()) -> None:
    """Tunables changed between runs (the shape hash is the same): keep the new values. `changes`
    says which, and when each takes effect (plan.edits)."""
    cur.execute("UPDATE mover.migrations SET plan = %s, updated_at = now() WHERE id = %s", (json.dumps(plan), mid))
    message = "tunable settings changed" + (": " + "; ".join(changes) if changes else "")
    event(cur, mid, actor, None, "plan_updated", message,
          {"plan": plan, **({"changes": list(changes)} if changes else {})})


def shapes(cur: psycopg.Cursor, mid: int) -> dict[str, dict[str, Any] | None]:
    """The recorded descriptions of the original ("source") and new ("target") table (mover/catalog/shape.py)."""
    cur.execute("SELECT source_shape, target_shape FROM mover.migrations WHERE id = %s", (mid,))
    row = cur.fetchone()
    return {"source": row[0], "target": row[1]} if row else {"source": None, "target": None}


def store_shape(cur: psycopg.Cursor, mid: int, side: str, description: dict[str, Any], fingerprint: str) -> None:
    if side not in ("source", "target"):
        raise ValueError(side)
    cur.execute(sql.SQL("UPDATE mover.migrations SET {} = %s, {} = %s WHERE id = %s").format(
        sql.Identifier(f"{side}_shape"), sql.Identifier(f"{side}_fingerprint")),
        (json.dumps(description), fingerprint, mid))


_INSERT_EVENT = ("INSERT INTO mover.events (migration_id, actor, step, kind, message, detail, duration_ms)"
                 " VALUES (%s, %s, %s, %s, %s, %s, %s)")
# The same, naming what a log line says: the migration (a family's table: the family, the name
# the operator gives) and the table the event concerns (the row its detail names, else its own).
_INSERT_EVENT_NAMED = (
    "WITH e AS (" + _INSERT_EVENT + " RETURNING id, migration_id, detail)"
    " SELECT e.id, h.name, t.source_schema, t.source_table FROM e"
    " JOIN mover.migrations m ON m.id = e.migration_id"
    " JOIN mover.migrations h ON h.id = coalesce(m.family_id, m.id)"
    " LEFT JOIN mover.migrations t ON t.id = coalesce((e.detail->>'table_id')::bigint, e.migration_id)")


def event(cur: psycopg.Cursor, mid: int, actor: str, step: str | None, kind: str, message: str,
          detail: dict[str, Any] | None = None, duration_ms: float | None = None, *,
          level: int = logging.INFO) -> None:
    """Record an event, in the caller's transaction. Once that commits it is also a log record of
    `events_log` at `level` (`--log-format json` writes it as a line), carrying as attributes the
    migration, table, step, event (its kind), fields (its detail), event_id, actor and duration_ms;
    nothing when it rolls back, so a retried transaction's event is said once."""
    values = (mid, actor, step, kind, message, json.dumps(detail, default=str) if detail is not None else None,
              duration_ms)
    if not events_log.isEnabledFor(level):
        cur.execute(_INSERT_EVENT, values)
        return
    cur.execute(_INSERT_EVENT_NAMED, values)
    event_id, migration, schema, table = one(cur)
    said = {"migration": migration, "table": str(QualifiedName(schema, table)) if table else None, "step": step,
            "event": kind, "fields": detail or {}, "event_id": event_id, "actor": actor, "duration_ms": duration_ms}
    after_commit(cur, lambda: events_log.log(level, message, extra=said))


# The table an event concerns: the row it is recorded on, or the row its detail names (an event a
# family records on its head about one of its tables: a process that died in that table's step).
CONCERNS = "table_id"
_CONCERNED = sql.SQL("coalesce((detail->>'table_id')::bigint, migration_id)")


def _ids(mid: int | Sequence[int]) -> list[int]:
    return [mid] if isinstance(mid, int) else list(mid)


def _story_where(mid: int | Sequence[int], only: int | None) -> tuple[sql.Composable, tuple[Any, ...]]:
    where = sql.SQL("migration_id = ANY(%s) AND kind <> 'sample' AND (%s::bigint IS NULL OR {} = %s)").format(
        _CONCERNED)
    return where, (_ids(mid), only, only)


def events(cur: psycopg.Cursor, mid: int | Sequence[int], limit: int = 50, *,
           only: int | None = None) -> list[dict[str, Any]]:
    """The last `limit` events of one migration row, or of several (a family's, as one story),
    oldest first, each with the id of the row it concerns (`table_id`); `only`: those concerning
    that row."""
    where, params = _story_where(mid, only)
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        # Progress samples (mover/state/samples.py) are for charts; they would drown the story here.
        dcur.execute(sql.SQL("SELECT * FROM (SELECT at, actor, step, kind, message, duration_ms, id, {} AS table_id"
                             " FROM mover.events WHERE {} ORDER BY id DESC LIMIT %s) e ORDER BY id").format(
                                 _CONCERNED, where), (*params, limit))
        return dcur.fetchall()


def story(cur: psycopg.Cursor, mid: int | Sequence[int], *, only: int | None = None) -> list[dict[str, Any]]:
    """Every event of one migration row (or of several) but the progress samples, oldest first,
    with its detail and the id of the row it concerns (`table_id`); `only`: those concerning that row."""
    where, params = _story_where(mid, only)
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute(sql.SQL("SELECT id, at, actor, step, kind, message, detail, duration_ms, {} AS table_id"
                             " FROM mover.events WHERE {} ORDER BY id").format(_CONCERNED, where), params)
        return dcur.fetchall()


def steps(cur: psycopg.Cursor, mid: int) -> list[dict[str, Any]]:
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT name, status, started_at, finished_at FROM mover.steps WHERE migration_id = %s"
                     " ORDER BY position", (mid,))
        return dcur.fetchall()


# ---------------------------------------------------------------------------------------------
# The state machine: every write to mover.migrations and mover.steps is one of the transitions
# below. Each is an UPDATE guarded by the lease (and, where the step matters, by the step it
# leaves) that must hit one row, with an events row in the same transaction.

FINISHED = "finished"  # the step after the last one
TERMINAL = ("done", "aborted")


def next_step(step: str) -> str:
    i = STEPS.index(step)
    return STEPS[i + 1] if i + 1 < len(STEPS) else FINISHED


def shown_step(step: str) -> str:
    """One word for the end everywhere the operator reads it: step "retire" (state "done"), not the
    internal FINISHED."""
    return STEPS[-1] if step == FINISHED else step


def _through(first: str, last: str) -> frozenset[str]:
    return frozenset(STEPS[STEPS.index(first):STEPS.index(last) + 1])


# The runs of steps that more than one module asks about, named once here (in STEPS' order).
# Before any range work: the target and the capture are being made.
SETTING_UP = _through(STEPS[0], "install_capture")
# The target is not complete yet: its deferred indexes come at the end of the backfill.
BUILDING = _through(STEPS[0], "backfill")
# Range workers may run, and a pause (or a rows/s cap) holds them at a range boundary.
RANGE_STEPS = _through(STEPS[0], "reconcile")
# Where a helper (`mover worker`) finds ranges to take: the backfill's, then reconcile passes.
HELPED = _through("backfill", "cutover")
# Reconcile passes run: at the step, and on demand (`mover reconcile`) at the gate.
COMPARING = _through("reconcile", "cutover")
# Before the swap: what mover built can still be dropped (abort).
BEFORE_SWAP = _through(STEPS[0], "cutover")
# Nothing to run until the operator decides, only a change log to keep drained: the gate (the
# cutover step before its swap) and the rollback window. `mover follow` drains there.
FOLLOWED = frozenset({"cutover", "rollback_window"})

# Which operator command is legal at which step (and never once the migration is done or aborted).
COMMANDS: dict[str, frozenset[str]] = {
    "run": frozenset(STEPS),
    "cutover": _through("cutover", "cutover"),
    "rollback": _through("rollback_window", "rollback_window"),
    "retire": _through("rollback_window", "retire"),
    # Before the swap abort drops what mover built. After it the new table is live: only a
    # rollback brings the original back (losing nothing, or refusing), and abort comes after.
    "abort": BEFORE_SWAP,
    "reconcile": COMPARING,
    "repair": COMPARING,
    # The query rehearsal plans statements on the target: complete, indexes built, not yet swapped.
    "rehearse": COMPARING,
    "accept": frozenset(STEPS),
    # A change of the live table's shape is adopted on the other table up to the end of the window.
    "adopt": _through(STEPS[0], "rollback_window"),
    # Pause holds the range workers (backfill, reconcile) at a range boundary; later steps have none.
    "pause": RANGE_STEPS,
    "unpause": frozenset(STEPS),
    # A lost replication slot is replaced while the forward capture is logical and installed.
    "recapture": _through("install_capture", "cutover"),
    "set": frozenset(STEPS),
}
VERBS = {"cutover": "cut over", "rollback": "roll back"}


def allows(m: Migration, command: str) -> bool:
    """Whether `command` works on the migration where it stands (COMMANDS, never once it ended)."""
    return m.state not in TERMINAL and m.step in COMMANDS[command]


def leaves_at(command: str, step: str) -> str:
    """The step a command that works at `step` leaves the migration at: what the next command of a
    hint chaining two (`mover rollback`, then `mover abort`) must work at."""
    if command == "run":
        return "cutover" if STEPS.index(step) < STEPS.index("cutover") else step  # it stops at the gate
    return {"cutover": "rollback_window", "rollback": "reconcile", "retire": FINISHED}.get(command, step)


def way_to_undo(m: Migration) -> str | None:
    """The commands that undo the migration from where it stands (abort; after the swap a
    rollback first), or None once nothing can (past its window)."""
    if allows(m, "abort"):
        return f"`mover abort {m.name}`"
    if allows(m, "rollback") and leaves_at("rollback", m.step) in COMMANDS["abort"]:
        return f"`mover rollback {m.name}` swaps the original back, then `mover abort {m.name}`"
    return None


def way_to_finish(m: Migration) -> str:
    """The command that finishes the migration from where it stands."""
    if allows(m, "retire"):
        return f"`mover retire {m.name}`" + (" once its window ends" if m.step == "rollback_window" else "")
    if allows(m, "cutover"):
        return f"`mover cutover {m.name}`"
    return f"`mover run {m.name}` takes it to the cutover gate, then `mover cutover {m.name}`"


def ways_out(m: Migration) -> str:
    """How to get the migration out of the way (of another migration of its table, of a changed
    plan), with only commands that work where it stands: finish it, or undo it."""
    if m.state in TERMINAL:
        return f"migration {m.name!r} is {m.state}"
    undo = way_to_undo(m)
    return f"finish it ({way_to_finish(m)})" + (f" or undo it ({undo})" if undo else "")


def require_command(m: Migration, command: str) -> None:
    """Refuse an operator command the migration's step does not allow."""
    if command == "abort" and m.step == "rollback_window" and m.state not in TERMINAL:
        raise BadInput(f"cannot abort migration {m.name!r} after its cutover: {m.source} is the new table now",
                       hint=way_to_undo(m) or f"`mover status {m.name}`")
    if command == "pause" and m.state not in TERMINAL and m.step not in COMMANDS[command]:
        raise BadInput(f"cannot pause migration {m.name!r} at step {m.step!r}: pause holds the backfill and "
                       f"reconcile workers, and none run from the cutover on",
                       hint=f"nothing to pause; `mover status {m.name}` shows what it waits for")
    if m.state in TERMINAL or m.step not in COMMANDS[command]:
        allowed = ", ".join(s for s in STEPS if s in COMMANDS[command])
        raise BadInput(f"cannot {VERBS.get(command, command)} migration {m.name!r}: it is at step "
                       f"{shown_step(m.step)!r}, "
                       f"state {m.state!r} (allowed at: {allowed})", hint=_way_to(m, command))


# The commands that move a migration on, in the order an operator would consider them.
_MOVES = ("run", "cutover", "rollback", "retire", "abort")


def _way_to(m: Migration, command: str) -> str:
    """The `next:` of a refused command: the commands that get the migration to where `command`
    applies (`mover run` to the cutover gate, `mover cutover` past it) while that is ahead, or
    what applies where it stands (it is behind). Each command named works where the one before
    leaves the migration (leaves_at)."""
    if m.state in TERMINAL:
        return f"the migration is {m.state}; `mover history {m.name}` lists its steps"
    allowed = [s for s in STEPS if s in COMMANDS[command]]
    here = STEPS.index(m.step) if m.step in STEPS else len(STEPS)
    if allowed and here < STEPS.index(allowed[0]):
        chain, step = [], m.step
        while step not in COMMANDS[command]:
            move = "run" if leaves_at("run", step) != step else "cutover"
            chain.append(f"`mover {move} {m.name}`")
            step = leaves_at(move, step)
        takes = "takes" if len(chain) == 1 else "take"
        return f"{', then '.join(chain)} {takes} it to step {step!r}, then `mover {command} {m.name}`"
    moves = [f"`mover {c} {m.name}`" for c in _MOVES if c != command and allows(m, c)]
    return f"at step {m.step!r}: " + (", ".join(moves) if moves else f"`mover status {m.name}`")


def _one_row(cur: psycopg.Cursor, mid: int, what: str) -> None:
    if cur.rowcount != 1:
        cur.execute("SELECT step, state, lease_owner, name FROM mover.migrations WHERE id = %s", (mid,))
        row = cur.fetchone()
        step, state, holder, name = row if row else (None, None, None, mid)
        raise LeaseLost(f"migration {name!r} cannot {what}: it is at step {step!r}, state {state!r}, "
                        f"lease held by {holder!r}",
                        hint="another process took over or the migration moved on; nothing was written by this one")


# The three ways a migration waits for the operator with its work done for now. Each is guarded by
# the lease and by the step it waits at; the error column says what the operator must decide
# (`mover status` shows it as "waiting"), or is cleared when nothing blocks.


def wait_at_gate(cur: psycopg.Cursor, m: Migration, owner: str, counts: dict[str, Any]) -> None:
    """At the cutover gate, before the swap: the target is in step; `counts` (divergence_counts)
    says whether open divergences refuse the cutover."""
    error = None
    if counts["open"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in counts["open_by_kind"].items())
        error = f"{counts['open']} divergences ({kinds})"
    _wait(cur, m, owner, "cutover", error, "waiting at the cutover gate")


def wait_in_window(cur: psycopg.Cursor, m: Migration, owner: str) -> None:
    """Swapped, in the rollback window: the reverse capture keeps the old table in step."""
    _wait(cur, m, owner, "rollback_window", None, "waiting in the rollback window")


def wait_for_divergences(cur: psycopg.Cursor, m: Migration, owner: str, open_: int) -> None:
    """A reconcile pass at the reconcile step found rows that differ: repair, accept or abort."""
    _wait(cur, m, owner, "reconcile", f"{open_} divergences", "waiting for the divergences to be resolved")


def _wait(cur: psycopg.Cursor, m: Migration, owner: str, step: str, error: str | None, what: str) -> None:
    cur.execute("UPDATE mover.migrations SET state = 'waiting', error = %s, updated_at = now()"
                " WHERE id = %s AND step = %s AND lease_owner = %s AND state NOT IN ('done', 'aborted')",
                (error, m.id, step, owner))
    _one_row(cur, m.id, what)
    event(cur, m.id, owner, step, "state", what + (f": {error}" if error else ""), {"state": "waiting"})


def record_outcome(cur: psycopg.Cursor, mid: int, owner: str, step: str, state: str, error: str | None,
                   kind: str | None = None, message: str | None = None, detail: dict[str, Any] | None = None) -> bool:
    """How a command ended (waiting, paused, failed); a step left running goes back to pending.
    False when the migration already ended or changed hands (nothing to record then)."""
    cur.execute("UPDATE mover.migrations SET state = %s, error = %s, updated_at = now()"
                " WHERE id = %s AND lease_owner = %s AND state NOT IN ('done', 'aborted')",
                (state, error, mid, owner))
    if cur.rowcount != 1:
        return False
    cur.execute("UPDATE mover.steps SET status = 'pending' WHERE migration_id = %s AND status = 'running'", (mid,))
    event(cur, mid, owner, step, kind or state, message or error or state, detail,
          level=logging.ERROR if state == "failed" else logging.INFO)
    return True


def clear_error(cur: psycopg.Cursor, mid: int, owner: str) -> None:
    """The command succeeded: an error a failed earlier attempt recorded is history (the events keep
    it), not the state. A waiting state's message (divergences, a gate) stays."""
    cur.execute("UPDATE mover.migrations SET error = NULL WHERE id = %s AND lease_owner = %s"
                " AND state NOT IN ('waiting', 'failed') AND error IS NOT NULL", (mid, owner))
    if cur.rowcount:
        event(cur, mid, owner, None, "error_cleared", "the command succeeded; the earlier error is history")


def start_step(cur: psycopg.Cursor, m: Migration, step: str, owner: str) -> None:
    guard(cur, m.id, step, owner)
    cur.execute("UPDATE mover.migrations SET state = 'running', error = NULL, updated_at = now()"
                " WHERE id = %s AND step = %s AND lease_owner = %s", (m.id, step, owner))
    _one_row(cur, m.id, f"start step {step!r}")
    cur.execute("UPDATE mover.steps SET status = 'running', started_at = coalesce(started_at, now())"
                " WHERE migration_id = %s AND name = %s AND status <> 'done'"
                " RETURNING (SELECT status FROM mover.steps WHERE migration_id = %s AND name = %s)",
                (m.id, step, m.id, step))
    row = cur.fetchone()
    if row and row[0] != "running":  # once per start, not per poll of a step that waits
        event(cur, m.id, owner, step, "step_started", f"{step} started")


def guard(cur: psycopg.Cursor, mid: int, step: str, owner: str) -> None:
    """Fail unless we still hold the lease and the migration is at `step`. FOR SHARE makes a
    concurrent takeover wait for this transaction, so our commit cannot follow a takeover."""
    cur.execute(
        "SELECT 1 FROM mover.migrations WHERE id = %s AND step = %s AND lease_owner = %s"
        " AND lease_expires_at > clock_timestamp() FOR SHARE",
        (mid, step, owner),
    )
    if cur.fetchone() is None:
        cur.execute("SELECT step, lease_owner, name FROM mover.migrations WHERE id = %s", (mid,))
        row = cur.fetchone()
        name = row[2] if row else mid
        if row and row[1] == owner and row[0] != step:
            raise Failed(f"migration {name!r} is at step {row[0]!r}, not {step!r}",
                         hint=f"`mover status {name}` shows where it stands; `mover run {name}` goes on from there")
        raise LeaseLost(f"lost the lease on migration {name!r} (now held by {row[1] if row else None!r})",
                        hint="another process took over; nothing was written by this one")


def finish_step(cur: psycopg.Cursor, m: Migration, step: str, owner: str,
                *, state: str = "running", message: str | None = None, detail: dict[str, Any] | None = None,
                duration_ms: float | None = None) -> None:
    """Mark `step` done and move to the next one — in the caller's transaction, which also holds
    the step's effect wherever PostgreSQL allows it."""
    cur.execute(
        "UPDATE mover.migrations SET step = %s, state = %s, error = NULL, updated_at = now()"
        " WHERE id = %s AND step = %s AND lease_owner = %s",
        (next_step(step), state, m.id, step, owner),
    )
    _one_row(cur, m.id, f"finish step {step!r} under lease {owner}")
    cur.execute("UPDATE mover.steps SET status = 'done', started_at = coalesce(started_at, now()),"
                " finished_at = now() WHERE migration_id = %s AND name = %s", (m.id, step))
    event(cur, m.id, owner, step, "step_done", message or f"{step} done", detail, duration_ms)


def mark_swapped(cur: psycopg.Cursor, m: Migration, owner: str, *, lock_ms: float, window_ms: int,
                 detail: dict[str, Any]) -> None:
    """The cutover committed: the rollback window opens now."""
    finish_step(cur, m, "cutover", owner, state="waiting",
                message=f"swapped {m.source} in; lock held {lock_ms:.1f} ms", detail=detail, duration_ms=lock_ms)
    cur.execute("UPDATE mover.migrations SET cutover_at = now(), cutover_lock_ms = %s,"
                " window_ends_at = now() + make_interval(secs => %s / 1000.0)"
                " WHERE id = %s AND step = 'rollback_window' AND lease_owner = %s", (lock_ms, window_ms, m.id, owner))
    _one_row(cur, m.id, "open the rollback window")


def mark_swapped_back(cur: psycopg.Cursor, m: Migration, owner: str, *, lock_ms: float, attempt: int = 1) -> None:
    """The swap back committed: the migration is at reconcile again, before the cutover gate."""
    cur.execute("UPDATE mover.migrations SET step = 'reconcile', state = 'pending', error = NULL, cutover_at = NULL,"
                " cutover_lock_ms = NULL, window_ends_at = NULL, updated_at = now()"
                " WHERE id = %s AND step = 'rollback_window' AND lease_owner = %s", (m.id, owner))
    _one_row(cur, m.id, "swap back")
    cur.execute("UPDATE mover.steps SET status = 'pending', finished_at = NULL"
                " WHERE migration_id = %s AND name = ANY(%s)", (m.id, list(_through("reconcile", "rollback_window"))))
    event(cur, m.id, owner, "rollback_window", "rolled_back", f"swapped back; lock held {lock_ms:.1f} ms",
          {"lock_ms": lock_ms, "attempt": attempt}, lock_ms)


def close_window(cur: psycopg.Cursor, m: Migration, owner: str, *, force: bool) -> bool:
    """End the rollback window when it is over (or now, with force); False while it is open."""
    cur.execute("SELECT window_ends_at <= now() FROM mover.migrations WHERE id = %s", (m.id,))
    if not one(cur)[0] and not force:
        return False
    finish_step(cur, m, "rollback_window", owner,
                message="rollback window closed" + (" early (--force)" if force else ""))
    return True


def mark_retired(cur: psycopg.Cursor, m: Migration, owner: str, *, message: str) -> None:
    """The last step: the migration is done and nobody holds it any more; what retire ended is
    resolved with it (retired_with_old_table)."""
    retired_with_old_table(cur, m, owner)
    finish_step(cur, m, STEPS[-1], owner, state="done", message=message)
    cur.execute("UPDATE mover.migrations SET finished_at = now(), lease_owner = NULL, lease_host = NULL,"
                " lease_pid = NULL, lease_expires_at = NULL WHERE id = %s AND step = %s AND lease_owner = %s",
                (m.id, FINISHED, owner))
    _one_row(cur, m.id, "finish")


RETIRED = "retired with the old table"


def retired_with_old_table(cur: psycopg.Cursor, m: Migration, owner: str) -> list[int]:
    """The divergences of the reverse direction are rows the old table could not take in the
    rollback window (a replay into it that failed: a key the old table's key cannot hold after a
    partition conversion, a value past the old type): they are about the old table, which retire
    drops (or keeps, no longer synced). Resolved with it as `retired`, in retire's transaction,
    so a finished migration shows none open; the live table holds those rows. The divergences of
    the forward direction (rows only the old table holds) are retire's refusal or the operator's
    `--give-up-rows`, before this. Returns the ids resolved."""
    kept = bool((m.plan.get("rollback") or {}).get("keep_old"))
    resolution = RETIRED + (f" (kept as {m.old}, no longer synced)" if kept else f" ({m.old} dropped)")
    cur.execute("UPDATE mover.divergences SET resolved_at = now(), resolution = %s, resolved_how = 'retired',"
                " resolved_by = %s, checked_at = now() WHERE migration_id = %s AND resolved_at IS NULL"
                " AND kind = 'apply_error' AND columns->>'direction' = 'reverse' RETURNING id, key",
                (resolution, owner, m.id))
    rows = cur.fetchall()
    if rows:
        keys = "; ".join(str(list(key)) for _, key in rows[:20]) + ("; ..." if len(rows) > 20 else "")
        event(cur, m.id, owner, STEPS[-1], "divergences_retired",
              f"{len(rows)} divergences of the old table resolved: {resolution}; the live table holds those rows"
              f" (keys {keys})", {"ids": [i for i, _ in rows]})
    return [i for i, _ in rows]


def mark_aborted(cur: psycopg.Cursor, m: Migration, owner: str) -> None:
    """Everything mover created is gone: the migration ends, its steps undone."""
    cur.execute("UPDATE mover.migrations SET state = 'aborted', error = NULL, finished_at = now(), lease_owner = NULL,"
                " lease_host = NULL, lease_pid = NULL, lease_expires_at = NULL, updated_at = now()"
                " WHERE id = %s AND lease_owner = %s AND step = ANY(%s) AND state NOT IN ('done', 'aborted')",
                (m.id, owner, sorted(COMMANDS["abort"])))
    _one_row(cur, m.id, "abort")
    cur.execute("UPDATE mover.steps SET status = 'undone' WHERE migration_id = %s AND status <> 'pending'", (m.id,))
    event(cur, m.id, owner, None, "aborted", "aborted; everything mover created was removed")


def _pending_again(cur: psycopg.Cursor, m: Migration, owner: str, *, back_to_reconcile: bool) -> None:
    """The migration pending again (its error cleared); with back_to_reconcile, one at the cutover
    gate goes back to reconcile for a full pass. The caller checks the last update's row."""
    if back_to_reconcile and m.step == "cutover":
        cur.execute("UPDATE mover.migrations SET step = 'reconcile' WHERE id = %s AND step = 'cutover'"
                    " AND lease_owner = %s", (m.id, owner))
        _one_row(cur, m.id, "go back to reconcile")
        cur.execute("UPDATE mover.steps SET status = 'pending', finished_at = NULL"
                    " WHERE migration_id = %s AND name = ANY(%s)", (m.id, list(_through("reconcile", "cutover"))))
    cur.execute("UPDATE mover.migrations SET state = 'pending', error = NULL, updated_at = now()"
                " WHERE id = %s AND lease_owner = %s AND state NOT IN ('done', 'aborted')", (m.id, owner))


def mark_adopted(cur: psycopg.Cursor, m: Migration, owner: str, *, recheck: bool, message: str,
                 detail: dict[str, Any]) -> None:
    """`mover adopt` applied a change of the live table's shape; with `recheck` (a column added
    before the swap) a migration at the cutover gate goes back to reconcile for a full pass."""
    _pending_again(cur, m, owner, back_to_reconcile=recheck)
    _one_row(cur, m.id, "record the adopted change")
    event(cur, m.id, owner, m.step, "adopted", message, detail)


def mark_recaptured(cur: psycopg.Cursor, m: Migration, owner: str, *, slot: str) -> None:
    """`mover recapture`: logical capture restarted from a new slot after the old one was lost; the
    next reconcile pass compares every range (a migration at the cutover gate goes back to it)."""
    _pending_again(cur, m, owner, back_to_reconcile=True)
    _one_row(cur, m.id, "record the new capture slot")
    event(cur, m.id, owner, m.step, "capture_recovered",
          f"logical capture restarted from a new replication slot {slot}; the next reconcile pass compares every"
          f" range", {"slot": slot})


def mark_capture_restored(cur: psycopg.Cursor, m: Migration, owner: str, gaps: list[str]) -> None:
    """Capture is in force again after a gap (mover/engines/capture/integrity.py): as after `mover
    recapture`, the next reconcile pass compares every range (the caller forgot the ranges), and a
    migration at the cutover gate goes back to reconcile for it."""
    _pending_again(cur, m, owner, back_to_reconcile=True)
    _one_row(cur, m.id, "record the capture restored")
    event(cur, m.id, owner, m.step, "capture_recovered",
          f"capture in force again after a gap ({'; '.join(gaps)}); the next reconcile pass compares every range",
          {"gaps": gaps})


def set_paused(cur: psycopg.Cursor, name: str, paused: bool, actor: str) -> Migration:
    """`mover pause` / `unpause`: a flag the workers read; no lease needed, the row lock orders it."""
    m = head_of(cur, get(cur, name, lock=True))
    require_command(m, "pause" if paused else "unpause")
    cur.execute("UPDATE mover.migrations SET paused = %s, updated_at = now() WHERE id = %s"
                " AND state NOT IN ('done', 'aborted')", (paused, m.id))
    _one_row(cur, m.id, "pause" if paused else "unpause")
    if m.family_id is not None:  # every table of the family: each one's workers read its own row
        cur.execute("UPDATE mover.migrations SET paused = %s, updated_at = now() WHERE family_id = %s AND id <> %s"
                    " AND state NOT IN ('done', 'aborted')", (paused, m.family_id, m.id))
    event(cur, m.id, actor, None, "paused" if paused else "unpaused",
          "paused by the operator" if paused else "unpaused by the operator")
    return m


def set_aside_aborted(cur: psycopg.Cursor, m: Migration, actor: str) -> None:
    """Keep an aborted attempt's history under another name, so that its plan can start afresh
    (a family's tables with it: their names come back with the plan)."""
    cur.execute("UPDATE mover.migrations SET name = name || '#' || id WHERE id = %s AND state = 'aborted'", (m.id,))
    _one_row(cur, m.id, "be set aside")
    if m.family_id is not None:
        cur.execute("UPDATE mover.migrations SET name = name || '#' || id WHERE family_id = %s AND id <> %s"
                    " AND state = 'aborted'", (m.family_id, m.id))
    event(cur, m.id, actor, None, "set_aside", f"renamed {m.name!r} to {m.name}#{m.id}: its plan starts afresh")


# ---------------------------------------------------------------------------------------------
# The orchestrator's lease


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take_leases(cur: psycopg.Cursor, rows: Sequence[Migration], owner: str) -> None:
    """Take the lease of every row of a migration (a family's, the head's first: two takers queue on
    its row lock). A previous holder that never released it ended without finishing (kill -9, a
    lost server connection, a stalled process whose lease ran out): what it was doing is recorded
    here, on the head, as a failed attempt of the migration (`mover history` counts it, the
    attempt of the step it was in ends "failed"), naming the table and step it died in; its
    steps left "running" are pending again, so that the step this process resumes starts a new
    attempt."""
    previous = [p for row in rows if (p := acquire_lease(cur, row, owner)) is not None]
    if previous:
        _record_lost_holder(cur, rows, owner, previous[0])


def _record_lost_holder(cur: psycopg.Cursor, rows: Sequence[Migration], owner: str,
                        previous: tuple[str, str | None, int | None, bool]) -> None:
    holder, host, pid, live = previous
    ids = [row.id for row in rows]
    cur.execute("SELECT m.id, s.name FROM mover.steps s JOIN mover.migrations m ON m.id = s.migration_id"
                " WHERE s.migration_id = ANY(%s) AND s.status = 'running' AND m.state NOT IN ('done', 'aborted')"
                " ORDER BY m.family_position NULLS FIRST, s.position LIMIT 1", (ids,))
    running = cur.fetchone()
    if running is None:
        cur.execute("SELECT id, step FROM mover.migrations WHERE id = ANY(%s) AND state = 'running'"
                    " ORDER BY family_position NULLS FIRST LIMIT 1", (ids,))
        running = cur.fetchone()
    by_id = {row.id: row for row in rows}
    head = rows[0]
    where = ""
    step = None
    detail: dict[str, Any] = {"previous": holder, "host": host, "pid": pid, "lease_live": live}
    if running is not None:
        mid, step = running
        step = shown_step(step)
        where = f" in step {step}" + (f" of {by_id[mid].source}" if len(rows) > 1 else "")
        detail[CONCERNS] = mid
    how = "its process is gone" if live else "its lease expired"
    cur.execute("UPDATE mover.steps SET status = 'pending' WHERE migration_id = ANY(%s) AND status = 'running'",
                (ids,))
    event(cur, head.id, owner, step, "failed",
          f"process {pid} on {host} ended without finishing{where} ({how}: killed, or it lost its connection to"
          f" the server); {owner} took over", detail)


def acquire_lease(cur: psycopg.Cursor, m: Migration, owner: str) -> tuple[str, str | None, int | None, bool] | None:
    """Take the lease if free, expired, ours, or held by a dead process on this host. Returns the
    previous holder (owner, host, pid, lease still live) when it was another process's."""
    host, pid = socket.gethostname(), os.getpid()
    cur.execute("SELECT lease_owner, lease_host, lease_pid, lease_expires_at > clock_timestamp()"
                " FROM mover.migrations WHERE id = %s FOR UPDATE", (m.id,))
    holder, holder_host, holder_pid, live = one(cur)
    if holder is not None and holder != owner and live:
        if not (holder_host == host and holder_pid is not None and not process_alive(holder_pid)):
            raise LeaseHeld(
                f"migration {m.name!r} is being run by {holder} (host {holder_host}, pid {holder_pid})",
                hint=f"wait for it to finish, or stop that process; its lease expires {LEASE_SECONDS}s "
                     f"after its last heartbeat",
            )
    cur.execute(
        "UPDATE mover.migrations SET lease_owner = %s, lease_host = %s, lease_pid = %s,"
        " lease_expires_at = clock_timestamp() + make_interval(secs => %s), heartbeat_at = clock_timestamp()"
        " WHERE id = %s",
        (owner, host, pid, LEASE_SECONDS, m.id),
    )
    if holder is not None and holder != owner:
        ended = end_stale_appliers(cur, m.id)
        event(cur, m.id, owner, None, "lease_taken_over", f"lease taken over from {holder}",
              {"previous": holder, "previous_live": bool(live), "applier_sessions_ended": ended})
        return holder, holder_host, holder_pid, bool(live)
    return None


# capture.py's advisory locks, and logical.py's feeder lock, keyed (name, migration)
APPLIER_LOCKS = ("mover.apply", "mover.apply.reverse", "mover.feed")


def end_stale_appliers(cur: psycopg.Cursor, mid: int) -> list[int]:
    """At a takeover: end every other session holding the migration's applier lock. The process
    whose lease expired may be stalled rather than dead (a paused VM, SIGSTOP) inside a replay
    batch, and a transaction that never ends would keep every later applier out (their batches
    only try the lock). A live `mover worker` caught in a batch retries it on a new connection;
    the stalled process finds its connection gone, then its lease lost. Returns their pids."""
    cur.execute(
        "SELECT pid, pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        # pg_advisory_xact_lock(int4, int4) shows its keys as classid, objid (unsigned) and objsubid 2
        " AND classid::bigint IN (SELECT hashtext(n)::bigint & 4294967295 FROM unnest(%s::text[]) n)"
        " AND objid::bigint = %s AND objsubid = 2 AND pid <> pg_backend_pid()", (list(APPLIER_LOCKS), mid))
    pids = [r[0] for r in cur.fetchall()]
    if pids:
        log.warning("ended the sessions %s holding the applier lock of migration %s at the takeover", pids, mid)
    return pids


def heartbeat(cur: psycopg.Cursor, mid: int, owner: str) -> bool:
    """Extend `owner`'s lease; False when another process holds the migration. A migration this
    process has just finished (retire, abort release the lease in their own transition) is not a
    lost lease: nobody can take it over, and the beats between that commit and the end of the
    command would otherwise report a finished run as taken over."""
    cur.execute(
        "UPDATE mover.migrations SET lease_expires_at = clock_timestamp() + make_interval(secs => %s),"
        " heartbeat_at = clock_timestamp() WHERE id = %s AND lease_owner = %s",
        (LEASE_SECONDS, mid, owner),
    )
    if cur.rowcount == 1:
        return True
    cur.execute("SELECT lease_owner IS NULL AND state = ANY(%s) FROM mover.migrations WHERE id = %s",
                (list(TERMINAL), mid))
    row = cur.fetchone()
    return bool(row and row[0])


def lease_live(cur: psycopg.Cursor, mid: int) -> bool:
    """Whether a live process holds the migration's lease (whoever it is)."""
    cur.execute("SELECT lease_expires_at > clock_timestamp() FROM mover.migrations WHERE id = %s", (mid,))
    row = cur.fetchone()
    return bool(row and row[0])


def release_lease(cur: psycopg.Cursor, mid: int, owner: str) -> None:
    # Nobody runs it any more: a migration left 'running' (one step done, say) is ready to resume.
    cur.execute("UPDATE mover.migrations SET lease_owner = NULL, lease_host = NULL, lease_pid = NULL,"
                " lease_expires_at = NULL, state = CASE WHEN state = 'running' THEN 'pending' ELSE state END"
                " WHERE id = %s AND lease_owner = %s", (mid, owner))


# ---------------------------------------------------------------------------------------------
# Ranges


def range_totals(cur: psycopg.Cursor, mid: int, kind: str) -> tuple[int, int, int]:
    """(rows, ranges done, ranges known)."""
    cur.execute("SELECT coalesce(sum(rows) FILTER (WHERE status = 'done'), 0), count(*) FILTER (WHERE status = 'done'),"
                " count(*) FROM mover.ranges WHERE migration_id = %s AND kind = %s", (mid, kind))
    rows, done, total = one(cur)
    return int(rows), done, total


# ---------------------------------------------------------------------------------------------
# Divergences


def record_divergence(cur: psycopg.Cursor, mid: int, key: list[str], kind: str, columns: Any) -> None:
    cur.execute("INSERT INTO mover.divergences (migration_id, key, kind, columns) VALUES (%s, %s, %s, %s)",
                (mid, key, kind, json.dumps(columns, default=str)))


def open_divergences(cur: psycopg.Cursor, mid: int) -> int:
    cur.execute("SELECT count(*) FROM mover.divergences WHERE migration_id = %s AND resolved_at IS NULL", (mid,))
    return int(one(cur)[0])


def list_divergences(cur: psycopg.Cursor, mid: int, include_resolved: bool = False) -> list[dict[str, Any]]:
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT id, key, kind, columns, found_at, resolved_at, resolution, resolved_how, resolved_by,"
                     " reason, checked_at FROM mover.divergences"
                     " WHERE migration_id = %s AND (%s OR resolved_at IS NULL) ORDER BY id", (mid, include_resolved))
        return dcur.fetchall()


def resolve_divergences_as(cur: psycopg.Cursor, mid: int, ids: list[int], how: str, resolution: str,
                           actor: str, reason: str | None = None) -> list[int]:
    """Close open divergences, recording how (equal_on_recheck, repaired, accepted), by whom and why."""
    if not ids:
        return []
    cur.execute("UPDATE mover.divergences SET resolved_at = now(), resolution = %s, resolved_how = %s,"
                " resolved_by = %s, reason = %s, checked_at = now()"
                " WHERE migration_id = %s AND id = ANY(%s) AND resolved_at IS NULL RETURNING id",
                (resolution, how, actor, reason, mid, ids))
    return [r[0] for r in cur.fetchall()]


def update_divergence(cur: psycopg.Cursor, mid: int, did: int, kind: str, columns: Any) -> None:
    """An open divergence found again, possibly with other values: keep its id and found_at."""
    cur.execute("UPDATE mover.divergences SET kind = %s, columns = %s, checked_at = now()"
                " WHERE migration_id = %s AND id = %s", (kind, json.dumps(columns, default=str), mid, did))


def open_divergence_rows(cur: psycopg.Cursor, mid: int, did: int | None = None) -> list[dict[str, Any]]:
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT id, key, kind, columns FROM mover.divergences WHERE migration_id = %s"
                     " AND resolved_at IS NULL AND (%s::bigint IS NULL OR id = %s) ORDER BY id", (mid, did, did))
        return dcur.fetchall()


def divergence_counts(cur: psycopg.Cursor, mid: int) -> dict[str, Any]:
    """Open divergences by kind, and how the closed ones were closed."""
    cur.execute("SELECT kind, count(*) FROM mover.divergences WHERE migration_id = %s AND resolved_at IS NULL"
                " GROUP BY kind ORDER BY kind", (mid,))
    open_by_kind: dict[str, int] = dict(cur.fetchall())
    cur.execute("SELECT coalesce(resolved_how, 'superseded'), count(*) FROM mover.divergences"
                " WHERE migration_id = %s AND resolved_at IS NOT NULL GROUP BY 1 ORDER BY 1", (mid,))
    return {"open": sum(open_by_kind.values()), "open_by_kind": open_by_kind, "resolved_by_how": dict(cur.fetchall())}


# ---------------------------------------------------------------------------------------------
# Reconcile ranges (mover/engines/bulk/reconcile.py): what each verified range held on both sides


def reconcile_ranges(cur: psycopg.Cursor, mid: int) -> dict[str, Any]:
    cur.execute(
        """
        SELECT count(*) FILTER (WHERE status = 'done'), count(*), count(*) FILTER (WHERE status = 'failed'),
               coalesce(sum(src_rows) FILTER (WHERE status = 'done'), 0),
               coalesce(sum(dst_rows) FILTER (WHERE status = 'done'), 0),
               min(verified_at) FILTER (WHERE status = 'done'), max(verified_at) FILTER (WHERE status = 'done')
        FROM mover.ranges WHERE migration_id = %s AND kind = 'reconcile'
        """, (mid,))
    done, total, failed, src_rows, dst_rows, oldest, newest = one(cur)
    return {"ranges_done": done, "ranges_total": total, "ranges_failed": failed, "source_rows": int(src_rows),
            "target_rows": int(dst_rows), "oldest_verification": oldest, "newest_verification": newest}
