"""Race 7: rows that swap unique values in one transaction (two rows, or a longer cycle) must
replay to the source's final state; a row the other side cannot hold is never dropped silently."""

from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import sql

from tests import workload
from tests.workload import AppWriter, finish, hung_at, mover, plan_file, spawn

ACCT_COLUMNS = ("id", "email", "handle", "note")

def create_acct(dsn: str, rows: int = 3000) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, email text NOT NULL UNIQUE, handle text,"
                     " note text)")
        # An expression index too: the closure must match it as the target evaluates it.
        conn.execute("CREATE UNIQUE INDEX acct_handle ON acct (lower(handle))")
        conn.execute("INSERT INTO acct SELECT g, 'u' || g || '@x', 'H' || g, 'n' FROM generate_series(1, %s) g",
                     (rows,))
        workload.create_mirror(conn, "acct", MIRROR)


def acct_plan(tmp_path, range_rows=500, columns=None, backfill=None, target=None) -> str:
    return plan_file(tmp_path, "acct", "acct", columns={"id": "bigint", **(columns or {})},
                     target=target or {}, backfill={"range_rows": range_rows, **(backfill or {})})


def status(dsn):
    r = mover(dsn, "status", "acct", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


MIRROR = "acct_mirror"


def assert_oracle(dsn: str, *tables: str) -> None:
    """Each table holds what the application (rotate) committed, column by column."""
    workload.assert_oracle(dsn, *tables, mirror=MIRROR, columns=ACCT_COLUMNS)


def differences(dsn: str, a: str, b: str) -> tuple[int, int]:
    """Independent of mover: EXCEPT ALL both ways in one snapshot, over acct's columns."""
    return workload.differences(dsn, a, b, columns=ACCT_COLUMNS)


def rotate(conn: psycopg.Connection, ids: list[int], column: str = "email") -> None:
    """One application transaction: each row takes the next one's value (a cycle of len(ids));
    the rows as it leaves them are copied to the mirror in the same transaction."""
    col = sql.Identifier(column)
    with conn.transaction():
        values = [conn.execute(sql.SQL("SELECT {} FROM acct WHERE id = %s").format(col), (i,)).fetchone()[0]
                  for i in ids]
        conn.execute(sql.SQL("UPDATE acct SET {} = 'tmp-' || id WHERE id = ANY(%s)").format(col), (ids,))
        for i, v in zip(ids, values[1:] + values[:1], strict=True):
            conn.execute(sql.SQL("UPDATE acct SET {} = %s WHERE id = %s").format(col), (v, i))
        cols = sql.SQL(", ").join(map(sql.Identifier, ACCT_COLUMNS))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(sql.Identifier(MIRROR)), (ids,))
        conn.execute(sql.SQL("INSERT INTO {m} ({c}) SELECT {c} FROM acct WHERE id = ANY(%s)").format(
            m=sql.Identifier(MIRROR), c=cols), (ids,))


def test_swap_and_cycle_at_the_gate_replay_and_cut_over(db_dsn, tmp_path):
    create_acct(db_dsn)
    plan = acct_plan(tmp_path)
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rotate(conn, [1, 2])  # the issue's swap
        rotate(conn, [3, 4, 5])  # a 3-cycle
        rotate(conn, [6, 7], "handle")  # through the expression index
        rotate(conn, [10, 2900])  # keys far apart: not in one range
    r = mover(db_dsn, "run", "acct")
    assert r.returncode == 3, r.stderr
    assert "ready for cutover" in r.stderr
    st = status(db_dsn)
    assert (st["step"], st["divergences"]) == ("cutover", 0), st
    assert_oracle(db_dsn, "acct", "acct_new")
    # And under the cutover's lock: swaps committed after the last drain outside it.
    code, err = while_hanging(db_dsn, tmp_path, "cutover", "swap:before_lock",
                              lambda conn: (rotate(conn, [1, 2]), rotate(conn, [20, 21, 22])))
    assert code == 0, err
    assert_oracle(db_dsn, "acct", "acct_old")


