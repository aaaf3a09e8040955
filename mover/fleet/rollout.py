"""The fleet's commands: each member's migration moved by the ordinary commands (mover/api.py), wave
by wave, under the fleet runner's lease in the home database.

Invariants:
- A member's migration is an ordinary one: registered, run, cut over, rolled back, retired or
  aborted by the same calls as `mover run NAME` ... in its own database, where `mover status NAME`
  tells its story. The fleet adds no lifecycle: it decides which member moves when.
- Never a member twice at once: mover's per-migration lease holds one orchestrator per migration
  (a killed runner's member is taken over by the next one, LeaseHeld if it lives elsewhere).
- Never a cutover ahead of the rollout: a member is cut over only when `fleet run` reached its
  wave and every member of the wave is at its gate; waves are cut over in order.
- Bounded by the servers: at most `concurrency` members in flight over the fleet and `per_server`
  on one server (host:port), counted here, in the one thread that starts them.
- Resumable: every member's state and every wave reached is recorded in the home database before
  and after it moves; a command run again carries on from there.
- All writes to the home database come from the command's own thread (the members' work runs in
  a pool and reports back), so one connection serves them.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from mover import api
from mover.db import Database, bind, mask
from mover.errors import (
    BadInput,
    FleetHeld,
    FleetStopped,
    Interrupted,
    LeaseHeld,
    MoverError,
    NotFound,
    PlanError,
    ServerGone,
    Waiting,
    combined,
)
from mover.fleet import state
from mover.fleet.file import FleetFile
from mover.fleet.members import Placed, home_of, plan_document, resolve
from mover.state.control import new_owner_id
from mover.state.heartbeat import Heartbeat

log = logging.getLogger("mover.fleet")

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Outcome:
    """Where one member's command left it: its fleet state, why (detail), and the stop condition it
    meets (None: none; else one of STOP_ON, or "busy" / "interrupted", which always stop)."""

    member: str
    state: str
    detail: str | None = None
    stop: str | None = None


@dataclass
class Session:
    """One fleet command under the runner's lease: the members, the home database, who we are."""

    fleet: FleetFile
    placed: list[Placed]
    db: Database
    owner: str
    stop: threading.Event
    say: Say
    row: state.FleetRow = field(init=False)

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> state.FleetRow:
        self.row = self.db.transaction(bind(state.get, self.fleet.name), label="fleet")
        return self.row

    def states(self) -> dict[str, state.MemberRow]:
        return {m.name: m for m in self.refresh().members}

    def write(self, fn: Callable[[psycopg.Cursor], Any], label: str = "fleet state") -> Any:
        return self.db.transaction(fn, label=label)

    def member(self, name: str, new_state: str, *, detail: str | None = None, message: str | None = None) -> None:
        self.write(bind(state.set_member, self.fleet.name, name, new_state, self.owner, detail=detail,
                        message=message))
        if message:
            self.say(f"{name}: {message}")

    def halt(self, reason: str, member: str | None, message: str) -> None:
        self.write(bind(state.stopped, self.fleet.name, self.owner, reason, member, message))
        self.say(f"stopped: {message}")


def _members_rows(placed: list[Placed]) -> list[dict[str, Any]]:
    return [{"name": p.name, "wave": p.wave, "server": p.server, "migration": p.migration, "dsn": p.dsn}
            for p in placed]


