"""`mover demo`, as a new user runs it: its own server, a live writer, every step, checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


@pytest.mark.timeout(330)
def test_demo_runs_end_to_end():
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("DATABASE_URL", None)  # the demo starts its own server and must not need one
    try:
        r = subprocess.run([sys.executable, "-m", "mover", "demo", "--rows", "20000"], capture_output=True,
                           text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mover demo did not finish within 300 s; output so far:\n{exc.stdout}\n{exc.stderr}")
    output = r.stdout + r.stderr
    assert r.returncode == 0, output

    # The independent comparison of the new table with the old one, with the writer paused.
    assert "rows only in the new table: 0; rows only in the old table: 0" in output, output
    assert "tables match: 0 differences either way" in output, output
    counts = re.search(r"row counts: ([\d,]+) / ([\d,]+)", output)
    assert counts and counts.group(1) == counts.group(2), output
    assert int(counts.group(1).replace(",", "")) > 0

    # The writer really wrote, every kind of change, and never failed (cutover included).
    writer_lines = re.findall(r"writer: ([\d,]+) ops \((.*?)\); (\d+) errors", output)
    assert len(writer_lines) == 2, output
    for ops, kinds, errors in writer_lines:
        assert errors == "0", output
        assert int(ops.replace(",", "")) > 100, output
        for kind in ("inserts", "updates", "deletes", "key changes", "reinserts"):
            n = re.search(rf"(\d+) {kind}", kinds)
            assert n and int(n.group(1)) > 0, f"no {kind}: {output}"

    lock = re.search(r"lock held ([\d.]+) ms", output)
    assert lock and float(lock.group(1)) < 5000, output
    assert '"public"."Orders".id is now bigint' in output, output
    assert "old table dropped" in output, output
    assert "mover objects left behind: 0" in output, output