def while_hanging(dsn, tmp_path, command, point, action) -> tuple[int, str]:
    """Run `mover COMMAND acct`, stopped at fault point POINT while `action(conn)` runs."""
    release = tmp_path / f"release-{point}"
    proc = spawn(dsn, command, "acct", env={"MOVER_FAULT": f"hang@{point}", "MOVER_FAULT_RELEASE": str(release)})
    try:
        line = proc.stderr.readline()
        while line and f"hanging at {point}" not in line:
            line = proc.stderr.readline()
        assert line, f"mover {command} ended before {point}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            action(conn)
    finally:
        release.touch()
    return finish(proc, 120)


def test_swaps_while_the_backfill_runs(db_dsn, tmp_path):
    # The target's secondary unique indexes are built after the backfill, so replays during it
    # cannot meet them; this guards that the swaps still arrive, across the copied bound.
    create_acct(db_dsn)
    plan = acct_plan(tmp_path, backfill={"min_rows": 100, "max_rows": 500})  # small ranges: some left to copy
    release = tmp_path / "release"
    proc = spawn(db_dsn, "run", plan, env={"MOVER_FAULT": "hang@backfill_range:2", "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert hung_at(proc, "backfill_range:2")
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            copied = conn.execute("SELECT max(id) FROM acct_new").fetchone()[0]
            assert 2 < copied < 2500
            rotate(conn, [1, 2])  # both copied
            rotate(conn, [copied, 2500])  # a copied row and one still to copy
            rotate(conn, [2600, 2700])  # both still to copy
            rotate(conn, [3, 4, 2800])  # a cycle across the copied bound
    finally:
        release.touch()
    code, err = finish(proc, 120)
    assert code == 3 and "ready for cutover" in err, err
    assert status(db_dsn)["divergences"] == 0
    assert_oracle(db_dsn, "acct", "acct_new")


def swapper(rows: int):
    """An application that swaps unique values all the time: pairs and 3-cycles of random rows."""
    def swap(conn: psycopg.Connection, rnd) -> None:
        rotate(conn, rnd.sample(range(1, rows + 1), rnd.choice((2, 2, 3))), rnd.choice(("email", "email", "handle")))
    return swap


@dataclass(kw_only=True)
class IssueMix(AppWriter):
    """Issue 21, item 4's application, as fast as it goes on its own connection: half of its
    transactions two-row e-mail swaps through a temporary value (rotate), the rest note updates,
    inserts and deletes, each mirrored in its transaction. `swapped` is set once it has made
    `swaps` swaps; it stops by itself after `seconds`."""

    rows: int
    swaps: int
    seed: int = 7
    seconds: float = 300
    made: int = 0  # swaps made so far
    next_id: int = 10_000_000
    swapped: threading.Event = field(default_factory=threading.Event)

    def connected(self, conn: psycopg.Connection) -> None:
        deadline = threading.Timer(self.seconds, self.stop.set)
        deadline.daemon = True
        deadline.start()

    def write(self, conn: psycopg.Connection, rnd) -> None:
        mirror, cols = sql.Identifier(MIRROR), sql.SQL(", ").join(map(sql.Identifier, ACCT_COLUMNS))
        r = rnd.random()
        if r < 0.5:
            rotate(conn, rnd.sample(range(1, self.rows + 1), 2))
            self.made += 1
            if self.made >= self.swaps:
                self.swapped.set()
        elif r < 0.7:
            k = rnd.randint(1, self.rows)
            with conn.transaction():
                conn.execute("UPDATE acct SET note = md5(random()::text) WHERE id = %s", (k,))
                conn.execute(sql.SQL("UPDATE {m} SET note = a.note FROM acct a WHERE a.id = %s"
                                     " AND {m}.id = a.id").format(m=mirror), (k,))
        elif r < 0.85:
            self.next_id += 1
            with conn.transaction():
                conn.execute("INSERT INTO acct VALUES (%s, %s, %s, 'new')",
                             (self.next_id, f"n{self.next_id}@x", f"N{self.next_id}"))
                conn.execute(sql.SQL("INSERT INTO {m} ({c}) SELECT {c} FROM acct WHERE id = %s").format(
                    m=mirror, c=cols), (self.next_id,))
        else:
            k = rnd.randint(10_000_001, max(self.next_id, 10_000_001))
            with conn.transaction():
                conn.execute("DELETE FROM acct WHERE id = %s", (k,))
                conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(mirror), (k,))


def test_swaps_piled_up_while_nothing_applied_converge_with_the_writer_still_running(db_dsn, tmp_path):
    """Issue 21, item 4: the applier fell behind a writer swapping unique e-mails (a busy machine,
    or any pause), and never caught up again: `mover run` did not reach the gate in 300 s. Random
    swaps of rows the target has not seen yet chain into permutation cycles through hundreds of
    rows (past n/2 swaps of n rows, one giant cycle). Here the writer makes that many while no
    applier runs (the migration waits at the gate), then `mover run` starts beside it, the writer
    still going: it must drain what piled up and what keeps coming, and reach the gate. The wait
    is bounded (a failure bound, not a speed claim): the closure replay of a step per statement
    stopped after 20 steps, halved the set down to single keys that each failed again, and ran
    past it. Judged by the mirror at the gate (writer paused) and after the cutover."""
    rows = 3000
    create_acct(db_dsn, rows)
    r = mover(db_dsn, "run", acct_plan(tmp_path))
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    writer = IssueMix(db_dsn, rows=rows, swaps=rows).start()
    try:
        assert writer.swapped.wait(240), f"the writer made only {writer.made} swaps"
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            (mid,) = conn.execute("SELECT id FROM mover.migrations WHERE name = 'acct'").fetchone()
            piled = conn.execute(f"SELECT count(*) FROM mover.m{mid}_changes").fetchone()[0]
        assert piled > rows
        proc = spawn(db_dsn, "run", "acct")
        try:
            code, err = finish(proc, 240)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"`mover run acct` did not reach the gate in 240 s beside the writer ({writer.made} swaps"
                        f" so far): {err[-2000:]}")
        assert not writer.stop.is_set(), "the writer stopped before mover reached the gate"
        assert code == 3 and "ready for cutover" in err, err
        writer.pause()
        r = mover(db_dsn, "run", "acct")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        assert_oracle(db_dsn, "acct", "acct_new")
        r = mover(db_dsn, "cutover", "acct")
        assert r.returncode == 0, r.stderr
        assert_oracle(db_dsn, "acct", "acct_old")
    finally:
        writer.halt()
    assert writer.errors == []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        stuck = conn.execute("SELECT count(*) FROM mover.divergences WHERE kind = 'apply_error'").fetchone()[0]
    assert stuck == 0


