"""Capture that is switched off behind mover's back (issue 34, item 1; invariant 14 in docs/design.md):
`DISABLE TRIGGER USER` / `ENABLE TRIGGER USER` around a bulk load (which leaves mover's ENABLE
ALWAYS trigger an ordinary one, skipped by writes under session_replication_role = replica),
DISABLE TRIGGER ALL, ENABLE REPLICA, a DISABLE then ENABLE ALWAYS between two of mover's checks,
the trigger dropped and created again, the same on the reverse trigger in the rollback window, and
logical capture's publication altered or dropped. Each is named, and no swap happens until capture
is back in force and a full comparison (or re-sync) ran after it. Judged by the writer's mirror
(the oracle the application writes in the same transaction), never by mover's reconcile alone."""

from __future__ import annotations

import json
import re

import psycopg
import pytest

from tests.workload import Writer, app_execute, assert_oracle, create_orders, mover, plan_file

NAME = "orders_bigint"
TRIGGER = "mover_m1_capture"
REVERSE = "mover_m1_reverse_capture"


def run(dsn, *args):
    """mover's command with its stderr on one line (the console wraps long messages)."""
    r = mover(dsn, *args)
    r.stderr = " ".join(r.stderr.split())
    return r


def status(dsn):
    r = mover(dsn, "status", NAME, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def events(dsn, kind):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT message FROM mover.events WHERE kind = %s ORDER BY id",
                                           (kind,)).fetchall()]


def tgenabled(dsn, trigger):
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT tgenabled::text FROM pg_trigger WHERE tgname = %s", (trigger,)).fetchone()
        return row[0] if row else None


def bulk_load(conn, tag):
    """What a DBA's load does to the table, mirrored in the same transactions (the oracle): a
    200-row insert, a 100-row update, a few deletes."""
    app_execute(conn, "INSERT INTO {t} (\"Account\", amount, status, note) SELECT g, g, 'bulk', %s"
                      " FROM generate_series(1, 200) g", (tag,))
    app_execute(conn, "UPDATE {t} SET amount = amount + 7, note = %s WHERE id IN"
                      " (SELECT id FROM {t} WHERE mod(id, 10) = 3 ORDER BY id LIMIT 100)", (tag,))
    app_execute(conn, "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE mod(id, 10) = 7 ORDER BY id LIMIT 20)")


def replica_writes(conn, tag):
    """Writes of a session with session_replication_role = replica (pg_restore, loaders, logical
    replication appliers): they fire only ALWAYS and REPLICA triggers."""
    conn.execute("SET session_replication_role = replica")
    try:
        app_execute(conn, "UPDATE {t} SET note = %s WHERE id IN (SELECT id FROM {t} WHERE mod(id, 10) = 5"
                          " ORDER BY id LIMIT 50)", (tag,))
        app_execute(conn, "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE mod(id, 10) = 9 ORDER BY id LIMIT 10)")
    finally:
        conn.execute("SET session_replication_role = origin")


def orders(dsn, tmp_path, **sections):
    create_orders(dsn, 4000)
    return plan_file(tmp_path, NAME, columns={"id": "bigint"}, backfill={"range_rows": 1000}, **sections)


def recover_forward(dsn, writer):
    """After capture is back in force: the full comparison, the repair of what it finds, the cutover."""
    r = run(dsn, "run", NAME)  # a reconcile pass over every range finds what capture missed
    assert r.returncode == 3, r.stderr
    assert "reconcile (full)" in r.stderr or "full" in json.dumps(events(dsn, "pass_done")), r.stderr
    found = status(dsn)["divergences"]
    assert found > 0, r.stderr  # the writes capture missed: found by the comparison, not by luck
    if found:
        assert "capture was bypassed" in r.stderr, r.stderr  # the divergences are explained, not bare
        writer.pause()
        assert mover(dsn, "repair", NAME).returncode == 0
        writer.resume()
        r = run(dsn, "run", NAME)
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    assert status(dsn)["capture"]["gaps"] == []
    r = run(dsn, "cutover", NAME)
    assert r.returncode == 0, r.stderr
    writer.pause()  # just after the swap: every committed write is in the live table
    assert_oracle(dsn, "Orders")


