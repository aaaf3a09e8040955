"""A logical-replication subscriber of the source stays exactly in step through a whole migration
(run, cutover, the rollback window, rollback, cutover again, retire) under a writer, for each kind
of publication: the kinds that would publish mover's tables are refused by `mover init` or
`plan check`, naming the publication and the statements to run, and once those statements run
(with the subscriber live) the migration goes through. The oracle: after the subscriber confirmed
the source's WAL position taken once the writer paused, its table equals the source's live table
(as a multiset, both ways) and its apply worker counted no error.

The server is the test's own (wal_level = logical; the suite's server keeps its settings), the
subscriber a second database on it, subscribed through a slot created beforehand (a subscription
to the same cluster cannot create its slot)."""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from mover.demo.embedded import EmbeddedPostgres
from tests.workload import MIRROR, ORDERS_COLUMNS, ORDERS_DDL, Writer, assert_oracle, create_orders, mover, plan_file

ROWS = 3000
WIDEN = {"columns": {"id": "bigint"}}  # the plan's [target]
PARTITION = {"partition": {"by": "hash", "column": "id", "modulus": 4}}
# A FOR TABLE publication with a column list and a row filter: both must hold through the swaps.
PUBLISHED_COLUMNS = ("id", "Account", "amount", "status")
ROW_FILTER = "id % 3 <> 0"


def sub_plan(tmp_path, target: dict) -> str:
    return plan_file(tmp_path, "orders_sub", target=target, backfill={"range_rows": 1000})


WIDE = {"COLUMNS": "2000"}  # the printed statements on one line each, to run them as printed

KINDS = {
    # kind: (publication, the plan's target, who refuses it)
    "all_tables": ("CREATE PUBLICATION pub FOR ALL TABLES", WIDEN, "init"),
    "in_schema": ("CREATE PUBLICATION pub FOR TABLES IN SCHEMA public", WIDEN, "plan check"),
    "partitioned_not_via_root": (
        f'CREATE PUBLICATION pub FOR TABLE "Orders" (id, "Account", amount, status) WHERE ({ROW_FILTER})',
        PARTITION, "plan check"),
}


@pytest.fixture(scope="module")
def logical() -> Iterator[EmbeddedPostgres]:
    # Status reports every second: the source sees the subscriber's confirmed position promptly.
    with EmbeddedPostgres(fast=True, settings={"wal_level": "logical", "wal_receiver_status_interval": "1s"}) as pg:
        yield pg


def _sql(dsn: str, statement: str | sql.Composable, params=None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def _rows(dsn: str, columns: tuple[str, ...], where: str = "true") -> collections.Counter:
    cols = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns)
    return collections.Counter(_sql(dsn, sql.SQL('SELECT {} FROM "Orders" WHERE {}').format(cols, sql.SQL(where))))