def test_continuous_swaps_through_every_step(db_dsn, tmp_path):
    create_acct(db_dsn)
    plan = acct_plan(tmp_path, range_rows=300, backfill={"max_rows_per_second": 4000})
    writer = AppWriter(db_dsn, each=swapper(3000), delay=0.002).start()  # busy, not a tight loop
    # Stops by itself after its time is up, so a stuck step cannot leave it running.
    timer = threading.Timer(240, writer.stop.set)
    timer.start()
    try:
        r = mover(db_dsn, "run", plan)
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        writer.pause()
        r = mover(db_dsn, "run", "acct")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        assert_oracle(db_dsn, "acct", "acct_new")
        writer.resume()
        r = mover(db_dsn, "reconcile", "acct", "--full")
        assert r.returncode == 0, r.stderr
        r = mover(db_dsn, "cutover", "acct")
        assert r.returncode == 0, r.stderr
        r = mover(db_dsn, "run", "acct")  # the window: the old table follows the new one
        assert r.returncode == 3, r.stderr
        writer.pause()
        r = mover(db_dsn, "run", "acct")
        assert r.returncode == 3, r.stderr
        assert_oracle(db_dsn, "acct", "acct_old")
        writer.resume()
        r = mover(db_dsn, "rollback", "acct")
        assert r.returncode == 0, r.stderr
        writer.pause()
        r = mover(db_dsn, "run", "acct")
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        assert_oracle(db_dsn, "acct", "acct_new")
    finally:
        writer.halt()
        timer.cancel()
    assert writer.errors == []
    assert writer.ops > 50
    st = status(db_dsn)
    assert (st["step"], st["divergences"]) == ("cutover", 0), st
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        stuck = conn.execute("SELECT count(*) FROM mover.divergences WHERE kind = 'apply_error'").fetchone()[0]
    assert stuck == 0


