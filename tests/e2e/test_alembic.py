"""mover inside an application's own Alembic revisions (mover/contrib/alembic.py): a real Alembic
project written into tmp_path (alembic.ini, env.py, versions/), its first revision creating the
application's table, the commands run through alembic.command in this process as `alembic` runs
them, the application writing meanwhile, and the result judged by the mirror the application
keeps (tests/workload.py), never by mover's own reconcile."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import URL

import mover.api as api
from mover.contrib.alembic import MoveNotReady
from mover.errors import BadInput, Waiting
from tests.workload import ORDERS_DDL, Writer, assert_oracle, catalog_snapshot, differences, plan_file

NAME = "orders-id-bigint"

ENV_PY = '''
from alembic import context
from sqlalchemy import engine_from_config, pool

import mover.contrib.alembic  # noqa: F401  (op.start_move, op.finish_move, ...)

config = context.config
if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = engine_from_config(config.get_section(config.config_ini_section), prefix="sqlalchemy.",
                                poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
'''

# The template `alembic init` writes, for `alembic revision`.
SCRIPT_MAKO = '''"""${message}"""
from alembic import op
import sqlalchemy as sa
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}


def upgrade():
    ${upgrades if upgrades else "pass"}


def downgrade():
    ${downgrades if downgrades else "pass"}
'''

# The application's table and the mirror its writer keeps (tests/workload.py create_orders and
# create_mirror), made by the project's first revision.
CREATE = f'''
def upgrade():
    op.execute({ORDERS_DDL!r})
    op.execute("""INSERT INTO "Orders" ("Account", amount, status, payload, note)
                  SELECT mod(g, 1000), mod(g, 100000) / 100.0, (ARRAY['new','paid','shipped'])[1 + mod(g, 3)],
                         jsonb_build_object('g', g), CASE WHEN mod(g, 7) = 0 THEN NULL ELSE md5(g::text) END
                  FROM generate_series(1, 5000) g""")
    op.execute('CREATE TABLE "Orders_mirror" (LIKE "Orders")')
    op.execute('ALTER TABLE "Orders_mirror" ALTER id TYPE bigint, ADD PRIMARY KEY (id)')
    op.execute('INSERT INTO "Orders_mirror" SELECT * FROM "Orders"')
    op.execute('ANALYZE "Orders"')


def downgrade():
    op.execute('DROP TABLE "Orders", "Orders_mirror"')
'''


def sqlalchemy_url(dsn: str) -> str:
    """The test server's DSN as SQLAlchemy's URL with the psycopg 3 driver (as an application's
    alembic.ini would name its database)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + dsn.split("://", 1)[1]
    params = conninfo_to_dict(dsn)
    return URL.create("postgresql+psycopg", database=params.pop("dbname", None),
                      query={k: str(v) for k, v in params.items()}).render_as_string(hide_password=False)


def project(tmp_path: Path, dsn: str, revisions: dict[str, str], env: str = ENV_PY) -> Config:
    """An Alembic project as `alembic init` lays it out, with `revisions` (id -> the body of its
    upgrade() and downgrade(), `op` imported) in a chain in their order; its Config."""
    root = tmp_path / "app"
    versions = root / "migrations" / "versions"
    versions.mkdir(parents=True)
    (root / "migrations" / "env.py").write_text(env)
    (root / "migrations" / "script.py.mako").write_text(SCRIPT_MAKO)
    (root / "alembic.ini").write_text("[alembic]\nscript_location = %(here)s/migrations\n")
    down = None
    for rev, body in revisions.items():
        (versions / f"{rev}.py").write_text(
            f"from alembic import op\n\nrevision = {rev!r}\ndown_revision = {down!r}\n\n{textwrap.dedent(body)}\n")
        down = rev
    cfg = Config(str(root / "alembic.ini"), stdout=io.StringIO())
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    return cfg


