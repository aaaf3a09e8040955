"""mover/engines/swap/lockwatch.py against real sessions: the tables whose foreign keys reference the migrated
one are found, and a session holding a lock on any watched table is named."""

from __future__ import annotations

import psycopg

from mover.engines.swap import lockwatch
from mover.names import QualifiedName


def test_referencing_tables_and_their_blockers_are_named(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE parent (id int PRIMARY KEY)")
        conn.execute('CREATE TABLE "Child" (id int PRIMARY KEY, p int REFERENCES parent)')
        conn.execute("CREATE TABLE unrelated (id int PRIMARY KEY)")
        holder = psycopg.connect(db_dsn, application_name="app-child")
        try:
            holder.execute('SELECT count(*) FROM "Child"')  # idle in transaction, holding ACCESS SHARE
            other = psycopg.connect(db_dsn, application_name="app-unrelated")
            other.execute("SELECT count(*) FROM unrelated")
            with conn.cursor() as cur:
                parent = QualifiedName("public", "parent")
                refs = lockwatch.referencing_tables(cur, [parent])
                assert refs == [QualifiedName("public", "Child")]
                found = lockwatch.blockers(cur, [parent, *refs])
                assert [(b.pid, b.application_name, b.state, b.tables, b.autovacuum) for b in found] == \
                    [(holder.info.backend_pid, "app-child", "idle in transaction", ('"public"."Child"',), False)]
                assert f"pid {holder.info.backend_pid} (user " in found[0].describe()
                # Younger than the threshold: not named before the attempt (only autovacuum always is).
                assert lockwatch.blockers(cur, refs, min_age_s=3600) == []
            other.close()
        finally:
            holder.close()