def test_swap_in_the_window_then_rollback_loses_nothing(db_dsn, tmp_path):
    create_acct(db_dsn)
    assert mover(db_dsn, "run", acct_plan(tmp_path)).returncode == 3
    r = mover(db_dsn, "cutover", "acct")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rotate(conn, [1, 2])
    r = mover(db_dsn, "run", "acct")  # the reverse replay meets the swap first
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rotate(conn, [3, 4, 5])  # and the rollback's own drain
    code, err = while_hanging(db_dsn, tmp_path, "rollback", "swap_back:before_lock",  # and the one under its lock
                              lambda conn: rotate(conn, [6, 7], "handle"))
    assert code == 0, err
    assert_oracle(db_dsn, "acct", "acct_new")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT email FROM acct WHERE id = 1").fetchone()[0] == "u2@x"
        assert conn.execute("SELECT email FROM acct WHERE id = 3").fetchone()[0] == "u4@x"
    assert status(db_dsn)["divergences"] == 0


def events_of(dsn, kind):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT message, detail FROM mover.events WHERE kind = %s ORDER BY id", (kind,)).fetchall()


def test_rows_the_old_table_rejects_block_rollback_and_abort_until_given_up(db_dsn, tmp_path):
    create_acct(db_dsn)
    assert mover(db_dsn, "run", acct_plan(tmp_path)).returncode == 3
    assert mover(db_dsn, "cutover", "acct").returncode == 0
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # The new table's bigint key holds these; the old table's integer cannot.
        conn.execute("INSERT INTO acct VALUES (3000000001, 'big1@x', 'B1', 'n'), (3000000002, 'big2@x', 'B2', 'n')")
    r = mover(db_dsn, "run", "acct")
    assert r.returncode == 3, r.stderr
    assert "rollback window" in r.stderr and "2 rows exist only in" in r.stderr and "3000000002" in r.stderr
    r = mover(db_dsn, "rollback", "acct")
    assert r.returncode == 3, r.stderr
    assert "3000000001" in r.stderr and "3000000002" in r.stderr and "out of range" in r.stderr, r.stderr
    assert "--give-up-rows" in r.stderr
    st = status(db_dsn)
    assert st["step"] == "rollback_window" and st["cutover"] is not None  # nothing swapped back
    # The application fixes one row: it goes through, the other still blocks.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM acct WHERE id = 3000000002")
        conn.execute("UPDATE acct SET note = 'again' WHERE id = 3000000001")  # fails again: still one divergence
    r = mover(db_dsn, "run", "acct")
    assert r.returncode == 3 and "1 rows exist only in" in r.stderr and "3000000002" not in r.stderr, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT key, count(*) FROM mover.divergences WHERE resolved_at IS NULL GROUP BY key"
                            ).fetchall() == [(["3000000001"], 1)]
    r = mover(db_dsn, "abort", "acct")  # the new table is live: only a rollback brings the original back
    assert r.returncode == 2 and "`mover rollback acct`" in r.stderr, r.stderr
    assert status(db_dsn)["step"] == "rollback_window"
    assert events_of(db_dsn, "rows_given_up") == []

    r = mover(db_dsn, "rollback", "acct", "--give-up-rows")
    assert r.returncode == 0, r.stderr
    ((message, detail),) = events_of(db_dsn, "rows_given_up")
    assert [row["key"] for row in detail["rows"]] == [["3000000001"]], detail
    assert "3000000001" in message and "out of range" in message
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM acct WHERE email LIKE 'big%'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM acct_new WHERE email = 'big1@x'").fetchone()[0] == 1
    # Everything else the window wrote is in the original.
    assert differences(db_dsn, "acct", "acct_new") == (0, 1)
    assert status(db_dsn)["divergences"] == 0
    r = mover(db_dsn, "abort", "acct")  # given up already: nothing else exists only in the new table
    assert r.returncode == 0, r.stderr