@contextmanager
def leased(fleet: FleetFile, command: str, *, stop: threading.Event | None = None, say: Say = _quiet,
           create: bool = True) -> Iterator[Session]:
    """The fleet's members (each reached: BadInput naming those that are not, before anything), its
    row in the home database (recorded on first use, `create`), and the runner's lease, kept by a
    heartbeat until the command ends; a lease lost stops the members at their next safe point."""
    placed = resolve(fleet)
    _, digest = plan_document(fleet)
    home = home_of(fleet, placed)
    stop = stop or threading.Event()
    with api.session(home.dsn) as db:
        owner = new_owner_id()

        def take(cur: psycopg.Cursor) -> None:
            if create:
                state.record(cur, fleet.name, digest, _members_rows(placed), owner)
            else:
                state.get(cur, fleet.name)
                state.record(cur, fleet.name, digest, _members_rows(placed), owner)  # the same fleet, or refused
            state.take_lease(cur, fleet.name, owner, command)

        db.transaction(take, label="fleet lease")
        lost = threading.Event()
        beat = Heartbeat(db.dsn, bind(state.heartbeat, fleet.name, owner), lost, stop, name=f"fleet-{fleet.name}")
        beat.start()
        try:
            yield Session(fleet=fleet, placed=placed, db=db, owner=owner, stop=stop, say=say)
        finally:
            beat.stop()
            if not lost.is_set():
                try:
                    db.transaction(bind(state.release_lease, fleet.name, owner), label="release fleet lease")
                except psycopg.Error as exc:
                    log.warning("could not release the fleet's lease (%s); it expires by itself", mask(str(exc)))


# ---------------------------------------------------------------------------------------------
# One member, one command (in a worker thread): the api call, then where it left the member


def _failure(p: Placed, exc: BaseException) -> Outcome:
    """An exception of a member's command as its outcome."""
    if isinstance(exc, LeaseHeld):
        return Outcome(p.name, "running", f"run elsewhere: {exc.message}", "busy")
    if isinstance(exc, (Interrupted, KeyboardInterrupt)):
        return Outcome(p.name, "running", "stopped by the operator", "interrupted")
    cause = exc.__cause__
    if isinstance(exc, ServerGone) or (isinstance(exc, MoverError) and isinstance(cause, psycopg.OperationalError)):
        return Outcome(p.name, "unreachable", mask(getattr(exc, "message", str(exc))), "unreachable")
    if isinstance(exc, psycopg.OperationalError):
        return Outcome(p.name, "unreachable", mask(" ".join(str(exc).split())), "unreachable")
    if isinstance(exc, BadInput):
        return Outcome(p.name, "failed", mask(exc.message), "refusal")
    if isinstance(exc, MoverError):
        return Outcome(p.name, "failed", mask(exc.message), "failure")
    return Outcome(p.name, "failed", mask(f"{type(exc).__name__}: {exc}"), "failure")


def judge(p: Placed, st: dict[str, Any]) -> Outcome:
    """A member's fleet state from its migration's status (`mover status NAME --json`)."""
    if st["divergences"]:
        return Outcome(p.name, "failed", f"{st['divergences']} open divergences (`mover divergences {p.migration}`)",
                       "divergence")
    if st["state"] == "failed":
        return Outcome(p.name, "failed", st["error"], "failure")
    if st["state"] == "aborted":
        return Outcome(p.name, "aborted")
    if st["state"] == "done":
        return Outcome(p.name, "retired")
    if st["step"] == "rollback_window":
        return Outcome(p.name, "cut_over")
    if st["step"] == "cutover" and st["state"] == "waiting":
        throttle = st.get("throttle") or {}
        if throttle.get("state") == "floor":
            return Outcome(p.name, "at_gate", f"its governor is at its floor: {throttle.get('reason')}",
                           "governor_floor")
        return Outcome(p.name, "at_gate")
    return Outcome(p.name, "running", st.get("error"), "failure" if st.get("error") else None)


def _then_judge(p: Placed, call: Callable[[], object]) -> Outcome:
    try:
        call()
    except Waiting as exc:
        if isinstance(exc, LeaseHeld):
            return _failure(p, exc)
    except (Exception, KeyboardInterrupt) as exc:
        return _failure(p, exc)
    try:
        return judge(p, api.status(p.dsn, p.migration))
    except (Exception, KeyboardInterrupt) as exc:
        return _failure(p, exc)


def to_gate(p: Placed, stop: threading.Event) -> Outcome:
    """Register the member's plan (or load its migration: a changed plan is refused) and run it to
    its cutover gate."""
    def go() -> None:
        api.register_plan(p.dsn, p.plan)
        api.run(p.dsn, p.migration, stop=stop)
    return _then_judge(p, go)


