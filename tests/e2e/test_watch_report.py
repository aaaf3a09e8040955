"""`mover watch` (one line per interval off a terminal; full screen on a pseudo-terminal) and
`mover report` (an HTML page rendered by a real headless browser), on real migrations under a writer."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import zlib
from html.parser import HTMLParser

import psycopg
import pytest

from tests.workload import ROOT, Spawned, Writer, assert_oracle, create_orders, finish, mover, plan_file, spawn

NAME = "orders_watched"
STEPS = ("create_target", "install_capture", "backfill", "reconcile", "cutover", "rollback_window", "retire")

def watched_plan(tmp_path, cap: int) -> str:
    return plan_file(tmp_path, NAME, columns={"id": "bigint"}, window="2s",
                     backfill={"range_rows": 1000, "max_rows_per_second": cap})


def test_watch_lines_then_report_in_a_browser(db_dsn, tmp_path):
    create_orders(db_dsn, 20_000)
    # A capped backfill of some seconds: several samples, and the cap shows as a wait.
    plan = watched_plan(tmp_path, 5000)
    writer = Writer(db_dsn).start()
    try:
        r = mover(db_dsn, "step", plan)  # registered (watch needs a name to look up)
        assert r.returncode == 0, r.stderr
        watch = Spawned(db_dsn, "watch", NAME, "--interval", "0.5", env={}, stdout=True)
        # The view is up (its first line): then the backfill starts, which it must see.
        assert watch.wait_for(f" | {NAME} | ", timeout=60), "".join(watch.err)
        r = mover(db_dsn, "run", NAME)
        assert r.returncode == 3, r.stderr  # the cutover gate
        r = mover(db_dsn, "cutover", NAME)
        assert r.returncode == 0, r.stderr
        r = mover(db_dsn, "run", NAME, "--wait")  # window of 2 s, then retire
        assert r.returncode == 0, r.stderr
        assert watch.wait(60) == 0, "".join(watch.err)  # watch ends by itself once the migration is done
        out = "".join(watch.err)
    finally:
        writer.halt()
    assert writer.errors == []
    assert_oracle(db_dsn, "Orders")

    lines = [ln for ln in out.splitlines() if f" | {NAME} | " in ln]
    assert len(lines) >= 5, out
    assert any("| backfill/running |" in ln for ln in lines), out
    assert any("waiting: rows/s cap" in ln for ln in lines), out  # the cap shows as what it waits for
    assert "| retire/done |" in lines[-1], lines[-1]

    page = tmp_path / "report.html"
    r = mover(db_dsn, "report", NAME, "--html", str(page), "--json")
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)
    assert model["status"]["state"] == "done" and len(model["samples"]) >= 4
    assert [s["name"] for s in model["status"]["steps"]] == list(STEPS)
    assert any(e["step"] == "cutover" and e["duration_ms"] for e in model["locks"]), model["locks"]

    r = mover(db_dsn, "events", NAME, "--json", "--limit", "1000")
    kinds = {e["kind"] for e in json.loads(r.stdout)}
    assert "step_done" in kinds and "sample" not in kinds  # the samples chart, they do not drown the story

    parsed = _parse(page.read_text())
    # Every chart but the lag one (a writer's log is applied within a beat, so lag may stay empty)
    # is drawn with a line: a path with points.
    drawn = {s for s, d in parsed.paths if d.count("L") >= 1}
    assert {"backfill", "forward (pending keys)"} <= drawn, parsed.paths
    assert parsed.svgs >= 3
    for step in STEPS:
        assert step in parsed.timeline, parsed.timeline
    assert {"summary", "timeline", "charts", "divergences", "locks", "actors", "plan", "events"} <= parsed.ids

    _screenshot_is_not_blank(page, tmp_path / "report.png")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.paths: list[tuple[str, str]] = []
        self.ids: set[str] = set()
        self.svgs = 0
        self.timeline = ""
        self._section = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.svgs += 1
        if tag == "path":
            self.paths.append((a.get("data-series") or "", a.get("d") or ""))
        if tag == "h2":
            self.ids.add(a.get("id") or "")
            self._section = a.get("id") or ""

    def handle_data(self, data):
        if self._section == "timeline":
            self.timeline += data + " "


def _parse(text: str) -> _Page:
    p = _Page()
    p.feed(text)
    p.close()
    return p


def _browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing; .ci/run installs it")
        pytest.skip("no chromium on this machine (.ci/run installs it in CI)")
    return found


def _screenshot_is_not_blank(page, png) -> None:
    subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={png}", "--window-size=1200,1600", f"file://{page}"],
                   check=True, capture_output=True, timeout=120)
    width, height, pixels = decode_png(png.read_bytes())
    assert (width, height) == (1200, 1600)
    ink = sum(1 for p in pixels if min(p[:3]) < 200)
    # A page of tables and three charts: well above a few per cent of the screen is ink.
    assert ink > width * height * 0.02, f"{ink} of {width * height} pixels are not white"


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """A minimal PNG decoder (8-bit RGB or RGBA, no interlace): enough for a screenshot."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(line)
        prev = line
    return width, height, [tuple(r[i:i + channels]) for r in rows for i in range(0, stride, channels)]