def test_a_row_the_target_cannot_hold_stays_a_divergence_and_blocks_cutover(db_dsn, tmp_path):
    create_acct(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE acct ADD COLUMN n integer NOT NULL DEFAULT 0")
    plan = acct_plan(tmp_path, columns={"n": "smallint"}, target={"accept_lossy": ["n"]})
    assert mover(db_dsn, "run", plan).returncode == 3
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE acct SET n = 40000 WHERE id = 5")  # smallint cannot hold it
        rotate(conn, [5, 8])  # 8 takes 5's email, which the target's row 5 keeps while 5 cannot be replayed
        rotate(conn, [1, 2])  # while a swap in the same batch still replays
    r = mover(db_dsn, "run", "acct")
    assert r.returncode == 3, r.stderr
    assert "ready for cutover" not in r.stderr and "2 apply_error" in r.stderr, r.stderr
    assert "mover divergences acct" in r.stderr
    found = json.loads(mover(db_dsn, "divergences", "acct", "--json").stdout)
    assert sorted((d["key"], d["kind"]) for d in found) == [(["5"], "apply_error"), (["8"], "apply_error")]
    why = {d["key"][0]: d["columns"]["error"] for d in found}
    assert "out of range" in why["5"] and "duplicate key" in why["8"], why  # 8 is held up by 5's old row
    r = mover(db_dsn, "cutover", "acct")
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT email FROM acct_new WHERE id = 1").fetchone()[0] == "u2@x"
        conn.execute("UPDATE acct SET n = 5 WHERE id = 5")
    r = mover(db_dsn, "repair", "acct")  # key by key, each with its closure: 5 and 8 swap back in place
    assert r.returncode == 0, r.stderr
    assert status(db_dsn)["divergences"] == 0
    assert_oracle(db_dsn, "acct", "acct_new")

    # A change the target rejects, committed between the last check and the swap's lock: the
    # swap's transaction rolls back whole, and the row becomes a divergence.
    code, err = while_hanging(db_dsn, tmp_path, "cutover", "swap:before_lock",
                              lambda conn: conn.execute("UPDATE acct SET n = 50000, note = 'late' WHERE id = 6"))
    assert code == 3 and "['6']" in err and "nothing was swapped" in err, err
    st = status(db_dsn)
    assert (st["step"], st["cutover"], st["divergences"]) == ("cutover", None, 1), st
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                            " WHERE attrelid = 'acct'::regclass AND attname = 'id'").fetchone()[0] == "integer"
        assert conn.execute("SELECT to_regclass('acct_old')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'acct'::regclass"
                            " AND NOT tgisinternal").fetchone()[0] == 2  # the forward capture is still there


def test_abort_in_the_window_is_refused_and_rollback_then_abort_keep_every_write(db_dsn, tmp_path):
    create_acct(db_dsn)
    assert mover(db_dsn, "run", acct_plan(tmp_path)).returncode == 3
    assert mover(db_dsn, "cutover", "acct").returncode == 0
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rotate(conn, [1, 2])
        conn.execute("INSERT INTO acct VALUES (5000, 'w@x', 'W', 'window')")
        conn.execute("DELETE FROM acct WHERE id = 9")
        expected = conn.execute("SELECT * FROM acct ORDER BY id").fetchall()
    r = mover(db_dsn, "abort", "acct")
    assert r.returncode == 2 and "after its cutover" in r.stderr, r.stderr
    assert mover(db_dsn, "rollback", "acct").returncode == 0
    r = mover(db_dsn, "abort", "acct")
    assert r.returncode == 0, r.stderr
    assert status(db_dsn)["state"] == "aborted"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT * FROM acct ORDER BY id").fetchall() == expected
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                            " WHERE attrelid = 'acct'::regclass AND attname = 'id'").fetchone()[0] == "integer"
        assert conn.execute("SELECT to_regclass('acct_new'), to_regclass('acct_old')").fetchone() == (None, None)


