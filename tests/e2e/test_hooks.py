"""[hooks]: commands and SQL before and after cutover, rollback and retire, through the CLI: a
failing before-hook stops the step with nothing changed, an after-hook's failure is reported and
the step stands, output goes to the events; `plan check` lists the hooks and warns about
prepared statements."""

from __future__ import annotations

import json

import psycopg

from tests.workload import catalog_snapshot, create_orders, differences, mover, plan_file


def plan(tmp_path, hooks: dict | None = None) -> str:
    return plan_file(tmp_path, "hooked", columns={"id": "bigint"}, **({"hooks": hooks} if hooks else {}))


def sql(dsn, statement, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def status(dsn):
    r = mover(dsn, "status", "hooked", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def events(dsn, kind):
    return sql(dsn, "SELECT message, detail FROM mover.events WHERE kind = %s ORDER BY id", (kind,))


def flat(text: str) -> str:
    return " ".join(text.split())  # the console wraps long lines


def test_a_failing_before_hook_stops_the_cutover_with_nothing_changed(db_dsn, tmp_path):
    create_orders(db_dsn, 500)
    p = plan(tmp_path, {"before_cutover": {"command": "echo deploys cannot be paused >&2; exit 4"}})
    assert mover(db_dsn, "run", p).returncode == 3
    before = catalog_snapshot(db_dsn)
    r = mover(db_dsn, "cutover", "hooked")
    assert r.returncode == 1, r.stderr
    err = flat(r.stderr)
    assert "before_cutover hook of 'hooked' failed (exit status 4); nothing was changed" in err, err
    assert "deploys cannot be paused" in err and "next: fix the hook" in err, err
    assert catalog_snapshot(db_dsn) == before
    assert status(db_dsn)["step"] == "cutover"
    ((_, detail),) = events(db_dsn, "hook_failed")
    assert detail == {"hook": "before_cutover", "output": "deploys cannot be paused"}


def test_hooks_run_around_cutover_rollback_and_retire_in_order(db_dsn, tmp_path):
    create_orders(db_dsn, 500)
    trail = tmp_path / "trail"
    hooks = {e: {"command": f'echo "$MOVER_HOOK $MOVER_MIGRATION $MOVER_SOURCE" >> {trail}; echo ran {e}'}
             for e in ("before_cutover", "before_rollback", "after_rollback", "before_retire", "after_retire")}
    hooks["after_cutover"] = {"sql": "SELECT pg_notify('app_schema', 'hooked swapped')", "timeout": "5s"}
    p = plan(tmp_path, hooks)
    assert mover(db_dsn, "run", p).returncode == 3
    with psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN app_schema")
        r = mover(db_dsn, "cutover", "hooked")
        assert r.returncode == 0, r.stderr
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == ["hooked swapped"]
    assert mover(db_dsn, "rollback", "hooked").returncode == 0
    assert mover(db_dsn, "run", "hooked").returncode == 3
    assert mover(db_dsn, "cutover", "hooked").returncode == 0
    r = mover(db_dsn, "retire", "hooked", "--force")
    assert r.returncode == 0, r.stderr
    assert trail.read_text().splitlines() == [f'{e} hooked "public"."Orders"' for e in (
        "before_cutover", "before_rollback", "after_rollback", "before_cutover", "before_retire", "after_retire")]
    ran = [(d["hook"], d["output"]) for _, d in events(db_dsn, "hook")]
    assert ran[0] == ("before_cutover", "ran before_cutover")
    assert ("after_cutover", "SELECT 1;") in ran, ran  # the SQL hook's status line and its (void) row
    assert status(db_dsn)["state"] == "done"


def test_a_failing_after_hook_is_reported_and_the_cutover_stands(db_dsn, tmp_path):
    create_orders(db_dsn, 500)
    p = plan(tmp_path, {"after_cutover": {"sql": "SELECT 1/0"}})
    assert mover(db_dsn, "run", p).returncode == 3
    r = mover(db_dsn, "cutover", "hooked")
    assert r.returncode == 0, r.stderr
    assert "not rolled back" in flat(r.stderr), r.stderr
    assert status(db_dsn)["step"] == "rollback_window"
    ((message, _),) = events(db_dsn, "hook_failed")
    assert "DivisionByZero" in message and "[22012]" in message and "the cutover stands" in message
    assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)


def test_a_hook_that_hangs_times_out_and_stops_the_rollback(db_dsn, tmp_path):
    create_orders(db_dsn, 500)
    p = plan(tmp_path, {"before_rollback": {"command": "sleep 20", "timeout": "300ms"}})
    assert mover(db_dsn, "run", p).returncode == 3
    assert mover(db_dsn, "cutover", "hooked").returncode == 0
    r = mover(db_dsn, "rollback", "hooked", timeout=15)
    assert r.returncode == 1, r.stderr
    assert "timed out after 300 ms" in flat(r.stderr), r.stderr
    assert status(db_dsn)["step"] == "rollback_window"


def test_plan_check_lists_hooks_and_warns_about_prepared_statements(db_dsn, tmp_path):
    create_orders(db_dsn, 100)
    r = mover(db_dsn, "plan", "check", plan(tmp_path))
    assert r.returncode == 0, r.stderr
    out = flat(r.stdout)
    assert "SQLSTATE 0A000" in out and "add [hooks.after_cutover]" in out, out
    r = mover(db_dsn, "plan", "check", plan(tmp_path, {"after_cutover": {
        "command": "psql -h pgbouncer -p 6432 pgbouncer -c 'RECONNECT app'"}}), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["hooks"] == {"after_cutover": "command = \"psql -h pgbouncer -p 6432 pgbouncer -c 'RECONNECT app'\","
                                                " timeout 30000 ms"}
    assert "hooks configured: after_cutover" in result["warnings"][0]


def test_the_warning_is_true_a_prepared_statement_fails_after_the_swap(db_dsn, tmp_path):
    """What the warning says, shown: PostgreSQL refuses a statement prepared before the swap."""
    create_orders(db_dsn, 100)
    assert mover(db_dsn, "run", plan(tmp_path)).returncode == 3
    with psycopg.connect(db_dsn, autocommit=True) as app:
        app.execute('PREPARE one AS SELECT id FROM "Orders" WHERE id = 1')
        app.execute("EXECUTE one")
        assert mover(db_dsn, "cutover", "hooked").returncode == 0
        try:
            app.execute("EXECUTE one")
            raised = None
        except psycopg.Error as exc:
            raised = exc.sqlstate
        assert raised == "0A000"
        app.execute("DEALLOCATE ALL")  # what the hook makes the application do
        app.execute('PREPARE one AS SELECT id FROM "Orders" WHERE id = 1')
        assert app.execute("EXECUTE one").fetchall() == [(1,)]
