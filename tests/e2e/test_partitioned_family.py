"""A partitioned source in a family (issue 37, item 1): the key of a partitioned events table widens
with the columns that reference it, one partitioned (notes) and one not (plain_ref), in one
migration with one swap, under an application that inserts an event with its note in one
transaction, updates, moves events without notes to another month, and deletes notes then their
event. Judged by the application's mirrors (written in the same statement as each write) with
EXCEPT ALL both ways on the live tables, and on the old ones during the rollback window. Also:
a conversion's partition upkeep leaves a table alone while another migration moves it."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import psycopg

from tests import workload
from tests.workload import AppWriter, mover

NAME = "events_fam"
TABLES = {
    "events": ("id", "created_at", "tenant", "payload"),
    "notes": ("id", "event_id", "event_at", "body"),
    "plain_ref": ("id", "event_id", "event_at"),
}

SETUP = """
CREATE TABLE events (id serial, created_at timestamptz NOT NULL, tenant int NOT NULL, payload text,
                     PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
CREATE TABLE events_old_months PARTITION OF events FOR VALUES FROM ('2000-01-01') TO (date_trunc('month', now()));
CREATE TABLE events_this_month PARTITION OF events
    FOR VALUES FROM (date_trunc('month', now())) TO (date_trunc('month', now()) + interval '1 month')
    PARTITION BY RANGE (created_at);
CREATE TABLE events_this_month_low PARTITION OF events_this_month
    FOR VALUES FROM (date_trunc('month', now())) TO (date_trunc('month', now()) + interval '10 days');
CREATE TABLE events_this_month_rest PARTITION OF events_this_month DEFAULT;
CREATE TABLE events_default PARTITION OF events DEFAULT;
CREATE INDEX events_tenant ON events (tenant);
GRANT SELECT ON events_old_months TO PUBLIC;
COMMENT ON TABLE events_this_month_low IS 'low tenants';
CREATE TABLE notes (id serial, event_id int NOT NULL, event_at timestamptz NOT NULL, body text,
                    PRIMARY KEY (id, event_id), FOREIGN KEY (event_id, event_at) REFERENCES events (id, created_at))
    PARTITION BY HASH (event_id);
CREATE TABLE notes_0 PARTITION OF notes FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE notes_1 PARTITION OF notes FOR VALUES WITH (MODULUS 2, REMAINDER 1);
CREATE TABLE plain_ref (id serial PRIMARY KEY, event_id int NOT NULL, event_at timestamptz NOT NULL,
                        FOREIGN KEY (event_id, event_at) REFERENCES events (id, created_at));
INSERT INTO events (created_at, tenant, payload)
    SELECT now() - (g % 90) * interval '1 day', g % 7, md5(g::text) FROM generate_series(1, 2000) g;
INSERT INTO notes (event_id, event_at, body) SELECT id, created_at, 'n' FROM events WHERE id % 4 = 0;
INSERT INTO plain_ref (event_id, event_at) SELECT id, created_at FROM events WHERE id % 5 = 0;
ANALYZE;
"""


def mirror(table: str) -> str:
    return f"{table}_mirror"


def create(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SETUP)
        for table, columns in TABLES.items():
            conn.execute(f"CREATE TABLE {mirror(table)} AS SELECT {', '.join(columns)} FROM {table}")


def mirrored(table: str, statement: str) -> str:
    """The application's INSERT or UPDATE of `table` and its effect on the mirror, one statement."""
    cols = ", ".join(TABLES[table])
    sets = ", ".join(f"{c} = w.{c}" for c in TABLES[table][1:])
    return (f"WITH w AS ({statement} RETURNING {cols}), u AS (UPDATE {mirror(table)} m SET {sets} FROM w"
            f" WHERE m.id = w.id RETURNING m.id) INSERT INTO {mirror(table)} ({cols}) SELECT {cols} FROM w"
            f" WHERE w.id NOT IN (SELECT id FROM u)")


def mirrored_delete(table: str, statement: str) -> str:
    return f"WITH w AS ({statement} RETURNING id) DELETE FROM {mirror(table)} m USING w WHERE m.id = w.id"


@dataclass(eq=False, kw_only=True)
class FamilyWriter(AppWriter):
    """Events with a note in one transaction; updates; an event without notes or references moved
    to another month (its key changes); a note and then its event deleted."""

    def write(self, conn: psycopg.Connection, rnd: random.Random) -> None:
        op = rnd.random()
        with conn.transaction():
            if op < 0.35:
                days = rnd.randint(0, 80)
                conn.execute(mirrored("events", "INSERT INTO events (created_at, tenant, payload) VALUES"
                                      " (now() - %s * interval '1 day', %s, 'w')"), (days, rnd.randint(0, 6)))
                (eid, at) = conn.execute("SELECT id, created_at FROM events_mirror ORDER BY id DESC LIMIT 1").fetchone()
                conn.execute(mirrored("notes", "INSERT INTO notes (event_id, event_at, body) VALUES (%s, %s, 'w')"),
                             (eid, at))
            elif op < 0.55:
                (top,) = conn.execute("SELECT max(id) FROM events_mirror").fetchone()
                conn.execute(mirrored("events", "UPDATE events SET payload = md5(random()::text) WHERE id = %s"),
                             (rnd.randint(1, top),))
            elif op < 0.75:
                # Across months (and tenants): the row changes partition and its key changes.
                conn.execute(mirrored("events", "UPDATE events e SET created_at = created_at + CASE WHEN created_at"
                                      " < now() - interval '40 days' THEN 1 ELSE -1 END * interval '35 days',"
                                      " tenant = (tenant + 1) %% 7 WHERE id = (SELECT e2.id FROM events e2 WHERE"
                                      " NOT EXISTS (SELECT 1 FROM notes n WHERE n.event_id = e2.id) AND NOT EXISTS"
                                      " (SELECT 1 FROM plain_ref r WHERE r.event_id = e2.id) AND e2.id > %s"
                                      " ORDER BY e2.id LIMIT 1)"), (rnd.randint(1, 2000),))
            else:
                row = conn.execute("SELECT n.id, n.event_id FROM notes n WHERE NOT EXISTS (SELECT 1 FROM plain_ref r"
                                   " WHERE r.event_id = n.event_id) AND n.id > %s ORDER BY n.id LIMIT 1",
                                   (rnd.randint(1, 600),)).fetchone()
                if row is not None:
                    conn.execute(mirrored_delete("notes", "DELETE FROM notes WHERE id = %s"), (row[0],))
                    conn.execute(mirrored_delete("events", "DELETE FROM events WHERE id = %s"), (row[1],))


def assert_mirrored(dsn: str, suffix: str = "") -> None:
    """Each table (or its `suffix` one: the old tables during the window) equals its mirror, both
    ways, by an independent query."""
    with psycopg.connect(dsn) as conn:
        for table, columns in TABLES.items():
            cols = ", ".join(columns)
            for a, b in ((f"{table}{suffix}", mirror(table)), (mirror(table), f"{table}{suffix}")):
                (n,) = conn.execute(f"SELECT count(*) FROM (SELECT {cols} FROM {a} EXCEPT ALL"
                                    f" SELECT {cols} FROM {b}) d").fetchone()
                assert n == 0, f"{n} rows of {a} are not in {b}"


def plan(tmp_path) -> str:
    text = workload.plan_text(NAME, "events", columns={"id": "bigint"}, backfill={"range_rows": 300})
    text += "".join(f'[[also]]\nsource = "{t}"\ncolumns = {{ event_id = "bigint" }}\n\n'
                    for t in ("notes", "plain_ref"))
    return workload.write_plan(tmp_path / "family.toml", text)


def test_a_partitioned_family_widens_through_cutover_rollback_and_retire(db_dsn, tmp_path):
    create(db_dsn)
    path = plan(tmp_path)
    check = mover(db_dsn, "plan", "check", path)
    assert check.returncode == 0, check.stderr
    assert "partitioned as the source is" in check.stdout
    with FamilyWriter(db_dsn, seed=11) as writer:
        r = mover(db_dsn, "run", path)
        assert r.returncode == 3, r.stderr
        writer.wait_for_ops(writer.ops + 30)
        r = mover(db_dsn, "cutover", NAME)
        assert r.returncode == 0, r.stderr
        writer.wait_for_ops(writer.ops + 30)
        writer.pause()
        drained = mover(db_dsn, "run", NAME)  # the window's reverse replay caught up
        assert drained.returncode == 3, drained.stderr
        assert_mirrored(db_dsn)
        assert_mirrored(db_dsn, "_old")  # the reverse capture kept the old tables in step
        writer.resume()
        r = mover(db_dsn, "rollback", NAME)
        assert r.returncode == 0, r.stderr
        writer.wait_for_ops(writer.ops + 30)
        r = mover(db_dsn, "run", NAME)
        assert r.returncode == 3, r.stderr
        r = mover(db_dsn, "cutover", NAME)
        assert r.returncode == 0, r.stderr
        writer.wait_for_ops(writer.ops + 30)
    assert writer.errors == []
    assert_mirrored(db_dsn)
    with psycopg.connect(db_dsn) as conn:
        # The partitions kept their names and what each carried of its own; the keys widened.
        names = {r[0] for r in conn.execute("SELECT c.relname FROM pg_partition_tree('events') t"
                                            " JOIN pg_class c ON c.oid = t.relid WHERE t.level > 0")}
        assert names == {"events_old_months", "events_this_month", "events_this_month_low",
                         "events_this_month_rest", "events_default"}
        assert conn.execute("SELECT obj_description('events_this_month_low'::regclass)").fetchone()[0] == "low tenants"
        assert conn.execute("SELECT has_table_privilege('public', 'events_old_months', 'SELECT')").fetchone()[0]
        types = dict(conn.execute("SELECT attrelid::regclass::text || '.' || attname, format_type(atttypid, NULL)"
                                  " FROM pg_attribute WHERE attname IN ('id', 'event_id') AND attrelid IN"
                                  " ('events'::regclass, 'notes'::regclass, 'plain_ref'::regclass)").fetchall())
        assert types["events.id"] == "bigint" and types["notes.event_id"] == "bigint"
        assert types["plain_ref.event_id"] == "bigint"
    r = mover(db_dsn, "retire", NAME, "--force")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(db_dsn) as conn:
        left = conn.execute("SELECT relname FROM pg_class WHERE relname ~ '_(old|new)$'").fetchall()
        assert left == []
    assert_mirrored(db_dsn)


def test_a_conversions_upkeep_leaves_the_table_alone_while_another_migration_moves_it(db_dsn, tmp_path):
    """A table mover converted (its partitions kept ahead by `partitions maintain` from cron) is
    later moved again, layout kept: the upkeep would change the partitions behind the second
    migration's back, so it reports the table skipped until that migration retires, then keeps
    the new table's partitions as before."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id serial PRIMARY KEY, created_at timestamptz NOT NULL, payload text);"
                     "INSERT INTO events (created_at, payload) SELECT now() - g * interval '1 day', 'e'"
                     " FROM generate_series(1, 300) g")
    first = workload.plan_file(tmp_path / "a.toml", "to_monthly", "events", target={"partition": {
        "by": "range", "column": "created_at", "interval": "1 month", "premake": 2, "accept_key_change": True}},
        partitions={"premake": 5})  # upkeep keeps 5 ahead where the conversion made 2
    for args in (("run", first), ("cutover", "to_monthly"), ("retire", "to_monthly", "--force")):
        r = mover(db_dsn, *args)
        assert r.returncode in (0, 3), r.stderr
    second = workload.plan_file(tmp_path / "b.toml", "widen", "events", columns={"id": "bigint"})
    r = mover(db_dsn, "run", second)
    assert r.returncode == 3, r.stderr
    r = mover(db_dsn, "partitions", "maintain", "--all", "--json")
    assert r.returncode == 0, r.stderr
    (result,) = json.loads(r.stdout)
    assert "being moved by migration 'widen'" in result["skipped"]
    r = mover(db_dsn, "cutover", "widen")
    assert r.returncode == 0, r.stderr  # the shape of its source did not change
    r = mover(db_dsn, "retire", "widen", "--force")
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "partitions", "maintain", "--all", "--json")
    assert r.returncode == 0, r.stderr
    (result,) = json.loads(r.stdout)
    assert not result.get("skipped") and len(result["created"]) == 3  # 2 ahead -> 5, on the new table
