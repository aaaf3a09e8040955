"""The Python API as a user's program calls it: docs/api.md's example program, as written there,
run as a process of its own (`python move.py DSN PLAN [--cutover]`) while the application keeps
writing. It registers the plan and runs it to the gate, reads the status, cuts over and retires;
the tables are judged by independent queries, never by mover's own reconcile."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

from tests.workload import ROOT, Writer, create_orders, differences, plan_file

NAME = "orders_api"


def example_program() -> str:
    doc = (ROOT / "docs" / "api.md").read_text()
    return doc.split("## An example program\n", 1)[1].split("```python\n", 1)[1].split("\n```\n", 1)[0]


def test_the_documented_example_moves_a_table_under_writes(db_dsn, tmp_path):
    create_orders(db_dsn, 3000)
    plan = plan_file(tmp_path, NAME, columns={"id": "bigint"}, backfill={"range_rows": 1000})
    program = tmp_path / "move.py"
    program.write_text(example_program())
    # This checkout's mover, as the suite's own imports find it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}

    def move(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(program), db_dsn, plan, *args], capture_output=True, text=True,
                              timeout=300, env=env, cwd=tmp_path)

    with Writer(db_dsn) as writer:
        writer.wait_for_ops(20)
        gate = move()
        assert gate.returncode == 3, gate.stdout + gate.stderr
        assert f"mover cutover {NAME}" in gate.stdout and f"{NAME}: cutover / waiting, " in gate.stdout, gate.stdout
        # At the gate, with the application paused: a second run drains the log, and the target holds
        # exactly the source's rows.
        writer.pause()
        assert move().returncode == 3
        assert differences(db_dsn, "Orders", "Orders_new") == (0, 0)
        writer.resume()
        writer.wait_for_ops(writer.ops + 20)
        done = move("--cutover")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "swapped in; the lock was held" in done.stdout and done.stdout.endswith(f"{NAME}: done\n"), done.stdout
        writer.wait_for_ops(writer.ops + 20)  # writes on the new table, after the swap and the retire
    assert writer.errors == []
    # The live table is the new one (id widened), holding exactly what the application committed.
    assert differences(db_dsn, "Orders", "Orders_mirror") == (0, 0)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                            "'\"Orders\"'::regclass AND attname = 'id'").fetchone() == ("bigint",)
        assert conn.execute("SELECT to_regclass('\"Orders_old\"')").fetchone() == (None,)
