"""The Django integration (mover.contrib.django) in a real Django project built in tmp_path: its
settings point DATABASES at the test's database, its app `library` has Author and Book (a
ForeignKey to Author) with AutoField keys, its first migration is written by makemigrations and
applied by migrate. Then the project moves to BigAutoField the way docs/django.md says: a mover
plan for the family (author.id, book.id, book.author_id), a migration with StartMove and a later
one with MoveTable carrying the AlterField state operations, applied by `manage.py migrate` while
the application writes through the ORM (inserts, updates, deletes with their cascade, a book
moved to another author), each write with its mirror row in its own transaction. Judged by the
mirrors (EXCEPT ALL both ways), the catalog (every column bigint, the foreign key valid) and
Django's own migration state (BigAutoField; makemigrations finds nothing to do).

Every manage.py call is a process of its own: Django's settings are configured once per process.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

from mover import api
from tests.workload import ROOT, differences

NAME = "library-bigint"
PLAN = "mover/bigint.toml"  # in the app's directory: where a relative plan path of the operations is read
# Django passes it to libpq; the test server trusts local connections and never asks for it, so it
# may be anything, and no command may print it.
PASSWORD = "pw-Django-9f3e"
COLUMNS = {"library_author": ("id", "name"), "library_book": ("id", "author_id", "title", "pages")}
MOVED = {("library_author", "id"), ("library_book", "id"), ("library_book", "author_id")}

SETTINGS = """
SECRET_KEY = "test"
USE_TZ = True
INSTALLED_APPS = ["mover.contrib.django", "library"]
DEFAULT_AUTO_FIELD = {auto_field!r}
DATABASES = {{
    "default": {{"ENGINE": "django.db.backends.postgresql", "NAME": {name!r}, "HOST": {host!r}, "PORT": {port!r},
                "USER": {user!r}, "PASSWORD": {password!r}, "OPTIONS": {{"application_name": "library"}}}},
    # Nothing listens there: the error names the server, never the password.
    "unreachable": {{"ENGINE": "django.db.backends.postgresql", "NAME": "x", "HOST": "127.0.0.1", "PORT": 1,
                    "USER": "app", "PASSWORD": {password!r}, "OPTIONS": {{"connect_timeout": 2}}}},
}}
"""

MANAGE = """
import sys
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
"""

MODELS = """
from django.db import models


class Author(models.Model):
    name = models.CharField(max_length=100)


class Book(models.Model):
    author = models.ForeignKey(Author, on_delete=models.CASCADE)
    title = models.CharField(max_length=200)
    pages = models.IntegerField(default=0)
"""

# The application: one ORM write per transaction, and in the same transaction the rows it touched
# copied to the mirrors as it left them (a row gone from the table goes from the mirror). Runs until
# SIGTERM; prints "ops N" as it goes and a last line "done {json}" with what failed (nothing may).
WRITER = """
import json, random, signal, sys, threading

from django.core.management.base import BaseCommand
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Max

from library.models import Author, Book

COLUMNS = {columns!r}


def mirror(table, ids):
    cols = ", ".join(COLUMNS[table])
    sets = ", ".join(f"{{c}} = excluded.{{c}}" for c in COLUMNS[table])
    with connection.cursor() as cur:
        cur.execute(f"DELETE FROM {{table}}_mirror m WHERE m.id = ANY(%s)"
                    f" AND NOT EXISTS (SELECT 1 FROM {{table}} t WHERE t.id = m.id)", [list(ids)])
        cur.execute(f"INSERT INTO {{table}}_mirror ({{cols}}) SELECT {{cols}} FROM {{table}} WHERE id = ANY(%s)"
                    f" ON CONFLICT (id) DO UPDATE SET {{sets}}", [list(ids)])


def pick(model, rnd):
    top = model.objects.aggregate(top=Max("id"))["top"] or 1
    return model.objects.filter(id__gte=rnd.randint(1, top)).order_by("id").first()


def new_author(rnd):
    a = Author.objects.create(name=f"new {{rnd.random()}}")
    books = [Book.objects.create(author=a, title="first", pages=rnd.randint(1, 900)) for _ in range(2)]
    mirror("library_author", [a.id])
    mirror("library_book", [b.id for b in books])


def new_book(rnd):
    a = pick(Author, rnd)
    if a:
        mirror("library_book", [Book.objects.create(author=a, title="more", pages=rnd.randint(1, 900)).id])


