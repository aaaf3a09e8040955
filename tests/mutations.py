"""A kept mutation check: would the suite notice a broken mover?

Run on demand (not collected by pytest: the name does not start with test_):

    .venv/bin/python tests/mutations.py [--only TEXT] [--baseline]

For each fault below, the repository's working tree is copied to a temporary directory, the
fault is planted there as exact source-text substitutions, and the tests listed for it are run
against the copy (each run starts its own PostgreSQL, as the suite does). A fault is *caught*
when at least one of its tests fails, *missed* when all pass, and *stale* when its anchor text
is no longer in the source (the code moved on: update the substitution, don't drop the fault).

Faults outside reconcile are planted together with a blinded reconcile (it never sees a
difference), so the test that catches them is one that judges by the writer's mirror
(tests/workload.py, assert_oracle), not by mover's own verdict.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FULL = "tests/e2e/test_full_migration.py::test_full_migration_under_concurrent_writer"
ROLLBACK = "tests/e2e/test_full_migration.py::test_rollback_keeps_rows_written_after_cutover"
ZERO_WINDOW = "tests/e2e/test_full_migration.py::test_zero_window_retires_in_one_run_with_auto_cutover"
WORKERS = "tests/e2e/test_backfill_workers.py::test_workers_race_and_a_killed_worker_range_is_redone_once"
HOT = "tests/e2e/test_reconcile.py::test_differences_on_hot_keys_are_reported_once_settled_and_only_then"
EVERY_COLUMN = "tests/e2e/test_reconcile.py::test_a_difference_in_any_column_of_any_type_is_found_naming_that_column"
TAKEN_OVER = ("tests/e2e/test_reconcile.py::"
              "test_a_range_taken_over_while_its_keys_settle_is_not_committed_by_the_old_worker")
STALLED = "tests/e2e/test_crash_resume.py::test_stalled_orchestrator_cannot_commit_after_takeover"
FULL_LOGICAL = FULL + "[logical]"
ROLLBACK_LOGICAL = ROLLBACK + "[logical]"
FEED_CRASH = "tests/e2e/test_logical_capture.py::test_kill9_at_the_feeders_points_then_resume[feed:inserted-gate]"
FLUSH = "tests/e2e/test_logical_capture.py::test_the_cutover_flushes_the_wal_before_it_reads_the_stream"
NOT_FED = "tests/e2e/test_logical_capture.py::test_a_change_not_yet_fed_when_reconcile_reads_is_not_a_divergence"
HOT_LOGICAL = "tests/e2e/test_logical_capture.py::test_hot_keys_under_logical_capture_never_become_divergences"
BACK_UNCHANGED = ("tests/e2e/test_conversions_back.py::"
                  "test_integer_to_text_rows_that_cannot_go_back_are_kept_and_named",
                  "tests/e2e/test_never_stuck.py::test_an_accepted_type_change_can_always_leave_the_window"
                  "[numeric_float8]")
THREAD_ERRORS = ("tests/integration/test_rangework.py::test_a_worker_threads_error_fails_the_backfill_with_that_error",
                 "tests/integration/test_rangework.py::test_an_applier_error_fails_the_backfill_with_that_error")

# (file, exact text, replacement)
BLIND_RECONCILE = ("mover/sql/compare.py",
                   '    return sql.SQL("({})").format(sql.SQL(" OR ").join(parts))\n\n\ndef _key_text(',
                   '    return sql.SQL("false")\n\n\ndef _key_text(')


def _skip_deletes(direction: str) -> list[tuple[str, str, str]]:
    # The forward applier writes the target (…_new), the reverse one the old table (…_old).
    skipped = 'm.dst.name.endswith("_old")' if direction == "reverse" else 'not m.dst.name.endswith("_old")'
    return [
        ("mover/sql/capture.py", "    WHERE {d_eq_l} AND NOT EXISTS (SELECT 1 FROM {src} s WHERE ",
         "    WHERE {d_eq_l} AND {fault} AND NOT EXISTS (SELECT 1 FROM {src} s WHERE "),
        ("mover/sql/capture.py", "    ).format(dst=m.dst.ident, src=m.src.ident, d_eq_l=key_equal(\"d\", \"l\", k),",
         f"    ).format(fault=sql.SQL('false' if {skipped} else 'true'), dst=m.dst.ident, src=m.src.ident,"
         " d_eq_l=key_equal(\"d\", \"l\", k),"),
    ]


@dataclass
class Fault:
    name: str
    edits: list[tuple[str, str, str]]
    tests: list[str]
    blind: bool = True  # plant a blinded reconcile too
    outcome: str = ""
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


FAULTS = [
    Fault("replay skips deletes (forward)", _skip_deletes("forward"), [FULL, WORKERS]),
    Fault("replay skips deletes (reverse, rollback window)", _skip_deletes("reverse"), [FULL, ROLLBACK]),
    Fault("reconcile ignores the last non-key column",
          [("mover/sql/compare.py", "              for c in spec.non_key]\n    return sql.SQL(\"({})\")",
            "              for c in spec.non_key[:-1]]\n    return sql.SQL(\"({})\")")],
          [EVERY_COLUMN], blind=False),
    Fault("reconcile drops differences of keys pending at the first read",
          [("mover/engines/bulk/reconcile.py", "            now = _recheck(cur, spec, mid, keys)\n",
            "            now = [d for d in _recheck(cur, spec, mid, keys)"
            " if not any(x['pending'] and x['key'] == d['key'] for x in diffs)]\n")],
          [HOT], blind=False),
    Fault("backfill skips the last row of each range",
          [("mover/sql/copy.py", 'SELECT {values} FROM {src} s WHERE {where}")',
            'SELECT {values} FROM {src} s WHERE {where} ORDER BY 1 DESC OFFSET 1")')],
          [FULL, ZERO_WINDOW]),
    Fault("cutover skips the final drain under its lock",
          [("mover/engines/swap/cutover.py", "        while True:\n            got = changelog.apply_batch(",
            "        while False:\n            got = changelog.apply_batch(")],
          [FULL, ROLLBACK]),
    Fault("replay ignores the backfill watermark (race 1)",
          [("mover/engines/capture/changelog.py", '    if backfill_done:\n        return sql.SQL("true"), {}',
            '    if True:\n        return sql.SQL("true"), {}')],
          [FULL, WORKERS]),
    # Logical capture (mover/engines/capture/logical.py, mover/engines/capture/pgoutput.py).
    Fault("the decoder drops the old key of an UPDATE that changes the key",
          [("mover/engines/capture/pgoutput.py", "    return [new, old]  # type: ignore[list-item]",
            "    return [new]  # type: ignore[list-item]")],
          [FULL_LOGICAL, ROLLBACK_LOGICAL]),
    Fault("the swap reads the stream without flushing the WAL first",
          [("mover/engines/capture/logical.py", "    if flusher.flush() < upto or _flush_position(cur) < upto:",
            "    if False:")],
          [FLUSH]),
    Fault("the feeder advances the slot before its keys are committed",
          [("mover/engines/capture/logical.py", '    faults.point("feed:inserted")',
            '    cur.execute(q.advance(), {"slot": slot, "lsn": wire.lsn_text(fed.at)})\n'
            '    faults.point("feed:inserted")')],
          [FEED_CRASH]),
    Fault("reconcile takes feeder lag for a divergence",
          [("mover/engines/bulk/reconcile.py", "or (diffs and from_wal):", ":"),
           ("mover/engines/bulk/reconcile.py",
            "never feeder lag.\n                logical.feed_in(cur, ctx, flusher)\n",
            "never feeder lag.\n                pass\n")],
          [NOT_FED, HOT_LOGICAL], blind=False),
    Fault("no lease check before a range's done mark (race 6)",
          [("mover/state/ranges.py", "    if cur.fetchone() is None:\n        raise LeaseLost(",
            "    if cur.fetchone() is None and False:\n        raise LeaseLost(")],
          [TAKEN_OVER, STALLED], blind=False),
    Fault("the rollback window sends a value back unchecked (issue 21)",
          [("mover/sql/mapping.py", "    if c.checked is None:\n        return value\n",
            "    if True:\n        return value\n")],
          list(BACK_UNCHANGED), blind=False),
    Fault("a thread's error vanishes (mover/threads.py)",
          [("mover/threads.py", "in the waiting thread\n            self._fail(exc)\n",
            "in the waiting thread\n            del exc  # dropped\n")],
          list(THREAD_ERRORS), blind=False),
]


def copy_tree(dest: Path) -> None:
    """The working tree as it is (committed or not), without the venv and caches."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def plant(tree: Path, edits: list[tuple[str, str, str]]) -> str | None:
    """Apply the substitutions; the first anchor not found exactly once, or None."""
    for file, old, new in edits:
        path = tree / file
        text = path.read_text()
        if text.count(old) != 1:
            return f"{file}: {old.strip()[:60]!r}"
        path.write_text(text.replace(old, new))
    return None