def test_watch_full_screen_on_a_terminal(db_dsn, tmp_path):
    create_orders(db_dsn, 20_000)
    plan = watched_plan(tmp_path, 2000)  # ten seconds of backfill to look at
    writer = Writer(db_dsn).start()
    run = None
    try:
        assert mover(db_dsn, "step", plan).returncode == 0
        run = spawn(db_dsn, "run", NAME)
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 160, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        view = subprocess.Popen([sys.executable, "-m", "mover", "--dsn", db_dsn, "status", NAME, "--watch"],
                                stdin=slave, stdout=slave, stderr=slave, env={**env, "TERM": "xterm-256color",
                                                                               "PYTHONFAULTHANDLER": "1"},
                                cwd=ROOT, close_fds=True, preexec_fn=_ctrl_c_as_on_a_terminal)
        os.close(slave)
        screen = _Screen(master)
        wanted = ("steps", "progress", "capture", "workers", "attention", "recent events", "lease:", "backfill",
                  "rows/s", "ETA", "divergences:", "waiting for:", "rows/s cap")
        assert screen.wait_for(wanted, timeout=60), screen.text()[-3000:]
        assert re.search(r"▶ +backfill", screen.text()), screen.text()[-3000:]  # the running step is marked
        view.send_signal(signal.SIGINT)  # Ctrl-C leaves the view, changing nothing
        try:
            assert view.wait(60) == 0
        except subprocess.TimeoutExpired:  # where it hangs: faulthandler prints every thread's stack
            view.send_signal(signal.SIGABRT)
            view.wait(30)
            raise AssertionError("the view did not leave on Ctrl-C:\n" + screen.text()[-6000:]) from None
        os.close(master)
    finally:
        if run is not None and run.poll() is None:
            run.send_signal(signal.SIGINT)
            finish(run, 60)
        writer.halt()


def _ctrl_c_as_on_a_terminal() -> None:
    """The view as a terminal's shell starts it, with SIGINT at its default: the suite itself may
    run with SIGINT ignored (a background job of a non-interactive shell, as CI may start it), a
    child inherits that, and Python then installs no KeyboardInterrupt handler at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Screen:
    """What a pseudo-terminal showed, escape sequences removed, read as it comes."""

    def __init__(self, fd: int) -> None:
        self.fd, self.raw, self.changed = fd, bytearray(), threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.raw += chunk
            self.changed.set()

    def text(self) -> str:
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\x1b[=>]", "", self.raw.decode("utf-8", "replace"))

    def wait_for(self, wanted, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(w in self.text() for w in wanted):
                return True
            self.changed.clear()
            self.changed.wait(1)
        return False


def test_watch_and_report_of_an_unknown_migration_say_what_to_do(db_dsn):
    for args in (("watch", "nosuch"), ("report", "nosuch", "--json"), ("status", "--watch")):
        r = mover(db_dsn, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert "next:" in r.stderr, (args, r.stderr)


def test_report_during_a_migration_shows_how_each_divergence_was_resolved(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    plan = watched_plan(tmp_path, 0)
    assert mover(db_dsn, "run", plan).returncode == 3  # at the cutover gate
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("""INSERT INTO "Orders_new" (id, "Account", note) VALUES (-7, 7, 'kept on purpose')""")
        conn.execute("""UPDATE "Orders_new" SET note = 'drifted' WHERE id = 42""")
    assert mover(db_dsn, "reconcile", NAME, "--full").returncode == 3
    assert mover(db_dsn, "accept", NAME, "--reason", "an <intended> row", "--id",
                 str(_divergence_id(db_dsn, "extra_in_target"))).returncode == 0
    r = mover(db_dsn, "repair", NAME)
    assert r.returncode == 0, r.stderr

    page = tmp_path / "report.html"
    r = mover(db_dsn, "report", NAME, "--html", str(page), "--json")
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)
    assert model["status"]["step"] == "cutover"
    how = {d["kind"]: (d["resolved_how"], d["reason"]) for d in model["divergences"]}
    assert how == {"extra_in_target": ("accepted", "an <intended> row"), "different": ("repaired", None)}
    text = page.read_text()
    divergences = text.split('id="divergences"', 1)[1].split("<h2", 1)[0]
    assert "an &lt;intended&gt; row" in divergences and "repaired" in divergences and "OPEN" not in divergences
    assert "<intended>" not in text  # escaped everywhere


def _divergence_id(dsn: str, kind: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT id FROM mover.divergences WHERE kind = %s AND resolved_at IS NULL",
                            (kind,)).fetchone()[0]


def test_watch_of_an_aborted_migration_prints_one_line_and_ends(db_dsn, tmp_path):
    create_orders(db_dsn, 500)
    assert mover(db_dsn, "step", watched_plan(tmp_path, 0)).returncode == 0
    r = mover(db_dsn, "abort", NAME)
    assert r.returncode == 0, r.stderr
    r = mover(db_dsn, "watch", NAME, "--interval", "30", timeout=60)  # ends at once, not after 30 s
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if f" | {NAME} | " in ln]
    assert "/aborted |" in line, line