def edit_book(rnd):
    b = pick(Book, rnd)
    if b:
        Book.objects.filter(id=b.id).update(pages=F("pages") + 1, title="edited")
        mirror("library_book", [b.id])


def rename_author(rnd):
    a = pick(Author, rnd)
    if a:
        a.name = f"renamed {{rnd.random()}}"
        a.save(update_fields=["name"])
        mirror("library_author", [a.id])


def move_book(rnd):
    b, a = pick(Book, rnd), pick(Author, rnd)
    if b and a:
        b.author = a
        b.save(update_fields=["author"])
        mirror("library_book", [b.id])


def delete_book(rnd):
    b = pick(Book, rnd)
    if b:
        key = b.id  # delete() sets it to None
        b.delete()
        mirror("library_book", [key])


def delete_author(rnd):
    a = pick(Author, rnd)
    if a:
        key, books = a.id, list(a.book_set.values_list("id", flat=True))
        a.delete()  # the ORM's cascade: its books first
        mirror("library_book", books)
        mirror("library_author", [key])


OPS = [new_author, new_book, edit_book, edit_book, rename_author, move_book, delete_book, delete_author]


class Command(BaseCommand):
    def handle(self, *args, **options):
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        rnd, ops, errors = random.Random(7), 0, []
        while not stop.is_set():
            try:
                with transaction.atomic():
                    rnd.choice(OPS)(rnd)
                ops += 1
            except DatabaseError as exc:
                errors.append(f"{{type(exc).__name__}}: {{exc}}")
            if ops % 10 == 0:
                print(f"ops {{ops}}", flush=True)
            stop.wait(0.002)
        print("done " + json.dumps({{"ops": ops, "errors": errors}}), flush=True)
"""

PLAN_TEXT = """
[migration]
name = "{name}"
source = "public.library_author"

[target]
columns = {{ id = "bigint" }}

# The referencing table moves in the same migration (`manage.py mover plan check` prints this block).
[[also]]
source = "public.library_book"
columns = {{ id = "bigint", author_id = "bigint" }}

[backfill]
range_rows = 1000
min_rows = 1000
max_rows = 1000

[reconcile]
range_rows = 2000

[throttle]
max_latency_increase = "off"

[rollback]
window = "{window}"
"""

BIG_ID = 'models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")'

START = """
from django.db import migrations

from mover.contrib.django.operations import StartMove


class Migration(migrations.Migration):
    atomic = {atomic}  # mover commits step by step, on its own connections
    dependencies = [("library", "0001_initial")]
    operations = [StartMove(plan={plan!r})]
"""

FINISH = f"""
from django.db import migrations, models

from mover.contrib.django.operations import MoveTable


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("library", "0002_start_move")]
    operations = [
        MoveTable(plan={PLAN!r}, state_operations=[
            migrations.AlterField(model_name="author", name="id", field={BIG_ID}),
            migrations.AlterField(model_name="book", name="id", field={BIG_ID}),
        ]),
    ]
"""

# Django's migration state as the applied migrations leave it (not the models): each model's key
# field; and whether makemigrations finds the models and that state apart.
STATE = """
import json
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
loader = MigrationLoader(connection)
apps = loader.project_state(list(loader.applied_migrations)).apps
state = {m: type(apps.get_model("library", m)._meta.pk).__name__ for m in ("author", "book")}
try:
    call_command("makemigrations", "library", check=True, dry_run=True, verbosity=0)
    state["models"] = "agree"
except SystemExit:
    state["models"] = "differ"
