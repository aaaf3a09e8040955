"""Temporary measurement (not committed): the swap's hold on a plain table under a writer."""
import psycopg

from tests.e2e.test_full_migration import plan_file
from tests.workload import Writer, create_orders, mover


def test_plain_hold(db_dsn, tmp_path):
    create_orders(db_dsn, 3000)
    writer = Writer(db_dsn).start()
    try:
        assert mover(db_dsn, "run", plan_file(tmp_path)).returncode == 3
        r = mover(db_dsn, "cutover", "orders-bigint") if False else None
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            name = conn.execute("SELECT name FROM mover.migrations ORDER BY id DESC LIMIT 1").fetchone()[0]
        r = mover(db_dsn, "cutover", name)
        assert r.returncode == 0, r.stderr
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            held = conn.execute("SELECT detail FROM mover.events WHERE detail ? 'lock_ms' ORDER BY id DESC LIMIT 1"
                                ).fetchone()[0]
        print("plain swap held the lock " + ", ".join(f"{k} {float(v):.1f}" for k, v in sorted(held.items())
                                                      if not isinstance(v, list)))
    finally:
        writer.halt()