def check_one(p: Placed) -> Outcome:
    """`mover plan check` on the member: "checked", or "failed" with the refusal (every problem)."""
    try:
        api.check_plan(p.dsn, p.plan)
    except (Exception, KeyboardInterrupt) as exc:
        out = _failure(p, exc)
        return out if out.stop != "failure" else Outcome(p.name, "failed", out.detail, "refusal")
    return Outcome(p.name, "checked")


# ---------------------------------------------------------------------------------------------
# The scheduler: members in flight, bounded over the fleet and per server


def schedule(s: Session, todo: list[Placed], action: Callable[[Placed], Outcome], *,
             starting: str | None, verb: str) -> tuple[list[Outcome], Outcome | None]:
    """Run `action` on each member of `todo` (in their order), at most `concurrency` at once and
    `per_server` on one server. A member's outcome that meets a stop condition starts no more
    (those in flight finish where they are); returns every outcome and the one that stopped."""
    r = s.fleet.rollout
    pending = list(todo)
    inflight: dict[Future[Outcome], Placed] = {}
    on_server: Counter[str] = Counter()
    outcomes: list[Outcome] = []
    halted: Outcome | None = None
    with ThreadPoolExecutor(max_workers=r.concurrency, thread_name_prefix="mover-fleet") as pool:
        while pending or inflight:
            while pending and halted is None and not s.stop.is_set() and len(inflight) < r.concurrency:
                p = next((p for p in pending if on_server[p.server] < r.per_server), None)
                if p is None:
                    break  # every pending member's server is full: wait for one to finish
                pending.remove(p)
                on_server[p.server] += 1
                if starting is not None:
                    s.member(p.name, starting, message=f"{verb} (wave {p.wave}, on {p.server})")
                else:
                    s.say(f"{p.name}: {verb} (wave {p.wave}, on {p.server})")
                inflight[pool.submit(action, p)] = p
            if not inflight:
                break
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            for f in done:
                p = inflight.pop(f)
                on_server[p.server] -= 1
                out = f.result()
                outcomes.append(out)
                message = out.state.replace("_", " ") + (f": {out.detail}" if out.detail else "")
                s.member(p.name, out.state, detail=out.detail, message=message)
                if halted is None and out.stop is not None and (
                        out.stop in ("busy", "interrupted") or out.stop in r.stop_on):
                    halted = out
    return outcomes, halted


def _stop_for(s: Session, out: Outcome, what: str) -> MoverError:
    """Record what stopped the fleet; the error the command ends with (exit 1, or 3 for what waits
    for the operator's decision rather than a fix)."""
    if out.stop == "interrupted":
        s.halt("interrupted", out.member, f"{what}: stopped by the operator")
        return Interrupted(f"fleet {s.fleet.name!r}: stopped by the operator",
                           hint=f"`mover fleet {what} FLEET` resumes where the fleet stands")
    message = f"{what} stopped by member {out.member!r} ({out.stop}): {out.detail or out.state}"
    s.halt(out.stop or "failure", out.member, message)
    hint = (f"fix it (`mover status {_migration(s, out.member)}` on that member tells its story), then "
            f"`mover fleet {what} FLEET` resumes; `mover fleet status FLEET` shows every member")
    if out.stop in ("divergence", "governor_floor"):
        return FleetHeld(f"fleet {s.fleet.name!r}: {message}", hint=hint)
    return FleetStopped(f"fleet {s.fleet.name!r}: {message}", hint=hint)


def _migration(s: Session, member: str) -> str:
    return next(p.migration for p in s.placed if p.name == member)


def _bake(s: Session, wave: int) -> None:
    """Before a wave (not the first): let the last one bake for [rollout] bake since it finished."""
    bake = s.fleet.rollout.bake_ms / 1000
    if wave == 0 or bake <= 0:
        return
    since = s.write(bind(state.seconds_since_wave_done, s.fleet.name))
    left = bake - (since if since is not None else bake)
    if left > 0:
        s.say(f"baking wave {wave - 1} for {left:.0f}s before wave {wave}")
        if s.stop.wait(left):
            raise Interrupted(f"fleet {s.fleet.name!r}: stopped while baking", hint="the same command resumes")