print(json.dumps(state))
"""


class Project:
    """A Django project in a directory: settings, manage.py, the app `library`."""

    def __init__(self, where: Path, dsn: str):
        self.dir = where
        self.dsn = dsn
        self.app = where / "library"
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": "settings", "COLUMNS": "200",
                    "PYTHONPATH": os.pathsep.join([str(where), str(ROOT)])}
        self.env.pop("DATABASE_URL", None)  # the DSN is the settings' alone
        for sub in ("migrations", "management", "management/commands", "mover"):
            (self.app / sub).mkdir(parents=True, exist_ok=True)
        for package in ("", "migrations", "management", "management/commands"):
            (self.app / package / "__init__.py").write_text("")
        (where / "manage.py").write_text(MANAGE)
        (self.app / "models.py").write_text(MODELS)
        (self.app / "management/commands/write_library.py").write_text(WRITER.format(columns=COLUMNS))
        self.settings("django.db.models.AutoField")

    def settings(self, auto_field: str) -> None:
        info = conninfo_to_dict(self.dsn)
        (self.dir / "settings.py").write_text(SETTINGS.format(
            auto_field=auto_field, name=info["dbname"], host=info.get("host", ""), port=info.get("port", ""),
            user=info.get("user", ""), password=PASSWORD))

    def write(self, relative: str, text: str) -> None:
        (self.app / relative).write_text(textwrap.dedent(text).lstrip())

    def manage(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "manage.py", *args], cwd=self.dir, env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        assert PASSWORD not in r.stdout + r.stderr, f"manage.py {' '.join(args)} printed the password"
        return r

    def ok(self, *args: str) -> subprocess.CompletedProcess:
        r = self.manage(*args)
        assert r.returncode == 0, f"manage.py {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r

    def state(self) -> dict:
        # The last line: Django 5.2's shell may say first what it imported.
        return json.loads(self.ok("shell", "-c", STATE).stdout.splitlines()[-1])


class OrmWriter:
    """`manage.py write_library` in the background; wait_for_ops(n) returns once it did n more."""

    def __init__(self, project: Project):
        self.err = project.dir / "writer.err"  # a file: a pipe nobody reads could fill and stop the writer
        with self.err.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "write_library"], cwd=project.dir,
                                         env=project.env, stdout=subprocess.PIPE, stderr=err, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.ops = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for_ops(self, more: int) -> None:
        target = self.ops + more
        while self.ops < target:
            line = self.lines.get(timeout=60)
            assert line is not None, f"the writer ended: {self.err.read_text()}"
            if line.startswith("ops "):
                self.ops = int(line.split()[1])

    def finish(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(60) == 0, self.err.read_text()
        while (line := self.lines.get(timeout=60)) is not None:
            if line.startswith("done "):
                return json.loads(line[5:])
        raise AssertionError(f"the writer said nothing at the end: {self.err.read_text()}")


def sql(dsn: str, statement: str, params=None) -> list:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def column_types(dsn: str) -> dict:
    return {(t, c): ty for t, c, ty in sql(
        dsn, "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
             " JOIN pg_class c ON c.oid = a.attrelid WHERE c.relname IN ('library_author', 'library_book')"
             " AND a.attnum > 0 AND NOT a.attisdropped") if (t, c) in MOVED}


def applied(dsn: str) -> list[str]:
    return [n for (n,) in sql(dsn, "SELECT name FROM django_migrations WHERE app = 'library' ORDER BY id")]


def library(tmp_path: Path, dsn: str, authors: int, books: int, window: str) -> Project:
    """The project with its first migration applied (makemigrations, migrate), the tables filled
    and mirrored, then the models on BigAutoField and the move's plan written."""
    project = Project(tmp_path / "site", dsn)
    project.ok("makemigrations", "library")
    project.ok("migrate")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO library_author (name) SELECT 'author ' || g FROM generate_series(1, %s) g",
                     (authors,))
        conn.execute("INSERT INTO library_book (author_id, title, pages) SELECT 1 + g %% %s, 'book ' || g, g %% 900"
                     " FROM generate_series(1, %s) g", (authors, books))
        for table in COLUMNS:
            # The oracle: what the application committed, kept by its writes (bigint keys: any value fits).
            conn.execute(f"CREATE TABLE {table}_mirror AS SELECT * FROM {table}")
            conn.execute(f"ALTER TABLE {table}_mirror ALTER id TYPE bigint, ADD PRIMARY KEY (id)")
            conn.execute(f"ANALYZE {table}")
    project.settings("django.db.models.BigAutoField")
    project.write(PLAN, PLAN_TEXT.format(name=NAME, window=window))
    project.write("migrations/0003_move.py", FINISH)
    return project


