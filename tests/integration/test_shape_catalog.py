"""mover/catalog/shape.py against the real catalog, read by a role that is no superuser (the table's
owner): what the description holds, and the diff each kind of DDL produces."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql

from mover.catalog import shape
from mover.names import QualifiedName


def test_description_and_diff_as_the_owner_without_superuser(db_dsn):
    role = f"shape_owner_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOSUPERUSER").format(sql.Identifier(role)))
        try:
            conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            conn.execute('CREATE UNLOGGED TABLE "Odd ""T""" (id int PRIMARY KEY, w text COLLATE "C" NOT NULL'
                         " DEFAULT 'x', n numeric(12, 2))")
            conn.execute('ALTER TABLE "Odd ""T""" ADD CONSTRAINT n_pos CHECK (n > 0) NOT VALID')
            conn.execute('CREATE INDEX "w idx" ON "Odd ""T""" (w) WHERE n IS NOT NULL')
            with conn.cursor() as cur:
                cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
                assert cur.fetchone() == (False,)
                before = shape.describe_table(cur, QualifiedName("public", 'Odd "T"'))
                assert before["persistence"] == "u" and before["name"] == 'Odd "T"'
                assert [(c["name"], c["type"], c["collation"], c["not_null"], c["default"])
                        for c in before["columns"]] == [
                    ("id", "integer", None, True, None), ("w", "text", 'pg_catalog."C"', True, "'x'::text"),
                    ("n", "numeric(12,2)", None, False, None)]
                assert before["constraints"]["n_pos"]["validated"] is False
                assert before["indexes"]["w idx"]["definition"] == "USING btree (w) WHERE (n IS NOT NULL)"
                assert shape.fingerprint(before) == shape.fingerprint(
                    shape.describe(cur, [before["oid"]])[before["oid"]])

                def after(*ddl):
                    for d in ddl:
                        cur.execute(d)
                    now = shape.describe(cur, [before["oid"]]).get(before["oid"])
                    found = [(c.kind, c.item) for c in shape.diff(before, now)]
                    cur.execute("ROLLBACK")
                    cur.execute("BEGIN")
                    return found

                cur.execute("BEGIN")
                assert after('ALTER TABLE "Odd ""T""" ADD COLUMN p int NOT NULL DEFAULT 0') == [("column_added", "p")]
                assert after('ALTER TABLE "Odd ""T""" ALTER COLUMN n TYPE numeric(14,2)') == [("column_type", "n")]
                assert after('ALTER TABLE "Odd ""T""" ALTER COLUMN w TYPE text COLLATE "POSIX"') == [
                    ("column_collation", "w")]
                assert after('ALTER TABLE "Odd ""T""" ALTER COLUMN n SET NOT NULL') == [("column_not_null", "n")]
                assert after('ALTER TABLE "Odd ""T""" ALTER COLUMN w DROP DEFAULT') == [("column_default", "w")]
                assert after('ALTER TABLE "Odd ""T""" VALIDATE CONSTRAINT n_pos') == [
                    ("constraint_validated", "n_pos")]
                assert after('ALTER TABLE "Odd ""T""" DROP CONSTRAINT n_pos') == [("constraint_dropped", "n_pos")]
                assert after('ALTER TABLE "Odd ""T""" ADD CONSTRAINT w_u UNIQUE (w)') == [("constraint_added", "w_u")]
                assert after('DROP INDEX "w idx"') == [("index_dropped", "w idx")]
                assert after('ALTER TABLE "Odd ""T""" SET LOGGED') == [("persistence", None)]
                assert after('ALTER TABLE "Odd ""T""" RENAME TO "Even"') == [("renamed", None)]
                assert after('ALTER TABLE "Odd ""T""" RENAME COLUMN w TO "W"') == [("column_renamed", "w"),
                                                                                ("index_changed", "w idx")]
                assert after('ALTER TABLE "Odd ""T""" DROP COLUMN w, ADD COLUMN w text') == [
                    ("column_recreated", "w"), ("index_dropped", "w idx")]  # the index went with the column
                assert after('DROP TABLE "Odd ""T"""') == [("dropped", None)]
                # What leaves the shape alone.
                assert after('ALTER TABLE "Odd ""T""" SET (fillfactor = 70)', 'ANALYZE "Odd ""T"""',
                             "INSERT INTO \"Odd \"\"T\"\"\" VALUES (1, 'a', 1)") == []
                cur.execute("ROLLBACK")
            # Issue 21 item 9: whether a table is typed (OF type) is in its shape, both ways.
            conn.execute("CREATE TYPE shape_t AS (id int, v text)")
            conn.execute("CREATE TABLE shape_typed OF shape_t (PRIMARY KEY (id))")
            conn.execute("CREATE TABLE shape_plain (id int PRIMARY KEY, v text)")
            with conn.cursor() as cur:
                typed = shape.describe_table(cur, QualifiedName("public", "shape_typed"))
                plain = shape.describe_table(cur, QualifiedName("public", "shape_plain"))
                assert typed["of_type"] == "shape_t" and "of_type" not in plain
                cur.execute("BEGIN")
                cur.execute("ALTER TABLE shape_typed NOT OF")
                cur.execute("ALTER TABLE shape_plain OF shape_t")
                now = shape.describe(cur, [typed["oid"], plain["oid"]])
                assert [(c.kind, c.item) for c in shape.diff(typed, now[typed["oid"]])] == [("of_type", None)]
                assert [(c.kind, c.item) for c in shape.diff(plain, now[plain["oid"]])] == [("of_type", None)]
                cur.execute("ROLLBACK")
        finally:
            conn.execute("RESET ROLE")
            conn.execute('DROP TABLE IF EXISTS "Odd ""T"""')
            conn.execute('DROP TABLE IF EXISTS shape_typed, shape_plain')
            conn.execute('DROP TYPE IF EXISTS shape_t')
            conn.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
