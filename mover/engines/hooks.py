"""Plan hooks (`[hooks.before_cutover]` ... `[hooks.after_retire]`): a shell command or SQL run
before and after the cutover, the rollback and retire. Output goes to the events.

A before-hook runs before the step changes anything; its failure stops the step (Failed, exit 1,
nothing changed). An after-hook runs once the step has committed; its failure is recorded and
reported, and the step stands: nothing is rolled back for it.
"""

from __future__ import annotations

import logging
import os
import subprocess

import psycopg

from mover.db import mask
from mover.engines.context import Context
from mover.errors import Failed
from mover.plan import Hook
from mover.sql import trusted
from mover.state import control

log = logging.getLogger("mover.hooks")

OUTPUT_CHARS = 4000  # kept of a hook's output in its event


class _HookError(Exception):
    def __init__(self, why: str, output: str = ""):
        super().__init__(why)
        self.why, self.output = why, output


def _tail(text: str) -> str:
    text = mask(text.strip())
    return text if len(text) <= OUTPUT_CHARS else "..." + text[-OUTPUT_CHARS:]


def _run_command(ctx: Context, hook: Hook, event: str) -> str:
    m = ctx.migration
    # What the command may want to know; never the DSN (it may carry a password).
    env = {**os.environ, "MOVER_MIGRATION": m.name, "MOVER_HOOK": event, "MOVER_SOURCE": str(m.source),
           "MOVER_OLD": str(m.old), "MOVER_TARGET": str(m.target)}
    try:
        done = subprocess.run(["/bin/sh", "-c", hook.command or ""], capture_output=True, text=True, env=env,
                              timeout=hook.timeout_ms / 1000, check=False)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        raise _HookError(f"timed out after {hook.timeout_ms} ms", _tail(out)) from None
    output = _tail(done.stdout + done.stderr)
    if done.returncode != 0:
        raise _HookError(f"exit status {done.returncode}", output)
    return output


def _run_sql(ctx: Context, hook: Hook) -> str:
    def go(cur: psycopg.Cursor) -> str:
        cur.execute(trusted(hook.sql or "", "plan hook"))
        rows = cur.fetchmany(20) if cur.description else []
        return "; ".join([cur.statusmessage or "", *(" | ".join(map(str, r)) for r in rows)])
    try:
        return _tail(ctx.db.transaction(go, statement_timeout=f"{hook.timeout_ms}ms", attempts=1, label="hook"))
    except psycopg.Error as exc:
        raise _HookError(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
                         f"{' [' + exc.sqlstate + ']' if exc.sqlstate else ''}") from None


def run(ctx: Context, event: str) -> None:
    """Run the plan's hook for `event`, if any."""
    hook = ctx.plan.hooks.get(event)
    if hook is None:
        return
    m = ctx.migration
    verb = event.split("_", 1)[1]
    try:
        output = _run_command(ctx, hook, event) if hook.command is not None else _run_sql(ctx, hook)
    except _HookError as exc:
        why, failed_output = exc.why, exc.output
        before = event.startswith("before_")
        consequence = ("nothing was changed" if before
                       else f"the {verb} stands: an after-hook's failure is reported, not rolled back")
        message = f"the {event} hook of {m.name!r} failed ({why}); {consequence}"
        ctx.db.transaction(lambda cur: control.event(cur, m.id, ctx.owner, m.step, "hook_failed", message,
                                                     {"hook": event, "output": failed_output}), label="record hook")
        if before:
            raise Failed(message + (f"; output: {failed_output}" if failed_output else ""),
                         hint=f"fix the hook in [hooks.{event}] (then `mover run PLAN` stores it), or the cause it "
                              f"reports; then `mover {verb} {m.name}` again") from None
        log.warning("%s", message)
        ctx.report("hook_failed", hook=event, error=why, note="not rolled back")
        return
    ctx.db.transaction(lambda cur: control.event(cur, m.id, ctx.owner, m.step, "hook",
                                                 f"the {event} hook ran", {"hook": event, "output": output}),
                       label="record hook")
    ctx.report("hook", hook=event, output=output[:200])
