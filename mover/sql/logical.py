"""SQL of logical capture (mover/engines/capture/logical.py): the publication and the replication slot the
source's changes are decoded through, the one-row feed state, reading the slot, and the insert
that feeds the decoded keys into the change log. Builders only, no I/O.

Everything is schema-qualified (pg_catalog.): mover's sessions pin their search_path, and these
functions are the server's own."""

from __future__ import annotations

from psycopg import sql

from mover.names import QualifiedName
from mover.sql import trusted
from mover.sql.mapping import ident_list

# What the decoder asks pgoutput for. Protocol version 1 (every supported server has it): no
# streaming of transactions in progress, no two-phase, no binary values (the text form is what
# the log's columns take back), no logical messages.
PROTO_VERSION = "1"
# A truncate is published too, so that one that got past the TRUNCATE trigger (disabled or
# dropped by someone) stops the migration instead of going unseen.
PUBLISH = "insert, update, delete, truncate"


def create_publication(publication: str, table: QualifiedName) -> sql.Composed:
    # publish_via_partition_root: changes to a partitioned table's partitions are published under
    # the table's own name and oid; it is also what mover's subscriber checks ask of a publication
    # of a table converted to a partitioned one (mover/catalog/subscribers.py).
    return sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = {}, publish_via_partition_root = true)"
                   ).format(sql.Identifier(publication), table.ident, sql.Literal(PUBLISH))


def comment_publication(publication: str, migration: str) -> sql.Composed:
    return sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(sql.Identifier(publication), sql.Literal(
        f"mover migration {migration}: its logical capture, read by mover alone; not for subscribers"
        f" (dropped at the cutover, abort or retire)"))


def drop_publication(publication: str) -> sql.Composed:
    return sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication))


def create_slot() -> sql.SQL:
    """%s: the slot's name. Not temporary: it outlives the session, so that a crash of mover loses
    no change (the slot keeps the WAL until mover has fed it)."""
    return sql.SQL("SELECT lsn FROM pg_catalog.pg_create_logical_replication_slot(%s, 'pgoutput')")


def drop_slot() -> sql.SQL:
    """%s: the slot's name; nothing when it is gone already."""
    return sql.SQL("SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots"
                   " WHERE slot_name = %s")


def slot() -> sql.SQL:
    """%s: the slot's name. wal_status 'lost': its WAL is gone (max_slot_wal_keep_size, or removed by
    hand); the catalog_xmin NULL with a restart_lsn NULL says the same on any version."""
    return sql.SQL("SELECT s.database, s.plugin, s.slot_type, s.temporary, s.active_pid, s.wal_status,"
                   " s.confirmed_flush_lsn::text, s.restart_lsn::text"
                   " FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = %s")


def own_slots() -> sql.SQL:
    """Slots named as mover names them (names.capture_slot) for this database: (name, migration id)."""
    return sql.SQL("SELECT s.slot_name::text,"
                   " (pg_catalog.regexp_match(s.slot_name::text, '^mover_m([0-9]+)_d'))[1]::bigint"
                   " FROM pg_catalog.pg_replication_slots s"
                   " WHERE s.slot_name::text ~ '^mover_m[0-9]+_d[0-9]+$' AND s.slot_name::text"
                   " ~ ('_d' || (SELECT d.oid FROM pg_catalog.pg_database d"
                   " WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())::text || '$')")


def own_publications() -> sql.SQL:
    """Publications named as mover names them (names.capture_publication): (name, migration id)."""
    return sql.SQL("SELECT p.pubname::text, (pg_catalog.regexp_match(p.pubname::text, '^mover_m([0-9]+)_capture$'))[1]"
                   "::bigint FROM pg_catalog.pg_publication p WHERE p.pubname::text ~ '^mover_m[0-9]+_capture$'")


def peek(publication: str) -> sql.Composed:
    """The slot's changes from its confirmed position up to %(upto)s (an LSN; the transactions whose
    commit record starts before it), at most about %(changes)s messages (whole transactions: the
    limit is checked after each one; 0 for none). Peek, not get: the slot's position moves only when
    mover advances it, after what was read here has committed in the change log."""
    names = sql.Identifier(publication)  # quoted: pgoutput splits the option as a list of identifiers
    return sql.SQL("SELECT data FROM pg_catalog.pg_logical_slot_peek_binary_changes(%(slot)s, %(upto)s::pg_lsn,"
                   " %(changes)s, 'proto_version', {}, 'publication_names', {})").format(
        sql.Literal(PROTO_VERSION), sql.Literal(names.as_string()))


def advance() -> sql.SQL:
    """%(slot)s to %(lsn)s, only when it is behind it (moving a slot back is an error)."""
    return sql.SQL("SELECT pg_catalog.pg_replication_slot_advance(s.slot_name, %(lsn)s::pg_lsn)"
                   " FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = %(slot)s"
                   " AND s.confirmed_flush_lsn < %(lsn)s::pg_lsn")