# Each way to leave mover's trigger not in force, and the operator's bulk load around it.
NOT_IN_FORCE = {
    # The reported case: the trigger ends up 'O'; writes under replica role skip it.
    "disable_enable_user": ('ALTER TABLE "Orders" DISABLE TRIGGER USER', 'ALTER TABLE "Orders" ENABLE TRIGGER USER',
                            "tgenabled O (was A)"),
    "disable_all": ('ALTER TABLE "Orders" DISABLE TRIGGER ALL', None, "tgenabled D (was A)"),
    "enable_replica": (f'ALTER TABLE "Orders" ENABLE REPLICA TRIGGER {TRIGGER}', None, "tgenabled R (was A)"),
}


@pytest.mark.parametrize("how", list(NOT_IN_FORCE))
def test_capture_switched_off_refuses_the_cutover_until_restored_and_compared(db_dsn, tmp_path, how):
    off, after, seen = NOT_IN_FORCE[how]
    plan = orders(db_dsn, tmp_path)
    writer = Writer(db_dsn, seed=34, delay=0.002).start()
    try:
        assert mover(db_dsn, "run", plan).returncode == 3  # at the gate
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(off)
            bulk_load(conn, "bulk")
            if after:
                conn.execute(after)
            replica_writes(conn, "replica")
        r = run(db_dsn, "cutover", NAME)
        assert r.returncode == 3, r.stderr
        assert f'trigger "{TRIGGER}" on "public"."Orders"' in r.stderr and seen in r.stderr, r.stderr
        fix = f'ALTER TABLE "public"."Orders" ENABLE ALWAYS TRIGGER "{TRIGGER}"'
        assert fix in r.stderr, r.stderr
        st = status(db_dsn)
        assert st["step"] == "cutover" and TRIGGER in [g["object"] for g in st["capture"]["gaps"]], st
        assert "CAPTURE GAP" in mover(db_dsn, "status", NAME).stdout
        assert events(db_dsn, "capture_gap")
        assert mover(db_dsn, "cutover", NAME).returncode == 3  # still off: still refused
        fixes = re.findall(r'ALTER TABLE "public"\."Orders" ENABLE ALWAYS TRIGGER "[^"]+"', r.stderr)
        assert len(fixes) == (1 if how == "enable_replica" else 2), r.stderr  # the TRUNCATE trigger's too
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            for statement in fixes:  # what the refusal said
                conn.execute(statement)
        r = run(db_dsn, "cutover", NAME)  # back in force, but what it missed is not compared yet
        assert r.returncode == 3 and "every range must be compared again" in r.stderr, r.stderr
        assert status(db_dsn)["step"] == "reconcile"
        recover_forward(db_dsn, writer)
    finally:
        writer.halt()
    assert writer.errors == []


def test_a_row_the_application_deletes_behind_a_captured_replica_update_is_gone_after_the_cutover(db_dsn, tmp_path):
    """The one failure of the test above ([enable_replica], under CPU load), made deterministic:
    the trigger ENABLE REPLICA; a replica session's update of row k is captured, and the
    application's delete of k (not captured: an origin write), waiting for k's lock, commits right
    after it. The target must lose k, and the oracle must say k is gone (it once kept k, the mirror
    row app_execute rewrote: tests/integration/test_workload_oracle.py)."""
    import threading
    import time

    from psycopg import sql
    plan = orders(db_dsn, tmp_path)
    writer = Writer(db_dsn, seed=34, delay=0.002).start()
    try:
        assert mover(db_dsn, "run", plan).returncode == 3  # at the gate
        with psycopg.connect(db_dsn, autocommit=True) as conn, psycopg.connect(db_dsn, autocommit=True) as app, \
                psycopg.connect(db_dsn, autocommit=True) as watch:
            conn.execute(NOT_IN_FORCE["enable_replica"][0])
            deleter = Writer(db_dsn)
            deleter.connected(app)
            conn.execute("SET session_replication_role = replica")
            with conn.transaction():  # replica_writes' update, its transaction held until the delete waits
                app_execute(conn, "UPDATE {t} SET note = 'replica' WHERE id IN (SELECT id FROM {t}"
                                  " WHERE mod(id, 10) = 5 ORDER BY id LIMIT 50)")
                (k,) = conn.execute("SELECT max(id) FROM \"Orders\" WHERE note = 'replica'").fetchone()
                t = threading.Thread(target=deleter._run, args=(app, sql.SQL('DELETE FROM "Orders" WHERE id = %(k)s'
                                                                              ' RETURNING id'), {"k": k}),
                                     kwargs={"delete": True})
                t.start()
                deadline = time.monotonic() + 30
                while watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                    (app.info.backend_pid,)).fetchone()[0] != "Lock":
                    assert time.monotonic() < deadline, "the delete never waited for the row"
                    time.sleep(0.01)
            t.join(30)
            conn.execute("SET session_replication_role = origin")
            conn.execute(f'ALTER TABLE "public"."Orders" ENABLE ALWAYS TRIGGER "{TRIGGER}"')
        r = run(db_dsn, "cutover", NAME)  # back in force: every range compared again first
        assert r.returncode == 3 and "every range must be compared again" in r.stderr, r.stderr
        recover_forward(db_dsn, writer)  # the oracle, just after the swap
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            assert conn.execute('SELECT count(*) FROM "Orders" WHERE id = %s', (k,)).fetchone()[0] == 0
    finally:
        writer.halt()
    assert writer.errors == []