def test_swaps_with_composite_key_quoted_names_and_partial_index(db_dsn, tmp_path):
    t = sql.Identifier("Odd Schema", 'Acct "X"')
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "Odd Schema"')
        conn.execute(sql.SQL('CREATE TABLE {} ("Tenant" int, "Line No" int, "E-mail" text NOT NULL UNIQUE,'
                             ' "Handle" text, live bool NOT NULL DEFAULT true, slot int,'
                             ' "Slot 2" int GENERATED ALWAYS AS (slot * 2) STORED UNIQUE, tiny int NOT NULL DEFAULT 0,'
                             ' PRIMARY KEY ("Tenant", "Line No"))')
                     .format(t))
        conn.execute(sql.SQL('CREATE UNIQUE INDEX "by handle" ON {} (lower("Handle"), "Tenant") WHERE live')
                     .format(t))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g % 3, g, 'e' || g, 'h' || g, true, g"
                             " FROM generate_series(1, 900) g").format(t))
    plan = plan_file(tmp_path, "odd", '"Odd Schema"."Acct ""X"""', columns={"Line No": "bigint", "tiny": "smallint"},
                     target={"accept_lossy": ["tiny"]})
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr

    def swap(conn, a, b, column):
        col = sql.Identifier(column)
        with conn.transaction():
            va, vb = (conn.execute(sql.SQL('SELECT {} FROM {} WHERE "Line No" = %s').format(col, t), (k,))
                      .fetchone()[0] for k in (a, b))
            conn.execute(sql.SQL('UPDATE {} SET {} = NULL WHERE "Line No" = %s').format(t, col), (a,))
            conn.execute(sql.SQL('UPDATE {} SET {} = %s WHERE "Line No" = %s').format(t, col), (va, b))
            conn.execute(sql.SQL('UPDATE {} SET {} = %s WHERE "Line No" = %s').format(t, col), (vb, a))

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        swap(conn, 3, 6, "Handle")  # same tenant: the expression index, with its predicate
        swap(conn, 10, 11, "slot")  # only the generated column's index sees this one
        # A real failure in the same batch: the batch falls back to key by key, each key with its closure.
        conn.execute(sql.SQL('UPDATE {} SET tiny = 40000 WHERE "Line No" = 900').format(t))
        with conn.transaction():  # the e-mail index: a 3-cycle through a temporary value
            conn.execute(sql.SQL('UPDATE {} SET "E-mail" = \'tmp\' WHERE "Line No" = 1').format(t))
            conn.execute(sql.SQL('UPDATE {} SET "E-mail" = \'e1\' WHERE "Line No" = 2').format(t))
            conn.execute(sql.SQL('UPDATE {} SET "E-mail" = \'e2\' WHERE "Line No" = 4').format(t))
            conn.execute(sql.SQL('UPDATE {} SET "E-mail" = \'e4\' WHERE "Line No" = 1').format(t))
    r = mover(db_dsn, "run", "odd")
    assert r.returncode == 3 and "1 divergences (1 apply_error)" in r.stderr, r.stderr
    (d,) = json.loads(mover(db_dsn, "divergences", "odd", "--json").stdout)
    assert d["key"] == ["0", "900"] and "out of range" in d["columns"]["error"], d
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL('UPDATE {} SET tiny = 1 WHERE "Line No" = 900').format(t))
    r = mover(db_dsn, "run", "odd")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        new = sql.Identifier("Odd Schema", 'Acct "X"_new')
        for x, y in ((t, new), (new, t)):
            q = sql.SQL("SELECT count(*) FROM (SELECT * FROM {} EXCEPT ALL SELECT * FROM {}) d").format(x, y)
            assert conn.execute(q).fetchone()[0] == 0
