"""Every command speaks for all of a migration's tables (issue 35): a new user's Django `auth_user`
widened to bigint with its three referencing tables (auth_user_groups, auth_user_user_permissions,
django_admin_log), every foreign key Django's DEFERRABLE INITIALLY DEFERRED."""

from __future__ import annotations

import json
import re
import signal
from datetime import datetime

import psycopg

from tests.workload import mover, write_plan

# Django's own DDL (contrib.auth and contrib.admin's migrations, as `sqlmigrate` prints them).
DJANGO = """
CREATE TABLE django_content_type (id serial PRIMARY KEY, app_label varchar(100) NOT NULL, model varchar(100) NOT NULL,
    CONSTRAINT django_content_type_app_label_model_76bd3d3b_uniq UNIQUE (app_label, model));
CREATE TABLE auth_permission (id serial PRIMARY KEY, name varchar(255) NOT NULL, content_type_id integer NOT NULL,
    codename varchar(100) NOT NULL,
    CONSTRAINT auth_permission_content_type_id_codename_01ab375a_uniq UNIQUE (content_type_id, codename));
ALTER TABLE auth_permission ADD CONSTRAINT auth_permission_content_type_id_2f476e4b_fk_django_co
    FOREIGN KEY (content_type_id) REFERENCES django_content_type (id) DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX auth_permission_content_type_id_2f476e4b ON auth_permission (content_type_id);
CREATE TABLE auth_group (id serial PRIMARY KEY, name varchar(150) NOT NULL UNIQUE);
CREATE TABLE auth_user (id serial PRIMARY KEY, password varchar(128) NOT NULL, last_login timestamptz NULL,
    is_superuser boolean NOT NULL, username varchar(150) NOT NULL UNIQUE, first_name varchar(150) NOT NULL,
    last_name varchar(150) NOT NULL, email varchar(254) NOT NULL, is_staff boolean NOT NULL,
    is_active boolean NOT NULL, date_joined timestamptz NOT NULL);
CREATE INDEX auth_user_username_6821ab7c_like ON auth_user (username varchar_pattern_ops);
CREATE TABLE auth_user_groups (id serial PRIMARY KEY, user_id integer NOT NULL, group_id integer NOT NULL,
    CONSTRAINT auth_user_groups_user_id_group_id_94350c0c_uniq UNIQUE (user_id, group_id));
ALTER TABLE auth_user_groups ADD CONSTRAINT auth_user_groups_user_id_6a12ed8b_fk_auth_user_id
    FOREIGN KEY (user_id) REFERENCES auth_user (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE auth_user_groups ADD CONSTRAINT auth_user_groups_group_id_97559544_fk_auth_group_id
    FOREIGN KEY (group_id) REFERENCES auth_group (id) DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX auth_user_groups_user_id_6a12ed8b ON auth_user_groups (user_id);
CREATE INDEX auth_user_groups_group_id_97559544 ON auth_user_groups (group_id);
CREATE TABLE auth_user_user_permissions (id serial PRIMARY KEY, user_id integer NOT NULL,
    permission_id integer NOT NULL,
    CONSTRAINT auth_user_user_permissions_user_id_permission_id_14a6b632_uniq UNIQUE (user_id, permission_id));
ALTER TABLE auth_user_user_permissions ADD CONSTRAINT auth_user_user_permissions_user_id_a95ead1b_fk_auth_user_id
    FOREIGN KEY (user_id) REFERENCES auth_user (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE auth_user_user_permissions ADD CONSTRAINT auth_user_user_permi_permission_id_1fbb5f2c_fk_auth_perm
    FOREIGN KEY (permission_id) REFERENCES auth_permission (id) DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX auth_user_user_permissions_user_id_a95ead1b ON auth_user_user_permissions (user_id);
CREATE INDEX auth_user_user_permissions_permission_id_1fbb5f2c ON auth_user_user_permissions (permission_id);
CREATE TABLE django_admin_log (id serial PRIMARY KEY, action_time timestamptz NOT NULL, object_id text NULL,
    object_repr varchar(200) NOT NULL, action_flag smallint NOT NULL CHECK (action_flag >= 0),
    change_message text NOT NULL, content_type_id integer NULL, user_id integer NOT NULL);
ALTER TABLE django_admin_log ADD CONSTRAINT django_admin_log_content_type_id_c4bce8eb_fk_django_co
    FOREIGN KEY (content_type_id) REFERENCES django_content_type (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE django_admin_log ADD CONSTRAINT django_admin_log_user_id_c564eba6_fk_auth_user_id
    FOREIGN KEY (user_id) REFERENCES auth_user (id) DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX django_admin_log_content_type_id_c4bce8eb ON django_admin_log (content_type_id);
CREATE INDEX django_admin_log_user_id_c564eba6 ON django_admin_log (user_id);
"""

