"""The whole migration through PgBouncer in transaction pooling mode (Debian's pgbouncer), with a
concurrent writer also going through it: few server connections, shared by every client, so a
server-side prepared statement or a session SET of one client would reach the others."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.workload import Writer, assert_oracle, create_orders, differences, mover, plan_text, write_plan

PLAN = plan_text("pooled", columns={"id": "bigint"}, backfill={"range_rows": 500},
                 cutover={"lock_timeout": "100ms", "attempts": 3})


def _pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if os.path.exists(p)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def bouncer(db_dsn) -> Iterator[str]:
    """A pgbouncer in transaction mode in front of the test database; yields its DSN."""
    exe = _pgbouncer()
    if exe is None:
        pytest.fail("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does it)", pytrace=False)
    server = urllib.parse.urlsplit(db_dsn)
    dbname = server.path.lstrip("/")
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="mover-pgbouncer-")
    os.chmod(workdir, 0o755)
    with open(os.path.join(workdir, "userlist.txt"), "w") as f:
        f.write('"postgres" ""\n')
    ini = os.path.join(workdir, "pgbouncer.ini")
    with open(ini, "w") as f:
        f.write(f"""[databases]
{dbname} = host={server.hostname} port={server.port} dbname={dbname}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/userlist.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 100
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = {workdir}/pgbouncer.log
pidfile = {workdir}/pgbouncer.pid
""")
    for name in os.listdir(workdir):
        os.chmod(os.path.join(workdir, name), 0o644)
    args = [exe, ini]
    if os.geteuid() == 0:
        # pgbouncer refuses to run as root: drop to the postgres user (Debian's package makes it).
        user = next((u for u in ("postgres", "nobody") if _user_exists(u)), None)
        if user is None:
            pytest.fail("pgbouncer refuses root and there is no postgres or nobody user", pytrace=False)
        args = [exe, "-u", user, ini]
        os.chown(workdir, pwd.getpwnam(user).pw_uid, -1)
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    dsn = f"postgresql://postgres@127.0.0.1:{port}/{dbname}"
    deadline = time.monotonic() + 20
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=2, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
            break
        except psycopg.OperationalError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out = proc.communicate()[0].decode(errors="replace")
                log = open(os.path.join(workdir, "pgbouncer.log")).read() if os.path.exists(
                    os.path.join(workdir, "pgbouncer.log")) else ""
                pytest.fail(f"pgbouncer did not start: {out}\n{log}", pytrace=False)
            time.sleep(0.1)
    try:
        yield dsn
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def status(dsn):
    r = mover(dsn, "status", "pooled", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_pooler_is_detected_and_no_session_setting_is_left_behind(db_dsn, bouncer):
    from mover.db import Database
    direct, pooled = Database(db_dsn), Database(bouncer)
    # Fails if a session-level lock_timeout is in force when the statement runs: behind the pooler
    # the next client might get that server connection, setting included.
    probe = ("DO $$ BEGIN IF current_setting('lock_timeout') = '1234ms' THEN"
             " RAISE EXCEPTION 'a session setting reached the pooled server connection'; END IF; END $$")
    try:
        assert direct.pooled() is False and pooled.pooled() is True
        pooled.autocommit(probe, lock_timeout="1234ms", statement_timeout="0")
    finally:
        direct.close()
        pooled.close()
    # Several clients, at most default_pool_size server connections: the servers are shared.
    clients = [psycopg.connect(bouncer, autocommit=True, prepare_threshold=None) for _ in range(8)]
    try:
        pids = {c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in clients}
        assert len(pids) <= 4
    finally:
        for c in clients:
            c.close()


def test_whole_sequence_through_transaction_mode_with_a_writer(db_dsn, bouncer, tmp_path):
    create_orders(db_dsn, 4_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA mover CASCADE")  # init itself goes through the pooler
    r = mover(bouncer, "init")
    assert r.returncode == 0, r.stderr
    plan = write_plan(tmp_path / "pooled.toml", PLAN)
    writer = Writer(bouncer, seed=21).start()
    try:
        def step(command, arg, code):
            r = mover(bouncer, command, arg)
            assert r.returncode == code, f"{command}: {r.stderr}"
            assert "prepared statement" not in r.stderr
            if code == 0:
                assert status(bouncer)["error"] is None

        step("run", plan, 3)
        step("cutover", "pooled", 0)
        step("run", "pooled", 3)
        # A rollback that cannot get its lock waits (exit 3, recorded) ...
        with psycopg.connect(db_dsn) as blocker:
            blocker.execute('LOCK TABLE "Orders" IN ACCESS SHARE MODE')
            r = mover(bouncer, "rollback", "pooled")
            assert r.returncode == 3, r.stderr
        assert status(bouncer)["error"]
        # ... and once it succeeds, that error is no longer the migration's state.
        step("rollback", "pooled", 0)
        step("run", "pooled", 3)
        step("cutover", "pooled", 0)
        writer.pause()
        r = mover(bouncer, "run", "pooled")
        assert r.returncode == 3, r.stderr  # the window is open; the old table is kept in sync
        assert differences(db_dsn, "Orders", "Orders_old") == (0, 0)
        assert_oracle(db_dsn, "Orders", "Orders_old")
        writer.resume()
        r = mover(bouncer, "retire", "pooled", "--force")
        assert r.returncode == 0, r.stderr
    finally:
        writer.halt()
    assert writer.errors == []
    assert writer.ops > 0
    st = status(bouncer)
    assert (st["step"], st["state"], st["error"]) == ("retire", "done", None)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                            " WHERE attrelid = '\"Orders\"'::regclass AND attname = 'id'").fetchone()[0] == "bigint"


def test_index_builds_behind_a_pooler_set_their_own_timeout_and_a_concurrent_build_is_refused(
        db_dsn, bouncer, tmp_path):
    """The backfill's index builds run in transactions (SET LOCAL statement_timeout): behind a
    transaction-mode pooler, with a server default that would cancel a long statement, the step
    goes through. `mover adopt`'s CREATE INDEX CONCURRENTLY on the table the application reads
    cannot run in a transaction, so there mover cannot give it its own statement_timeout: it
    refuses (exit 2) naming the fix, instead of failing and retrying forever."""
    create_orders(db_dsn, 2_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE postgres IN DATABASE {} SET statement_timeout = '5min'").format(
            sql.Identifier(urllib.parse.urlsplit(db_dsn).path.lstrip("/"))))
        # The pooler's open server connections predate the setting: make it open new ones.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                     " AND pid <> pg_backend_pid()")
    plan = write_plan(tmp_path / "pooled.toml", PLAN)
    r = mover(bouncer, "run", plan)
    assert r.returncode == 3, r.stderr
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FILTER (WHERE indisvalid), count(*) FROM pg_index"
                            " WHERE indrelid = '\"Orders_new\"'::regclass AND NOT indisprimary").fetchone() == (1, 1)
        conn.execute('CREATE INDEX orders_status ON "Orders" (status)')
    r = mover(bouncer, "adopt", "pooled")
    assert r.returncode == 2, r.stderr
    assert "pooler" in r.stderr and "statement_timeout" in r.stderr and "next:" in r.stderr
    # A direct connection adopts it: there the timeout is set for the statement's session.
    r = mover(db_dsn, "adopt", "pooled")
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "run", "pooled")
    assert r.returncode == 3, r.stderr
    assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
    assert_oracle(db_dsn, "Orders", "Orders_new")


def test_a_later_success_clears_the_recorded_error(db_dsn, tmp_path):
    """Direct connection: a rollback that cannot get its lock records why; the rollback that then
    succeeds leaves no error in `status` (the events keep the history)."""
    create_orders(db_dsn, 1_000)
    plan = write_plan(tmp_path / "pooled.toml", PLAN)
    assert mover(db_dsn, "run", plan).returncode == 3
    assert mover(db_dsn, "cutover", "pooled").returncode == 0
    with psycopg.connect(db_dsn) as blocker:
        blocker.execute('LOCK TABLE "Orders" IN ACCESS SHARE MODE')
        r = mover(db_dsn, "rollback", "pooled")
        assert r.returncode == 3 and "next:" in r.stderr, r.stderr
    assert "could not lock" in status(db_dsn)["error"]
    r = mover(db_dsn, "rollback", "pooled")
    assert r.returncode == 0, r.stderr
    st = status(db_dsn)
    assert (st["step"], st["error"]) == ("reconcile", None)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        kinds = [k for (k,) in conn.execute("SELECT kind FROM mover.events ORDER BY id").fetchall()]
    assert "rolled_back" in kinds