# Capture put back before mover looked: the state is right, the row is not the one mover verified.
PUT_BACK = {
    "disable_enable_always": [f'ALTER TABLE "Orders" DISABLE TRIGGER {TRIGGER}', "LOAD",
                              f'ALTER TABLE "Orders" ENABLE ALWAYS TRIGGER {TRIGGER}'],
    "one_transaction": ["BEGIN", 'ALTER TABLE "Orders" DISABLE TRIGGER USER', "LOAD",
                        f'ALTER TABLE "Orders" ENABLE ALWAYS TRIGGER {TRIGGER}',
                        f'ALTER TABLE "Orders" ENABLE ALWAYS TRIGGER {TRIGGER}_truncate', "COMMIT"],
    "dropped_and_created": [f'DROP TRIGGER {TRIGGER} ON "Orders"', "LOAD",
                            f'CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON "Orders" FOR EACH ROW'
                            f' EXECUTE FUNCTION mover.m1_capture()',
                            f'ALTER TABLE "Orders" ENABLE ALWAYS TRIGGER {TRIGGER}'],
}


@pytest.mark.parametrize("how", list(PUT_BACK))
def test_capture_off_and_on_between_two_checks_is_a_gap(db_dsn, tmp_path, how):
    plan = orders(db_dsn, tmp_path)
    writer = Writer(db_dsn, seed=35, delay=0.002).start()
    try:
        assert mover(db_dsn, "run", plan).returncode == 3  # at the gate; the drains verified the trigger
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            for stmt in PUT_BACK[how]:
                if stmt == "LOAD":
                    bulk_load(conn, "unseen")
                else:
                    conn.execute(stmt)
        assert tgenabled(db_dsn, TRIGGER) == "A"  # it looks as mover left it
        r = run(db_dsn, "cutover", NAME)
        assert r.returncode == 3, r.stderr
        assert f'trigger "{TRIGGER}" on "public"."Orders"' in r.stderr, r.stderr
        assert ("dropped and created again" if how == "dropped_and_created" else "row was rewritten") in r.stderr
        assert status(db_dsn)["step"] == "reconcile"  # back for a pass over every range
        r = run(db_dsn, "cutover", NAME)
        assert r.returncode != 0, r.stderr  # not at the gate: the full pass has not run
        recover_forward(db_dsn, writer)
    finally:
        writer.halt()
    assert writer.errors == []


def test_a_gap_seen_only_under_the_swaps_lock_refuses(db_dsn, tmp_path):
    """The trigger switched off and on again after the last drain before the lock: the check inside
    the swap's locked transaction refuses, records the gap, and nothing is swapped."""
    from tests.workload import cutover_with_change_before_lock
    plan = orders(db_dsn, tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    code, err = cutover_with_change_before_lock(
        db_dsn, NAME, tmp_path, f'ALTER TABLE "Orders" DISABLE TRIGGER {TRIGGER}',
        "UPDATE \"Orders\" SET note = 'lost' WHERE id < 50",
        f'ALTER TABLE "Orders" ENABLE ALWAYS TRIGGER {TRIGGER}')
    err = " ".join(err.split())
    assert code == 3, err
    assert f'trigger "{TRIGGER}" on "public"."Orders"' in err and "row was rewritten" in err, err
    st = status(db_dsn)
    assert st["step"] in ("cutover", "reconcile") and st["capture"]["gaps"], st
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM \"Orders_new\" WHERE note = 'lost'").fetchone()[0] == 0
        assert conn.execute("SELECT to_regclass('\"Orders_old\"')").fetchone()[0] is None  # not swapped


