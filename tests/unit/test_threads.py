"""The one way mover runs threads (mover/threads.py) and the range workers' pool
(mover/engines/bulk/rangework.py run_workers), without a database: an error in any thread reaches
the thread that waits for them, and it is the error that set things off, not the stop it caused."""

from __future__ import annotations

import subprocess
import sys
import threading
from functools import partial
from types import SimpleNamespace

import pytest

from mover import threads
from mover.engines.bulk import rangework
from mover.errors import Interrupted


class FakeWorker:
    """What run_workers needs of a RangeWorker: run(), and the stop flag its context shares."""

    def __init__(self, stop: threading.Event, body):
        self.ctx = SimpleNamespace(stop=stop)
        self.body = body
        self.ran_in: str | None = None

    def run(self) -> None:
        self.ran_in = threading.current_thread().name
        self.body(self.ctx.stop)


def stops_when_told(stop: threading.Event) -> None:
    """A worker between ranges: it stops at its next safe point once the flag is set."""
    assert stop.wait(30), "the stop flag was never set"
    raise Interrupted("stopped at a safe point")


def breaks(stop: threading.Event) -> None:
    raise RuntimeError("worker broke")


def test_a_worker_threads_error_fails_the_pool_not_the_stop_it_caused():
    # Worker 1 (a thread) fails; worker 0 (the caller's thread) then stops on the flag that the
    # failure set. The pool raises worker 1's error, after both have stopped.
    stop = threading.Event()
    workers = [FakeWorker(stop, stops_when_told), FakeWorker(stop, breaks), FakeWorker(stop, stops_when_told)]
    with pytest.raises(RuntimeError, match="worker broke"):
        rangework.run_workers(workers, "test")
    assert stop.is_set()
    assert workers[0].ran_in == threading.current_thread().name
    assert [w.ran_in for w in workers[1:]] == ["mover-test-1", "mover-test-2"]


def test_the_callers_own_workers_error_is_raised_once_the_threads_have_stopped():
    stop = threading.Event()
    ended = threading.Event()

    def slow_to_stop(stop: threading.Event) -> None:
        assert stop.wait(30)
        ended.set()

    with pytest.raises(RuntimeError, match="worker broke"):
        rangework.run_workers([FakeWorker(stop, breaks), FakeWorker(stop, slow_to_stop)], "test")
    assert ended.is_set()  # raised only after the other worker ended


def test_a_second_signal_in_the_callers_worker_goes_before_the_stops_of_the_others():
    # The first SIGTERM set the stop flag: the thread stops at its safe point (Interrupted). The
    # second arrives as KeyboardInterrupt in the caller's worker, inside its open transaction:
    # that is the one the pool raises (the CLI then says the transaction was rolled back).
    stop = threading.Event()
    stopped = threading.Event()

    def thread_worker(stop: threading.Event) -> None:
        assert stop.wait(30)
        stopped.set()
        raise Interrupted("stopped at a safe point")

    def callers_worker(stop: threading.Event) -> None:
        stop.set()  # the first signal
        assert stopped.wait(30)
        raise KeyboardInterrupt  # the second

    with pytest.raises(KeyboardInterrupt):
        rangework.run_workers([FakeWorker(stop, callers_worker), FakeWorker(stop, thread_worker)], "test")


def test_workers_that_end_by_themselves_raise_nothing():
    stop = threading.Event()
    done = []
    rangework.run_workers([FakeWorker(stop, lambda s: done.append(1)) for _ in range(3)], "test")
    assert done == [1, 1, 1] and not stop.is_set()


def test_a_group_keeps_the_first_error_and_says_the_later_ones(caplog):
    first_failed = threading.Event()
    group = threads.Group()

    def first() -> None:
        first_failed.set()
        raise ValueError("first")

    def second() -> None:
        assert first_failed.wait(30)
        raise KeyError("second")

    group.start(first, "mover-a")
    group.start(second, "mover-b")
    with pytest.raises(ValueError, match="first"):
        group.join()
    assert group.wait(timeout=0)  # every thread has ended
    assert any("mover-b also failed: KeyError" in r.getMessage() for r in caplog.records)


def fail(message: str) -> None:
    raise ValueError(message)


def test_a_group_calls_on_error_once_with_the_first_error():
    seen: list[BaseException] = []
    group = threads.Group(on_error=seen.append)
    group.call(partial(fail, "one"))
    group.call(partial(fail, "two"))
    assert [str(e) for e in seen] == ["one"] and group.failed
    with pytest.raises(ValueError, match="one"):
        group.join()


def test_wait_with_a_timeout_leaves_a_running_thread_alone():
    release = threading.Event()
    group = threads.Group()
    t = group.start(lambda: release.wait(30), "mover-slow")
    assert group.wait(timeout=0.05) is False and t.is_alive()
    release.set()
    group.join()
    assert not t.is_alive()


# -- signals ----------------------------------------------------------------------------------------

# Run in a process of its own: a handler runs in the main thread, which is pytest's here. The main
# thread spins on the stop flag's wait(0), holding the Event's lock most of the time (mover's own
# range worker waits on the same flag between ranges), while SIGTERM arrives: a handler that set
# the flag itself waited forever for the lock its own thread held (CI saw a run that went on
# copying past its SIGTERM until the test gave up).
FIRST_SIGNALS = """
import faulthandler, os, signal, threading, time
from mover import cli
from mover.views.console import Consoles
faulthandler.dump_traceback_later(50, exit=True)
for trial in range(300):
    stop = cli._interruptible(Consoles.make())
    threading.Timer(0.0005 * (trial % 7), os.kill, (os.getpid(), signal.SIGTERM)).start()
    deadline = time.monotonic() + 10
    while not stop.wait(0):
        assert time.monotonic() < deadline, f"trial {trial}: the signal never set the stop flag"
    assert stop.reason == "SIGTERM"
print("stopped 300 times")
try:
    os.kill(os.getpid(), signal.SIGTERM)
    while True:
        stop.wait(0)
except KeyboardInterrupt:
    print("the second signal interrupted")
"""


def test_a_first_sigterm_reaches_the_stop_flag_while_the_main_thread_waits_on_it():
    r = subprocess.run([sys.executable, "-c", FIRST_SIGNALS], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["stopped 300 times", "the second signal interrupted"], r.stdout
    assert r.stderr.count("SIGTERM: stopping at the next safe point") == 300, r.stderr[-2000:]


def test_the_relay_runs_every_piece_of_work_handed_over_by_a_flood_of_signals():
    script = """
import os, signal, threading, time
from mover import threads
threads.start_signal_relay()
ran, flag = [], threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: threads.from_signal(lambda: (ran.append(1), flag.set(), flag.clear())))
for _ in range(2000):
    os.kill(os.getpid(), signal.SIGUSR1)
    flag.wait(0)
deadline = time.monotonic() + 10
while len(ran) < 2000 and time.monotonic() < deadline:
    flag.wait(0.01)
print(len(ran))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "2000"
