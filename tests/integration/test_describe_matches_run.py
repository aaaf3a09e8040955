"""`plan check` prints what runs: each DDL step's describe(), taken just before the step runs,
lists exactly the DDL statements the step then executes, in order (recorded by a cursor that
logs every statement sent on the orchestrator's connection)."""

from __future__ import annotations

import re

import psycopg
from psycopg import sql

from mover import api, control, cutover, runner, steps
from mover.db import Database
from mover.plan import load_plan
from mover.steps import rollback_window
from tests.workload import create_orders, write_plan

PLAN = """
[migration]
name = "{name}"
source = 'public."Orders"'

[target]
columns = {{ id = "bigint" }}

[backfill]
range_rows = 100

[rollback]
window = "1h"
"""

DDL = re.compile(r"\s*(CREATE|ALTER|DROP|COMMENT|GRANT|REVOKE|LOCK|SELECT setval)\b", re.IGNORECASE)


class Recording(psycopg.Cursor):
    sent: list[str] = []

    def execute(self, query, params=None, **kwargs):
        Recording.sent.append(query.as_string(self) if isinstance(query, sql.Composable) else str(query))
        return super().execute(query, params, **kwargs)


def ddl_only(texts) -> list[str]:
    return [t for t in texts if DDL.match(t)]


def described(ctx, cur, stmts) -> list[str]:
    return ddl_only(s if isinstance(s, str) else s.as_string(cur) for s in stmts)


def _setup(db_dsn, tmp_path, name):
    create_orders(db_dsn, 300)
    plan = write_plan(tmp_path / f"{name}.toml", PLAN.format(name=name))
    db = Database(db_dsn)
    m = api._register_or_load(db, load_plan(plan), "test")
    db.connection().cursor_factory = Recording
    return db, m


def _run_and_compare(ctx, name, run) -> list[str]:
    want = ctx.db.transaction(lambda cur: described(ctx, cur, steps.BY_NAME[name].describe(ctx, cur)))
    Recording.sent = []
    run()
    got = ddl_only(Recording.sent)
    assert got == want, f"{name}: describe() printed\n" + "\n".join(want) + "\nbut ran\n" + "\n".join(got)
    return got


def test_each_ddl_step_runs_what_it_describes(db_dsn, tmp_path):
    db, m = _setup(db_dsn, tmp_path, "orders_describe")
    try:
        with runner.leased(db, m, control.new_owner_id()) as ctx:
            for name in ("create_target", "install_capture"):
                assert ctx.refresh().step == name
                assert _run_and_compare(ctx, name, lambda: runner.advance(ctx, one_step=True))
            runner.advance(ctx, one_step=True)  # backfill
            runner.advance(ctx, one_step=True)  # reconcile
            assert ctx.refresh().step == "cutover"
            swap = _run_and_compare(ctx, "cutover", lambda: runner.advance(ctx, through_cutover=True))
            assert any("RENAME TO" in s for s in swap) and any("CREATE TRIGGER" in s for s in swap)
            assert rollback_window.close(ctx, force=True)
            dropped = _run_and_compare(ctx, "retire", lambda: runner.advance(ctx))
            assert len(dropped) >= 7  # both captures' triggers, functions, logs, the notes, the old table
            assert ctx.refresh().state == "done"
    finally:
        db.close()


def test_abort_runs_what_it_lists(db_dsn, tmp_path):
    db, m = _setup(db_dsn, tmp_path, "orders_abort")
    try:
        with runner.leased(db, m, control.new_owner_id()) as ctx:
            runner.advance(ctx, one_step=True)
            runner.advance(ctx, one_step=True)
            want = ctx.db.transaction(lambda cur: described(ctx, cur, [cutover.render(cur, s)
                                                                       for s in cutover.abort_sql(cur, ctx)]))
            Recording.sent = []
            runner.abort(ctx)
            assert ddl_only(Recording.sent) == want and any(s.startswith("DROP TABLE") for s in want)
            assert ctx.refresh().state == "aborted"
    finally:
        db.close()
