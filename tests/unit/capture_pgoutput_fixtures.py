"""Captures the pgoutput messages tests/unit/test_pgoutput.py parses, from a real server, into
tests/unit/pgoutput_messages.json: each case's SQL, and the binary messages its transactions
decoded to (pg_logical_slot_get_binary_changes, protocol version 1, as mover reads them).

    .venv/bin/python tests/unit/capture_pgoutput_fixtures.py DSN   # a superuser DSN, wal_level = logical

Run once per server version the fixtures should come from; the JSON keeps the version. Not
collected by pytest (its name does not start with test_): the unit tests read the JSON only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg

OUT = Path(__file__).with_name("pgoutput_messages.json")

SETUP = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE TABLE t (id int PRIMARY KEY, v text)",
    "CREATE TABLE two (a int, b text, v int, PRIMARY KEY (a, b))",
    "CREATE TABLE full_t (id int PRIMARY KEY, v text)",
    "ALTER TABLE full_t REPLICA IDENTITY FULL",
    "CREATE TABLE typed (id int PRIMARY KEY, m mood)",
    "CREATE TABLE toasted (id int PRIMARY KEY, big text, n int)",
    "ALTER TABLE toasted ALTER COLUMN big SET STORAGE EXTERNAL",
    "CREATE TABLE parted (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
    "CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)",
    "CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (100) TO (200)",
    "CREATE PUBLICATION fixtures FOR TABLE t, two, full_t, typed, toasted, parted"
    " WITH (publish_via_partition_root = true)",
    "INSERT INTO t VALUES (1, 'one'), (2, 'two'), (3, 'three')",
    "INSERT INTO full_t VALUES (1, 'one')",
    "INSERT INTO toasted VALUES (1, repeat('x', 5000), 0)",
    "SELECT pg_replication_origin_create('fixture_origin')",
]

# name: the statements of one case, each list one transaction
CASES: dict[str, list[list[str]]] = {
    "insert": [["INSERT INTO t VALUES (10, 'ten')"]],
    "insert_null": [["INSERT INTO t VALUES (11, NULL)"]],
    "insert_utf8": [["INSERT INTO t VALUES (12, 'ünïcødé ✓')"]],
    "update": [["UPDATE t SET v = 'uno' WHERE id = 1"]],
    "update_key": [["UPDATE t SET id = 20 WHERE id = 2"]],
    "delete": [["DELETE FROM t WHERE id = 3"]],
    "several_in_one_transaction": [["INSERT INTO t VALUES (30, 'a')", "UPDATE t SET id = 31 WHERE id = 30",
                                    "DELETE FROM t WHERE id = 31", "INSERT INTO t VALUES (30, 'b')"]],
    "two_transactions": [["INSERT INTO t VALUES (40, 'a')"], ["INSERT INTO t VALUES (41, 'b')"]],
    "composite_key": [["INSERT INTO two VALUES (1, 'x', 0)", "UPDATE two SET b = 'y' WHERE a = 1",
                       "DELETE FROM two WHERE a = 1"]],
    "replica_identity_full": [["UPDATE full_t SET v = 'uno' WHERE id = 1", "DELETE FROM full_t WHERE id = 1"]],
    "type": [["INSERT INTO typed VALUES (1, 'happy')"]],
    "unchanged_toast": [["UPDATE toasted SET n = n + 1 WHERE id = 1"]],
    "truncate": [["TRUNCATE t, full_t"]],
    "origin": [["SELECT pg_replication_origin_session_setup('fixture_origin')",
                "SELECT pg_replication_origin_xact_setup('0/12345678', now())",
                "INSERT INTO t VALUES (50, 'from elsewhere')"]],
    "partition_via_root": [["INSERT INTO parted VALUES (5, 'a'), (150, 'b')",
                            "UPDATE parted SET id = 105 WHERE id = 5"]],
}


def capture(dsn: str) -> dict:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in SETUP:
            conn.execute(stmt)
        version = conn.execute("SHOW server_version").fetchone()[0]
        out: dict = {"server_version": version, "setup": SETUP, "cases": {}}
        for name, transactions in CASES.items():
            slot = f"fixture_{name}"
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            with psycopg.connect(dsn, autocommit=True) as app:
                for statements in transactions:
                    with app.transaction():
                        app.execute("SET LOCAL synchronous_commit = on")
                        for stmt in statements:
                            app.execute(stmt)
                if name == "origin":
                    app.execute("SELECT pg_replication_origin_session_reset()")
            rows = conn.execute("SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL,"
                                " 'proto_version', '1', 'publication_names', 'fixtures')", (slot,)).fetchall()
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            out["cases"][name] = {"transactions": transactions, "messages": [bytes(r[0]).hex() for r in rows]}
        return out


if __name__ == "__main__":
    OUT.write_text(json.dumps(capture(sys.argv[1]), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")