ROWS = """
INSERT INTO django_content_type (app_label, model) VALUES ('auth', 'user'), ('auth', 'group'), ('auth', 'permission');
INSERT INTO auth_permission (name, content_type_id, codename)
    SELECT 'Can ' || a || ' ' || m, ct.id, a || '_' || m FROM django_content_type ct, unnest(ARRAY['add', 'change',
    'delete', 'view']) a, LATERAL (SELECT ct.model AS m) x;
INSERT INTO auth_group (name) SELECT 'group ' || g FROM generate_series(1, 5) g;
INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, is_staff, is_active,
                       date_joined)
    SELECT 'pbkdf2_sha256$' || md5(g::text), g = 1, 'user' || g, 'First', 'Last', 'u' || g || '@example.com',
           g % 10 = 0, true, now() - make_interval(days => g) FROM generate_series(1, {users}) g;
INSERT INTO auth_user_groups (user_id, group_id) SELECT u, 1 + k FROM generate_series(1, {users}) u,
    generate_series(0, 2) k;
INSERT INTO auth_user_user_permissions (user_id, permission_id) SELECT u, p FROM generate_series(1, {users}, 4) u,
    (SELECT id AS p FROM auth_permission LIMIT 2) ps;
INSERT INTO django_admin_log (action_time, object_id, object_repr, action_flag, change_message, content_type_id,
                              user_id)
    SELECT now(), g::text, 'user' || g, 1 + g % 3, '[]', 1, 1 + g % 10 FROM generate_series(1, {users}) g;
ANALYZE;
"""

USERS = 1000
# auth_user: 1,000 rows (2 ranges of 500); auth_user_groups: 3,000 (6 ranges); the others fewer.
TABLES = ('"public"."auth_user"', '"public"."auth_user_groups"', '"public"."auth_user_user_permissions"',
          '"public"."django_admin_log"')

PLAN = """
[migration]
name = "users"
source = "public.auth_user"

[target]
columns = { id = "bigint" }

[[also]]
source = "public.auth_user_groups"
columns = { user_id = "bigint" }

[[also]]
source = "public.auth_user_user_permissions"
columns = { user_id = "bigint" }

[[also]]
source = "public.django_admin_log"
columns = { user_id = "bigint" }

[backfill]
range_rows = 500
min_rows = 500
max_rows = 500

[rollback]
window = "1h"
"""


def django(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DJANGO)
        conn.execute(ROWS.format(users=USERS))


def plan(tmp_path) -> str:
    return write_plan(tmp_path / "users.toml", PLAN)


