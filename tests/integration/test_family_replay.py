"""A family's logs are replayed by one statement (mover/engines/capture/changelog.py apply_family_batch): the
foreign keys between the targets are checked at its end, against the sources' state of one
snapshot. A batch of each log that is not a cut the keys hold (a child's row in it, its new
parent's beyond it; a parent's delete in it, its child's beyond it) is replayed again with every
logged row: never a divergence for writes the application made legally."""

from __future__ import annotations

import psycopg
import pytest

from mover import api
from mover.db import Database
from mover.engines.capture import changelog
from mover.engines.context import Context
from mover.errors import PlanError, Waiting
from mover.state import control
from tests.workload import write_plan

SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers, note text);
INSERT INTO customers SELECT g, 'c' FROM generate_series(1, 100) g;
INSERT INTO orders SELECT g, g, 'o' FROM generate_series(1, 100) g;
"""

PLAN = """
[migration]
name = "fam"
source = "customers"

[target]
columns = { id = "bigint" }

[[also]]
source = "orders"
columns = { customer_id = "bigint" }

[rollback]
window = "1h"
"""


@pytest.fixture
def at_gate(db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    with pytest.raises(Waiting):
        api.run(db_dsn, write_plan(tmp_path / "fam.toml", PLAN))
    return db_dsn


def replay(dsn: str, limit: int) -> changelog.Applied:
    db = Database(dsn)
    try:
        ctx = Context(db=db, migration=db.transaction(lambda cur: control.get(cur, "fam")), owner="test")
        return db.transaction(lambda cur: changelog.apply_family_batch(cur, ctx, reverse=False, limit=limit))
    finally:
        db.close()


def counts(dsn: str) -> tuple[int, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT (SELECT count(*) FROM mover.divergences),"
            " (SELECT count(*) FROM mover.m1_changes) + (SELECT count(*) FROM mover.m2_changes),"
            " (SELECT count(*) FROM (SELECT * FROM customers EXCEPT SELECT * FROM customers_new) d)"
            " + (SELECT count(*) FROM (SELECT * FROM orders EXCEPT SELECT * FROM orders_new) d)"
            " + (SELECT count(*) FROM (SELECT * FROM customers_new EXCEPT SELECT * FROM customers) d)"
            " + (SELECT count(*) FROM (SELECT * FROM orders_new EXCEPT SELECT * FROM orders) d)").fetchone()


def test_a_child_in_the_batch_and_its_new_parent_beyond_it(at_gate):
    with psycopg.connect(at_gate) as conn:  # one transaction: parents, then a child of the last one
        conn.execute("INSERT INTO customers SELECT g, 'new' FROM generate_series(101, 110) g")
        conn.execute("INSERT INTO orders VALUES (101, 110, 'child of the last parent')")
    # A batch of one row of each log: customer 101 and order 101, whose parent (110) is beyond it.
    got = replay(at_gate, limit=1)
    assert (got.claimed, got.failed) == (11, 0)  # every logged row, in one statement
    assert counts(at_gate) == (0, 0, 0)


def test_a_parent_deleted_in_the_batch_and_its_child_beyond_it(at_gate):
    with psycopg.connect(at_gate) as conn:  # one transaction: the children first, legally
        conn.execute("UPDATE orders SET note = 'touched' WHERE id = 1")
        conn.execute("DELETE FROM orders WHERE id = 50")
        conn.execute("DELETE FROM customers WHERE id = 50")
    # One row of each log: the customer's delete, and the update of order 1 (not order 50's delete).
    got = replay(at_gate, limit=1)
    assert (got.claimed, got.failed) == (3, 0)
    assert counts(at_gate) == (0, 0, 0)


def test_a_cut_the_keys_hold_is_replayed_batch_by_batch(at_gate):
    with psycopg.connect(at_gate) as conn:
        conn.execute("UPDATE customers SET name = 'u' WHERE id <= 10")
        conn.execute("UPDATE orders SET note = 'u' WHERE id <= 10")
    got = replay(at_gate, limit=4)
    assert got.claimed == 8  # four of each log: nothing the keys refuse, no second statement
    assert counts(at_gate)[:2] == (0, 12)


KINDS = """
CREATE TABLE parents (a int, b int, PRIMARY KEY (a, b), u int UNIQUE);
CREATE TABLE kids (id int PRIMARY KEY, a int, b int, u int, note text,
    CONSTRAINT kids_full FOREIGN KEY (a, b) REFERENCES parents MATCH FULL ON UPDATE CASCADE ON DELETE SET NULL (b),
    CONSTRAINT kids_u FOREIGN KEY (u) REFERENCES parents (u) ON DELETE SET DEFAULT DEFERRABLE INITIALLY DEFERRED);
ALTER TABLE kids ADD CONSTRAINT kids_loose FOREIGN KEY (u) REFERENCES parents (u) NOT VALID;
INSERT INTO parents SELECT g, g, g FROM generate_series(1, 20) g;
INSERT INTO kids SELECT g, g, g, g, 'k' FROM generate_series(1, 20) g;
"""

KINDS_PLAN = """
[migration]
name = "kinds"
source = "parents"

[[also]]
source = "kids"

[rollback]
window = "1h"
"""


def test_the_targets_keys_print_as_the_sources_keys(db_dsn, tmp_path):
    """Each key between the family's sources is on the targets as it is on the sources: match,
    actions (ON DELETE SET NULL (column)), deferral, validation state; NOT ENFORCED on 18."""
    enforced = psycopg.connect(db_dsn, autocommit=True).info.server_version >= 180000
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(KINDS)
        if enforced:
            conn.execute("ALTER TABLE kids ADD CONSTRAINT kids_unenforced FOREIGN KEY (a, b) REFERENCES parents"
                         " NOT ENFORCED")
    with pytest.raises(Waiting):
        api.run(db_dsn, write_plan(tmp_path / "kinds.toml", KINDS_PLAN))
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        def keys(table: str) -> dict[str, tuple[str, bool]]:
            return {name: (definition.replace("parents_new", "parents"), validated) for name, definition, validated
                    in conn.execute("SELECT conname, pg_get_constraintdef(oid), convalidated FROM pg_constraint"
                                    " WHERE conrelid = %s::regclass AND contype = 'f'", (table,)).fetchall()}
        source, target = keys("kids"), keys("kids_new")
    assert len(source) == 3 + enforced and target == source


def test_an_edit_cannot_leave_a_key_between_the_tables_behind(db_dsn, tmp_path):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(KINDS)
    plan = """
[migration]
name = "kids-first"
source = "kids"

[[also]]
source = "parents"

[rollback]
window = "1h"
"""
    path = write_plan(tmp_path / "kids.toml", plan)
    with pytest.raises(Waiting):
        api.run(db_dsn, path)
    edited = plan.replace('source = "kids"\n', 'source = "kids"\n\n[target]\ndrop_foreign_keys = ["kids_u"]\n')
    with pytest.raises(PlanError) as info:
        api.check_plan(db_dsn, write_plan(tmp_path / "kids.toml", edited))
    assert '"kids_u" references another table of this migration' in str(info.value)