def _by_wave(s: Session) -> list[list[Placed]]:
    waves: list[list[Placed]] = [[] for _ in range(s.row.waves)]
    for p in s.placed:
        waves[p.wave].append(p)
    return waves


# ---------------------------------------------------------------------------------------------
# The commands


def check(fleet: FleetFile, *, say: Say = _quiet) -> dict[str, Any]:
    """`mover fleet check`: plan check on every member, one summary. Refusals: BadInput naming each,
    nothing recorded or started; with [rollout] skip_refused they are recorded as skipped."""
    placed = resolve(fleet)
    with ThreadPoolExecutor(max_workers=fleet.rollout.concurrency, thread_name_prefix="mover-fleet") as pool:
        outcomes = list(pool.map(check_one, placed))
    refused = [o for o in outcomes if o.state != "checked"]
    if refused and not fleet.rollout.skip_refused:
        raise combined([PlanError(f"member {o.member!r} refuses the plan: {o.detail}",
                                  hint="fix it there, or set [rollout] skip_refused = true to leave it out")
                        for o in refused],
                       hint="nothing was started on any member; fix each, then `mover fleet check FLEET` again")
    with leased(fleet, "check", say=say) as s:
        now = s.states()
        for o in outcomes:
            if now[o.member].state in ("pending", "checked"):
                s.member(o.member, "checked" if o.state == "checked" else "skipped", detail=o.detail,
                         message="plan check passed" if o.state == "checked" else f"skipped: {o.detail}")
        return {**summary(s), "checked": [{"member": o.member, "passed": o.state == "checked", "why": o.detail}
                                          for o in outcomes]}


def run(fleet: FleetFile, *, stop: threading.Event | None = None, say: Say = _quiet) -> dict[str, Any]:
    """`mover fleet run`: every member to its cutover gate, the canaries first, then wave by wave;
    ends with FleetHeld (exit 3) once every member waits at its gate."""
    with leased(fleet, "run", stop=stop, say=say) as s:
        _check_new_members(s)
        s.write(bind(state.clear_stop, fleet.name))
        for wave, members in enumerate(_by_wave(s)):
            now = s.states()
            todo = [p for p in members if now[p.name].state not in state.SETTLED]
            if wave > s.row.run_wave:
                _bake(s, wave)
                _health(s, wave)
                s.write(bind(state.reach_wave, fleet.name, "run_wave", wave, s.owner,
                             f"wave {wave} started: {', '.join(p.name for p in members)}"))
                say(f"wave {wave} started ({len(members)} members)")
            if not todo:
                continue
            _, halted = schedule(s, todo, lambda p: to_gate(p, s.stop), starting="running", verb="run to its gate")
            if halted is not None:
                raise _stop_for(s, halted, "run")
            if s.stop.is_set():
                raise _stop_for(s, Outcome("-", "running", stop="interrupted"), "run")
            s.write(bind(state.wave_done, fleet.name, s.owner, "at its gate", wave))
        raise FleetHeld(f"fleet {fleet.name!r}: every member is at its cutover gate",
                        hint=f"`mover fleet cutover {fleet.path}` cuts them over, wave by wave")


def _check_new_members(s: Session) -> None:
    """The members never checked: plan check first, so that a refusal starts nothing anywhere."""
    now = s.states()
    fresh = [p for p in s.placed if now[p.name].state == "pending"]
    if not fresh:
        return
    with ThreadPoolExecutor(max_workers=s.fleet.rollout.concurrency, thread_name_prefix="mover-fleet") as pool:
        outcomes = list(pool.map(check_one, fresh))
    refused = [o for o in outcomes if o.state != "checked"]
    if refused and not s.fleet.rollout.skip_refused:
        raise combined([PlanError(f"member {o.member!r} refuses the plan: {o.detail}",
                                  hint="fix it there, or set [rollout] skip_refused = true to leave it out")
                        for o in refused],
                       hint="nothing was started on any member; fix each, then the same command again")
    for o in outcomes:
        s.member(o.member, "checked" if o.state == "checked" else "skipped", detail=o.detail,
                 message="plan check passed" if o.state == "checked" else f"skipped: {o.detail}")