def flush() -> sql.SQL:
    """The WAL insert position, then a transactional logical message: a transaction that wrote WAL,
    whose commit with synchronous_commit on (local) flushes all WAL before it, that position
    included. Decoding reads only flushed WAL, and a transaction the application committed with
    synchronous_commit off may still sit in the WAL buffers. No table is written, no lock taken."""
    return sql.SQL("SELECT pg_catalog.pg_current_wal_insert_lsn()::text,"
                   " pg_catalog.pg_logical_emit_message(true, 'mover', 'flush')")


def positions() -> sql.SQL:
    return sql.SQL("SELECT pg_catalog.pg_current_wal_insert_lsn()::text, pg_catalog.pg_current_wal_flush_lsn()::text")


def create_feed_state(feed: QualifiedName, slot: str) -> sql.Composed:
    """One row: the slot, how far its changes are in the change log (fed_lsn, committed with the
    keys it fed; NULL: from where the slot starts), when that was read, and counts. Made with its
    row in one statement; granted to no one."""
    return sql.SQL("CREATE TABLE {} AS SELECT {}::text AS slot, NULL::pg_lsn AS fed_lsn, NULL::timestamptz AS fed_at,"
                   " 0::bigint AS changes, 0::bigint AS keys").format(feed.ident, sql.Literal(slot))


def read_feed_state(feed: QualifiedName) -> sql.Composed:
    return sql.SQL("SELECT slot, fed_lsn::text, EXTRACT(epoch FROM pg_catalog.clock_timestamp() - fed_at)::float8"
                   " FROM {}").format(feed.ident)


def record_fed(feed: QualifiedName) -> sql.Composed:
    return sql.SQL("UPDATE {} SET fed_lsn = %(lsn)s::pg_lsn, fed_at = pg_catalog.clock_timestamp(),"
                   " changes = changes + %(changes)s, keys = keys + %(keys)s").format(feed.ident)


def reset_feed_state(feed: QualifiedName) -> sql.Composed:
    return sql.SQL("UPDATE {} SET slot = %s, fed_lsn = NULL, fed_at = NULL").format(feed.ident)


def drop_feed_state(feed: QualifiedName) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {}").format(feed.ident)


def insert_keys(log: QualifiedName, key: tuple[str, ...], key_types: tuple[str, ...]) -> sql.Composed:
    """The keys decoded from the slot into the change log, as the capture trigger would have written
    them, each with its transaction's commit time (what `mover status` reads a lag from). The
    values come as the text form the decoding session's output functions wrote (bytes in the
    server's encoding: %(k_0)s... bytea[]), converted back here by the key types' input functions,
    in the same session and under the same settings: exactly the keys the rows hold."""
    columns = sql.SQL(", ").join(
        sql.SQL("CAST(pg_catalog.convert_from(u.{}, pg_catalog.current_setting('server_encoding')::pg_catalog.name)"
                " AS {})").format(sql.Identifier(f"k_{i}"), trusted(t, "format_type"))
        for i, t in enumerate(key_types))
    arrays = sql.SQL(", ").join(sql.SQL("pg_catalog.unnest({}::pg_catalog.bytea[])").format(sql.Placeholder(f"k_{i}"))
                                for i in range(len(key)))
    return sql.SQL("INSERT INTO {log} ({cols}, logged_at) SELECT {columns}, u.at"
                   " FROM ROWS FROM ({arrays}, pg_catalog.unnest(%(at)s::pg_catalog.timestamptz[])) AS u({names}, at)"
                   ).format(
        log=log.ident, cols=ident_list(key), columns=columns, arrays=arrays,
        names=ident_list(f"k_{i}" for i in range(len(key))))


def health(feed: QualifiedName) -> sql.Composed:
    """What `mover status` shows of a slot and what the governor watches: its state, the WAL not
    fed yet (bytes), how old the oldest change not fed can be (seconds since the last feed read
    the stream to its end), and the WAL it keeps the server from recycling."""
    return sql.SQL(
        """
SELECT f.slot, s.slot_name IS NOT NULL, s.wal_status, s.active_pid,
       pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(),
                                  GREATEST(s.confirmed_flush_lsn, f.fed_lsn))::bigint,
       EXTRACT(epoch FROM pg_catalog.clock_timestamp() - f.fed_at)::float8,
       pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.restart_lsn)::bigint,
       s.safe_wal_size, f.fed_lsn::text, s.confirmed_flush_lsn::text, f.changes, f.keys
FROM {} f LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name OPERATOR(pg_catalog.=) f.slot
""").format(feed.ident)
