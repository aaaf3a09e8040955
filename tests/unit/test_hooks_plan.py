"""[hooks.<event>] in the plan: exactly one of sql or command, a timeout, nothing else."""

from __future__ import annotations

import pytest

from mover.errors import PlanError
from mover.plan import Hook, parse_plan, plan_from_canonical, to_document

BASE = {"migration": {"name": "h", "source": "orders"}, "rollback": {"window": "1h"}}


def with_hooks(hooks):
    return parse_plan({**BASE, "hooks": hooks})


def test_hooks_parse_and_survive_the_canonical_form():
    plan = with_hooks({"before_cutover": {"command": "true"}, "after_retire": {"sql": "SELECT 1", "timeout": "2s"}})
    assert plan.hooks == {"before_cutover": Hook(command="true"), "after_retire": Hook(sql="SELECT 1", timeout_ms=2000)}
    assert plan_from_canonical(plan.canonical()).hooks == plan.hooks
    assert parse_plan(to_document(plan)).hooks == plan.hooks


@pytest.mark.parametrize("hooks, message", [
    ({"before_cutover": {"command": "true", "sql": "SELECT 1"}}, "exactly one of sql or command"),
    ({"before_cutover": {"timeout": "1s"}}, "exactly one of sql or command"),
    ({"before_cutover": {"command": "true", "retries": "2"}}, "unknown key [hooks.before_cutover] retries"),
    ({"before_cutover": {"command": ""}}, "must be a non-empty string"),
    ({"before_cutover": {"command": "true", "timeout": "2h"}}, "between 1ms and 1h"),
    ({"during_cutover": {"command": "true"}}, "unknown key [hooks] during_cutover"),
])
def test_bad_hooks_are_refused_naming_the_key(hooks, message):
    with pytest.raises(PlanError) as info:
        with_hooks(hooks)
    assert message in str(info.value)
