"""A concurrent index build on the source mid-backfill (issue 34 item 7): REINDEX TABLE CONCURRENTLY
puts <index>_ccnew beside each index for as long as it runs. That transient index is not a change
of the table's shape (mover/catalog/shape.py transient()): it stopped a healthy run (exit 2) telling
the operator to `mover abort`. Now the run goes on while the build runs (its lock keeps the swap
out until it ends), the REINDEX leaves the recorded shape as it was, and the run reaches the gate
and swaps without `mover adopt`; the application's mirror (an independent oracle) matches. A build
that failed leaves its index behind: named, with the DROP INDEX that clears it, never "abort"."""

from __future__ import annotations

import threading
import time

import psycopg

from tests.workload import (
    Writer,
    assert_oracle,
    create_orders,
    finish,
    hung_at,
    mover,
    plan_text,
    spawn,
    write_plan,
)

INDEXES = """SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE i.indrelid = '"Orders"'::regclass ORDER BY 1"""


def _plan(tmp_path) -> str:
    return write_plan(tmp_path / "orders.toml", plan_text("orders", '"Orders"', columns={"id": "bigint"},
                                                          backfill={"range_rows": 500, "min_rows": 500,
                                                                    "max_rows": 500}, cutover={"attempts": 3}))


def _waiting_reindex(dsn: str, done: list) -> threading.Thread:
    """REINDEX TABLE CONCURRENTLY "Orders" in a thread, returned once it waits with its _ccnew
    indexes built beside the originals (the caller holds an old snapshot it waits for)."""
    def reindex() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute('REINDEX TABLE CONCURRENTLY "Orders"')
            done.append(None)
        except psycopg.Error as exc:
            done.append(exc)

    thread = threading.Thread(target=reindex)
    thread.start()
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            (phase,) = conn.execute("SELECT coalesce(max(phase), '') FROM pg_stat_progress_create_index"
                                    " WHERE relid = '\"Orders\"'::regclass").fetchone()
            if phase == "waiting for old snapshots":
                break
            assert time.monotonic() < deadline and not done, (phase, done)
            time.sleep(0.05)  # polling the build's progress view: the event is another session's state
        assert any(name.endswith("_ccnew") and not valid for name, valid in conn.execute(INDEXES).fetchall())
    return thread


def test_a_reindex_concurrently_mid_backfill_is_waited_out_not_an_abort(db_dsn, tmp_path):
    create_orders(db_dsn, 8000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        indexes = conn.execute(INDEXES).fetchall()
    plan = _plan(tmp_path)
    writer = Writer(db_dsn, seed=34).start()
    release = tmp_path / "release"
    proc = spawn(db_dsn, "run", plan, env={"MOVER_FAULT": "hang@range_copied:2", "MOVER_FAULT_RELEASE": str(release)})
    holder = psycopg.connect(db_dsn)  # an old snapshot the REINDEX waits for before it can finish
    reindexed: list = []
    thread = None
    try:
        assert hung_at(proc, "range_copied:2")  # capture installed, the backfill under way
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")
        thread = _waiting_reindex(db_dsn, reindexed)
        release.touch()  # the range checks the shape, now with Orders_pkey_ccnew beside Orders_pkey
        code, err = finish(proc, 300)
        assert code == 3 and "ready for cutover" in err, err
        assert "abort" not in err and "adopt" not in err, err
        assert not reindexed  # still waiting: the whole backfill and reconcile ran beside it
        # The swap cannot meet the build: its lock waits for the build's, as for any blocker.
        r = mover(db_dsn, "cutover", "orders")
        said = " ".join(r.stderr.split())
        assert r.returncode == 3 and "running REINDEX CONCURRENTLY (waiting for old snapshots)" in said, r.stderr
        assert "abort" not in said, r.stderr
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT to_regclass('\"Orders_old\"')").fetchone() == (None,)  # nothing swapped
        holder.rollback()
        thread.join(120)
        assert reindexed == [None], reindexed
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            assert conn.execute(INDEXES).fetchall() == indexes  # rebuilt under the same names
        r = mover(db_dsn, "run", "orders")  # the recorded shape holds again: no adopt
        assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
        r = mover(db_dsn, "cutover", "orders")
        assert r.returncode == 0, r.stderr
        writer.pause()
        r = mover(db_dsn, "run", "orders")
        assert r.returncode == 3, r.stderr
    finally:
        release.touch()
        holder.close()
        writer.halt()
        if thread is not None:
            thread.join(120)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert writer.errors == [], writer.errors[:5]
    assert_oracle(db_dsn, "Orders", "Orders_old")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert [n for n, _ in conn.execute(INDEXES).fetchall()] == [n for n, _ in indexes]


def test_a_failed_concurrent_build_is_named_with_the_drop_that_clears_it(db_dsn, tmp_path):
    create_orders(db_dsn, 2000)
    plan = _plan(tmp_path)
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")  # an old snapshot: the REINDEX waits for it
        done: list = []
        thread = _waiting_reindex(db_dsn, done)
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_progress_create_index"
                         " WHERE relid = '\"Orders\"'::regclass")
        thread.join(60)
    assert done and isinstance(done[0], psycopg.errors.QueryCanceled), done
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        left = [n for n, valid in conn.execute(INDEXES).fetchall() if not valid]
    assert left and all(n.endswith("_ccnew") for n in left), left
    r = mover(db_dsn, "run", "orders")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "mover abort" not in said, r.stderr
    for n in left:
        assert f'DROP INDEX CONCURRENTLY "public"."{n}"' in said, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for n in left:
            conn.execute(f'DROP INDEX CONCURRENTLY "public"."{n}"')
    r = mover(db_dsn, "run", "orders")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
