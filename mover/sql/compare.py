"""SQL of reconcile: compare one key range of both tables in one statement (one snapshot).

Rows are compared column by column with IS DISTINCT FROM after casting the source value to the
destination's type, which is the definition of equal: numbers compare by value, NULLs match.
Types without an equality operator (json, xml, point...) compare by their text form. The same
snapshot reads the change log, so a key that differs while a change to it is still pending is
reported as pending, not as a divergence.
"""

from __future__ import annotations

from psycopg import sql

from mover.sql.mapping import Mapping, key_equal, range_predicate

VALUE_CHARS = 200  # long values are truncated in divergence reports


def _pair(c, alias_s: str = "s", alias_t: str = "t") -> tuple[sql.Composable, sql.Composable]:
    s = sql.Identifier(alias_s, c.name)
    t = sql.Identifier(alias_t, c.name)
    if c.cast_to:
        s = sql.SQL("CAST({} AS {})").format(s, sql.SQL(c.cast_to))
    if c.compare_as_text:
        s, t = sql.SQL("{}::text").format(s), sql.SQL("{}::text").format(t)
    return s, t


def compare_range(m: Mapping, log, lo: list[str] | None, hi: list[str] | None) -> tuple[sql.Composed, list]:
    s_where, s_params = range_predicate("s", m, lo, hi)
    t_where, t_params = range_predicate("t", m, lo, hi)
    pairs = [(c, *_pair(c, "s", "t")) for c in m.non_key]
    differs = sql.SQL(" OR ").join(sql.SQL("{} IS DISTINCT FROM {}").format(a, b) for _, a, b in pairs) \
        if pairs else sql.SQL("false")
    detail = sql.SQL("jsonb_strip_nulls(jsonb_build_object({}))").format(sql.SQL(", ").join(
        sql.SQL("{name}, CASE WHEN {a} IS DISTINCT FROM {b} THEN jsonb_build_array(left({sv}::text, {n}),"
                " left({tv}::text, {n})) END").format(
            name=sql.Literal(c.name), a=a, b=b, sv=sql.Identifier("s", c.name), tv=sql.Identifier("t", c.name),
            n=sql.Literal(VALUE_CHARS))
        for c, a, b in pairs)) if pairs else sql.SQL("'{}'::jsonb")
    key_text = sql.SQL("ARRAY[{}]").format(sql.SQL(", ").join(
        sql.SQL("coalesce({}::text, {}::text)").format(sql.Identifier("s", k), sql.Identifier("t", k)) for k in m.key))
    pending = sql.SQL("EXISTS (SELECT 1 FROM {log} l WHERE {eq})").format(
        log=log.ident, eq=sql.SQL(" AND ").join(
            sql.SQL("l.{k} = coalesce(s.{k}, t.{k})").format(k=sql.Identifier(k)) for k in m.key))
    q = sql.SQL(
        """
SELECT {key_text},
       CASE WHEN t.{k0} IS NULL THEN 'missing_in_target'
            WHEN s.{k0} IS NULL THEN 'extra_in_target'
            ELSE 'different' END,
       CASE WHEN s.{k0} IS NOT NULL AND t.{k0} IS NOT NULL THEN {detail} END,
       {pending}
FROM (SELECT * FROM {src} s WHERE {s_where}) s
FULL JOIN (SELECT * FROM {dst} t WHERE {t_where}) t ON {on}
WHERE s.{k0} IS NULL OR t.{k0} IS NULL OR {differs}
"""
    ).format(key_text=key_text, k0=sql.Identifier(m.key[0]), detail=detail, pending=pending,
             src=m.src.ident, dst=m.dst.ident, s_where=s_where, t_where=t_where,
             on=key_equal("s", "t", m.key), differs=differs)
    return q, s_params + t_params