def test_a_bypass_the_catalog_cannot_show_is_named_by_the_comparison(db_dsn, tmp_path):
    """A trigger mover never marked (as one a mover older than the check installed): its first check
    takes it as it finds it, so a bypass before that leaves no trace in the catalog. The comparison
    still finds it, and names it: ranges equal at the last pass now differ in nearly every row."""
    plan = orders(db_dsn, tmp_path)
    writer = Writer(db_dsn, seed=38, delay=0.002).start()
    try:
        assert mover(db_dsn, "run", plan).returncode == 3
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM mover.capture_marks")
            with conn.transaction():
                conn.execute(f'ALTER TABLE "Orders" DISABLE TRIGGER {TRIGGER}')
                app_execute(conn, "UPDATE {t} SET amount = amount + 1")
                conn.execute(f'ALTER TABLE "Orders" ENABLE ALWAYS TRIGGER {TRIGGER}')
        writer.wait_for_ops(writer.ops + 100)  # captured writes: the incremental pass re-verifies their ranges
        r = run(db_dsn, "cutover", NAME)
        assert r.returncode == 3, r.stderr
        assert "unresolved divergences" in r.stderr and "capture was bypassed" in r.stderr, r.stderr
        assert re.search(r"\d+ of the \d+ rows of reconcile range \d+ differ, though the range was equal", r.stderr)
        writer.pause()
        assert mover(db_dsn, "repair", NAME).returncode == 0
        writer.resume()
        r = run(db_dsn, "reconcile", NAME, "--full")
        assert mover(db_dsn, "repair", NAME).returncode == 0
        assert run(db_dsn, "run", NAME).returncode == 3
        r = run(db_dsn, "cutover", NAME)
        assert r.returncode == 0, r.stderr
        writer.pause()
        assert_oracle(db_dsn, "Orders")
    finally:
        writer.halt()
    assert writer.errors == []


def test_reverse_capture_demoted_in_the_window_refuses_rollback(db_dsn, tmp_path):
    plan = orders(db_dsn, tmp_path)
    writer = Writer(db_dsn, seed=36, delay=0.002).start()
    try:
        assert mover(db_dsn, "run", plan).returncode == 3
        assert mover(db_dsn, "cutover", NAME).returncode == 0
        assert mover(db_dsn, "run", NAME).returncode == 3  # the window: the reverse drains verify the trigger
        with psycopg.connect(db_dsn, autocommit=True) as conn:  # the same routine, on the live table
            conn.execute('ALTER TABLE "Orders" DISABLE TRIGGER USER')
            bulk_load(conn, "window bulk")
            conn.execute('ALTER TABLE "Orders" ENABLE TRIGGER USER')
            replica_writes(conn, "window replica")
        r = run(db_dsn, "rollback", NAME)
        assert r.returncode == 3, r.stderr
        fix = f'ALTER TABLE "public"."Orders" ENABLE ALWAYS TRIGGER "{REVERSE}"'
        assert f'trigger "{REVERSE}" on "public"."Orders"' in r.stderr and fix in r.stderr, r.stderr
        assert "tgenabled O (was A)" in r.stderr, r.stderr
        r = run(db_dsn, "run", NAME)  # the window's own run names it too
        assert r.returncode == 3 and REVERSE in r.stderr, r.stderr
        fixes = re.findall(r'ALTER TABLE "public"\."Orders" ENABLE ALWAYS TRIGGER "[^"]+"', r.stderr)
        assert fix in fixes and len(fixes) == 2, r.stderr  # and the TRUNCATE trigger's
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            for statement in fixes:
                conn.execute(statement)
        r = run(db_dsn, "rollback", NAME)  # in force again, but the old table lacks what it missed
        assert r.returncode == 3 and "re-syncs every row" in r.stderr, r.stderr
        assert status(db_dsn)["step"] == "rollback_window"
        r = run(db_dsn, "run", NAME)  # re-syncs every key into the old table
        assert r.returncode == 3, r.stderr
        assert events(db_dsn, "capture_resynced")
        assert status(db_dsn)["capture"]["gaps"] == []
        r = run(db_dsn, "rollback", NAME)
        assert r.returncode == 0, r.stderr
        writer.pause()
        assert_oracle(db_dsn, "Orders")  # the original again, holding every write, the bulk load's too
    finally:
        writer.halt()
    assert writer.errors == []


