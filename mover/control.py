"""The only code that reads or writes mover's control schema.

Every state change is a guarded UPDATE (`WHERE id = %s AND step = %s AND lease_owner = %s`)
that must hit exactly one row, and writes an events row in the same transaction: a process
that lost its lease, or that works from a stale idea of the step, changes nothing.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from mover.db import one
from mover.errors import BadInput, Failed, LeaseHeld, LeaseLost, NotFound
from mover.names import CONTROL_SCHEMA, QualifiedName

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
            lease_expires_at=r["lease_expires_at"],
        )

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
    here = Path(__file__).resolve().parent.parent / "alembic"
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

    from mover.db import application_name

    _check_init_privileges(dsn)
    # A creator keeps libpq's own DSN handling (URLs, key=value, PG* variables, passfile); no
    # server-side prepared statements, as on all of mover's connections (see db.connect).
    engine = create_engine("postgresql+psycopg://",
                           creator=lambda: psycopg.connect(dsn, application_name=application_name("mover-init"),
                                                           prepare_threshold=None),
                           poolclass=NullPool)
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
                           hint="see README.md \"Privileges\": let the migrating role own schema \"mover\" "
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
                     f"what README.md \"Privileges\" (setup B) lists")


def schema_ready(cur: psycopg.Cursor) -> bool:
    cur.execute("SELECT to_regclass('mover.migrations') IS NOT NULL")
    return one(cur)[0]


# ---------------------------------------------------------------------------------------------
# Migrations


def _fetch(cur: psycopg.Cursor, where: sql.Composable, params: tuple, lock: bool = False) -> list[Migration]:
    q = sql.SQL("SELECT * FROM mover.migrations WHERE {} ORDER BY id{}").format(
        where, sql.SQL(" FOR UPDATE") if lock else sql.SQL(""))
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


def list_all(cur: psycopg.Cursor) -> list[Migration]:
    return _fetch(cur, sql.SQL("true"), ())


def active_on_source(cur: psycopg.Cursor, source: QualifiedName) -> Migration | None:
    rows = _fetch(cur, sql.SQL("source_schema = %s AND source_table = %s AND state NOT IN ('done', 'aborted')"),
                  (source.schema, source.name))
    return rows[0] if rows else None


def register(cur: psycopg.Cursor, *, name: str, plan: dict, plan_hash: str, source: QualifiedName,
             target: QualifiedName, old: QualifiedName, key: list[str], actor: str) -> Migration:
    cur.execute(
        """
        INSERT INTO mover.migrations (name, plan, plan_hash, source_schema, source_table, target_schema,
                                      target_table, old_schema, old_table, key_columns)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id
        """,
        (name, json.dumps(plan), plan_hash, source.schema, source.name, target.schema, target.name,
         old.schema, old.name, key),
    )
    mid = one(cur)[0]
    cur.executemany("INSERT INTO mover.steps (migration_id, name, position) VALUES (%s, %s, %s)",
                    [(mid, s, i) for i, s in enumerate(STEPS)])
    event(cur, mid, actor, None, "registered", f"migration {name!r} registered", {"plan": plan})
    return get_by_id(cur, mid)


def update_plan(cur: psycopg.Cursor, mid: int, plan: dict, actor: str) -> None:
    """Tunables changed between runs (the shape hash is the same): keep the new values."""
    cur.execute("UPDATE mover.migrations SET plan = %s, updated_at = now() WHERE id = %s", (json.dumps(plan), mid))
    event(cur, mid, actor, None, "plan_updated", "tunable settings changed", {"plan": plan})


def shapes(cur: psycopg.Cursor, mid: int) -> dict[str, dict[str, Any] | None]:
    """The recorded descriptions of the original ("source") and new ("target") table (mover/shape.py)."""
    cur.execute("SELECT source_shape, target_shape FROM mover.migrations WHERE id = %s", (mid,))
    row = cur.fetchone()
    return {"source": row[0], "target": row[1]} if row else {"source": None, "target": None}


def store_shape(cur: psycopg.Cursor, mid: int, side: str, description: dict[str, Any], fingerprint: str) -> None:
    if side not in ("source", "target"):
        raise ValueError(side)
    cur.execute(sql.SQL("UPDATE mover.migrations SET {} = %s, {} = %s WHERE id = %s").format(
        sql.Identifier(f"{side}_shape"), sql.Identifier(f"{side}_fingerprint")),
        (json.dumps(description), fingerprint, mid))


def event(cur: psycopg.Cursor, mid: int, actor: str, step: str | None, kind: str, message: str,
          detail: dict | None = None, duration_ms: float | None = None) -> None:
    cur.execute(
        "INSERT INTO mover.events (migration_id, actor, step, kind, message, detail, duration_ms)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (mid, actor, step, kind, message, json.dumps(detail, default=str) if detail is not None else None,
         duration_ms),
    )


def events(cur: psycopg.Cursor, mid: int, limit: int = 50) -> list[dict[str, Any]]:
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT * FROM (SELECT at, actor, step, kind, message, duration_ms, id FROM mover.events"
                     " WHERE migration_id = %s ORDER BY id DESC LIMIT %s) e ORDER BY id", (mid, limit))
        return dcur.fetchall()


def steps(cur: psycopg.Cursor, mid: int) -> list[dict[str, Any]]:
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT name, status, started_at, finished_at FROM mover.steps WHERE migration_id = %s"
                     " ORDER BY position", (mid,))
        return dcur.fetchall()


def set_state(cur: psycopg.Cursor, mid: int, state: str, *, error: str | None = None, owner: str | None = None,
              expect_owner: bool = True) -> None:
    """Change the state column; when `owner` is given the change is guarded by the lease."""
    q = "UPDATE mover.migrations SET state = %s, error = %s, updated_at = now() WHERE id = %s"
    params: tuple = (state, error, mid)
    if owner is not None and expect_owner:
        q += " AND lease_owner = %s"
        params += (owner,)
    cur.execute(q, params)
    if cur.rowcount != 1:
        raise LeaseLost(f"migration {mid} changed hands while setting state {state!r}")


def start_step(cur: psycopg.Cursor, m: Migration, step: str, owner: str) -> None:
    guard(cur, m.id, step, owner)
    cur.execute("UPDATE mover.steps SET status = 'running', started_at = coalesce(started_at, now())"
                " WHERE migration_id = %s AND name = %s AND status <> 'done'", (m.id, step))
    cur.execute("UPDATE mover.migrations SET state = 'running', error = NULL, updated_at = now() WHERE id = %s",
                (m.id,))


def guard(cur: psycopg.Cursor, mid: int, step: str, owner: str) -> None:
    """Fail unless we still hold the lease and the migration is at `step`. FOR SHARE makes a
    concurrent takeover wait for this transaction, so our commit cannot follow a takeover."""
    cur.execute(
        "SELECT 1 FROM mover.migrations WHERE id = %s AND step = %s AND lease_owner = %s"
        " AND lease_expires_at > clock_timestamp() FOR SHARE",
        (mid, step, owner),
    )
    if cur.fetchone() is None:
        cur.execute("SELECT step, lease_owner FROM mover.migrations WHERE id = %s", (mid,))
        row = cur.fetchone()
        if row and row[1] == owner and row[0] != step:
            raise Failed(f"migration {mid} is at step {row[0]!r}, not {step!r}")
        raise LeaseLost(f"lost the lease on migration {mid} (now held by {row[1] if row else None!r})",
                        hint="another process took over; nothing was written by this one")


def finish_step(cur: psycopg.Cursor, m: Migration, step: str, next_step: str, owner: str,
                *, state: str = "running", message: str | None = None, detail: dict | None = None,
                duration_ms: float | None = None) -> None:
    """Mark `step` done and move to `next_step` — in the caller's transaction, which also holds
    the step's effect wherever PostgreSQL allows it."""
    cur.execute(
        "UPDATE mover.migrations SET step = %s, state = %s, error = NULL, updated_at = now()"
        " WHERE id = %s AND step = %s AND lease_owner = %s",
        (next_step, state, m.id, step, owner),
    )
    if cur.rowcount != 1:
        raise LeaseLost(f"lost the lease: migration {m.name!r} is no longer at step {step!r} under this process's "
                        f"lease", hint="another process took over; this one stopped")
    cur.execute("UPDATE mover.steps SET status = 'done', started_at = coalesce(started_at, now()),"
                " finished_at = now() WHERE migration_id = %s AND name = %s", (m.id, step))
    event(cur, m.id, owner, step, "step_done", message or f"{step} done", detail, duration_ms)