def run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[int, list[str], str]:
    """pytest's exit code, the tests that failed, and its output (the tail, with the short summary)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "400"}
    env.pop("MOVER_FAULT", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE",
                        *tests], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", r.stdout, re.M)))
    return r.returncode, failed, r.stdout[-3000:] + r.stderr[-2000:]


def check_copy_is_used(tree: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, "-c", "import mover; print(mover.__file__)"], cwd=tree, env=env,
                       capture_output=True, text=True, check=True)
    if not r.stdout.strip().startswith(str(tree)):
        sys.exit(f"the copy's mover is not the one imported ({r.stdout.strip()}): the check would test nothing")


def short(test: str) -> str:
    return test.split("::")[-1] if "::" in test else test


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run only the faults whose name contains this text")
    ap.add_argument("--baseline", action="store_true", help="first run every listed test on the unchanged copy")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per fault")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print why each test failed (and pytest's output for missed faults)")
    args = ap.parse_args()
    faults = [f for f in FAULTS if not args.only or args.only.lower() in f.name.lower()]

    if args.baseline:
        with tempfile.TemporaryDirectory(prefix="mover-mut-") as tmp:
            tree = Path(tmp)
            copy_tree(tree)
            check_copy_is_used(tree)
            tests = list(dict.fromkeys(t for f in faults for t in f.tests))
            code, failed, out = run_tests(tree, tests, args.timeout * 2)
            if code != 0:
                print(out)
                sys.exit(f"baseline: tests fail without any fault: {failed}")
            print(f"baseline: {len(tests)} tests pass on the unchanged code")

    for f in faults:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="mover-mut-") as tmp:
            tree = Path(tmp)
            copy_tree(tree)
            check_copy_is_used(tree)
            missing = plant(tree, f.edits + ([BLIND_RECONCILE] if f.blind else []))
            if missing:
                f.outcome = f"stale ({missing})"
            else:
                try:
                    code, f.failed, out = run_tests(tree, f.tests, args.timeout)
                    f.outcome = "caught" if code != 0 else "missed"
                    if code != 0 and not f.failed:
                        f.outcome = f"caught? (pytest exit {code}, no test named)"
                    if args.verbose:  # why each test failed: the fault, not a broken mutant
                        print("\n".join(line[:300] for line in out.splitlines()
                                        if line.startswith(("FAILED", "ERROR")) or f.outcome == "missed"))
                except subprocess.TimeoutExpired:
                    f.outcome = "caught? (timed out)"
        f.seconds = time.monotonic() - started
        print(f"{f.name}: {f.outcome} in {f.seconds:.0f}s", flush=True)

    print()
    print("| fault | tests | result |")
    print("|---|---|---|")
    for f in faults:
        tests = ", ".join(("**" + short(t) + "**") if t in f.failed else short(t) for t in f.tests)
        name = f.name + (" + reconcile blinded" if f.blind else "")
        print(f"| {name} | {tests} | {f.outcome} |")
    print("\n(bold: the tests that failed, i.e. caught the fault)")
    return 0 if all(f.outcome == "caught" for f in faults) else 1


if __name__ == "__main__":
    sys.exit(main())
