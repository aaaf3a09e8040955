"""Fault points for crash tests: `MOVER_FAULT=kill@POINT` makes the process SIGKILL itself when
it reaches POINT; `MOVER_FAULT=hang@POINT` makes it print a line and wait there (a live process
holding its lease) until SIGUSR1 arrives or the file named by MOVER_FAULT_RELEASE exists;
`MOVER_FAULT=error@POINT` raises a Failed there each time (a range that keeps failing). Unset
in normal use, where `point()` is one comparison."""

from __future__ import annotations

import os
import signal
import sys
import threading

from mover import threads

_SPEC = os.environ.get("MOVER_FAULT", "")
_ACTION, _, _WHERE = _SPEC.partition("@")


def point(name: str) -> None:
    if not _SPEC or name != _WHERE:
        return
    if _ACTION == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif _ACTION == "error":
        from mover.errors import Failed
        raise Failed(f"fault injected at {name}")
    elif _ACTION == "hang":
        go_on = threading.Event()
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            threads.start_signal_relay()
            signal.signal(signal.SIGUSR1, lambda *_: threads.from_signal(go_on.set))
        print(f"mover-fault: hanging at {name}", file=sys.stderr, flush=True)
        release = os.environ.get("MOVER_FAULT_RELEASE")
        # The file as well as the signal: a test that stops and continues the process must not
        # depend on when a pending signal reaches the Python handler.
        while not go_on.wait(0.05):
            if release and os.path.exists(release):
                break
