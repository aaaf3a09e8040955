"""SQL of change capture: the change log, the trigger that appends keys to it, and the
state-based replay that applies logged keys to the destination.

The trigger records *keys only* (the new key on INSERT/UPDATE, the old one on DELETE and on
an UPDATE that changes the key): it cannot fail on the application's data, and it writes one
small row. The applier later replays each logged key by state: the current source row is
upserted into the destination, or the destination row is deleted when the source has none.
Replay is idempotent and order-free, so a crash between two batches redoes at most a batch.
"""

from __future__ import annotations

from psycopg import sql

from mover.sql.mapping import Mapping, ident_list, key_equal, overriding, source_values


def create_log(log, key: tuple[str, ...], key_types: tuple[str, ...]) -> sql.Composed:
    cols = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(k), sql.SQL(t))
                              for k, t in zip(key, key_types, strict=True))
    return sql.SQL(
        "CREATE TABLE {log} (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, {cols},"
        " logged_at timestamptz NOT NULL DEFAULT now())"
    ).format(log=log.ident, cols=cols)


def create_trigger_function(function, log, key: tuple[str, ...], migration: str) -> sql.Composed:
    """The function body is a string literal (PostgreSQL takes no parameters there); the names
    inside it are composed with Identifier first, so they are quoted exactly once."""
    new_key = sql.SQL(", ").join(sql.SQL("NEW.{}").format(sql.Identifier(k)) for k in key)
    old_key = sql.SQL(", ").join(sql.SQL("OLD.{}").format(sql.Identifier(k)) for k in key)
    body = sql.SQL(
        """
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        -- The rows are gone before anyone could log their keys: refuse rather than diverge.
        RAISE EXCEPTION USING ERRCODE = 'object_in_use',
            MESSAGE = format('%s is being moved by mover migration %s; TRUNCATE would not reach the copy',
                             TG_TABLE_NAME, {migration}),
            HINT = format('delete the rows instead, or `mover abort %s` first', {migration});
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO {log} ({cols}) VALUES ({new_key});
    END IF;
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND ROW({old_key}) IS DISTINCT FROM ROW({new_key})) THEN
        INSERT INTO {log} ({cols}) VALUES ({old_key});
    END IF;
    RETURN NULL;
END
"""
    ).format(log=log.ident, cols=ident_list(key), new_key=new_key, old_key=old_key,
             migration=sql.Literal(migration))
    # Not SECURITY DEFINER: the function runs as the application's role, so a search_path that
    # role controls can hijack nothing but its own rights (a definer function would need a
    # SET search_path clause, which costs a GUC save and restore on every row). The role needs
    # USAGE on the schema and INSERT on the log, granted to PUBLIC: a forged log row is
    # harmless, since replay reads the key's real state.
    return sql.SQL("CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS {body}").format(
        fn=function.ident, body=sql.Literal(body.as_string()))


def grant_log(log) -> list[sql.Composed]:
    return [sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(sql.Identifier(log.schema)),
            sql.SQL("GRANT INSERT ON {} TO PUBLIC").format(log.ident)]


def truncate_trigger(trigger: str) -> str:
    return trigger + "_truncate"


def create_trigger(trigger: str, table, function) -> list[sql.Composed]:
    # ENABLE ALWAYS: the triggers fire even in sessions with session_replication_role = replica
    # (logical replication appliers, some bulk loaders), which would otherwise skip them.
    t, tt = sql.Identifier(trigger), sql.Identifier(truncate_trigger(trigger))
    return [
        sql.SQL("CREATE TRIGGER {t} AFTER INSERT OR UPDATE OR DELETE ON {tbl} FOR EACH ROW EXECUTE FUNCTION {fn}()")
        .format(t=t, tbl=table.ident, fn=function.ident),
        sql.SQL("CREATE TRIGGER {t} BEFORE TRUNCATE ON {tbl} FOR EACH STATEMENT EXECUTE FUNCTION {fn}()")
        .format(t=tt, tbl=table.ident, fn=function.ident),
        sql.SQL("ALTER TABLE {tbl} ENABLE ALWAYS TRIGGER {t}").format(t=t, tbl=table.ident),
        sql.SQL("ALTER TABLE {tbl} ENABLE ALWAYS TRIGGER {t}").format(t=tt, tbl=table.ident),
    ]


