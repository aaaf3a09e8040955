"""How `mover fleet ...` prints: one line per member and the totals (a table that fits a terminal),
the same as JSON, and the live view of `watch`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from mover.views import console
from mover.views.console import Consoles


def _progress(m: dict[str, Any]) -> str:
    copied, estimate = m["rows_copied"], m["rows_estimate"]
    if copied is None:
        return ""
    if estimate:
        return f"{copied}/{estimate} rows ({min(100, 100 * copied // max(estimate, 1))}%)"
    return f"{copied} rows"


def _eta(seconds: int | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def members_table(st: dict[str, Any]) -> Table:
    t = Table(title=f"fleet {st['fleet']}: run reached wave {st['run_wave']}, cutover wave {st['cutover_wave']} "
                    f"(of {st['waves'] - 1})")
    for col in ("member", "wave", "server", "fleet", "step", "state", "progress", "ETA", "div", "throttle / detail"):
        t.add_column(col)
    for m in st["members"]:
        note = m["error"] or m["detail"] or m["throttle"] or ""
        console.row(t, m["name"], str(m["wave"]), m["server"], m["fleet_state"], m["step"] or "-", m["state"] or "-",
                    _progress(m), _eta(m["eta_seconds"]),
                    "" if m["divergences"] is None else str(m["divergences"]), note)
    return t


def totals_line(st: dict[str, Any]) -> str:
    states = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in st["totals"]["states"].items())
    line = (f"{len(st['members'])} members: {states}; {st['totals']['rows_copied']} rows copied, "
            f"{st['totals']['divergences']} open divergences")
    if st["stopped"]:
        line += f"\nstopped ({st['stopped']['reason']}): {st['stopped']['message']}"
    if st["runner"]:
        line += f"\nrun by {st['runner']['owner']}"
    return line


def status(con: Consoles, st: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, st)
        return
    console.table(con.out, members_table(st))
    console.say(con.out, totals_line(st))


def live(st: dict[str, Any]) -> RenderableType:
    """The watch's screen: the members' table, the totals, the fleet's last events."""
    events = Text("\n".join(f"{e['at']}  {e['member'] or '-'}  {e['message']}" for e in st["events"][-6:]))
    return Group(members_table(st), Text(totals_line(st)), events)


def summary(con: Consoles, result: dict[str, Any], as_json: bool) -> None:
    """What a moving command ends with: the fleet's counts by state."""
    if as_json:
        console.as_json(con.out, result)
        return
    for c in result.get("checked", []):  # `fleet check`: each member's verdict
        console.say(con.out, f"{c['member']}: " + ("passes" if c["passed"] else f"refuses (skipped): {c['why']}"))
    states = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in result["states"].items())
    console.say(con.out, f"fleet {result['fleet']}: {result['members']} members: {states}")


@contextmanager
def shown(out: Console) -> Iterator[Callable[[dict[str, Any]], None]]:
    """`fleet watch`: the full screen on a terminal (put back when it ends, Ctrl-C included); off
    one, the totals line per reading."""
    if not out.is_terminal:
        yield lambda st: console.say(out, totals_line(st).replace("\n", "; "))
        return
    from rich.live import Live  # only on a terminal
    with Live(console=out, screen=True, auto_refresh=False) as screen:
        yield lambda st: screen.update(live(st), refresh=True)


def initialised(con: Consoles, revisions: dict[str, str], as_json: bool) -> None:
    if as_json:
        console.as_json(con.out, revisions)
        return
    for member, revision in revisions.items():
        console.say(con.out, f"{member}: control schema at revision {revision}")
