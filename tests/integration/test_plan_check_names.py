"""Every name `plan check` prints for objects mover creates is checked against the catalog (issue 34
item 7): a derived name already taken (the deferred index `t_v_idx_m<id>`, the target's key, a
change log, a capture function or trigger, a statistics copy) is refused by plan check and by the
run's registration (exit 2, nothing registered), naming what holds it and the fix, instead of
failing after the whole copy. The names are read from plan check's own output, so a name it
prints that the check does not cover fails this test."""

from __future__ import annotations

import json
import re

import psycopg
import pytest
from psycopg import sql

from tests.workload import mover, plan_text, write_plan

SCHEMA = """
CREATE TABLE t (id int PRIMARY KEY, v int, w int);
CREATE INDEX t_v_idx ON t (v);
CREATE STATISTICS t_vw ON v, w FROM t;
INSERT INTO t SELECT g, g, g FROM generate_series(1, 100) g;
"""

# The objects plan check's SQL creates, by the statement that creates each: (kind, name).
# An index's name is unqualified: it is created in its table's schema (ON ...).
IDENT = r'(?:"(?:[^"]|"")+"|\w+)'
CREATED = re.compile(r'CREATE (?:UNIQUE )?(?:OR REPLACE )?(INDEX|TABLE|FUNCTION|TRIGGER|STATISTICS)'
                     rf'(?: CONCURRENTLY)?(?: IF NOT EXISTS)? ((?:{IDENT}\.)?{IDENT})(?: ON (?:ONLY )?({IDENT})\.)?')


def _unquote(part: str) -> str:
    return part[1:-1].replace('""', '"') if part.startswith('"') else part


def _printed(dsn: str, plan: str) -> tuple[int, list[tuple[str, str, str]]]:
    r = mover(dsn, "plan", "check", plan, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    found = set()
    for step in out["steps"]:
        for statement in step["sql"]:
            if statement.startswith("--"):
                continue  # plan check's comments
            for kind, name, on in CREATED.findall(statement):
                if kind == "TRIGGER" and step["name"] != "install_capture":
                    continue  # the reverse capture's, on the new table mover created
                parts = re.findall(r'"(?:[^"]|"")+"|\w+', name)
                schema, rel = (_unquote(parts[0]), _unquote(parts[1])) if len(parts) == 2 else (
                    _unquote(on) if on else "public", _unquote(parts[0]))
                found.add((kind, schema, rel))
    return out["migration_id"], sorted(found)


def _blocker(kind: str, schema: str, name: str) -> sql.Composed:
    """Something else under the name mover would create."""
    n = sql.Identifier(schema, name)
    if kind in ("INDEX", "TABLE"):
        return sql.SQL("CREATE TABLE {} ()").format(n)
    if kind == "FUNCTION":
        return sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'").format(n)
    if kind == "STATISTICS":
        return sql.SQL("CREATE TABLE public.blocker (a int, b int); CREATE STATISTICS {} ON a, b FROM public.blocker"
                       ).format(n)
    assert kind == "TRIGGER"
    return sql.SQL("CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';"
                   " CREATE TRIGGER {} AFTER INSERT ON public.t FOR EACH ROW EXECUTE FUNCTION public.noop()"
                   ).format(sql.Identifier(name))


@pytest.mark.parametrize("partition", [None, {"by": "hash", "column": "w", "modulus": 2, "accept_key_change": True}])
def test_every_name_plan_check_prints_is_checked_and_a_taken_one_refused(db_dsn, tmp_path, partition):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    target = {"partition": partition} if partition else {}
    plan = write_plan(tmp_path / "t.toml", plan_text("t", "public.t", columns={"v": "bigint"}, target=target))
    mid, printed = _printed(db_dsn, plan)
    assert ("INDEX", "public", f"t_v_idx_m{mid}") in printed, printed  # the case
    if partition:  # each partition, and each one's part of the deferred index
        assert sum(k == "TABLE" and sch == "public" and n != "t_new" for k, sch, n in printed) == 2, printed
        assert sum(k == "INDEX" and n.endswith(f"t_v_idx_m{mid}") for k, _, n in printed) == 3, printed
    assert ("TRIGGER", "public", f"mover_m{mid}_capture") in printed, printed
    kinds = {k for k, _, _ in printed}
    assert {"INDEX", "TABLE", "FUNCTION", "TRIGGER", "STATISTICS"} <= kinds, printed
    for kind, schema, name in printed:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute(_blocker(kind, schema, name))
            conn.execute("COMMIT")
            try:
                r = mover(db_dsn, "plan", "check", plan)
                assert r.returncode == 2, (kind, name, r.stderr)
                assert name in r.stderr, (name, r.stderr)
                # free() names the target and the old table; [target.partition] the partitions
                assert any(w in r.stderr for w in ("taken by an existing", "already exists", "a table of that name"
                                                                                              " exists")), r.stderr
            finally:
                conn.execute("BEGIN")
                conn.execute("DROP TABLE IF EXISTS public.blocker")
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, name))) \
                    if kind in ("INDEX", "TABLE") else None
                conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(sql.Identifier(schema, name))) \
                    if kind == "FUNCTION" else None
                conn.execute(sql.SQL("DROP STATISTICS IF EXISTS {}").format(sql.Identifier(schema, name))) \
                    if kind == "STATISTICS" else None
                conn.execute("DROP FUNCTION IF EXISTS public.noop() CASCADE")
                conn.execute("COMMIT")
    assert mover(db_dsn, "plan", "check", plan).returncode == 0


@pytest.mark.parametrize("index", ["t_v_idx", 'Odd "Idx" name'])
def test_a_taken_deferred_index_name_stops_plan_check_and_the_run_before_the_copy(db_dsn, tmp_path, index):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        if index != "t_v_idx":
            conn.execute(sql.SQL("ALTER INDEX t_v_idx RENAME TO {}").format(sql.Identifier(index)))
    plan = write_plan(tmp_path / "t.toml", plan_text("t", "public.t", columns={"v": "bigint"}))
    mid, _ = _printed(db_dsn, plan)
    taken = f"{index}_m{mid}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE other (v int)")
        conn.execute(sql.SQL("CREATE INDEX {} ON other (v)").format(sql.Identifier(taken)))
    r = mover(db_dsn, "plan", "check", plan)
    quoted = '"public"."' + taken.replace('"', '""') + '"'
    said = " ".join(r.stderr.split())  # as one line, whatever the terminal's width
    assert r.returncode == 2 and quoted in said and "taken by an existing index" in said, r.stderr
    assert "after the whole copy" in said and f"ALTER INDEX {quoted} RENAME TO" in said, r.stderr
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 2 and quoted in " ".join(r.stderr.split()), r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # nothing registered, nothing created
        assert conn.execute("SELECT count(*) FROM mover.migrations").fetchone() == (0,)
        assert conn.execute("SELECT to_regclass('public.t_new')").fetchone() == (None,)
        conn.execute(sql.SQL("ALTER INDEX {} RENAME TO elsewhere").format(sql.Identifier(taken)))
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr  # at the gate: the whole copy and its indexes built
