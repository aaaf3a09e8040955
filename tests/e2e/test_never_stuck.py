"""Never stuck (issue 21, "Done when"): every (step, state) pair a migration can be in has a way
forward. For each pair the control schema allows (the CHECK constraints on mover.migrations, read
from the catalog) and control.py's transitions can reach, a migration is set in that state (a real
one driven to the step, in a copy of its database, the state written into its control row), and
`mover step NAME` (through mover.api, in-process) either moves it on or ends with a `next:` that
names a command the migration's step allows (control.require_command), which, run in turn, moves it
on. "Moves on": the migration's (step, state) changes, or a new migration of the plan is registered
(after an abort); the end, (finished, done), needs nothing."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from mover import api
from mover.errors import MoverError, Waiting
from mover.state import control
from tests.conftest import connect, dsn_with_dbname
from tests.workload import plan_file, plan_text, write_plan

PLAN = plan_text("ns", "ns", columns={"id": "bigint"}, backfill={"range_rows": 100})

COMMAND = re.compile(r"`mover ([a-z]+) ([^`]*)`")


def schema_states(dsn: str) -> tuple[list[str], list[str]]:
    """The values the CHECK constraints of mover.migrations allow for step and state."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                            " WHERE conrelid = 'mover.migrations'::regclass AND contype = 'c'").fetchall()
    found: dict[str, list[str]] = {}
    for (text,) in rows:
        m = re.match(r"CHECK \(\((\w+) = ANY \(ARRAY\[(.*)\]\)\)\)", text)
        if m and m.group(1) in ("step", "state"):
            found[m.group(1)] = re.findall(r"'([^']*)'::text", m.group(2))
    return found["step"], found["state"]


def reachable(steps: list[str], states: list[str]) -> list[tuple[str, str]]:
    """The pairs control.py's transitions produce: each step in every non-terminal state (a command
    ended waiting, failed or interrupted; a process died running), aborted where abort is allowed,
    and done only at the end."""
    assert set(control.STEPS) | {control.FINISHED} == set(steps), steps
    live = [s for s in states if s not in control.TERMINAL]
    assert set(states) - set(live) == set(control.TERMINAL), states
    return ([(step, state) for step in control.STEPS for state in live]
            + [(step, "aborted") for step in control.STEPS if step in control.COMMANDS["abort"]]
            + [(control.FINISHED, "done")])


