"""The one way mover runs threads: range workers, the applier beside them, index build sessions,
ANALYZE beside the builds, the lease heartbeat, and the helper worker pool of `mover worker`.

Invariants:
- Nothing a thread raises vanishes. A Group keeps the first error any of its threads raised
  (first in time: a failure that set the shared stop flag wins over the Interrupted it caused in
  the others), logs any later one, and raises the first in the thread that joins it: the
  orchestrator's step, which then fails with it. Only a KeyboardInterrupt (a second Ctrl-C or
  SIGTERM, which cuts the main thread's transaction short) goes before an error kept earlier.
- On the first error the Group calls its `on_error` (range workers: set the shared stop flag, so
  that the others stop at their next safe point, between transactions).
- A thread is never killed: a Group is joined only when its threads have ended by themselves
  (a stop flag, a lost lease, the end of the work). The waiting thread joins in slices, so that
  a signal (Ctrl-C) still reaches it: Python runs handlers only in the main thread.
- Threads are daemons: a process that exits on an error does not hang on a thread blocked in
  the database; its sessions end with it, and what they held (leases, range claims) expires.
- A signal handler takes no lock: it hands its work to the relay thread (from_signal).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from mover.errors import Interrupted, LeaseLost

log = logging.getLogger("mover.threads")

JOIN_SLICE_SECONDS = 0.5


class Group:
    """Threads whose first error is raised once they have stopped."""

    def __init__(self, on_error: Callable[[BaseException], None] | None = None) -> None:
        self.on_error = on_error
        self._threads: list[threading.Thread] = []
        self._error: BaseException | None = None
        self._where = ""  # the name of the thread that raised it
        self._lock = threading.Lock()

    @property
    def error(self) -> BaseException | None:
        """The first error a thread of the group raised, or None."""
        with self._lock:
            return self._error

    @property
    def failed(self) -> bool:
        return self.error is not None

    def start(self, fn: Callable[[], object], name: str) -> threading.Thread:
        """fn() in a (daemon) thread of its own named `name`; what it raises is kept."""
        t = threading.Thread(target=self.call, args=(fn,), name=name, daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()
        return t

    def call(self, fn: Callable[[], object]) -> None:
        """fn() in the calling thread, its error kept like a started thread's (not raised here:
        join() raises it once every thread has stopped)."""
        try:
            fn()
        except BaseException as exc:  # kept, and raised by join() in the waiting thread
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        here = threading.current_thread().name
        other: BaseException | None
        with self._lock:
            kept, kept_where = self._error, self._where
            # A KeyboardInterrupt (a second Ctrl-C or SIGTERM, in the main thread) ends the
            # process at once, cutting its open transaction short: that is what it must say,
            # over an error kept before (the Interrupted of a thread that stopped on the first).
            if kept is None or (not isinstance(exc, Exception) and isinstance(kept, Exception)):
                self._error, self._where = exc, here
                other, where = kept, kept_where
            else:
                other, where = exc, here
        if other is not None:  # said, not raised
            # A stop or a lost lease besides the first error is what that error set off.
            level = logging.DEBUG if isinstance(other, (Interrupted, LeaseLost)) else logging.ERROR
            log.log(level, "%s also failed: %s: %s", where, type(other).__name__, other)
        if kept is None and self.on_error is not None:
            self.on_error(exc)

    def wait(self, threads: Sequence[threading.Thread] | None = None, timeout: float | None = None) -> bool:
        """Wait for `threads` (by default every thread of the group) to end, or `timeout` seconds;
        whether they all ended. Raises nothing of theirs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            todo = list(self._threads if threads is None else threads)
        for t in todo:
            while t.is_alive():
                left = JOIN_SLICE_SECONDS if deadline is None else min(JOIN_SLICE_SECONDS, deadline - time.monotonic())
                if left <= 0:
                    return False
                t.join(left)
        return True

    def join(self, timeout: float | None = None) -> None:
        """Wait for every thread, then raise the first error any of them raised."""
        self.wait(timeout=timeout)
        if (exc := self.error) is not None:
            raise exc


# -- work handed over by signal handlers ----------------------------------------------------------

RELAY_THREAD = "mover-signal-relay"  # one per process, started once and kept
_relay_started = threading.Lock()
_relay: tuple[int, int, collections.deque[Callable[[], object]]] | None = None  # (pid, pipe, queue)


def start_signal_relay() -> None:
    """Start the relay thread of from_signal(), once per process (a forked child starts its own:
    threads do not survive a fork). Call it before installing a handler that uses it: a handler
    cannot start a thread (that takes locks)."""
    global _relay
    with _relay_started:
        if _relay is not None and _relay[0] == os.getpid():
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        queue: collections.deque[Callable[[], object]] = collections.deque()
        threading.Thread(target=_run_relay, args=(read_end, queue), name=RELAY_THREAD, daemon=True).start()
        _relay = os.getpid(), write_end, queue


def from_signal(fn: Callable[[], object]) -> None:
    """Run fn() soon in the relay thread. For signal handlers: Python runs a handler in the main
    thread between two of its bytecodes, also while that thread holds a lock, inside an Event's
    wait() for one. A handler that took the same lock (that Event's set()) would wait for itself
    forever, and the stop it carries would never reach the other threads. A deque's append and
    os.write take no Python lock."""
    assert _relay is not None, "start_signal_relay() first"
    _, write_end, queue = _relay
    queue.append(fn)
    try:
        os.write(write_end, b"s")
    except BlockingIOError:  # the pipe is full of wake-ups already: the relay is on its way
        pass


def _run_relay(read_end: int, queue: collections.deque[Callable[[], object]]) -> None:
    while True:
        os.read(read_end, 512)
        while queue:
            fn = queue.popleft()
            try:
                fn()
            except Exception:  # the handler's work failed: said, and the relay serves the next
                log.exception("a signal's handling failed")