def current(dsn: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('alembic_version')").fetchone()[0] is None:
            return None
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        return row[0] if row else None


def id_type(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                            " WHERE attrelid = '\"Orders\"'::regclass AND attname = 'id'").fetchone()[0]


def test_start_revision_then_finish_revision_under_a_writer(db_dsn, tmp_path):
    plan = plan_file(tmp_path, NAME, columns={"id": "bigint"}, window="1h", backfill={"range_rows": 1000},
                     throttle={"max_latency_increase": "off"})
    cfg = project(tmp_path, db_dsn, {
        "create_orders": CREATE,
        "start_bigint": f"""
            def upgrade():
                op.start_move({plan!r})  # registers it; `mover run` does the work

            def downgrade():
                op.abort_move({NAME!r})
            """,
        "finish_bigint": f"""
            def upgrade():
                op.finish_move({NAME!r}, retire=True)

            def downgrade():
                op.rollback_move({NAME!r})
            """,
    })
    command.upgrade(cfg, "create_orders")
    writer = Writer(db_dsn).start()
    try:
        writer.wait_for_ops(20)
        command.upgrade(cfg, "start_bigint")
        st = api.status(db_dsn, NAME)
        assert (st["step"], st["state"]) == ("create_target", "pending"), st

        # Too early: the finishing revision fails with where the migration stands and what to run.
        with pytest.raises(MoveNotReady) as refused:
            command.upgrade(cfg, "head")
        text = str(refused.value)
        assert f"mover migration {NAME!r} is not ready for its cutover" in text, text
        assert "step 'create_target', state 'pending'" in text, text
        assert f"`mover run {NAME}` takes it to the cutover gate" in text, text
        assert current(db_dsn) == "start_bigint"

        # The operator (or a job) runs it to the gate, the application still writing.
        with pytest.raises(Waiting):
            api.run(db_dsn, NAME)
        writer.wait_for_ops(writer.ops + 20)  # the writer wrote through the capture too
        command.upgrade(cfg, "head")
        assert current(db_dsn) == "finish_bigint"
        st = api.status(db_dsn, NAME)
        assert (st["step"], st["state"]) == ("retire", "done"), st
        writer.wait_for_ops(writer.ops + 20)  # and into the new table after the swap
    finally:
        writer.halt()
    assert writer.errors == []
    assert id_type(db_dsn) == "bigint"
    assert differences(db_dsn, "Orders", "Orders_mirror") == (0, 0)
    assert_oracle(db_dsn, "Orders")


def test_one_upgrade_runs_to_the_gate_and_a_rollback_after_it_keeps_the_migration(db_dsn, tmp_path):
    """The table's revision and the one that starts the move in one `alembic upgrade` (one
    transaction: the start commits what came before it); the start revision fails after
    registering: the migration stays, the error says what undoes it, and the next upgrade picks it
    up. Then its downgrade aborts it."""
    fail = tmp_path / "fail"
    fail.touch()
    cfg = project(tmp_path, db_dsn, {
        "create_orders": CREATE,
        "start_bigint": f"""
            from pathlib import Path

            def upgrade():
                op.start_move(name={NAME!r}, source='public."Orders"', columns={{"id": "bigint"}}, window="0s",
                              plan={{"throttle": {{"max_latency_increase": "off"}}}}, run_for=120)
                if Path({str(fail)!r}).exists():
                    op.execute("SELECT 1 / 0")  # a later statement of the revision fails

            def downgrade():
                op.abort_move({NAME!r})
            """,
    })
    with pytest.raises(Exception) as failed:
        command.upgrade(cfg, "head")
    notes = "\n".join(getattr(failed.value, "__notes__", []))
    assert f"migration {NAME!r} was registered by this upgrade and stays registered" in notes, notes
    assert f"`mover abort {NAME}` removes what mover built" in notes, notes
    assert current(db_dsn) == "create_orders"  # committed before mover started; the start's version rolled back
    st = api.status(db_dsn, NAME)
    assert (st["step"], st["state"]) == ("cutover", "waiting"), st  # run_for took the small table to the gate

    fail.unlink()
    command.upgrade(cfg, "head")  # the same revision again: registered already, at the gate already
    assert current(db_dsn) == "start_bigint"
    assert api.status(db_dsn, NAME)["step"] == "cutover"

    command.downgrade(cfg, "create_orders")
    assert api.status(db_dsn, NAME)["state"] == "aborted"
    assert id_type(db_dsn) == "integer"
    assert differences(db_dsn, "Orders", "Orders_mirror") == (0, 0)


def test_offline_sql_prints_plan_check_and_changes_nothing(db_dsn, tmp_path):
    plan = plan_file(tmp_path, NAME, columns={"id": "bigint"}, window="1h")
    cfg = project(tmp_path, db_dsn, {
        "create_orders": CREATE,
        "start_bigint": f"""
            def upgrade():
                op.start_move({plan!r}, run_for=600)
            """,
        "finish_bigint": f"""
            def upgrade():
                op.finish_move({NAME!r})
            """,
    })
    command.upgrade(cfg, "create_orders")
    before = catalog_snapshot(db_dsn)
    out = io.StringIO()
    cfg.output_buffer = out
    command.upgrade(cfg, "create_orders:head", sql=True)
    script = out.getvalue()
    assert f"-- mover: start_move registers migration {NAME!r} ({plan})" in script, script
    assert "for at most 600 s" in script
    # plan check's summary and its statements, each line a comment.
    assert f"-- plan {plan}: OK. migration {NAME!r}" in script, script
    assert script.count(f"-- plan {plan}: OK.") == 1, script  # the head once, then the summary, then the SQL
    assert '-- CREATE TABLE "public"."Orders_new" (LIKE "public"."Orders"' in script, script
    assert '-- ALTER TABLE "public"."Orders_new" ALTER COLUMN "id" TYPE bigint' in script, script
    assert f"-- mover: finish_move runs `mover cutover {NAME}`" in script, script
    assert f"-- now: mover has no migration {NAME!r} in this database" in script, script
    assert "UPDATE alembic_version SET version_num='finish_bigint'" in script
    assert catalog_snapshot(db_dsn) == before
    assert current(db_dsn) == "create_orders"
    assert api.status(db_dsn) == []


# An application whose model widens accounts.id (the table has integer), with the rewriter.
AUTOGENERATE_ENV = """
import sqlalchemy as sa
from alembic import context
from sqlalchemy import engine_from_config, pool

from mover.contrib.alembic_autogenerate import mover_rewriter

metadata = sa.MetaData()
sa.Table("accounts", metadata, sa.Column("id", sa.BigInteger, primary_key=True), sa.Column("name", sa.Text))

config = context.config
engine = engine_from_config(config.get_section(config.config_ini_section), prefix="sqlalchemy.",
                            poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata,
                      include_name=lambda name, kind, parent: kind != "table" or name == "accounts",
                      process_revision_directives=mover_rewriter(
                          {"accounts": {"window": "0s", "plan": {"throttle": {"max_latency_increase": "off"}}}}))
    with context.begin_transaction():
        context.run_migrations()
"""


def test_autogenerate_writes_the_start_then_the_finish(db_dsn, tmp_path):
    cfg = project(tmp_path, db_dsn, {"accounts": """
        def upgrade():
            op.execute("CREATE TABLE accounts (id integer PRIMARY KEY, name text)")
            op.execute("INSERT INTO accounts SELECT g, md5(g::text) FROM generate_series(1, 2000) g")
        """}, env=AUTOGENERATE_ENV)
    command.upgrade(cfg, "head")
    versions = tmp_path / "app" / "migrations" / "versions"

    command.revision(cfg, "widen accounts.id", autogenerate=True, rev_id="start_widen")
    start = (versions / "start_widen_widen_accounts_id.py").read_text()
    assert "op.start_move(name='accounts-id', source='\"accounts\"', columns={'id': 'BIGINT'}, window='0s'" in start, \
        start
    assert "op.abort_move('accounts-id')" in start and "alter_column" not in start, start
    assert "import mover.contrib.alembic" in start
    command.upgrade(cfg, "head")
    assert api.status(db_dsn, "accounts-id")["state"] == "pending"

    # Registered, the column still integer: the next autogenerate writes the revision that finishes it.
    command.revision(cfg, "finish accounts.id", autogenerate=True, rev_id="finish_widen")
    finish = (versions / "finish_widen_finish_accounts_id.py").read_text()
    assert "op.finish_move('accounts-id')" in finish and "op.rollback_move('accounts-id')" in finish, finish
    assert "op.start_move" not in finish and "alter_column" not in finish, finish
    with pytest.raises(Waiting):
        api.run(db_dsn, "accounts-id")
    command.upgrade(cfg, "head")
    assert api.status(db_dsn, "accounts-id")["state"] == "done"  # a zero window retires with the swap
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid ="
                            " 'accounts'::regclass AND attname = 'id'").fetchone()[0] == "bigint"
        assert conn.execute("SELECT count(*) FROM accounts").fetchone()[0] == 2000


def test_a_transaction_of_env_py_with_changes_in_it_is_refused(db_dsn, tmp_path):
    """env.py's own transaction around Alembic's cannot be committed by the operation: with the
    table created in it (invisible to mover's connections), start_move refuses, naming the fix."""
    env = ENV_PY.replace("with engine.connect() as connection:", "with engine.begin() as connection:")
    cfg = project(tmp_path, db_dsn, {"create_orders": CREATE, "start_bigint": f"""
        def upgrade():
            op.start_move(name={NAME!r}, source='public."Orders"', columns={{"id": "bigint"}}, window="1h")
        """}, env=env)
    with pytest.raises(BadInput, match="holds uncommitted changes") as refused:
        command.upgrade(cfg, "head")
    assert "transaction_per_migration=True" in str(refused.value)
    assert current(db_dsn) is None  # all of it rolled back, the table too
    assert api.status(db_dsn) == []
