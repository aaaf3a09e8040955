"""SQL of the backfill: find a range's upper bound, copy the range in one set-based statement.

The upper bound comes from an index-only OFFSET scan (next_bound), or, for an integer key in a
dense region, from key arithmetic checked by one index probe (key_above; mover/state/ranges.py).

No conflict clause: capture replays a key only after the range that covers it is done, so a
key the copy inserts cannot already be in the target. A unique violation here is a bug to
surface, not a row to skip. A row whose values do not convert (class 22, or a constraint of
class 23 other than uniqueness) is a divergence: the backfill narrows the range down to it.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from mover.sql.mapping import Mapping, ident_list, key_row, overriding, range_predicate, source_values


def next_bound(m: Mapping, lo: list[str] | None) -> tuple[sql.Composed, list[Any]]:
    """The key `%s` rows after `lo` (text form), or no row when fewer remain."""
    where, params = range_predicate("s", m, lo, None)
    # The text cast outside the OFFSET: inside, the index-only scan would cast every key it skips.
    q = sql.SQL("SELECT {keys} FROM (SELECT {cols} FROM {src} s WHERE {where} ORDER BY {order} OFFSET %s LIMIT 1) s"
                ).format(
        keys=sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier("s", k)) for k in m.key),
        cols=sql.SQL(", ").join(sql.Identifier("s", k) for k in m.key),
        src=m.reads("src"), where=where,
        order=sql.SQL(", ").join(sql.Identifier("s", k) for k in m.key))
    return q, params


def key_above(m: Mapping, bound: list[str]) -> tuple[sql.Composed, list[Any]]:
    """A row when any key lies above `bound` (text form): the first entry of the key's index
    answers, where the OFFSET scan would visit every key of the range. Not EXISTS: the planner
    drops an EXISTS subquery's ORDER BY and may then read the table from its start for the first
    row above the bound, which on an append-mostly table is at its end (a whole-table scan)."""
    where, params = range_predicate("s", m, bound, None)
    q = sql.SQL("SELECT 1 FROM {src} s WHERE {where} ORDER BY {order} LIMIT 1").format(
        src=m.reads("src"), where=where, order=sql.SQL(", ").join(sql.Identifier("s", k) for k in m.key))
    return q, params


def copy_range(m: Mapping, lo: list[str] | None, hi: list[str] | None) -> tuple[sql.Composed, list[Any]]:
    where, params = range_predicate("s", m, lo, hi)
    q = sql.SQL("INSERT INTO {dst} ({cols}){overriding} SELECT {values} FROM {src} s WHERE {where}").format(
        dst=m.dst.ident, cols=ident_list(c.name for c in m.columns), overriding=overriding(m),
        values=source_values("s", m), src=m.reads("src"), where=where)
    return q, params


def range_keys(m: Mapping, lo: list[str] | None, hi: list[str] | None) -> tuple[sql.Composed, list[Any]]:
    """The keys of a range as text, in key order: where to split a range that failed on data."""
    where, params = range_predicate("s", m, lo, hi)
    q = sql.SQL("SELECT {keys} FROM {src} s WHERE {where} ORDER BY {order}").format(
        keys=sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier("s", k)) for k in m.key),
        src=m.reads("src"), where=where, order=sql.SQL(", ").join(sql.Identifier("s", k) for k in m.key))
    return q, params


def covered_by(alias: str, m: Mapping, watermark_param: str = "wm") -> sql.Composed:
    """Keys at or below the backfill's watermark (named parameters `wm_0`...)."""
    from mover.sql.mapping import bound_row
    return sql.SQL("{} <= {}").format(key_row(alias, m.key),
                                      bound_row(m.src_key_types, watermark_param, m.key_collations))