def drop_trigger(trigger: str, table) -> sql.Composed:
    return sql.SQL("DROP TRIGGER IF EXISTS {t} ON {tbl}").format(t=sql.Identifier(trigger), tbl=table.ident)


def drop_function(function) -> sql.Composed:
    return sql.SQL("DROP FUNCTION IF EXISTS {fn}()").format(fn=function.ident)


def drop_table(table) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {t}").format(t=table.ident)


def _sync_keys(m: Mapping) -> sql.Composed:
    """CTEs that bring the destination rows of the keys in CTE `keys` to their source state:
    delete those whose source row is gone, upsert the others."""
    k = m.key
    action = (sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
        sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c.name)) for c in m.non_key))
        if m.non_key else sql.SQL("DO NOTHING"))
    return sql.SQL(
        """gone AS (
    DELETE FROM {dst} d USING keys l
    WHERE {d_eq_l} AND NOT EXISTS (SELECT 1 FROM {src} s WHERE {s_eq_l})
    RETURNING 1
), upserted AS (
    INSERT INTO {dst} AS d ({cols}){overriding}
    SELECT {values} FROM {src} s JOIN keys l ON {s_eq_l}
    ON CONFLICT ({key_cols}) {action}
    RETURNING 1
)"""
    ).format(dst=m.dst.ident, src=m.src.ident, d_eq_l=key_equal("d", "l", k), s_eq_l=key_equal("s", "l", k),
             cols=ident_list(c.name for c in m.columns), overriding=overriding(m), values=source_values("s", m),
             key_cols=ident_list(k), action=action)


def replay(m: Mapping, log, *, covered: sql.Composable, skip_locked: bool) -> sql.Composed:
    """One statement: claim up to %(limit)s log rows whose keys the backfill has covered, delete
    the destination rows whose source row is gone, upsert the others. One snapshot serves the
    claim and the reads, so every claimed change is visible in the source rows read."""
    lkey = sql.SQL(", ").join(sql.Identifier("l", c) for c in m.key)
    return sql.SQL(
        """
WITH claimed AS (
    DELETE FROM {log} l WHERE l.seq IN (
        SELECT c.seq FROM {log} c WHERE {covered} ORDER BY c.seq LIMIT %(limit)s FOR UPDATE{skip})
    RETURNING {lkey}
), keys AS (
    SELECT DISTINCT {lkey} FROM claimed l
), {sync}
SELECT (SELECT count(*) FROM claimed), (SELECT count(*) FROM gone), (SELECT count(*) FROM upserted)
"""
    ).format(log=log.ident, covered=covered, skip=sql.SQL(" SKIP LOCKED") if skip_locked else sql.SQL(""),
             lkey=lkey, sync=_sync_keys(m))


def replay_keys(m: Mapping) -> sql.Composed:
    """Replay a single key given as parameters (the fallback when a batch fails on data)."""
    keyrow = sql.SQL(", ").join(sql.SQL("CAST({} AS {}) AS {}").format(sql.Placeholder(), sql.SQL(t), sql.Identifier(c))
                                for c, t in zip(m.key, m.src_key_types, strict=True))
    return sql.SQL("WITH keys AS (SELECT {keyrow}), {sync}\n"
                   "SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM upserted)").format(
        keyrow=keyrow, sync=_sync_keys(m))


def claim_keys(log, covered: sql.Composable, key: tuple[str, ...]) -> sql.Composed:
    """Claim a batch of log rows and return their keys as text (the per-key fallback path)."""
    return sql.SQL(
        "DELETE FROM {log} l WHERE l.seq IN (SELECT c.seq FROM {log} c WHERE {covered} ORDER BY c.seq"
        " LIMIT %(limit)s FOR UPDATE) RETURNING {keys}"
    ).format(log=log.ident, covered=covered,
             keys=sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier("l", c)) for c in key))


def pending_count(log) -> sql.Composed:
    return sql.SQL("SELECT count(*), extract(epoch FROM clock_timestamp() - min(logged_at)) FROM {log}").format(
        log=log.ident)