def test_migrate_moves_to_bigautofield_under_an_orm_writer(db_dsn, tmp_path):
    project = library(tmp_path, db_dsn, authors=1500, books=4500, window="0s")
    project.write("migrations/0002_start_move.py", START.format(atomic=False, plan=PLAN))
    writer = OrmWriter(project)
    try:
        writer.wait_for_ops(20)
        r = project.ok("migrate", "library", "0002")  # StartMove: register, copy, compare, stop at the gate
        assert "at the cutover gate" in r.stderr, r.stderr
        st = api.status(db_dsn, NAME)
        assert (st["step"], st["state"]) == ("cutover", "waiting"), st
        assert column_types(db_dsn) == dict.fromkeys(MOVED, "integer")
        writer.wait_for_ops(20)  # writes waiting in the change log at the gate
        r = project.ok("migrate")  # MoveTable: the cutover, the retire ("0s" window), the state
        assert "swapped and retired" in r.stderr, r.stderr
        writer.wait_for_ops(20)  # the application goes on, on the new tables
    finally:
        outcome = writer.finish()
    assert outcome["errors"] == [], outcome["errors"]

    for table, columns in COLUMNS.items():
        assert differences(db_dsn, table, f"{table}_mirror", columns) == (0, 0), table
    assert column_types(db_dsn) == dict.fromkeys(MOVED, "bigint")
    assert sql(db_dsn, "SELECT convalidated FROM pg_constraint WHERE conrelid = 'library_book'::regclass"
                       " AND contype = 'f'") == [(True,)]
    st = api.status(db_dsn, NAME)
    assert st["state"] == "done" and st["tables_present"] == ["source"], st
    assert applied(db_dsn) == ["0001_initial", "0002_start_move", "0003_move"]
    assert project.state() == {"author": "BigAutoField", "book": "BigAutoField", "models": "agree"}


def test_two_phases_refusals_and_the_way_back(db_dsn, tmp_path):
    project = library(tmp_path, db_dsn, authors=200, books=600, window="1h")

    # In a migration's transaction mover cannot work: refused, nothing registered.
    project.write("migrations/0002_start_move.py", START.format(atomic=True, plan=PLAN))
    r = project.manage("migrate", "library", "0002")
    assert r.returncode == 2 and "atomic = False" in r.stderr, r.stderr
    assert api.status(db_dsn) == []
    project.write("migrations/0002_start_move.py", START.format(atomic=False, plan=PLAN))
    # The plan covers every column that references the key: plan check, through manage.py, agrees.
    r = project.ok("mover", "plan", "check", f"library/{PLAN}")
    assert "to widen the columns that reference" not in r.stdout + r.stderr, r.stdout

    # Phase one done elsewhere (faked here): MoveTable refuses, naming the command, until mover is at the gate.
    project.ok("migrate", "library", "0002", "--fake")
    r = project.manage("migrate")
    assert r.returncode == 2 and f"`mover run library/{PLAN}`" in r.stderr, r.stderr
    project.ok("mover", "step", f"library/{PLAN}")  # registered, its first step run
    r = project.manage("migrate")
    assert r.returncode == 3 and "not at the cutover gate yet" in r.stderr and f"`mover run {NAME}`" in r.stderr, \
        r.stderr
    assert project.manage("mover", "run", f"library/{PLAN}").returncode == 3  # at the gate
    r = project.ok("sqlmigrate", "library", "0003")  # says what mover will do, does nothing
    assert "`manage.py mover cutover NAME`" in r.stdout, r.stdout
    st = json.loads(project.ok("mover", "status", NAME, "--json").stdout)
    assert (st["step"], st["state"]) == ("cutover", "waiting"), st

    project.ok("migrate")
    assert column_types(db_dsn) == dict.fromkeys(MOVED, "bigint")
    assert api.status(db_dsn, NAME)["step"] == "rollback_window"

    # Back to 0001: MoveTable rolls the swap back, StartMove aborts.
    project.ok("migrate", "library", "0001")
    assert column_types(db_dsn) == dict.fromkeys(MOVED, "integer")
    assert api.status(db_dsn, NAME)["state"] == "aborted"
    assert applied(db_dsn) == ["0001_initial"]
    assert project.state() == {"author": "AutoField", "book": "AutoField", "models": "agree"}
    for table, columns in COLUMNS.items():
        assert differences(db_dsn, table, f"{table}_mirror", columns) == (0, 0), table

    # Another alias of DATABASES: nothing listens there; the error says so, without the password
    # (Project.manage checks every call's output for it).
    r = project.manage("mover", "--database", "unreachable", "status")
    assert r.returncode != 0 and "127.0.0.1" in r.stderr, r.stderr
