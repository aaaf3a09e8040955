"""Context.plan (mover/engines/context.py) parses the migration row's plan once per document, and
follows the row: a row a `mover set` changed, installed by use() or refresh() (or assigned, as
family() does), is parsed afresh. No database: the Context runs no transaction here."""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from mover.engines import context as context_module
from mover.engines.context import Context
from mover.names import QualifiedName
from mover.plan import plan_from_canonical
from mover.state import control


class _Db:
    """What a Context asks of its Database when it is made and given a row: the settings pinned."""

    def __init__(self) -> None:
        self.pinned: list[dict[str, str]] = []

    def pin(self, settings: dict[str, str]) -> None:
        self.pinned.append(settings)


def _row(plan: dict[str, Any]) -> control.Migration:
    now = datetime.now(UTC)
    return control.Migration(
        id=7, name="orders-bigint", plan=plan, plan_hash="", source=QualifiedName("public", "orders"),
        target=QualifiedName("public", "orders_new"), old=QualifiedName("public", "orders_old"), key_columns=["id"],
        step="backfill", state="running", paused=False, error=None, created_at=now, updated_at=now, cutover_at=None,
        cutover_lock_ms=None, window_ends_at=None, finished_at=None, lease_owner=None, lease_host=None,
        lease_pid=None, lease_expires_at=None, settings={"search_path": "public"})


def _document(range_rows: int) -> dict[str, Any]:
    doc = plan_from_canonical({}).canonical()
    doc["backfill"]["range_rows"] = range_rows
    # As a row read from the database holds it: a document of its own (JSON).
    return json.loads(json.dumps(doc))


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The documents Context.plan parsed, in order."""
    seen: list[dict[str, Any]] = []

    def counted(doc: dict[str, Any]):
        seen.append(doc)
        return plan_from_canonical(doc)

    monkeypatch.setattr(context_module, "plan_from_canonical", counted)
    return seen


def test_reading_the_plan_twice_parses_it_once(parses):
    db = _Db()
    ctx = Context(db=db, migration=_row(_document(2000)), owner="test")  # type: ignore[arg-type]
    assert db.pinned == [{"search_path": "public"}]
    first = ctx.plan
    second = ctx.plan
    assert first.backfill.range_rows == 2000
    assert second is first
    assert len(parses) == 1


def test_a_row_read_again_keeps_the_parse_and_a_changed_plan_is_seen(parses):
    ctx = Context(db=_Db(), migration=_row(_document(2000)), owner="test")  # type: ignore[arg-type]
    before = ctx.plan
    assert len(parses) == 1
    # refresh() reads the row again: another document, the same plan. No parse.
    ctx.use(_row(copy.deepcopy(ctx.migration.plan)))
    assert ctx.plan is before and len(parses) == 1
    # `mover set backfill.range_rows = 500`, then the row read again: the new value.
    ctx.use(_row(_document(500)))
    after = ctx.plan
    assert after.backfill.range_rows == 500 and len(parses) == 2
    assert ctx.plan is after and len(parses) == 2
    # A row assigned rather than used (Context.family() does so for its members): followed too.
    ctx.migration = dataclasses.replace(ctx.migration, plan=_document(3000))
    assert ctx.plan.backfill.range_rows == 3000 and len(parses) == 3