def status(dsn: str, name: str = "users") -> dict:
    r = mover(dsn, "status", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


GROUPS = TABLES[1]


def watched(dsn: str) -> dict:
    """One `mover watch users` snapshot (what its line and screen draw)."""
    from mover.db import Database, bind
    from mover.views import watch

    db = Database(dsn)
    try:
        return db.transaction(bind(watch.snapshot, "users"))
    finally:
        db.close()


def screen(snap: dict) -> str:
    from rich.console import Console

    from mover.views import watch

    console = Console(record=True, width=200)
    console.print(watch.screen(snap))
    return console.export_text()


def test_events_history_and_report_speak_for_every_table_and_a_killed_run_is_a_failed_attempt(db_dsn, tmp_path):
    """`mover events NAME`, `history` and `report` show the whole migration, each event naming its
    table; `NAME/public.auth_user_groups` is that table's alone. A kill -9 of `mover run` in the
    second table's copy is a failed attempt of the migration, recorded on its head when the next
    run takes over (and shown as failed before that, from the dead lease)."""
    django(db_dsn)
    # auth_user has 2 ranges, auth_user_groups 6: range 5 is copied in the second table only.
    r = mover(db_dsn, "run", plan(tmp_path), env={"MOVER_FAULT": "kill@backfill_range:5"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    st = status(db_dsn)
    assert [t["step"] for t in st["family"]["tables"]] == ["reconcile", "backfill", "backfill", "backfill"], st
    assert st["state"] == "failed", st

    # Before anyone takes over: the attempt the dead process was in is failed, not running.
    (h,) = json.loads(mover(db_dsn, "history", "users", "--json").stdout)
    (dead,) = [a for a in h["attempts"] if a["table"] == GROUPS and a["step"] == "backfill"]
    assert dead["outcome"] == "failed" and "ended without finishing" in dead["message"], h["attempts"]
    # watch: the family's steps (backfill is not done while three tables copy), the dead step
    # failed, and no worker of the dead process
    snap = watched(db_dsn)
    assert [(s["name"], s["status"]) for s in snap["steps"]][1:4] == [
        ("install_capture", "done"), ("backfill", "failed"), ("reconcile", "pending")], snap["steps"]
    assert snap["worker_list"] == [], snap["worker_list"]

    r = mover(db_dsn, "run", "users")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    # Each bar names its table.
    said = " ".join(r.stderr.split())
    # (1 at once while an application session is busy, 2 on a quiet server: the governor's call)
    assert f"backfill {GROUPS}" in said and re.search(rf"index builds \([12] at once\) {re.escape(TABLES[3])}", said), \
        r.stderr
    assert all(f"reconcile (full) {t}" in said for t in TABLES), r.stderr

    events = json.loads(mover(db_dsn, "events", "users", "--json", "--limit", "1000").stdout)
    assert {e["table"] for e in events} == set(TABLES)
    assert {e["message"] for e in events if e["table"] == GROUPS} >= {'created "public"."auth_user_groups_new"'}
    (died,) = [e for e in events if e["kind"] == "failed"]
    assert (died["table"], died["step"]) == (GROUPS, "backfill"), died
    assert "ended without finishing in step backfill of \"public\".\"auth_user_groups\"" in died["message"], died
    text = mover(db_dsn, "events", "users", "--limit", "1000").stdout
    assert "auth_user_user_permissions" in text and "django_admin_log" in text, text

    # The per-table form: that table's events, the family's record of its dead process among them.
    own = json.loads(mover(db_dsn, "events", "users/public.auth_user_groups", "--json", "--limit", "1000").stdout)
    assert {e["table"] for e in own} == {GROUPS} and died["message"] in {e["message"] for e in own}
    assert len(own) < len(events)

    (h,) = json.loads(mover(db_dsn, "history", "users", "--json").stdout)
    assert h["failures"] == 1, h
    assert {a["table"] for a in h["attempts"]} == set(TABLES)
    tried = [(a["step"], a["outcome"]) for a in h["attempts"] if a["table"] == GROUPS]
    assert tried == [("create_target", "done"), ("install_capture", "done"), ("backfill", "failed"),
                     ("backfill", "done"), ("reconcile", "done")], tried
    text = mover(db_dsn, "history", "users").stdout
    assert any("auth_user_groups" in ln and "backfill" in ln and "failed" in ln for ln in text.splitlines()), text
    (t,) = json.loads(mover(db_dsn, "history", "users/public.auth_user_groups", "--json").stdout)
    assert [(a["step"], a["outcome"]) for a in t["attempts"]] == tried

    page = tmp_path / "report.html"
    r = mover(db_dsn, "report", "users", "--json", "--html", str(page))
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)
    assert {e["table"] for e in model["events"]} == set(TABLES)
    assert [a for a in model["attempts"] if a["outcome"] == "failed"] == [
        a for a in h["attempts"] if a["outcome"] == "failed"]
    html = page.read_text()
    summary = html.split('id="summary"')[1].split("</table>")[0]
    assert "failed attempts" in summary and "auth_user_groups" in summary and "ended without finishing" in summary
    timeline = html.split('id="timeline"')[1].split("</table>")[0]
    assert "<th>table</th>" in timeline and "auth_user_user_permissions" in timeline


def parity(dsn: str, name: str = "users") -> tuple[int, dict]:
    r = mover(dsn, "parity", name, "--json")
    return r.returncode, json.loads(r.stdout)


def test_parity_and_the_swap_agree_on_every_table_before_the_first_cutover_and_after_a_rollback(db_dsn, tmp_path):
    """`mover parity NAME` judges every table of the family as the swap does: the keys between the
    family's tables (on the new tables since the first reconcile, referencing the other new tables)
    are planned, before the first cutover and after a rollback, and the cutover goes through; a
    difference the swap refuses on the third table is one `mover parity` names, on that table."""
    django(db_dsn)
    # Django's foreign keys are all DEFERRABLE INITIALLY DEFERRED: the family plans and runs.
    r = mover(db_dsn, "plan", "check", plan(tmp_path))
    assert r.returncode == 0 and "DEFERRABLE" not in r.stderr, r.stderr
    r = mover(db_dsn, "run", plan(tmp_path))
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr

    def check_planned() -> None:
        code, result = parity(db_dsn)
        assert code == 0 and result["equal"], result
        assert {c["table"] for c in result["comparisons"]} == set(TABLES)
        family = [d for c in result["comparisons"] for d in c["differences"] if "family's tables" in d["reason"]]
        # each child's key to auth_user, on the child and on auth_user (the new tables' and the sources')
        assert {d["item"].rsplit(".", 1)[-1] for d in family} == {
            "auth_user_groups_user_id_6a12ed8b_fk_auth_user_id",
            "auth_user_user_permissions_user_id_a95ead1b_fk_auth_user_id",
            "django_admin_log_user_id_c564eba6_fk_auth_user_id"}, family
        assert all(d["status"] == "planned" for d in family)
        one = json.loads(mover(db_dsn, "parity", "users/public.django_admin_log", "--json").stdout)
        assert {c["table"] for c in one["comparisons"]} == {TABLES[3]} and one["equal"], one

    check_planned()
    r = mover(db_dsn, "cutover", "users")
    assert r.returncode == 0, r.stderr
    assert parity(db_dsn)[0] == 0
    # Every foreign key of the live tables kept Django's deferral, and a Django transaction that
    # writes a child before its parent commits; the old tables follow it in the window.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        keys = conn.execute(
            "SELECT conrelid::regclass::text, conname, condeferrable, condeferred FROM pg_constraint"
            " WHERE contype = 'f' AND conrelid = ANY(%s::regclass[])", ([t.replace('"', '') for t in TABLES],)
        ).fetchall()
        assert len(keys) == 6 and all(d1 and d2 for _, _, d1, d2 in keys), keys
        with conn.transaction():
            conn.execute("INSERT INTO auth_user_groups (user_id, group_id) VALUES (5000000000, 1)")
            conn.execute("INSERT INTO auth_user (id, password, is_superuser, username, first_name, last_name,"
                         " email, is_staff, is_active, date_joined) VALUES (5000000000, '', false, 'big', '', '',"
                         " '', false, true, now())")
    r = mover(db_dsn, "run", "users")  # the window: the old tables kept in step (a key past int: not replayable)
    assert r.returncode == 3 and "rollback window" in r.stderr, r.stderr
    r = mover(db_dsn, "rollback", "users")
    assert r.returncode == 3 and "5000000000" in r.stderr, r.stderr  # refused: rows only the new tables hold
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM auth_user_groups WHERE user_id = 5000000000")
        conn.execute("DELETE FROM auth_user WHERE id = 5000000000")
    # watch in the window: its end, and the window's step waiting (nobody runs it), not running
    snap = watched(db_dsn)
    from mover.views import watch
    at = datetime.fromisoformat(snap["rollback_window_ends_at"]).astimezone()
    # The date too when the window ends on another day than today (a run an hour before midnight).
    ends = at.strftime("%H:%M:%S" if at.date() == datetime.now().astimezone().date() else "%Y-%m-%d %H:%M:%S")
    assert f"rollback_window/waiting until {ends}" in watch.line(snap), watch.line(snap)
    assert [s["status"] for s in snap["steps"]][-3:] == ["done", "waiting", "pending"], snap["steps"]
    assert f"rollback window until {ends}" in screen(snap)

    # Another plan for a table of the family, in its rollback window: the hint names only commands
    # that work there (abort after a rollback), each of them for the family.
    other = write_plan(tmp_path / "groups.toml", PLAN.replace('"users"', '"groups"').replace(
        'source = "public.auth_user"\n', 'source = "public.auth_user_groups"\n', 1).split("[[also]]")[0]
        + "[rollback]\nwindow = \"1h\"\n")
    r = mover(db_dsn, "plan", "check", other)
    assert r.returncode == 2 and "is already being moved by migration 'users'" in r.stderr, r.stderr
    said = " ".join(r.stderr.split())  # as one line: the console wraps long ones
    hint = said.split("is already being moved by migration 'users' (next: ")[1].split(" first)")[0]
    assert "`mover retire users` once its window ends" in hint, hint
    assert hint.index("`mover rollback users`") < hint.index("`mover abort users`"), hint
    assert mover(db_dsn, "abort", "users").returncode == 2  # what the hint no longer says first

    r = mover(db_dsn, "rollback", "users")
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "run", "users")
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    check_planned()

    # A difference on one table's new table: parity names it there, and the swap refuses it.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'")
        conn.execute("CREATE TRIGGER audit BEFORE UPDATE ON auth_user_user_permissions_new FOR EACH ROW"
                     " EXECUTE FUNCTION audit()")
    code, result = parity(db_dsn)
    bad = [(c["table"], d["key"]) for c in result["comparisons"] for d in c["differences"]
           if d["status"] == "unplanned"]
    assert code == 3 and bad == [(TABLES[2], "trigger:audit")], result
    r = mover(db_dsn, "cutover", "users")
    assert r.returncode == 3 and "trigger:audit" in r.stderr, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP TRIGGER audit ON auth_user_user_permissions_new")
    assert parity(db_dsn)[0] == 0
    r = mover(db_dsn, "cutover", "users")
    assert r.returncode == 0, r.stderr
    assert parity(db_dsn)[0] == 0



