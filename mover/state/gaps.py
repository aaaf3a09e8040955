"""Capture integrity's state (invariant 14): mover.capture_marks (what mover last verified of each
capture object: its catalog row's oid and raw xmin) and mover.capture_gaps (each time capture was
found not continuously in force). The only code that writes them; mover/engines/capture/integrity.py
decides what a gap is.

A gap's life: found (detected_at; restored_at NULL while the object is not in force), restored
(restored_at: capture is in force again, verified by mover, and the marks are the new rows), then
covered (compared_at): a full comparison (forward: a reconcile pass over every range) or a full
re-sync (reverse) started after restored_at has run. Until then the swap in that direction refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

DIRECTIONS = ("forward", "reverse")


def direction(reverse: bool) -> str:
    return DIRECTIONS[1 if reverse else 0]


@dataclass(frozen=True)
class Gap:
    id: int
    direction: str
    object: str
    relation: str | None
    seen: str
    fix: str | None
    detected_at: datetime
    restored_at: datetime | None
    compared_at: datetime | None
    resolution: str | None

    @property
    def restored(self) -> bool:
        return self.restored_at is not None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "direction": self.direction, "object": self.object, "relation": self.relation,
                "seen": self.seen, "fix": self.fix, "detected_at": self.detected_at, "restored_at": self.restored_at,
                "compared_at": self.compared_at, "resolution": self.resolution}


_COLUMNS = "id, direction, object, relation, seen, fix, detected_at, restored_at, compared_at, resolution"


def mark(cur: psycopg.Cursor, mid: int, reverse: bool, rows: list[tuple[str, int, str, str]]) -> None:
    """Record (object, oid, xmin, state) as verified now for this direction: its marks replaced."""
    d = direction(reverse)
    cur.execute("DELETE FROM mover.capture_marks WHERE migration_id = %s AND direction = %s", (mid, d))
    if not rows:
        return
    # One statement: a partitioned table has two objects a partition, and the swap marks them
    # under its lock (a statement each held it 443 ms with 1,076 partitions).
    objs, oids, xmins, states = (list(column) for column in zip(*rows, strict=True))
    cur.execute("INSERT INTO mover.capture_marks (migration_id, direction, object, object_oid, row_xmin, state)"
                " SELECT %s, %s, r.object, r.oid, r.xmin, r.state"
                " FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[]) AS r(object, oid, xmin, state)",
                (mid, d, objs, oids, xmins, states))


def remark(cur: psycopg.Cursor, mid: int, reverse: bool, obj: str, oid: int, xmin: str, state: str) -> None:
    """One object verified in force again (its row is a new one): the new row is the mark."""
    cur.execute("INSERT INTO mover.capture_marks (migration_id, direction, object, object_oid, row_xmin, state)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (migration_id, direction, object) DO UPDATE"
                " SET object_oid = EXCLUDED.object_oid, row_xmin = EXCLUDED.row_xmin, state = EXCLUDED.state,"
                " marked_at = clock_timestamp()", (mid, direction(reverse), obj, oid, xmin, state))


def forget_marks(cur: psycopg.Cursor, mid: int, reverse: bool) -> None:
    """The direction's capture was removed by mover itself (the swap hands it over)."""
    cur.execute("DELETE FROM mover.capture_marks WHERE migration_id = %s AND direction = %s", (mid, direction(reverse)))


def open_gaps(cur: psycopg.Cursor, mid: int, reverse: bool | None = None) -> list[Gap]:
    """The gaps not yet covered by a comparison run after capture was restored (both directions
    with reverse None), oldest first."""
    dirs = list(DIRECTIONS) if reverse is None else [direction(reverse)]
    cur.execute(f"SELECT {_COLUMNS} FROM mover.capture_gaps WHERE migration_id = %s AND direction = ANY(%s)"
                " AND compared_at IS NULL ORDER BY id", (mid, dirs))
    return [Gap(*r) for r in cur.fetchall()]


def recent_gaps(cur: psycopg.Cursor, mid: int, reverse: bool = False, limit: int = 3) -> list[Gap]:
    """The newest gaps of a direction, covered or not (a refusal over divergences names them)."""
    cur.execute(f"SELECT {_COLUMNS} FROM mover.capture_gaps WHERE migration_id = %s AND direction = %s"
                " ORDER BY id DESC LIMIT %s", (mid, direction(reverse), limit))
    return [Gap(*r) for r in cur.fetchall()]