def reopen_steps(cur: psycopg.Cursor, mid: int, names: list[str]) -> None:
    cur.execute("UPDATE mover.steps SET status = 'pending', finished_at = NULL"
                " WHERE migration_id = %s AND name = ANY(%s)", (mid, names))


def move_to(cur: psycopg.Cursor, mid: int, step: str, state: str, **columns: Any) -> None:
    """Unguarded step change for operator commands that hold the lease already (checked by caller)."""
    sets: list[sql.Composable] = [sql.SQL("step = %s"), sql.SQL("state = %s"), sql.SQL("updated_at = now()")]
    params: list[Any] = [step, state]
    for col, value in columns.items():
        sets.append(sql.SQL("{} = %s").format(sql.Identifier(col)))
        params.append(value)
    cur.execute(sql.SQL("UPDATE mover.migrations SET {} WHERE id = %s").format(sql.SQL(", ").join(sets)),
                (*params, mid))


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


def acquire_lease(cur: psycopg.Cursor, m: Migration, owner: str) -> None:
    """Take the lease if free, expired, ours, or held by a dead process on this host."""
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
        event(cur, m.id, owner, None, "lease_taken_over", f"lease taken over from {holder}",
              {"previous": holder, "previous_live": bool(live)})


def heartbeat(cur: psycopg.Cursor, mid: int, owner: str) -> bool:
    cur.execute(
        "UPDATE mover.migrations SET lease_expires_at = clock_timestamp() + make_interval(secs => %s),"
        " heartbeat_at = clock_timestamp() WHERE id = %s AND lease_owner = %s",
        (LEASE_SECONDS, mid, owner),
    )
    return cur.rowcount == 1