def _health(s: Session, wave: int) -> None:
    """Before a new wave: the members of the waves before it still at their gate, with no open
    divergence and their governor off its floor (what the bake was for)."""
    if wave == 0:
        return
    now = s.states()
    earlier = [p for p in s.placed if p.wave < wave and now[p.name].state == "at_gate"]
    with ThreadPoolExecutor(max_workers=s.fleet.rollout.concurrency, thread_name_prefix="mover-fleet") as pool:
        outcomes = list(pool.map(lambda p: _then_judge(p, lambda: None), earlier))
    for out in outcomes:
        if out.state != "at_gate" or out.stop is not None:
            s.member(out.member, out.state, detail=out.detail,
                     message=f"before wave {wave}: {out.state.replace('_', ' ')}" + (
                         f": {out.detail}" if out.detail else ""))
            if out.stop is None or out.stop in s.fleet.rollout.stop_on:
                raise _stop_for(s, out if out.stop else Outcome(out.member, out.state, out.detail, "failure"), "run")


def cutover(fleet: FleetFile, *, through: int | None = None, stop: threading.Event | None = None,
            say: Say = _quiet) -> dict[str, Any]:
    """`mover fleet cutover [--wave N]`: wave by wave (up to N), each member at its gate swapped in;
    never a wave `fleet run` has not reached, never one with a member not at its gate."""
    with leased(fleet, "cutover", stop=stop, say=say, create=False) as s:
        s.write(bind(state.clear_stop, fleet.name))
        for wave, members in enumerate(_by_wave(s)):
            if through is not None and wave > through:
                break
            now = s.states()
            live = [p for p in members if now[p.name].state != "skipped"]
            not_ready = [p.name for p in live if now[p.name].state not in ("at_gate", "cut_over", "retired")]
            if wave > s.row.run_wave or not_ready:
                why = (f"wave {wave} was not reached by `mover fleet run`" if wave > s.row.run_wave else
                       f"wave {wave} has members not at their gate: {', '.join(not_ready)}")
                s.halt("not_ready", not_ready[0] if not_ready else None, f"cutover stopped before wave {wave}: {why}")
                raise FleetHeld(f"fleet {fleet.name!r}: cutover stopped before wave {wave}: {why}",
                                hint=f"`mover fleet run {fleet.path}` takes them to their gate; then cutover again")
            todo = [p for p in live if now[p.name].state == "at_gate"]
            if not todo:
                continue
            if wave > s.row.cutover_wave:
                if s.row.cutover_wave >= 0:
                    _bake(s, wave)
                s.write(bind(state.reach_wave, fleet.name, "cutover_wave", wave, s.owner, f"cutover of wave {wave}"))
                say(f"cutover of wave {wave} ({len(todo)} members)")
            _, halted = schedule(s, todo, lambda p: _then_judge(p, lambda: api.cutover_now(p.dsn, p.migration,
                                                                                          stop=s.stop)),
                                 starting=None, verb="cutting over")
            if halted is not None:
                raise _stop_for(s, halted, "cutover")
            s.write(bind(state.wave_done, fleet.name, s.owner, "cut over", wave))
        return summary(s)