def all_gaps(cur: psycopg.Cursor, mid: int) -> list[Gap]:
    cur.execute(f"SELECT {_COLUMNS} FROM mover.capture_gaps WHERE migration_id = %s ORDER BY id", (mid,))
    return [Gap(*r) for r in cur.fetchall()]


def record(cur: psycopg.Cursor, mid: int, reverse: bool, obj: str, relation: str, seen: str, fix: str | None,
           *, restored: bool) -> tuple[Gap, bool]:
    """A gap in `obj`: the open one not yet restored is updated (what is seen now), else a new one.
    `restored`: the object is in force again now. Returns the gap and whether it is new."""
    d = direction(reverse)
    cur.execute(f"SELECT {_COLUMNS} FROM mover.capture_gaps WHERE migration_id = %s AND direction = %s"
                " AND object = %s AND restored_at IS NULL AND compared_at IS NULL ORDER BY id DESC LIMIT 1 FOR UPDATE",
                (mid, d, obj))
    row = cur.fetchone()
    if row is not None:
        cur.execute(f"UPDATE mover.capture_gaps SET seen = CASE WHEN %(restored)s THEN seen ELSE %(seen)s END,"
                    f" fix = %(fix)s, restored_at = CASE WHEN %(restored)s THEN clock_timestamp() END"
                    f" WHERE id = %(id)s RETURNING {_COLUMNS}",
                    {"restored": restored, "seen": seen, "fix": fix, "id": row[0]})
        return Gap(*cur.fetchone()), False  # type: ignore[misc]
    cur.execute(f"INSERT INTO mover.capture_gaps (migration_id, direction, object, relation, seen, fix, restored_at)"
                f" VALUES (%s, %s, %s, %s, %s, %s, CASE WHEN %s THEN clock_timestamp() END) RETURNING {_COLUMNS}",
                (mid, d, obj, relation, seen, fix, restored))
    return Gap(*cur.fetchone()), True  # type: ignore[misc]


def found_by_comparison(cur: psycopg.Cursor, mid: int, obj: str, seen: str) -> Gap:
    """A forward gap a reconcile comparison found (no catalog object to name): covered by that
    comparison already, recorded so that the refusals name it."""
    cur.execute(f"INSERT INTO mover.capture_gaps (migration_id, direction, object, seen, restored_at, compared_at,"
                f" resolution) VALUES (%s, 'forward', %s, %s, clock_timestamp(), clock_timestamp(),"
                f" 'found by the comparison itself') RETURNING {_COLUMNS}", (mid, obj, seen))
    return Gap(*cur.fetchone())  # type: ignore[misc]


def restored_now(cur: psycopg.Cursor, mid: int, obj: str, relation: str, seen: str) -> Gap:
    """A forward gap mover closed itself just now (`mover recapture`: a new slot): in force again,
    not yet compared."""
    cur.execute(f"INSERT INTO mover.capture_gaps (migration_id, direction, object, relation, seen, restored_at)"
                f" VALUES (%s, 'forward', %s, %s, %s, clock_timestamp()) RETURNING {_COLUMNS}",
                (mid, obj, relation, seen))
    return Gap(*cur.fetchone())  # type: ignore[misc]


def covered(cur: psycopg.Cursor, mid: int, reverse: bool, since: datetime, how: str) -> list[Gap]:
    """The restored gaps of a direction that a full comparison (or re-sync) started at `since`
    covers: those restored before it. Returns them."""
    cur.execute(f"UPDATE mover.capture_gaps SET compared_at = clock_timestamp(), resolution = %s"
                f" WHERE migration_id = %s AND direction = %s AND compared_at IS NULL AND restored_at <= %s"
                f" RETURNING {_COLUMNS}", (how, mid, direction(reverse), since))
    return [Gap(*r) for r in cur.fetchall()]


def given_up(cur: psycopg.Cursor, mid: int, reverse: bool, ids: list[int], how: str) -> None:
    """The operator gave up what the gaps may have lost (`--give-up-rows`)."""
    cur.execute("UPDATE mover.capture_gaps SET compared_at = clock_timestamp(), resolution = %s"
                " WHERE migration_id = %s AND direction = %s AND id = ANY(%s)", (how, mid, direction(reverse), ids))
