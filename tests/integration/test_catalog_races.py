"""Catalog reads racing DDL (issue 34 item 6, race 10): a read's scan finds an object that another
session drops before the catalog's functions print it (pg_get_indexdef() and its kin look it up in
the catalog as it is now; pg_get_constraintdef() in a new snapshot under READ COMMITTED), so they
print NULL. mover neither crashes on the NULL nor takes it for a shape change: the read
(mover/catalog/reading.py) reads again, or raises CatalogMoved, which Database.transaction retries
whole in a new snapshot; what is then found is the truth (the object is gone, or its successor is
there). Provoked deterministically: a snapshot taken before the drop (REPEATABLE READ: the scan
finds the index, the syscache does not), or a statement held between its scan and its print."""

from __future__ import annotations

import threading

import psycopg
import pytest

from mover.catalog import reading, shape
from mover.db import Database
from mover.errors import CatalogMoved
from mover.names import QualifiedName

T = QualifiedName("public", "child")


def _tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE parent (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE child (id int PRIMARY KEY, p int DEFAULT 0 CONSTRAINT child_p_fkey"
                     " REFERENCES parent, n int CONSTRAINT n_pos CHECK (n > 0))")
        conn.execute("CREATE INDEX child_n ON child (n)")


@pytest.mark.parametrize("ddl, changes", [
    ("DROP INDEX child_n", [("index_dropped", "child_n")]),
    # the index rebuilt (as REINDEX CONCURRENTLY swaps it): same name, same definition, a new oid
    ("BEGIN; DROP INDEX child_n; CREATE INDEX child_n ON child (n); COMMIT", []),
])
def test_a_shape_read_behind_ddl_is_read_again_not_misread(db_dsn, ddl, changes):
    _tables(db_dsn)
    db = Database(db_dsn)
    try:
        before = db.transaction(lambda cur: shape.describe_table(cur, T))
        attempts = []

        def check(cur: psycopg.Cursor) -> list[tuple[str, str | None]]:
            attempts.append(1)
            if len(attempts) == 1:
                cur.execute("SELECT 1")  # this attempt's snapshot: before the DDL
                with psycopg.connect(db_dsn, autocommit=True) as other:
                    other.execute(ddl)
                with pytest.raises(CatalogMoved) as caught:  # the scan found it, its print is NULL
                    shape.describe(cur, [before["oid"]])
                assert 'index "child_n" of "public"."child"' in str(caught.value), caught.value
                assert caught.value.exit_code == 3
                raise caught.value
            now = shape.describe(cur, [before["oid"]])[before["oid"]]
            return [(c.kind, c.item) for c in shape.diff(before, now)]

        # The truth in the next attempt's snapshot, as the ordinary shape check says it.
        assert db.transaction(check, repeatable_read=True) == changes
        assert len(attempts) == 2
    finally:
        db.close()


def test_a_constraint_dropped_between_the_scan_and_its_print_is_read_again(db_dsn):
    """READ COMMITTED: pg_get_constraintdef() reads a snapshot newer than its statement's. The read
    is held between the scan and the print (an advisory lock the other session holds while it drops
    the constraint, as another migration's swap re-creates a child's key); the print is NULL, and
    the read is made again whole: it finds the key's successor."""
    _tables(db_dsn)
    query = ("SELECT k.conname, (SELECT 1 FROM pg_advisory_xact_lock(34)), pg_get_constraintdef(k.oid)"
             " FROM pg_constraint k WHERE k.conrelid = 'child'::regclass AND k.contype = 'f'")
    with psycopg.connect(db_dsn, autocommit=True) as other:
        other.execute("BEGIN")
        other.execute("SELECT pg_advisory_xact_lock(34)")
        found: list = []
        with psycopg.connect(db_dsn) as conn, conn.cursor() as cur:
            pid = conn.info.backend_pid
            reader = threading.Thread(target=lambda: found.append(reading.read(
                cur, query, missing=reading.printed(2, name=lambda r: f"constraint {r[0]}"))))
            reader.start()
            # the reader has scanned pg_constraint and waits for the lock before the print
            while not other.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted"
                                    " AND locktype = 'advisory')", (pid,)).fetchone()[0]:
                pass
            other.execute("ALTER TABLE child DROP CONSTRAINT child_p_fkey,"
                          " ADD CONSTRAINT child_p_fkey FOREIGN KEY (p) REFERENCES parent NOT VALID")
            other.execute("COMMIT")
            reader.join(30)
            assert not reader.is_alive()
    assert found == [[("child_p_fkey", 1, "FOREIGN KEY (p) REFERENCES parent(id) NOT VALID")]]


def test_a_read_that_never_settles_is_a_typed_error_naming_the_object(db_dsn):
    """An object the read keeps finding but cannot print (here an oid no catalog has) is not
    printed as None, read again forever nor retried without bound: CatalogMoved names it."""
    db = Database(db_dsn)

    def read(cur: psycopg.Cursor) -> list:
        return reading.read(cur, "SELECT 'ghost', pg_get_constraintdef(4000000000::oid)",
                            missing=reading.printed(1, name=lambda r: f"constraint {r[0]!r}"))

    try:
        with pytest.raises(CatalogMoved, match="constraint 'ghost' vanished while mover read the catalog") as caught:
            db.transaction(read, attempts=2)
        assert "run the same command again" in str(caught.value) and caught.value.exit_code == 3
    finally:
        db.close()
