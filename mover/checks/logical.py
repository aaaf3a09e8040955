"""What `[capture] method = "logical"` needs of the server, the role and the source, each missing
piece reported with the statement or setting that provides it (mover/engines/capture/logical.py reads the
source's changes from the WAL through a replication slot and a publication of its own)."""

from __future__ import annotations

from psycopg import sql

from mover.checks.subject import Subject
from mover.db import one
from mover.engines.capture import logical
from mover.errors import PlanError

TRIGGER = 'or set [capture] method = "trigger" (the default, which needs none of this)'


def prerequisites(s: Subject) -> None:
    if not s.plan.capture.logical:
        return
    cur = s.cur
    cur.execute("SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int,"
                " (SELECT count(*) FROM pg_catalog.pg_replication_slots)::int,"
                " current_setting('max_slot_wal_keep_size'), current_user,"
                " (SELECT r.rolreplication OR r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user),"
                " has_database_privilege(current_database(), 'CREATE'), current_database(),"
                " pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = %s), 'USAGE'),"
                " (SELECT pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class c WHERE c.oid = %s),"
                " EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = 'rds_replication'"
                "         AND pg_has_role(current_user, r.oid, 'MEMBER'))",
                (s.table.oid, s.table.oid))
    (wal_level, max_slots, slots, keep_size, user, replication, create, database, owns, owner,
     rds) = one(cur)
    role = sql.Identifier(user).as_string(cur)
    if wal_level != "logical":
        s.report(PlanError(
            f"logical capture needs wal_level = logical; this server runs with wal_level = {wal_level}",
            hint="as a superuser `ALTER SYSTEM SET wal_level = logical;` then restart the server (on Amazon RDS "
                 "and Aurora: rds.logical_replication = 1 in the parameter group; Cloud SQL: the flag "
                 "cloudsql.logical_decoding = on; Azure: wal_level = LOGICAL in the server parameters); "
                 + TRIGGER))
    if not (replication or rds):
        s.report(PlanError(
            f"logical capture reads a replication slot, which needs the REPLICATION attribute: role {user} "
            f"lacks it",
            hint=f"as a superuser `ALTER ROLE {role} WITH REPLICATION;` (Amazon RDS: `GRANT rds_replication TO "
                 f"{role};`; Cloud SQL and Azure: `ALTER ROLE {role} WITH REPLICATION;` as the admin role); "
                 + TRIGGER))
    if slots >= max_slots:
        cur.execute("SELECT slot_name::text, coalesce(active_pid::text, 'inactive')"
                    " FROM pg_catalog.pg_replication_slots ORDER BY slot_name")
        taken = ", ".join(f"{n} ({a})" for n, a in cur.fetchall())
        s.report(PlanError(
            f"logical capture needs one replication slot, and all {max_slots} (max_replication_slots) are taken: "
            f"{taken or 'none listed'}",
            hint=f"`ALTER SYSTEM SET max_replication_slots = {max_slots + 1};` and restart the server, or drop a slot "
                 f"no one uses (`SELECT pg_drop_replication_slot('<name>');`); " + TRIGGER))
    if not create:
        s.report(PlanError(
            f"logical capture creates a publication of the source, which needs CREATE on database {database}: "
            f"role {user} lacks it",
            hint=f"`GRANT CREATE ON DATABASE {sql.Identifier(database).as_string(cur)} TO {role};` " + TRIGGER))
    if not owns:
        s.report(PlanError(
            f"logical capture creates a publication of {s.src}, which only its owner ({owner}) may do",
            hint=f"run mover as {owner} (or a role that is a member of it), " + TRIGGER))
    problem = logical.identity_problem(cur, s.src, s.table.key)
    if problem is not None:
        s.report(PlanError(problem.message, hint=f"{problem.hint}"))
    if keep_size == "-1":
        s.warnings.append(
            "logical capture: max_slot_wal_keep_size is -1 (unlimited): while mover is not running (or falls "
            "behind) its replication slot keeps the server's WAL, without bound; `ALTER SYSTEM SET "
            "max_slot_wal_keep_size = '50GB'` (and a reload) bounds it: past that the slot is lost and the "
            "migration stops with a way to recover (docs/operating.md \"Choosing a capture method\")")
