"""The per-attempt timeline of `mover history` and the report, from the events alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mover.views.history import attempts

T0 = datetime(2026, 12, 1, 21, 0, tzinfo=UTC)


def ev(s: float, step: str | None, kind: str, message: str = "", detail: dict | None = None,
       duration_ms: float | None = None) -> dict:
    return {"at": T0 + timedelta(seconds=s), "step": step, "kind": kind, "message": message or kind,
            "detail": detail, "duration_ms": duration_ms}


def test_each_attempt_failure_rollback_and_second_cutover_is_its_own_row():
    story = [
        ev(0, "reconcile", "step_started"), ev(30, "reconcile", "step_done"),
        ev(30, "cutover", "step_started"), ev(31, "cutover", "waiting", "ready for cutover"),
        ev(100, "cutover", "step_started"), ev(130, "cutover", "failed", "could not lock public.t"),
        ev(200, "cutover", "step_started"),
        ev(201.3, "cutover", "step_done", detail={"lock_ms": 17.6}, duration_ms=17.6),
        ev(201.3, "rollback_window", "step_started"),
        ev(500, "rollback_window", "rolled_back", "swapped back; lock held 47.5 ms", {"lock_ms": 47.5}, 47.5),
        ev(600, "reconcile", "step_started"), ev(620, "reconcile", "step_done"),
        ev(700, "cutover", "step_started"), ev(750, "cutover", "step_started"),  # the first one's process died
        ev(751.3, "cutover", "step_done", detail={"lock_ms": 22.4}, duration_ms=22.4),
    ]
    rows = [(a["step"], a["outcome"], a["seconds"], a["lock_ms"]) for a in attempts(story)]
    assert rows == [
        ("reconcile", "done", 30.0, None),
        ("cutover", "waiting", 1.0, None),
        ("cutover", "failed", 30.0, None),
        ("cutover", "done", 1.3, 17.6),
        ("rollback_window", "rolled back", 298.7, None),
        ("rollback", "done", None, 47.5),
        ("reconcile", "done", 20.0, None),
        ("cutover", "interrupted", 50.0, None),
        ("cutover", "done", 1.3, 22.4),
    ], rows
    failed = [a for a in attempts(story) if a["outcome"] == "failed"]
    assert failed[0]["message"] == "could not lock public.t"
