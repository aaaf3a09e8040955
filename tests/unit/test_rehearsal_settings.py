"""The query rehearsal's plan settings ([cutover] rehearse, rehearse_statements, rehearse_cost_factor)
round-trip, are settable with `mover set`, and leave the canonical form and the `mover set`
document of a plan that does not use them as they were (plans registered before read the same)."""

from __future__ import annotations

from mover.engines.swap.query_rehearsal import Settings, describe
from mover.errors import PlanError
from mover.plan import SETTABLE, parse_plan, plan_from_canonical, to_document


def doc(**cutover):
    return {"migration": {"name": "m", "source": "orders"}, "rollback": {"window": "1h"}, "cutover": cutover}


def test_left_at_their_defaults_they_are_not_stored_nor_written():
    plain = parse_plan(doc())
    assert (plain.cutover.rehearse, plain.cutover.rehearse_statements, plain.cutover.rehearse_cost_factor) == \
        (False, 20, 2)
    assert not {"rehearse", "rehearse_statements", "rehearse_cost_factor"} & set(plain.canonical()["cutover"])
    assert not {"rehearse", "rehearse_statements", "rehearse_cost_factor"} & set(to_document(plain)["cutover"])
    explicit = parse_plan(doc(rehearse=False, rehearse_statements=20, rehearse_cost_factor=2))
    assert explicit.canonical() == plain.canonical()
    assert describe(plain) == []  # plan check prints nothing of a rehearsal that does not run


def test_set_they_round_trip_and_mover_set_may_change_them():
    plan = parse_plan(doc(rehearse=True, rehearse_statements=50, rehearse_cost_factor=5))
    stored = plan.canonical()["cutover"]
    assert (stored["rehearse"], stored["rehearse_statements"], stored["rehearse_cost_factor"]) == (True, 50, 5)
    assert plan_from_canonical(plan.canonical()) == plan
    assert parse_plan(to_document(plan)) == plan  # what `mover set` re-parses
    assert {"rehearse", "rehearse_statements", "rehearse_cost_factor"} <= SETTABLE["cutover"]
    assert Settings.of(plan) == Settings(statements=50, cost_factor=5, lock_timeout_ms=200)
    assert Settings.of(plan, top=3).statements == 3
    assert "EXPLAIN (never executed) of the 50 statements" in describe(plan)[0]


def test_bounds_are_checked():
    for bad in ({"rehearse_statements": 0}, {"rehearse_cost_factor": 1}, {"rehearse": "yes"}):
        try:
            parse_plan(doc(**bad))
        except PlanError as exc:
            assert f"[cutover] {next(iter(bad))}" in exc.message
        else:
            raise AssertionError(f"{bad} was accepted")