def test_reverse_gap_given_up_is_recorded(db_dsn, tmp_path):
    plan = orders(db_dsn, tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    assert mover(db_dsn, "cutover", NAME).returncode == 0
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "Orders" DISABLE TRIGGER {REVERSE}')
        conn.execute("UPDATE \"Orders\" SET note = 'given up' WHERE id < 10")
        assert mover(db_dsn, "rollback", NAME, "--give-up-rows").returncode == 3  # not in force: never
        conn.execute(f'ALTER TABLE "Orders" ENABLE ALWAYS TRIGGER {REVERSE}')
    r = mover(db_dsn, "rollback", NAME, "--give-up-rows")
    assert r.returncode == 0, r.stderr
    assert events(db_dsn, "capture_gap_given_up")


LOGICAL_CHANGES = {
    "publish_fewer_actions": ("ALTER PUBLICATION mover_m1_capture SET (publish = 'insert')", "publishes only insert"),
    "table_dropped_from_it": ('ALTER PUBLICATION mover_m1_capture DROP TABLE "Orders"', "removed from mover's"),
    "dropped": ("DROP PUBLICATION mover_m1_capture", "the publication was dropped"),
}


@pytest.mark.parametrize("how", list(LOGICAL_CHANGES))
def test_logical_capture_publication_changed_is_named_and_refused(db_dsn, tmp_path, how):
    statement, seen = LOGICAL_CHANGES[how]
    plan = orders(db_dsn, tmp_path, capture={"method": "logical"})
    writer = Writer(db_dsn, seed=37, delay=0.002).start()
    try:
        assert mover(db_dsn, "run", plan).returncode == 3
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(statement)
            app_execute(conn, "UPDATE {t} SET note = 'unpublished' WHERE id BETWEEN 100 AND 140")
        r = run(db_dsn, "cutover", NAME)
        assert r.returncode == 3, r.stderr
        assert re.search(r'publication "mover_m1_capture"', r.stderr) and seen in r.stderr, r.stderr
        assert f"mover recapture {NAME}" in r.stderr, r.stderr
        assert status(db_dsn)["capture"]["gaps"]
        r = mover(db_dsn, "recapture", NAME)
        assert r.returncode == 0, r.stderr
        recover_forward(db_dsn, writer)
    finally:
        writer.halt()
    assert writer.errors == []


def test_logical_capture_slot_dropped_and_created_again_stops_the_feed(db_dsn, tmp_path):
    """A slot of mover's name made again by someone: it exists and is usable, but starts past where
    mover fed from the old one; the changes in between would never be fed."""
    plan = orders(db_dsn, tmp_path, capture={"method": "logical"})
    writer = Writer(db_dsn, seed=39, delay=0.002).start()
    try:
        assert mover(db_dsn, "run", plan).returncode == 3
        slot = status(db_dsn)["capture"]["slot"]["slot"]
        writer.pause()
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            app_execute(conn, "UPDATE {t} SET note = 'between the slots' WHERE id BETWEEN 300 AND 330")
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        writer.resume()
        r = run(db_dsn, "run", NAME)
        assert r.returncode == 1, r.stderr
        assert f"the replication slot {slot}" in r.stderr and "dropped and created again" in r.stderr, r.stderr
        assert f"mover recapture {NAME}" in r.stderr, r.stderr
        assert mover(db_dsn, "recapture", NAME).returncode == 0
        recover_forward(db_dsn, writer)
    finally:
        writer.halt()
    assert writer.errors == []