@contextmanager
def copy_of(pg_dsn: str, dsn: str) -> Iterator[str]:
    """A copy of the database behind `dsn` (nobody may be connected to it meanwhile)."""
    source = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"] if "://" not in dsn else dsn.rsplit("/", 1)[1]
    name = f"c_{uuid.uuid4().hex[:12]}"
    with connect(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(source)))
    try:
        yield dsn_with_dbname(pg_dsn, name)
    finally:
        with connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def where(dsn: str) -> tuple[str, str, int]:
    """(step, state, migrations registered) of the plan's newest migration, from the control row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        step, state = conn.execute("SELECT step, state FROM mover.migrations ORDER BY id DESC LIMIT 1").fetchone()
        n = conn.execute("SELECT count(*) FROM mover.migrations").fetchone()[0]
    return step, state, n


def attempt(fn: Callable[[], Any]) -> MoverError | None:
    try:
        fn()
        return None
    except MoverError as exc:
        return exc


def suggested(dsn: str, plan: str, hint: str | None) -> list[tuple[str, bool, Callable[[], Any]]]:
    """The commands a `next:` names, each as (verb, whether it names the plan file, the call
    through mover.api that runs it)."""
    out = []
    for verb, rest in COMMAND.findall(hint or ""):
        args = rest.split()
        target = plan if args and (args[0].endswith(".toml") or args[0] == "PLAN") else "ns"
        calls: dict[str, Callable[[], Any]] = {
            "run": lambda t=target: api.run(dsn, t),
            "step": lambda t=target: api.run(dsn, t, one_step=True),
            "cutover": lambda: api.cutover_now(dsn, "ns"),
            "rollback": lambda: api.rollback(dsn, "ns"),
            "retire": lambda f="--force" in args: api.retire(dsn, "ns", force=f),
            "abort": lambda: api.abort(dsn, "ns"),
            "reconcile": lambda: api.reconcile(dsn, "ns"),
        }
        if verb in calls:
            out.append((verb, target == plan, calls[verb]))
    return out


def allowed(dsn: str, verb: str) -> bool:
    if verb == "step":
        verb = "run"
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        m = control.get(cur, "ns")
    return attempt(lambda: control.require_command(m, verb)) is None


def check_pair(dsn: str, plan: str, step: str, state: str) -> str | None:
    """None when some command moves the migration on from (step, state); else why not."""
    before = where(dsn)
    assert before[:2] == (step, state), before
    if (step, state) == (control.FINISHED, "done"):
        return None if attempt(lambda: api.run(dsn, "ns", one_step=True)) is None else "run of a done migration failed"
    err = attempt(lambda: api.run(dsn, "ns", one_step=True))
    if err is None:
        return None if where(dsn) != before else f"`mover step ns` exited 0 and left it at {before[:2]}"
    tried = []
    for verb, by_plan, call in suggested(dsn, plan, err.hint):
        # A command on the migration must be one its step allows; a plan file registers anew.
        if not by_plan and not allowed(dsn, verb):
            tried.append(f"{verb}: not allowed at {where(dsn)[:2]}")
            continue
        again = attempt(call)
        # On, even if it then stops at the next gate or window (exit 3): never a failure.
        if (again is None or isinstance(again, Waiting)) and where(dsn) != before:
            return None
        tried.append(f"{verb}: {type(again).__name__ if again else 'no change'}: {again}")
    return (f"`mover step ns` at {(step, state)}: {type(err).__name__} (exit {err.exit_code}): {err}; next: {err.hint};"
            f" the suggested commands did not move it on: {tried}")


def test_every_reachable_step_and_state_has_a_way_forward(pg_dsn, db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ns (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO ns SELECT g, 'v' || g FROM generate_series(1, 300) g")
    plan = write_plan(tmp_path / "ns.toml", PLAN)
    steps, states = schema_states(db_dsn)
    pairs = reachable(steps, states)
    api.run(db_dsn, plan, one_step=True)  # registered, create_target done: at install_capture
    problems: list[str] = []

    def walk(at: str, setup: Callable[[str], None] | None = None) -> None:
        for step, state in [p for p in pairs if p[0] == at]:
            with copy_of(pg_dsn, db_dsn) as dsn:
                if setup is not None:
                    setup(dsn)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    if state == "aborted":
                        conn.close()
                        api.abort(dsn, "ns")
                    else:
                        conn.execute("UPDATE mover.migrations SET state = %s WHERE name = 'ns'", (state,))
                problem = check_pair(dsn, plan, step, state)
                if problem:
                    problems.append(problem)

    def at_step(step: str) -> Callable[[str], None]:
        """The control row put at `step`, which no command stops at (`mover step PLAN` registers and
        runs create_target; retire follows the window's end at once)."""
        def setup(dsn: str) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("UPDATE mover.migrations SET step = %s WHERE name = 'ns'", (step,))
                conn.execute("UPDATE mover.steps SET status = CASE WHEN position < %s THEN 'done' ELSE 'pending' END"
                             " WHERE migration_id = (SELECT id FROM mover.migrations WHERE name = 'ns')",
                             (control.STEPS.index(step),))
        return setup

    # create_target with its done mark taken back: the step finds its DDL in the catalog and goes on.
    walk("create_target", at_step("create_target"))
    walk("install_capture")
    api.run(db_dsn, "ns", one_step=True)
    walk("backfill")
    api.run(db_dsn, "ns", one_step=True)
    walk("reconcile")
    assert attempt(lambda: api.run(db_dsn, "ns")) is not None  # reconcile, then the gate
    walk("cutover")
    api.cutover_now(db_dsn, "ns")
    walk("rollback_window")
    walk("retire", at_step("retire"))
    api.retire(db_dsn, "ns", force=True)
    walk(control.FINISHED)
    assert problems == [], "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# A type change plan check accepts can always leave the rollback window (issue 21): after the swap
# the application writes values the old type holds and values it does not (or holds only changed:
# the way back of a widening narrows). Values that go back unchanged are in the old table; a row
# whose value does not stays in the new table only, named: `mover rollback` refuses while it
# exists, `--give-up-rows` swaps back without it, `mover retire` keeps it. Never a value changed
# on its way back, never a command that fails.

# name: (source type, plan type, accept_lossy, values before, written after the swap: going back
# unchanged, and not)
TYPE_PAIRS = {
    "int4_int8": ("integer", "bigint", False, ["1", "-7"], ["5", "2147483647"], ["3000000000"]),
    "int4_text": ("integer", "text", False, ["1", "-7"], ["42", "-3"], ["abc", "042", " 8"]),
    "numeric_float8": ("numeric", "double precision", True, ["1.5", "-0.25"], ["12.5", "1e-3"],
                       ["0.30000000000000004"]),  # numeric takes a float8 with 15 digits: 0.3
    "varchar10_text": ("varchar(10)", "text", False, ["short", "ten chars!"], ["fits", "é"],
                       ["eleven chars", "abcdefghij   "]),  # assignment to varchar(10) cuts trailing spaces
    "text_varchar5": ("text", "varchar(5)", True, ["ab", "abcde"], ["xyz", ""], []),
    "timestamp_timestamptz": ("timestamp", "timestamptz", True, ["2024-01-01 10:00", "infinity"],
                              ["2025-06-01 12:30:00.123456+02", "-infinity"], []),
    "int4_numeric": ("integer", "numeric", False, ["1", "-7"], ["8", "-2.000"], ["1.5", "1e20"]),
}


def _differing(dsn: str, table: str, typ: str, written: dict[int, str]) -> set[int]:
    """The keys whose row does not hold the value written (compared in `typ`, the new type, by its
    own `=`: -2.000 is -2), or that have no row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT w.k FROM unnest(%s::int[], %s::text[]) AS w(k, v) LEFT JOIN {t} t ON t.id = w.k"
            " WHERE t.id IS NULL OR CAST(t.v AS {ty}) IS DISTINCT FROM CAST(w.v AS {ty})").format(
            t=sql.Identifier(table), ty=sql.SQL(typ)), (list(written), list(written.values()))).fetchall()
    return {r[0] for r in rows}


@pytest.mark.parametrize("pair", list(TYPE_PAIRS))
def test_an_accepted_type_change_can_always_leave_the_window(pg_dsn, db_dsn, tmp_path, pair):
    old, new, lossy, before, back, stuck = TYPE_PAIRS[pair]
    name = f"tc_{pair}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v {})").format(sql.Identifier(name), sql.SQL(old)))
        for i, v in enumerate(before, 1):
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(sql.Identifier(name)), (i, v))
    plan = plan_file(tmp_path, name, name, columns={"v": new}, backfill={"range_rows": 100}, cutover={"auto": True},
                     **({"target": {"accept_lossy": ["v"]}} if lossy else {}))
    checked = api.check_plan(db_dsn, plan)
    assert checked["ok"], checked
    if stuck:  # plan check says what a rollback cannot carry back
        assert "v" in checked["rollback_carries_back"], checked
    err = attempt(lambda: api.run(db_dsn, plan))
    assert isinstance(err, Waiting) and where(db_dsn)[:2] == ("rollback_window", "waiting"), (err, where(db_dsn))
    # The application, after the swap: rows updated and inserted with values that go back, and not.
    written: dict[int, str] = {}
    bad: set[int] = set()
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        t = sql.Identifier(name)
        for i, v in enumerate(back):
            key = 1 if i == 0 else 100 + i
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, CAST(%s AS {})) ON CONFLICT (id) DO UPDATE SET v ="
                                 " EXCLUDED.v").format(t, sql.SQL(new)), (key, v))
            written[key] = v
        for i, v in enumerate(stuck):
            key = 2 if i == 0 else 200 + i
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, CAST(%s AS {})) ON CONFLICT (id) DO UPDATE SET v ="
                                 " EXCLUDED.v").format(t, sql.SQL(new)), (key, v))
            written[key] = v
            bad.add(key)
    err = attempt(lambda: api.run(db_dsn, name))
    assert isinstance(err, Waiting), err
    assert where(db_dsn)[:2] == ("rollback_window", "waiting"), where(db_dsn)
    for key in bad:
        assert f"key ['{key}']" in str(err), (key, str(err))

    # Rolled back: refused while rows would stay behind, then with them given up.
    with copy_of(pg_dsn, db_dsn) as dsn:
        err = attempt(lambda: api.rollback(dsn, name))
        if bad:
            assert isinstance(err, Waiting) and "refused" in str(err), err
            refused = {int(k) for k in re.findall(r"key \['(\d+)'\]", str(err))}
            assert refused == bad, (refused, bad, str(err))
            assert where(dsn)[:2] == ("rollback_window", "waiting")
            err = attempt(lambda: api.rollback(dsn, name, give_up_rows=True))
        assert err is None, err
        assert where(dsn)[:2] == ("reconcile", "pending"), where(dsn)
        assert _differing(dsn, name, new, written) == bad  # the rest went back as written

    # Retired instead: the rows the old table could not take live on in the new one.
    err = attempt(lambda: api.retire(db_dsn, name, force=True))
    assert err is None, err
    assert where(db_dsn)[:2] == (control.FINISHED, "done")
    assert _differing(db_dsn, name, new, written) == set()
