"""The state machine (mover/state/control.py): the Alembic CHECKs agree with the step list, operator
commands are refused at steps the transition table does not allow (changing nothing), and a
transition by a process that no longer holds the lease, or that works from a stale step, hits
zero rows and raises LeaseLost (writing nothing, events included)."""

from __future__ import annotations

import re

import psycopg
import pytest

from mover import api, steps
from mover.db import Database
from mover.engines.capture import changelog
from mover.errors import BadInput, LeaseLost, Waiting
from mover.state import control
from tests.workload import create_orders, plan_text, write_plan

PLAN = plan_text("orders_sm", columns={"id": "bigint"}, backfill={"range_rows": 200})


def _check_values(db: Database, table: str, column: str) -> set[str]:
    """The literals of the CHECK on mover.<table>.<column>, read from the catalog."""
    def read(cur):
        cur.execute("SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c JOIN pg_attribute a"
                    " ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)"
                    " WHERE c.conrelid = %s::regclass AND c.contype = 'c' AND a.attname = %s",
                    (f"mover.{table}", column))
        return [r[0] for r in cur.fetchall()]
    defs = db.transaction(read)
    assert len(defs) == 1, defs
    return set(re.findall(r"'([a-z_]+)'::text", defs[0]))


def test_check_constraints_agree_with_the_step_list(db_dsn):
    db = Database(db_dsn)
    try:
        assert _check_values(db, "migrations", "step") == set(control.STEPS) | {control.FINISHED}
        assert _check_values(db, "steps", "name") == set(control.STEPS)
    finally:
        db.close()
    assert [s.name for s in steps.ALL] == list(control.STEPS)
    assert [control.next_step(s) for s in control.STEPS] == [*control.STEPS[1:], control.FINISHED]


def test_transition_table_is_derived_from_the_steps():
    for command, allowed in control.COMMANDS.items():
        assert allowed and allowed <= set(control.STEPS), command
    assert control.COMMANDS["cutover"] == {"cutover"}
    assert control.COMMANDS["rollback"] == {"rollback_window"}
    assert control.COMMANDS["retire"] == {"rollback_window", "retire"}
    assert "retire" not in control.COMMANDS["abort"] and "rollback_window" not in control.COMMANDS["abort"]


def _where(db_dsn):
    st = api.status(db_dsn, "orders_sm")
    return st["step"], st["state"], len(api.events(db_dsn, "orders_sm", limit=1000))


def test_operator_commands_refused_at_illegal_steps(db_dsn, tmp_path):
    create_orders(db_dsn, 600)
    plan = write_plan(tmp_path / "orders.toml", PLAN)
    for _ in range(2):
        api.run(db_dsn, plan, one_step=True)
    before = _where(db_dsn)
    assert before[0] == "backfill"
    for command in (api.cutover_now, api.rollback, api.retire):
        with pytest.raises(BadInput, match="at step 'backfill'"):
            command(db_dsn, "orders_sm")
    assert _where(db_dsn) == before  # refused before anything was written

    with pytest.raises(Waiting):
        api.run(db_dsn, "orders_sm")  # stops at the cutover gate
    for command in (api.rollback, api.retire):
        with pytest.raises(BadInput, match="at step 'cutover'"):
            command(db_dsn, "orders_sm")
    assert api.cutover_now(db_dsn, "orders_sm")["step"] == "rollback_window"
    with pytest.raises(BadInput, match="cannot cut over"):
        api.cutover_now(db_dsn, "orders_sm")
    assert api.rollback(db_dsn, "orders_sm")["step"] == "reconcile"
    assert api.abort(db_dsn, "orders_sm")["state"] == "aborted"
    for command in (api.cutover_now, api.rollback, api.retire, api.abort):
        with pytest.raises(BadInput, match="state 'aborted'"):
            command(db_dsn, "orders_sm")
    with pytest.raises(BadInput):
        api.set_paused(db_dsn, "orders_sm", True)