def test_the_readme_refuses_only_a_deferrable_key_of_the_moved_table():
    """What a Django user reads first: the refusal is of a deferrable primary (or mover's unique)
    key of a moved table; deferrable foreign keys work (the test above runs Django's)."""
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    refused = readme.split("Refused at `plan check`, naming the fix:")[1].split("\n- ")[0]
    assert "deferrable keys" not in refused.lower(), refused
    assert "`DEFERRABLE` primary key" in refused and "Deferrable foreign keys" in refused, refused


ADMIN_LOG = """
[migration]
name = "admin-log"
source = "public.django_admin_log"

[target.partition]
by = "range"
column = "action_time"
interval = "1 month"
premake = 1
default = true
accept_key_change = true

[rollback]
window = "0s"
"""


def test_retire_resolves_the_divergences_of_the_old_table_it_drops(db_dsn, tmp_path):
    """django_admin_log converted to monthly partitions (its key becomes (id, action_time)) with a
    window of 0s: a row written between the swap and retire with an id the old table already
    holds cannot be replayed into it (an apply_error of the reverse direction). Retire drops the
    old table: that divergence is resolved with it, and the finished migration shows none open."""
    from tests.workload import Spawned

    django(db_dsn)
    path = write_plan(tmp_path / "admin-log.toml", ADMIN_LOG)
    r = mover(db_dsn, "run", path)
    assert r.returncode == 3 and "ready for cutover" in r.stderr, r.stderr
    release = tmp_path / "release"
    proc = Spawned(db_dsn, "cutover", "admin-log",
                   env={"MOVER_FAULT": "hang@after:cutover", "MOVER_FAULT_RELEASE": str(release)})
    try:
        assert proc.wait_for("hanging at after:cutover"), "".join(proc.err)
        with psycopg.connect(db_dsn, autocommit=True) as conn:  # swapped: the partitioned table is live
            conn.execute("INSERT INTO django_admin_log (id, action_time, object_repr, action_flag, change_message,"
                         " user_id) SELECT id, action_time + interval '1 second', 'again', 2, '[]', user_id"
                         " FROM django_admin_log WHERE id = 7")
    finally:
        release.touch()
    assert proc.wait(120) == 0, "".join(proc.err)
    st = status(db_dsn, "admin-log")
    assert (st["state"], st["divergences"]) == ("done", 0), st
    assert st["reconcile"]["divergences"]["resolved"] == {"retired": 1}, st["reconcile"]
    (d,) = json.loads(mover(db_dsn, "divergences", "admin-log", "--all", "--json").stdout)
    assert (d["key"], d["kind"], d["resolved_how"]) == (["7"], "apply_error", "retired"), d
    assert d["resolution"] == 'retired with the old table ("public"."django_admin_log_old" dropped)', d
    text = mover(db_dsn, "status", "admin-log").stdout
    assert "1 resolved with the old table at retire" in " ".join(text.split()), text
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # the live table holds both rows
        assert conn.execute("SELECT count(*) FROM django_admin_log WHERE id = 7").fetchone() == (2,)
