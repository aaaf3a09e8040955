"""Race 7 under PostgreSQL 18's temporal keys: `UNIQUE (room, during WITHOUT OVERLAPS)` is a unique
index and an exclusion constraint at once (indisunique and indisexclusion, conexclop `=` and
`&&`). The replay's closure finds the rows in a replayed row's way by the constraint's operators,
as for any exclusion constraint: overlapping periods of one room, equal ones among them. Skips,
saying why, on a server without temporal keys or btree_gist."""

from __future__ import annotations

import psycopg

from tests.e2e.test_temporal_keys import require_temporal
from tests.integration.test_capture import _replay_alone


def test_a_booking_moved_into_a_period_another_left_is_replayed_with_it_under_a_temporal_key(db_dsn):
    """Booking 1 moved into the period booking 2 left, which moved into booking 3's (half an hour
    later: the periods overlap, none is equal), a chain through 300 bookings. The destination's
    temporal key is one exclusion constraint of the closure (`=` on the room, `&&` on the period),
    not also a unique index compared by equality; replaying booking 1 alone pulls the chain in and
    the target then equals the source."""
    from mover.catalog import conversion, introspect
    from mover.engines.capture import changelog
    from mover.names import QualifiedName

    require_temporal(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for t in ("booking", "booking_new"):
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, room int NOT NULL, during int4range NOT NULL,"
                         f" CONSTRAINT {t}_no_overlap UNIQUE (room, during WITHOUT OVERLAPS))")
        conn.execute("INSERT INTO booking SELECT g, 1, int4range(g * 10, g * 10 + 10) FROM generate_series(1, 301) g")
        conn.execute("INSERT INTO booking_new SELECT * FROM booking")
        with conn.transaction():  # each booking moves 15 later, into the next one's period; the last leaves
            conn.execute("DELETE FROM booking WHERE id = 301")
            conn.execute("UPDATE booking SET during = int4range(lower(during) + 100000, upper(during) + 100000)")
            conn.execute("UPDATE booking SET during = int4range(lower(during) - 100000 + 15,"
                         " upper(during) - 100000 + 15)")
        with conn.cursor() as cur:
            m = conversion.mapping(introspect.describe(cur, QualifiedName("public", "booking")),
                                   introspect.describe(cur, QualifiedName("public", "booking_new")), ("id",))
            conflicts = changelog._conflicts(cur, m)
    assert conflicts.unique == ()
    assert [x.operators for x in conflicts.exclusions] == [(("pg_catalog", "="), ("pg_catalog", "&&"))]
    failed, _, differ = _replay_alone(db_dsn, "booking", "booking_new", [("1",)], ("id",))
    assert failed == {}
    assert differ == [0, 0]