def test_stale_owner_transitions_hit_no_row(db_dsn, tmp_path):
    create_orders(db_dsn, 100)
    plan = write_plan(tmp_path / "orders.toml", PLAN)
    api.run(db_dsn, plan, one_step=True)  # at install_capture, no lease held
    db = Database(db_dsn)
    try:
        m = db.transaction(lambda cur: control.get(cur, "orders_sm"))
        db.transaction(lambda cur: control.acquire_lease(cur, m, "old-owner"))
        # Another process took over (its lease is live): the old owner's view is stale.
        db.transaction(lambda cur: cur.execute("UPDATE mover.migrations SET lease_owner = 'new-owner' WHERE id = %s",
                                               (m.id,)))
        before = _where(db_dsn)
        stale = [
            lambda cur: control.finish_step(cur, m, "install_capture", "old-owner"),
            lambda cur: control.start_step(cur, m, "install_capture", "old-owner"),
            lambda cur: control.wait_at_gate(cur, m, "old-owner", {"open": 0, "open_by_kind": {}}),
            lambda cur: control.mark_aborted(cur, m, "old-owner"),
            lambda cur: control.mark_swapped(cur, m, "old-owner", lock_ms=1.0, window_ms=1000, detail={}),
            lambda cur: control.mark_retired(cur, m, "new-owner", message="x"),  # wrong step, right owner
            lambda cur: control.finish_step(cur, m, "backfill", "new-owner"),  # a step it is not at
            # Each named wait belongs to one step; none is install_capture.
            lambda cur: control.wait_at_gate(cur, m, "new-owner", {"open": 0, "open_by_kind": {}}),
            lambda cur: control.wait_in_window(cur, m, "new-owner"),
            lambda cur: control.wait_for_divergences(cur, m, "new-owner", 1),
        ]
        for transition in stale:
            with pytest.raises(LeaseLost):
                db.transaction(transition)
        assert not db.transaction(lambda cur: control.record_outcome(cur, m.id, "old-owner", m.step, "failed", "x"))
        assert _where(db_dsn) == before
    finally:
        db.close()


def test_a_lease_released_by_finishing_is_not_reported_lost(db_dsn, tmp_path):
    """The heartbeat may beat once more after the retire or abort that released the lease: that
    is the end of the run, not a takeover (a 10 M-row zero-window run failed on it)."""
    create_orders(db_dsn, 100)
    plan = write_plan(tmp_path / "orders.toml", PLAN)
    api.run(db_dsn, plan, one_step=True)
    db = Database(db_dsn)
    try:
        m = db.transaction(lambda cur: control.get(cur, "orders_sm"))
        db.transaction(lambda cur: control.acquire_lease(cur, m, "me"))
        assert db.transaction(lambda cur: control.heartbeat(cur, m.id, "me"))
        db.transaction(lambda cur: cur.execute("UPDATE mover.migrations SET lease_owner = 'other' WHERE id = %s",
                                               (m.id,)))
        assert not db.transaction(lambda cur: control.heartbeat(cur, m.id, "me"))  # taken over: lost
        db.transaction(lambda cur: cur.execute("UPDATE mover.migrations SET lease_owner = 'me' WHERE id = %s",
                                               (m.id,)))
        db.transaction(lambda cur: control.mark_aborted(cur, m, "me"))  # releases the lease
        assert db.transaction(lambda cur: control.heartbeat(cur, m.id, "me"))  # finished, not lost
    finally:
        db.close()


def test_a_takeover_ends_the_stale_holder_of_the_applier_lock(db_dsn, tmp_path):
    """A process whose lease expired while it was stalled inside a replay batch keeps the applier
    lock for as long as it is stalled; every later batch only tries the lock, so nothing would
    be applied. The process taking the lease over ends that session."""
    create_orders(db_dsn, 100)
    plan = write_plan(tmp_path / "orders.toml", PLAN)
    api.run(db_dsn, plan, one_step=True)
    db, stalled = Database(db_dsn), psycopg.connect(db_dsn)
    try:
        m = db.transaction(lambda cur: control.get(cur, "orders_sm"))
        db.transaction(lambda cur: control.acquire_lease(cur, m, "stalled"))
        changelog.lock_applier(stalled.cursor(), m.id, False)  # its batch, never committed
        stalled_pid = stalled.info.backend_pid
        db.transaction(lambda cur: cur.execute(
            "UPDATE mover.migrations SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = %s",
            (m.id,)))
        db.transaction(lambda cur: control.acquire_lease(cur, m, "taker"))
        (ended,), = db.transaction(lambda cur: cur.execute(
            "SELECT detail->'applier_sessions_ended' FROM mover.events WHERE kind = 'lease_taken_over'"
            " ORDER BY id DESC LIMIT 1").fetchall())
        assert ended == [stalled_pid]
        with pytest.raises(psycopg.OperationalError):
            stalled.execute("SELECT 1")
        # The lock is free again: a batch gets it.
        assert db.transaction(lambda cur: changelog._lock_applier(cur, m.id, False, wait=False))
        # A takeover from nobody, or of one's own lease, ends nothing.
        db.transaction(lambda cur: control.acquire_lease(cur, m, "taker"))
    finally:
        stalled.close()
        db.close()
