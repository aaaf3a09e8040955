"""Type changes that can lose information (issue 7, case 5; invariant 8).

Values convert as ALTER TABLE ... TYPE converts them (assignment semantics): a value that does
not fit is a divergence naming its row, never a truncated copy; a type change with no
assignment cast is refused at plan check; a lossy change must be acknowledged in the plan;
reconcile never calls a value equal because a conversion changed it.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass

import psycopg

from tests.workload import AppWriter, differences, mover, plan_file


def plan(tmp_path, name, source, columns, accept=None, rate=0):
    # Ungoverned: these tests are about conversions. Beside the suite's other tests, the probe reads
    # their load, the governor paces a backfill to its floor to protect the test's writer from
    # them, and a run's length would follow the machine's load (it passed 300 s once in CI); the
    # copy's pace comes from `rate` alone.
    return plan_file(tmp_path, name, source, columns=columns, target={} if accept is None else {"accept_lossy": accept},
                     backfill={"range_rows": 200, "min_rows": 100, "max_rows": 300, "max_rows_per_second": rate},
                     throttle={"max_latency_increase": "off"})


def run_sql(dsn, *statements):
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def query(dsn, q, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(q, params).fetchall()


def status(dsn, name):
    r = mover(dsn, "status", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def open_divergences(dsn, name):
    r = mover(dsn, "divergences", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _short(rng):  # never a truncation of a long value: those start with 'L'
    return "s" + "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(0, 4)))


def _long(rng):
    return "L" + "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(5, 15)))


@dataclass(eq=False, kw_only=True)
class CodeWriter(AppWriter):
    """Makes short codes long and long codes short while the migration runs. With a migration
    name: stops once its backfill is over. The writes then overlap capture and the copy, and
    reconcile converges however slow the machine (a writer that outlives `mover run` could keep
    a starved reconcile chasing fresh changes)."""

    rows: int
    seed: int = 3
    migration: str | None = None
    delay: float = 0.002
    prepare_threshold: int | None = 5  # psycopg's default: prepared statements, as an application has them

    def write(self, conn, rng: random.Random) -> None:
        if self.migration and self.ops % 20 == 0 and self._backfill_over(conn):
            self.stop.set()
            return
        i = rng.randint(1, self.rows)
        code = _long(rng) if rng.random() < 0.3 else _short(rng)
        conn.execute("UPDATE items SET code = %s, qty = qty + 1 WHERE id = %s", (code, i))

    def _backfill_over(self, conn) -> bool:
        row = conn.execute("SELECT step NOT IN ('create_target', 'install_capture', 'backfill')"
                           " FROM mover.migrations WHERE name = %s", (self.migration,)).fetchone()
        return bool(row and row[0])


ITEMS = 3000


def create_items(dsn):
    rng = random.Random(1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, code varchar(20) NOT NULL, qty int NOT NULL)")
        with conn.cursor().copy("COPY items (id, code, qty) FROM STDIN") as cp:
            for i in range(1, ITEMS + 1):
                cp.write_row((i, _long(rng) if i % 97 == 0 else _short(rng), i))


def test_varchar_narrowing_refused_unless_acknowledged(db_dsn, tmp_path):
    create_items(db_dsn)
    r = mover(db_dsn, "plan", "check", plan(tmp_path, "narrow", "items", {"code": "varchar(5)"}))
    assert r.returncode == 2, r.stderr
    for part in ('"code"', "character varying(20) -> character varying(5)", "length narrowing",
                 'accept_lossy = ["code"]'):
        assert part in r.stderr, r.stderr
    assert query(db_dsn, "SELECT count(*) FROM mover.migrations")[0][0] == 0
    r = mover(db_dsn, "run", plan(tmp_path, "narrow", "items", {"code": "varchar(5)"}))
    assert r.returncode == 2 and "accept_lossy" in r.stderr, r.stderr
    r = mover(db_dsn, "plan", "check", "--json", plan(tmp_path, "narrow", "items", {"code": "varchar(5)"}, ["code"]))
    assert r.returncode == 0, r.stderr
    assert "length narrowing" in json.loads(r.stdout)["lossy_accepted"]["code"]


def test_varchar_narrowing_long_rows_are_divergences(db_dsn, tmp_path):
    """The long values are never truncated into the target: each long row is a divergence naming
    it, the short ones are copied, the cutover waits; fixing the source rows and repairing ends
    in equal tables and a cutover."""
    create_items(db_dsn)
    path = plan(tmp_path, "narrow", "items", {"code": "varchar(5)"}, ["code"], rate=3000)
    writer = CodeWriter(db_dsn, rows=ITEMS, migration="narrow").start()
    try:
        r = mover(db_dsn, "run", path)
        assert r.returncode == 3, r.stderr
    finally:
        writer.halt()
    assert writer.errors == [] and writer.ops > 50
    r = mover(db_dsn, "run", "narrow")  # drains the writer's last changes, reconciles again
    assert r.returncode == 3, r.stderr
    assert status(db_dsn, "narrow")["step"] in ("reconcile", "cutover")  # waiting on the divergences
    assert query(db_dsn, "SELECT count(*) FROM mover.ranges WHERE kind = 'backfill' AND status <> 'done'")[0][0] == 0

    # Nothing was truncated into the target (an explicit cast would have made 'Labcdefg' 'Labcd').
    assert query(db_dsn, "SELECT count(*) FROM items_new WHERE code LIKE 'L%'")[0][0] == 0
    # Independently: the rows that differ are exactly the long ones, and each is an open divergence.
    long_keys = {str(r[0]) for r in query(db_dsn, "SELECT id FROM items WHERE length(code) > 5")}
    assert len(long_keys) >= ITEMS // 97
    differing = {str(r[0]) for r in query(
        db_dsn, "SELECT id FROM (SELECT * FROM items EXCEPT ALL SELECT * FROM items_new) a"
                " UNION SELECT id FROM (SELECT * FROM items_new EXCEPT ALL SELECT * FROM items) b")}
    assert differing == long_keys
    divergent = {d["key"][0] for d in open_divergences(db_dsn, "narrow")}
    assert divergent == long_keys
    kinds = {d["kind"] for d in open_divergences(db_dsn, "narrow")}
    assert "apply_error" in kinds
    errors = [d for d in open_divergences(db_dsn, "narrow") if d["kind"] == "apply_error"]
    assert all("character varying(5)" in json.dumps(d["columns"]) for d in errors)

    r = mover(db_dsn, "cutover", "narrow")  # refused: the migration waits on its divergences
    assert r.returncode in (2, 3), r.stderr
    assert query(db_dsn, "SELECT to_regclass('items_new') IS NOT NULL")[0][0]  # nothing swapped

    # The operator shortens the long values at the source; repair re-syncs them.
    run_sql(db_dsn, "UPDATE items SET code = left(code, 5) WHERE length(code) > 5")
    r = mover(db_dsn, "repair", "narrow")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mover(db_dsn, "run", "narrow")
    assert r.returncode == 3, r.stderr
    assert status(db_dsn, "narrow")["divergences"] == 0
    assert differences(db_dsn, "items", "items_new", columns=("id", "code", "qty")) == (0, 0)
    r = mover(db_dsn, "cutover", "narrow")
    assert r.returncode == 0, r.stderr


def test_rounding_conversions_are_reported_as_different(db_dsn, tmp_path):
    """numeric scale narrowing and float8 -> float4 round silently (as ALTER TABLE does): every
    value they changed must be a `different` divergence, the unchanged ones equal."""
    run_sql(db_dsn,
            "CREATE TABLE m (id int PRIMARY KEY, amount numeric(12,4), ratio double precision)",
            "INSERT INTO m SELECT g, CASE WHEN g % 10 = 0 THEN g + 0.1234 ELSE g + 0.5 END,"
            " CASE WHEN g % 7 = 0 THEN g * 0.1 ELSE g * 0.25 END FROM generate_series(1, 2000) g")
    columns = {"amount": "numeric(12,2)", "ratio": "real"}
    r = mover(db_dsn, "plan", "check", plan(tmp_path, "round", "m", columns))
    assert r.returncode == 2, r.stderr
    assert '"amount" numeric(12,4) -> numeric(12,2): scale narrowing' in r.stderr, r.stderr
    assert '"ratio" double precision -> real' in r.stderr, r.stderr
    r = mover(db_dsn, "run", plan(tmp_path, "round", "m", columns, ["amount", "ratio"]))
    assert r.returncode == 3, r.stderr
    changed = {str(r[0]) for r in query(
        db_dsn, "SELECT id FROM m WHERE amount <> round(amount, 2) OR ratio <> ratio::real::double precision")}
    assert len(changed) > 200
    found = open_divergences(db_dsn, "round")
    assert {d["kind"] for d in found} == {"different"}
    assert {d["key"][0] for d in found} == changed
    shown = next(d for d in found if d["key"] == ["10"])["columns"]
    assert shown["amount"] == ["10.1234", "10.12"]
    r = mover(db_dsn, "cutover", "round")
    assert r.returncode in (2, 3), r.stderr
    r = mover(db_dsn, "accept", "round", "--reason", "rounding intended")
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "run", "round")
    assert r.returncode == 3, r.stderr  # the cutover gate: the accepted differences no longer block it
    r = mover(db_dsn, "cutover", "round")
    assert r.returncode == 0, r.stderr


def test_no_assignment_cast_is_refused(db_dsn, tmp_path):
    run_sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, n text)", "INSERT INTO t VALUES (1, '42')")
    r = mover(db_dsn, "plan", "check", plan(tmp_path, "to-int", "t", {"n": "integer"}, ["n"]))
    assert r.returncode == 2, r.stderr
    assert 'column "n" cannot become \'integer\'' in r.stderr and "no assignment cast from text to integer" in r.stderr


def test_lossy_key_is_refused(db_dsn, tmp_path):
    run_sql(db_dsn, "CREATE TABLE k (id bigint PRIMARY KEY, v text)", "INSERT INTO k VALUES (1, 'a')")
    r = mover(db_dsn, "plan", "check", plan(tmp_path, "key-narrow", "k", {"id": "integer"}, ["id"]))
    assert r.returncode == 2, r.stderr
    assert 'key column "id"' in r.stderr and "bigint -> integer" in r.stderr, r.stderr


def test_a_narrowing_through_a_domain_is_named(db_dsn, tmp_path):
    run_sql(db_dsn, "CREATE DOMAIN code20 AS varchar(20)", "CREATE TABLE d (id int PRIMARY KEY, code code20)",
            "INSERT INTO d VALUES (1, 'abcdefgh')")
    r = mover(db_dsn, "plan", "check", plan(tmp_path, "dom", "d", {"code": "varchar(5)"}))
    assert r.returncode == 2, r.stderr
    assert '"code" public.code20 -> character varying(5): length narrowing' in r.stderr, r.stderr