def release_lease(cur: psycopg.Cursor, mid: int, owner: str) -> None:
    # Nobody runs it any more: a migration left 'running' (one step done, say) is ready to resume.
    cur.execute("UPDATE mover.migrations SET lease_owner = NULL, lease_host = NULL, lease_pid = NULL,"
                " lease_expires_at = NULL, state = CASE WHEN state = 'running' THEN 'pending' ELSE state END"
                " WHERE id = %s AND lease_owner = %s", (mid, owner))


# ---------------------------------------------------------------------------------------------
# Chunks


def last_chunk(cur: psycopg.Cursor, mid: int, kind: str) -> tuple[int, list[str] | None, list[str] | None] | None:
    cur.execute("SELECT chunk_no, lo, hi FROM mover.chunks WHERE migration_id = %s AND kind = %s"
                " ORDER BY chunk_no DESC LIMIT 1", (mid, kind))
    row = cur.fetchone()
    return None if row is None else (row[0], row[1], row[2])


def record_chunk(cur: psycopg.Cursor, mid: int, kind: str, chunk_no: int, lo: list[str] | None,
                 hi: list[str] | None, rows: int, duration_ms: float, owner: str) -> None:
    cur.execute(
        "INSERT INTO mover.chunks (migration_id, kind, chunk_no, lo, hi, status, owner, attempts, rows,"
        " duration_ms, finished_at) VALUES (%s, %s, %s, %s, %s, 'done', %s, 1, %s, %s, clock_timestamp())",
        (mid, kind, chunk_no, lo, hi, owner, rows, duration_ms),
    )


