"""Text keys whose collation is not the database's default (issue 7, case 4; invariant 8).

Ranges are cut in the key's own order (its index's); the change log, the watermark test, the
reconcile bounds and the notes must compare keys in that order too. Were any of them to use
the database's default collation, a key above the copied prefix could look below it: the
applier would insert it into the target before its range was copied, and the copy would then
fail with a unique violation (or a replay would be skipped). Each case runs a migration while
a writer changes keys (case flips, deletes and re-inserts, new keys) and ends with an
independent EXCEPT ALL comparison.
"""

from __future__ import annotations

import json
import random
import string
import uuid
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from mover import api
from tests.conftest import connect, dsn_with_dbname, require_icu
from tests.workload import AppWriter, differences, mover, plan_file

DATABASES = {
    # An ICU default collation, C.UTF-8 for the rest of the locale.
    "icu_db": "TEMPLATE template0 ENCODING 'UTF8' LOCALE_PROVIDER icu ICU_LOCALE 'en' LOCALE 'C.UTF-8'",
    "c_db": "TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'",
}
ROWS = 4000

PLAN = dict(backfill={"range_rows": 150, "min_rows": 100, "max_rows": 200, "max_rows_per_second": 2500})


@pytest.fixture(params=sorted(DATABASES))
def locale_dsn(request, pg_dsn):
    """A fresh database with the given locale, mover's control schema installed."""
    # Every case compares an ICU order with C's: an ICU database, or an ICU key in a C one.
    require_icu(pg_dsn)
    with connect(pg_dsn) as conn:
        name = f"t_{request.param}_{uuid.uuid4().hex[:8]}"
        # The locale clauses are fixed text above; the name is an identifier.
        conn.execute(sql.SQL("CREATE DATABASE {} " + DATABASES[request.param]).format(sql.Identifier(name)))
    dsn = dsn_with_dbname(pg_dsn, name)
    try:
        api.init(dsn)
        yield dsn
    finally:
        with connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _word(rng: random.Random) -> str:
    # Case and accents order differently under ICU and C: 'apple' < 'Banana' < 'écu' in ICU,
    # 'Banana' < 'apple' < 'écu' in C.
    letters = string.ascii_letters + "éÉöÖ"
    return "".join(rng.choice(letters) for _ in range(rng.randint(3, 9)))


@dataclass(eq=False, kw_only=True)
class KeyWriter(AppWriter):
    """Changes keys while the backfill runs: case flips of a key (an UPDATE of the key), delete
    and re-insert in one transaction, deletes, inserts of new keys, updates of the value. A
    flipped or new key that exists already is the application's problem (a unique violation)."""

    tolerate: tuple = (psycopg.errors.UniqueViolation,)
    prepare_threshold: int | None = 5  # psycopg's default: prepared statements, as an application has them

    def write(self, conn, rng: random.Random) -> None:
        row = conn.execute("SELECT w FROM words OFFSET floor(random() * (SELECT count(*) FROM words)) LIMIT 1"
                           ).fetchone()
        op = rng.random()
        if row is None or op < 0.15:
            conn.execute("INSERT INTO words (w, n) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                         (_word(rng), rng.randint(0, 10**6)))
            return
        w = row[0]
        if op < 0.45:
            conn.execute("UPDATE words SET w = %s WHERE w = %s", (w.swapcase(), w))
        elif op < 0.65:
            with conn.transaction():
                conn.execute("DELETE FROM words WHERE w = %s", (w,))
                conn.execute("INSERT INTO words (w, n) VALUES (%s, %s)", (w, rng.randint(0, 10**6)))
        elif op < 0.75:
            conn.execute("DELETE FROM words WHERE w = %s", (w,))
        else:
            conn.execute("UPDATE words SET n = n + 1 WHERE w = %s", (w,))


def _collation(dsn: str, table: str, column: str = "w") -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT attcollation::regcollation::text FROM pg_attribute"
                            " WHERE attrelid = %s::regclass AND attname = %s", (table, column)).fetchone()[0]


