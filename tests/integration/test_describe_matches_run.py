"""`plan check` prints what runs: each DDL step's describe(), taken just before the step runs,
lists exactly the DDL statements the step then executes, in order (recorded by a cursor that
logs every statement sent on the orchestrator's connection)."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import sql

from mover import steps
from mover.db import Database
from mover.engines.capture import logical
from mover.engines.swap import cutover
from mover.plan import load_plan
from mover.runner import lifecycle, register
from mover.runner.lease import leased
from mover.state import control
from mover.steps import rollback_window
from tests.workload import create_orders, plan_file

DDL = re.compile(r"\s*(CREATE|ALTER|DROP|COMMENT|GRANT|REVOKE|LOCK|REFRESH|SELECT setval)\b", re.IGNORECASE)


class Recording(psycopg.Cursor):
    sent: list[str] = []

    def execute(self, query, params=None, **kwargs):
        Recording.sent.append(query.as_string(self) if isinstance(query, sql.Composable) else str(query))
        return super().execute(query, params, **kwargs)


# The lock discipline's autovacuum pause and its restore (mover/engines/swap/lockwatch.py) wrap each locked
# step rather than belong to it: plan check says so in a comment, not statement by statement.
AUTOVACUUM_PAUSE = re.compile(r"ALTER TABLE \S+ (SET|RESET) \(autovacuum_enabled")
# The conversion probe's table (mover/catalog/conversion.py probe), made in a savepoint that is rolled
# back when the rollback window's mapping is built: it asks the server, it changes nothing.
CAST_PROBE = re.compile(r'CREATE TABLE "mover"\."cast_probe_')


def ddl_only(texts) -> list[str]:
    return [t for t in texts if DDL.match(t) and not AUTOVACUUM_PAUSE.match(t) and not CAST_PROBE.match(t)]


def joined(texts) -> str:
    """The swap sends runs of statements as one query joined by "; " (cutover.execute_batched):
    compared as one text, the order and every statement's text still count, only not where a
    round trip ends."""
    return "; ".join(texts)


def described(ctx, cur, stmts) -> list[str]:
    return ddl_only(s if isinstance(s, str) else s.as_string(cur) for s in stmts)


def _setup(db_dsn, tmp_path, name, extra="", method="trigger"):
    create_orders(db_dsn, 300)
    if extra:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(extra)
    plan = plan_file(tmp_path, name, columns={"id": "bigint"}, backfill={"range_rows": 100},
                     **({"capture": {"method": method}} if method != "trigger" else {}))
    db = Database(db_dsn)
    m = register.register_or_load(db, load_plan(plan), "test")
    db.connection().cursor_factory = Recording
    return db, m


def _run_and_compare(ctx, name, run) -> list[str]:
    want = ctx.db.transaction(lambda cur: described(ctx, cur, steps.BY_NAME[name].describe(ctx, cur)))
    Recording.sent = []
    run()
    got = ddl_only(Recording.sent)
    assert joined(got) == joined(want), \
        f"{name}: describe() printed\n" + "\n".join(want) + "\nbut ran\n" + "\n".join(got)
    return got


METHODS = pytest.mark.parametrize("method", ["trigger", "logical"])


@METHODS
def test_each_ddl_step_runs_what_it_describes(db_dsn, tmp_path, method):
    db, m = _setup(db_dsn, tmp_path, "orders_describe", method=method)
    try:
        with leased(db, m, control.new_owner_id()) as ctx:
            for name in ("create_target", "install_capture"):
                assert ctx.refresh().step == name
                assert _run_and_compare(ctx, name, lambda: lifecycle.advance(ctx, one_step=True))
            lifecycle.advance(ctx, one_step=True)  # backfill
            lifecycle.advance(ctx, one_step=True)  # reconcile
            assert ctx.refresh().step == "cutover"
            swap = _run_and_compare(ctx, "cutover", lambda: lifecycle.advance(ctx, through_cutover=True))
            assert any("RENAME TO" in s for s in swap) and any("CREATE TRIGGER" in s for s in swap)
            # Logical capture: the publication goes in the swap (the slot after its commit).
            assert any("DROP PUBLICATION" in s for s in swap) == (method == "logical")
            assert rollback_window.close(ctx, [ctx], force=True)
            dropped = _run_and_compare(ctx, "retire", lambda: lifecycle.advance(ctx))
            assert len(dropped) >= 7  # both captures' triggers, functions, logs, the notes, the old table
            assert ctx.refresh().state == "done"
    finally:
        db.close()


@METHODS
def test_abort_runs_what_it_lists(db_dsn, tmp_path, method):
    db, m = _setup(db_dsn, tmp_path, "orders_abort", method=method)
    try:
        with leased(db, m, control.new_owner_id()) as ctx:
            lifecycle.advance(ctx, one_step=True)
            lifecycle.advance(ctx, one_step=True)
            want = ctx.db.transaction(lambda cur: described(ctx, cur, [cutover.render(cur, s)
                                                                       for s in cutover.abort_sql(cur, ctx)]))
            Recording.sent = []
            lifecycle.abort(ctx)
            # Its LOCK TABLE statements first, one per relation (mover/engines/swap/lockwatch.py lock_all),
            # as the rollback's.
            ran = [s for s in ddl_only(Recording.sent) if not s.startswith("LOCK")]
            assert ran == want and any(s.startswith("DROP TABLE") for s in want)
            assert ctx.refresh().state == "aborted"
    finally:
        db.close()


DEPENDENTS = """
CREATE TABLE accounts (id int PRIMARY KEY);
INSERT INTO accounts SELECT generate_series(0, 999);
ALTER TABLE "Orders" ADD CONSTRAINT orders_account_fkey FOREIGN KEY ("Account") REFERENCES accounts;
CREATE TABLE lines (id int PRIMARY KEY, order_id int REFERENCES "Orders" ON DELETE CASCADE);
CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
CREATE TRIGGER orders_noop AFTER INSERT ON "Orders" FOR EACH ROW EXECUTE FUNCTION noop();
ALTER TABLE "Orders" DISABLE TRIGGER orders_noop;
ALTER TABLE "Orders" ENABLE ROW LEVEL SECURITY;
CREATE POLICY everyone ON "Orders" USING (true);
CREATE VIEW orders_v AS SELECT id, "Account" FROM "Orders";
CREATE MATERIALIZED VIEW orders_mv AS SELECT count(*) AS n FROM "Orders";
"""


@METHODS
def test_cutover_and_rollback_with_dependents_run_what_they_describe(db_dsn, tmp_path, method):
    """The statements that move the dependents (mover/engines/swap/carry.py) are the ones plan check lists."""
    db, m = _setup(db_dsn, tmp_path, "orders_dependents", DEPENDENTS, method=method)
    try:
        with leased(db, m, control.new_owner_id()) as ctx:
            for _ in range(4):  # create_target, install_capture, backfill, reconcile
                lifecycle.advance(ctx, one_step=True)
            swap = _run_and_compare(ctx, "cutover", lambda: lifecycle.advance(ctx, through_cutover=True))
            for fragment in ('DROP CONSTRAINT "lines_order_id_fkey"', 'DROP TRIGGER "orders_noop"',
                             'DROP POLICY "everyone"', 'DROP VIEW "public"."orders_v"',
                             'REFRESH MATERIALIZED VIEW "public"."orders_mv"', 'DISABLE TRIGGER "orders_noop"',
                             'ADD CONSTRAINT "orders_account_fkey"', 'RENAME TO "Orders_pkey"'):
                assert any(fragment in s for s in swap), fragment
            # With logical capture, the forward slot's publication first (logical.prepare, before the lock).
            want = ctx.db.transaction(lambda cur: described(ctx, cur, [
                *(logical.prepare_sql(ctx, cur, ctx.original) if method == "logical" else []),
                *(cutover.render(cur, s) for s in cutover.swap_sql(cur, ctx, forward=False))]))
            Recording.sent = []
            lifecycle.rollback(ctx)
            got = [s for s in ddl_only(Recording.sent) if not s.startswith(("LOCK", "ALTER TABLE \"public\".\"lines\" "
                                                                            "VALIDATE", "ALTER TABLE \"public\".\""
                                                                            "Orders\" VALIDATE"))]
            assert joined(got) == joined(want), "rollback listed\n" + "\n".join(want) + "\nbut ran\n" + "\n".join(got)
    finally:
        db.close()


WAY_BACK = re.compile(r'-- ("[^"]+") goes back to .+? as: (.+)$', re.S)


def test_plan_check_prints_the_copy_and_the_way_back_that_run(db_dsn, tmp_path, monkeypatch):
    """The conversions (issue 21): before anything exists, plan check prints the backfill's INSERT
    and each changed column's way back in the rollback window, built by the mapping code over the
    rehearsed target; the backfill then sends that very INSERT, and the window's replay that very
    expression for each column (text -> integer through CAST, float8 -> numeric(12,2) checked)."""
    create_orders(db_dsn, 300)
    plan = plan_file(tmp_path, "orders_way", columns={"Account": "text", "amount": "double precision"},
                     target={"accept_lossy": ["amount"]}, backfill={"range_rows": 100})
    db = Database(db_dsn)
    try:
        checked, _ = register.check(db, plan)
        printed = {step["name"]: step["sql"] for step in checked["steps"]}
        copy = [s for s in printed["backfill"] if s.startswith("INSERT INTO")]
        assert len(copy) == 1, printed["backfill"]
        ways = dict(m.groups() for s in printed["rollback_window"] if (m := WAY_BACK.match(s)))
        assert set(ways) == {'"Account"', '"amount"'}, printed["rollback_window"]
        assert "CAST(\"s\".\"Account\" AS integer)" in ways['"Account"']
        m = register.register_or_load(db, load_plan(plan), "test")
        # Every connection's statements, the backfill's worker threads' included.
        execute = psycopg.Cursor.execute

        def recorded(cur, query, params=None, **kwargs):
            Recording.sent.append(query.as_string(cur) if isinstance(query, sql.Composable) else str(query))
            return execute(cur, query, params, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", recorded)
        with leased(db, m, control.new_owner_id()) as ctx:
            lifecycle.advance(ctx, one_step=True)  # create_target
            lifecycle.advance(ctx, one_step=True)  # install_capture
            Recording.sent = []
            lifecycle.advance(ctx, one_step=True)  # backfill
            assert copy[0] in Recording.sent, "plan check printed\n" + copy[0] + "\nbut the backfill sent\n" + \
                "\n".join(s for s in Recording.sent if s.startswith("INSERT"))
            lifecycle.advance(ctx, one_step=True)  # reconcile
            lifecycle.advance(ctx, through_cutover=True)
            with psycopg.connect(db_dsn, autocommit=True) as conn:  # the application, in the window
                conn.execute('UPDATE "Orders" SET "Account" = %s, amount = %s WHERE id = 1', ("7", 1.5))
            Recording.sent = []
            assert not rollback_window.close(ctx, [ctx], force=False)
            replayed = "\n".join(Recording.sent)
            for column, expression in ways.items():
                assert expression in replayed, (column, expression, replayed)
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                assert conn.execute('SELECT "Account", amount FROM "Orders_old" WHERE id = 1').fetchone() == (7, 1.5)
    finally:
        db.close()