def chunk_totals(cur: psycopg.Cursor, mid: int, kind: str) -> tuple[int, int, int]:
    """(rows, chunks done, chunks known)."""
    cur.execute("SELECT coalesce(sum(rows) FILTER (WHERE status = 'done'), 0), count(*) FILTER (WHERE status = 'done'),"
                " count(*) FROM mover.chunks WHERE migration_id = %s AND kind = %s", (mid, kind))
    rows, done, total = one(cur)
    return int(rows), done, total


def clear_chunks(cur: psycopg.Cursor, mid: int, kind: str) -> None:
    cur.execute("DELETE FROM mover.chunks WHERE migration_id = %s AND kind = %s", (mid, kind))


# ---------------------------------------------------------------------------------------------
# Divergences


def record_divergence(cur: psycopg.Cursor, mid: int, key: list[str], kind: str, columns: Any) -> None:
    cur.execute("INSERT INTO mover.divergences (migration_id, key, kind, columns) VALUES (%s, %s, %s, %s)",
                (mid, key, kind, json.dumps(columns, default=str)))


def open_divergences(cur: psycopg.Cursor, mid: int) -> int:
    cur.execute("SELECT count(*) FROM mover.divergences WHERE migration_id = %s AND resolved_at IS NULL", (mid,))
    return one(cur)[0]


def list_divergences(cur: psycopg.Cursor, mid: int, include_resolved: bool = False) -> list[dict[str, Any]]:
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT id, key, kind, columns, found_at, resolved_at, resolution, resolved_how, resolved_by,"
                     " reason, checked_at FROM mover.divergences"
                     " WHERE migration_id = %s AND (%s OR resolved_at IS NULL) ORDER BY id", (mid, include_resolved))
        return dcur.fetchall()


def resolve_divergences(cur: psycopg.Cursor, mid: int, ids: list[int], resolution: str) -> None:
    cur.execute("UPDATE mover.divergences SET resolved_at = now(), resolution = %s"
                " WHERE migration_id = %s AND id = ANY(%s) AND resolved_at IS NULL", (resolution, mid, ids))


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
# Reconcile ranges (mover/reconcile.py): what each verified range held on both sides


def store_range_fingerprint(cur: psycopg.Cursor, mid: int, chunk_no: int, src_rows: int, src_fingerprint: int,
                            dst_rows: int, dst_fingerprint: int, differences: int) -> None:
    cur.execute("UPDATE mover.chunks SET src_rows = %s, src_fingerprint = %s, dst_rows = %s, dst_fingerprint = %s,"
                " differences = %s, verified_at = clock_timestamp()"
                " WHERE migration_id = %s AND kind = 'reconcile' AND chunk_no = %s",
                (src_rows, src_fingerprint, dst_rows, dst_fingerprint, differences, mid, chunk_no))


def reconcile_ranges(cur: psycopg.Cursor, mid: int) -> dict[str, Any]:
    cur.execute(
        """
        SELECT count(*) FILTER (WHERE status = 'done'), count(*), count(*) FILTER (WHERE status = 'failed'),
               coalesce(sum(src_rows) FILTER (WHERE status = 'done'), 0),
               coalesce(sum(dst_rows) FILTER (WHERE status = 'done'), 0),
               min(verified_at) FILTER (WHERE status = 'done'), max(verified_at) FILTER (WHERE status = 'done')
        FROM mover.chunks WHERE migration_id = %s AND kind = 'reconcile'
        """, (mid,))
    done, total, failed, src_rows, dst_rows, oldest, newest = one(cur)
    return {"ranges_done": done, "ranges_total": total, "ranges_failed": failed, "source_rows": int(src_rows),
            "target_rows": int(dst_rows), "oldest_verification": oldest, "newest_verification": newest}


def range_fingerprints(cur: psycopg.Cursor, mid: int) -> list[dict[str, Any]]:
    with cur.connection.cursor(row_factory=dict_row) as dcur:
        dcur.execute("SELECT chunk_no, lo, hi, status, src_rows, src_fingerprint, dst_rows, dst_fingerprint,"
                     " differences, verified_at FROM mover.chunks WHERE migration_id = %s AND kind = 'reconcile'"
                     " ORDER BY chunk_no", (mid,))
        return dcur.fetchall()