@pytest.mark.parametrize("key_collation, composite", [("en-x-icu", False), ("C", False), ("en-x-icu", True)])
def test_keys_in_their_own_collation_under_key_changes(locale_dsn, key_collation, composite, tmp_path):
    rng = random.Random(42)
    words = {_word(rng) + str(i) for i in range(ROWS)}
    with psycopg.connect(locale_dsn, autocommit=True) as conn:
        # Composite: the text column second, so row comparisons of bounds reach it after a tie on g.
        conn.execute(sql.SQL("CREATE TABLE words (g int NOT NULL DEFAULT 1, w text COLLATE {} NOT NULL, n int,"
                             " PRIMARY KEY ({}))").format(sql.Identifier(key_collation),
                                                          sql.SQL("g, w" if composite else "w")))
        with conn.cursor().copy("COPY words (g, w, n) FROM STDIN") as cp:
            for i, w in enumerate(sorted(words)):
                cp.write_row((i % 2, w, i))
        conn.execute("ANALYZE words")
        # The case is only a test when the two orders disagree on these keys.
        other = "C" if key_collation != "C" else "en-x-icu"
        disagree = conn.execute(sql.SQL(
            "SELECT count(*) FROM (SELECT w, row_number() OVER (ORDER BY w) a,"
            " row_number() OVER (ORDER BY w COLLATE {}) b FROM words) x WHERE a <> b").format(
            sql.Identifier(other))).fetchone()[0]
        assert disagree > ROWS // 2
    plan = plan_file(tmp_path, "words-move", "words", **PLAN)
    writer = KeyWriter(locale_dsn, seed=7).start()
    try:
        r = mover(locale_dsn, "run", plan)
        assert r.returncode == 3, r.stderr  # the cutover gate, every range copied
        writer.pause()
        assert writer.errors == [] and writer.ops > 50, (writer.errors, writer.ops)
        r = mover(locale_dsn, "run", "words-move")  # drains what the writer did last, reconciles
        assert r.returncode == 3, r.stderr
        st = json.loads(mover(locale_dsn, "status", "words-move", "--json").stdout)
        assert st["divergences"] == 0, st
        assert differences(locale_dsn, "words", "words_new", columns=("g", "w", "n")) == (0, 0)
        assert _collation(locale_dsn, "words_new") == _collation(locale_dsn, "words")
        with psycopg.connect(locale_dsn, autocommit=True) as conn:
            failed = conn.execute("SELECT count(*) FROM mover.ranges WHERE error IS NOT NULL").fetchone()[0]
        assert failed == 0  # no range ever failed (the old code: UniqueViolation)
        writer.paused.clear()
        r = mover(locale_dsn, "cutover", "words-move")
        assert r.returncode == 0, r.stderr
        writer.pause()
        r = mover(locale_dsn, "run", "words-move")  # the rollback window keeps the old table in sync
        assert r.returncode == 3, r.stderr
        assert differences(locale_dsn, "words", "words_old", columns=("g", "w", "n")) == (0, 0)
    finally:
        writer.halt()
    assert writer.errors == []


def test_nondeterministic_key_collation_is_refused(db_dsn, icu, tmp_path):
    """Keys equal under a case-insensitive collation differ in bytes: a case change of a key
    would be invisible to the replay and to the comparison by key. Refused, nothing created."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('CREATE COLLATION "ci words" (provider = icu, locale = \'und-u-ks-level2\','
                     " deterministic = false)")
        conn.execute('CREATE TABLE words (w text COLLATE "ci words" PRIMARY KEY, n int)')
        conn.execute("INSERT INTO words VALUES ('a', 1), ('B', 2)")
    r = mover(db_dsn, "plan", "check", plan_file(tmp_path, "words-move", "words", **PLAN))
    assert r.returncode == 2, r.stderr
    assert 'key column "w"' in r.stderr and '"ci words"' in r.stderr and "nondeterministic" in r.stderr, r.stderr


def test_a_column_keeps_its_collation_through_a_type_change(db_dsn, icu, tmp_path):
    """ALTER TABLE ... TYPE alone would reset it to the new type's default collation."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE labels (id int PRIMARY KEY, label varchar(20) COLLATE "en-x-icu")')
        conn.execute("INSERT INTO labels SELECT g, left(md5(g::text), 15) FROM generate_series(1, 100) g")
    plan = plan_file(tmp_path, "labels", "labels", columns={"label": "varchar(40)"})
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    assert _collation(db_dsn, "labels_new", "label") == '"en-x-icu"'
    assert differences(db_dsn, "labels", "labels_new", columns=("id", "label")) == (0, 0)