def rollback(fleet: FleetFile, *, wave: int | None = None, member: str | None = None,
             stop: threading.Event | None = None, say: Say = _quiet) -> dict[str, Any]:
    """`mover fleet rollback [--wave N | --member NAME]`: the members cut over (of that wave, or that
    one; else all), the latest wave first, each swapped back losing nothing."""
    with leased(fleet, "rollback", stop=stop, say=say, create=False) as s:
        names = {p.name for p in s.placed}
        if member is not None and member not in names:
            raise NotFound(f"fleet {fleet.name!r} has no member {member!r}", hint=f"`mover fleet status {fleet.path}`")
        now = s.states()
        chosen = [p for p in s.placed if now[p.name].state == "cut_over"
                  and (wave is None or p.wave == wave) and (member is None or p.name == member)]
        if not chosen:
            which = (f" in wave {wave}" if wave is not None else "") + (f" named {member!r}" if member else "")
            raise BadInput(f"fleet {fleet.name!r}: no member cut over{which}",
                           hint=f"`mover fleet status {fleet.path}`")
        for w in sorted({p.wave for p in chosen}, reverse=True):
            todo = [p for p in chosen if p.wave == w]
            say(f"rollback of wave {w} ({len(todo)} members)")
            _, halted = schedule(s, todo, lambda p: _then_judge(p, lambda: api.rollback(p.dsn, p.migration,
                                                                                       stop=s.stop)),
                                 starting=None, verb="rolling back")
            rolled = [p for p in todo if s.states()[p.name].state == "running"]
            for p in rolled:  # swapped back: at reconcile again, before the gate
                s.member(p.name, "rolled_back", message="rolled back; `mover fleet run` takes it to its gate again")
            if rolled:
                s.write(bind(state.lower_cutover_wave, fleet.name, w))
            if halted is not None:
                raise _stop_for(s, halted, "rollback")
        return summary(s)


def retire(fleet: FleetFile, *, force: bool = False, stop: threading.Event | None = None,
           say: Say = _quiet) -> dict[str, Any]:
    """`mover fleet retire [--force]`: each member cut over, wave by wave, retired (after its window;
    before it with force)."""
    with leased(fleet, "retire", stop=stop, say=say, create=False) as s:
        now = s.states()
        for members in _by_wave(s):
            todo = [p for p in members if now[p.name].state == "cut_over"]
            if not todo:
                continue
            _, halted = schedule(s, todo, lambda p: _then_judge(p, lambda: api.retire(p.dsn, p.migration, force=force,
                                                                                     stop=s.stop)),
                                 starting=None, verb="retiring")
            if halted is not None:
                raise _stop_for(s, halted, "retire")
        return summary(s)


def abort(fleet: FleetFile, *, stop: threading.Event | None = None, say: Say = _quiet) -> dict[str, Any]:
    """`mover fleet abort`: every member not cut over has its migration aborted (or, never started,
    is marked aborted). Refused while a member is cut over: roll it back first."""
    with leased(fleet, "abort", stop=stop, say=say, create=False) as s:
        now = s.states()
        swapped = [p.name for p in s.placed if now[p.name].state == "cut_over"]
        if swapped:
            raise BadInput(f"fleet {fleet.name!r}: members {', '.join(swapped)} are cut over; nothing was aborted",
                           hint=f"`mover fleet rollback {fleet.path}` swaps them back first, then abort")
        todo = [p for p in s.placed if now[p.name].state not in ("retired", "aborted")]
        _, halted = schedule(s, todo, lambda p: _abort_one(p, s.stop), starting=None, verb="aborting")
        if halted is not None:
            raise _stop_for(s, halted, "abort")
        return summary(s)


def _abort_one(p: Placed, stop: threading.Event) -> Outcome:
    try:
        api.abort(p.dsn, p.migration, stop=stop)
    except NotFound:
        return Outcome(p.name, "aborted", "never started")
    except (Exception, KeyboardInterrupt) as exc:
        if isinstance(exc, BadInput) and "was aborted" in exc.message:
            return Outcome(p.name, "aborted")
        return _failure(p, exc)
    return Outcome(p.name, "aborted")


def summary(s: Session) -> dict[str, Any]:
    row = s.refresh()
    counts = Counter(m.state for m in row.members)
    return {"fleet": row.name, "members": len(row.members), "waves": row.waves, "run_wave": row.run_wave,
            "cutover_wave": row.cutover_wave, "states": dict(sorted(counts.items())),
            "stopped": None if row.stopped_reason is None else {
                "reason": row.stopped_reason, "member": row.stopped_member, "message": row.stopped_message}}