class Subscriber:
    def __init__(self, pg: EmbeddedPostgres, source: str, sub: str, published: tuple[str, ...], row_filter: str):
        self.source, self.sub, self.published, self.row_filter = source, sub, published, row_filter

    def errors(self) -> tuple[int, int]:
        return _sql(self.sub, "SELECT apply_error_count, sync_error_count FROM pg_stat_subscription_stats"
                              " WHERE subname = 'sub'")[0]

    def wait_until(self, predicate, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.errors() == (0, 0), f"the subscriber's apply failed (waiting for {what}): {self.errors()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    def assert_in_step(self) -> None:
        """Called with the writer paused and mover idle: everything up to now reached the subscriber."""
        (lsn,) = _sql(self.source, "SELECT pg_current_wal_lsn()")[0]
        self.wait_until(lambda: _sql(self.source, "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots"
                                                  " WHERE slot_name = 'sub'", (lsn,))[0][0],
                        "the subscriber to confirm the source's position")
        assert self.errors() == (0, 0)
        diff = [0, 0]

        def same() -> bool:
            live, copy = _rows(self.source, self.published, self.row_filter), _rows(self.sub, self.published)
            diff[:] = sum((live - copy).values()), sum((copy - live).values())
            return diff == [0, 0]
        # The confirmed position can run ahead of what the subscriber's apply has made visible: the
        # rows are compared until they agree (the writer is paused, nothing changes on the source).
        try:
            self.wait_until(same, "the subscriber's rows to match the source's", timeout=30)
        except AssertionError:
            raise AssertionError(f"{diff[0]} rows only on the source, {diff[1]} on the subscriber") from None


def _run_printed(dsn: str, stderr: str) -> None:
    """The statements mover printed for the refusal, run as printed."""
    found = re.findall(r"BEGIN; .*? COMMIT;", stderr)
    assert found, stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statements in found:
            conn.execute(statements)


@pytest.mark.parametrize("kind", list(KINDS))
def test_subscriber_stays_in_step_for_each_kind_of_publication(logical, tmp_path, kind):
    publication, target, refused_by = KINDS[kind]
    published, row_filter = ((PUBLISHED_COLUMNS, ROW_FILTER) if kind == "partitioned_not_via_root"
                             else (ORDERS_COLUMNS, "true"))
    source, sub = logical.dsn_for(f"src_{kind}"), logical.dsn_for(f"sub_{kind}")
    for db in (f"src_{kind}", f"sub_{kind}"):
        _sql(logical.dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    create_orders(source, ROWS)
    _sql(sub, ORDERS_DDL)  # the subscriber's copy: the same tables, empty (the subscription copies them)
    _sql(sub, sql.SQL('CREATE TABLE {m} (LIKE "Orders"); ALTER TABLE {m} ALTER id TYPE bigint, ADD PRIMARY KEY (id)')
         .format(m=sql.Identifier(MIRROR)))
    _sql(source, publication)
    _sql(source, "SELECT pg_create_logical_replication_slot('sub', 'pgoutput')")
    _sql(sub, sql.SQL("CREATE SUBSCRIPTION sub CONNECTION {} PUBLICATION pub WITH (create_slot = false,"
                      " slot_name = 'sub')").format(sql.Literal(source)))
    subscriber = Subscriber(logical, source, sub, published, row_filter)
    writer = None
    try:
        subscriber.wait_until(lambda: _sql(sub, "SELECT count(*) FILTER (WHERE srsubstate <> 'r'), count(*)"
                                                " FROM pg_subscription_rel")[0] in ((0, 1), (0, 2)),
                              "the subscription's initial copy")
        writer = Writer(source, seed=11).start()

        r = mover(source, "init", env=WIDE)
        if refused_by == "init":
            assert r.returncode == 2 and '"pub"' in r.stderr and "FOR ALL TABLES" in r.stderr, r.stderr
            assert _sql(source, "SELECT to_regnamespace('mover')")[0][0] is None  # nothing created
            _run_printed(source, r.stderr)
            r = mover(source, "init")
        assert r.returncode == 0, r.stderr

        plan = sub_plan(tmp_path, target)
        r = mover(source, "plan", "check", plan, env=WIDE)
        if refused_by == "plan check":
            assert r.returncode == 2 and '"pub"' in r.stderr, r.stderr
            _run_printed(source, r.stderr)
            r = mover(source, "plan", "check", plan)
        assert r.returncode == 0, r.stderr

        assert mover(source, "run", plan).returncode == 3  # at the cutover gate
        r = mover(source, "cutover", "orders_sub")
        assert r.returncode == 0, r.stderr
        assert mover(source, "run", "orders_sub").returncode == 3  # the window: the old table follows
        writer.pause()
        subscriber.assert_in_step()
        writer.resume()

        r = mover(source, "rollback", "orders_sub")
        assert r.returncode == 0, r.stderr
        writer.pause()
        subscriber.assert_in_step()
        writer.resume()

        assert mover(source, "run", "orders_sub").returncode == 3
        r = mover(source, "cutover", "orders_sub")
        assert r.returncode == 0, r.stderr
        r = mover(source, "retire", "orders_sub", "--force")
        assert r.returncode == 0, r.stderr
        writer.halt()
        assert writer.errors == []
        assert_oracle(source, "Orders")
        subscriber.assert_in_step()
    finally:
        if writer is not None:
            writer.halt()
        # A leftover slot would retain WAL: the subscription drops its slot with it.
        _sql(sub, "DROP SUBSCRIPTION IF EXISTS sub")
        _sql(source, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active")


def test_cutover_refuses_a_publication_made_since_registration(db_dsn, tmp_path):
    """plan check ran before the publication existed: the cutover checks again, before the swap."""
    create_orders(db_dsn, ROWS)
    plan = sub_plan(tmp_path, PARTITION)
    assert mover(db_dsn, "run", plan).returncode == 3
    _sql(db_dsn, 'CREATE PUBLICATION pub FOR TABLE "Orders"')
    r = mover(db_dsn, "cutover", "orders_sub", env=WIDE)
    assert r.returncode == 2 and '"pub"' in r.stderr and "publish_via_partition_root" in r.stderr, r.stderr
    assert _sql(db_dsn, """SELECT relkind FROM pg_class WHERE oid = '"Orders"'::regclass""") == [("r",)]
    _run_printed(db_dsn, r.stderr)
    r = mover(db_dsn, "cutover", "orders_sub")
    assert r.returncode == 0, r.stderr
    assert _sql(db_dsn, """SELECT relkind FROM pg_class WHERE oid = '"Orders"'::regclass""") == [("p",)]


def test_a_publication_of_the_control_schema_is_refused(db_dsn, tmp_path):
    create_orders(db_dsn, 100)
    _sql(db_dsn, "CREATE PUBLICATION pub FOR TABLES IN SCHEMA mover")
    plan = sub_plan(tmp_path, WIDEN)
    for args in (("init",), ("plan", "check", plan)):
        r = mover(db_dsn, *args, env=WIDE)
        assert r.returncode == 2 and '"pub"' in r.stderr and "control schema" in r.stderr, r.stderr
    _run_printed(db_dsn, r.stderr)
    assert mover(db_dsn, "init").returncode == 0
    assert mover(db_dsn, "plan", "check", plan).returncode == 0
