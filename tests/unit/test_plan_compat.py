"""Plans read today store and hash exactly as they did before the settings were declared once.

Migrations registered by an earlier mover keep their canonical plan in the control table and
are reloaded by `plan_from_canonical`; the shape hash decides whether a plan file is the same
migration. `plan_compat.json` holds, for every example plan in plans/ and for the plans below,
what the code on main at e5b02a5 (before the declarations) computed: the canonical form (key
order included), the shape hash, the document `mover set` edits, the canonical form of a
stored plan read back, and every problem of each bad plan. It was written once by that code
and must not be regenerated from the current code: it is the proof that nothing moved.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from mover.errors import PlanError
from mover.plan import load_plan, parse_plan, plan_from_canonical, to_document

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("plan_compat.json")


def _base(**sections: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"migration": {"name": "orders-bigint", "source": "orders"}, "rollback": {"window": "24h"}}
    out.update(sections)
    return out


MONTHLY = {"by": "range", "column": "created_at", "interval": "1 month", "accept_key_change": True}

# Representative plans: every key of every section set away from its default at least once.
GOOD: dict[str, dict[str, Any]] = {
    "minimal": _base(),
    "every-key": {
        "migration": {"name": "orders_v2", "source": 'Sales."Order Items"'},
        "target": {"name": '"Order Items_v2"', "columns": {"id": "bigint", "Total Amount": " numeric(14,2) ",
                                                          "code": "varchar(5)", "b": "text"},
                   "accept_lossy": ["code", "Total Amount", "code"],
                   "drop_foreign_keys": ["order_items_customer_fkey", 'Odd "FK"']},
        "backfill": {"range_rows": 500, "target_range_ms": 250, "min_rows": 100, "max_rows": 5000, "workers": 4,
                     "max_rows_per_second": 9000, "max_replica_lag": "2min", "max_attempts": 7,
                     "synchronous_commit": True, "index_builds": 3},
        "cutover": {"auto": True, "lock_timeout": "1.5s", "attempts": 7, "terminate_blockers": True,
                    "blocker_grace": "90s", "accept_parity": ["grant:SELECT TO PUBLIC", "owner", "owner"]},
        "rollback": {"window": "2d", "old_name": "order_items_before", "keep_old": True},
        "reconcile": {"workers": 3, "range_rows": 250_000, "before_cutover": False, "settle_rounds": 20,
                      "max_attempts": 9, "max_rows_per_second": 123},
    },
    "legacy-chunk-keys": _base(backfill={"chunk_rows": 777, "target_chunk_ms": 250}),
    "legacy-and-new-keys": _base(backfill={"chunk_rows": 1, "range_rows": 2}),
    "max-rows-follows-range-rows": _base(backfill={"range_rows": 300_000}),
    "zero-durations": _base(rollback={"window": "0s"}, cutover={"lock_timeout": "60s", "blocker_grace": "0"},
                            backfill={"max_replica_lag": "0s"}),
    "odd-durations": _base(rollback={"window": "1.5h"}, cutover={"lock_timeout": "1ms", "blocker_grace": "10min"},
                           backfill={"max_replica_lag": "250ms"}),
    "empty-sections": _base(target={}, backfill={}, cutover={}, reconcile={}, hooks={}),
    "qualified-names": _base(migration={"name": "m", "source": "Public.Orders"},
                             target={"name": "public.orders_v2"}, rollback={"window": "1h", "old_name": "orders_x"}),
    "range-monthly-upkeep": _base(migration={"name": "events", "source": "events"},
                                  target={"partition": {**MONTHLY, "premake": 6, "default": True}},
                                  partitions={"premake": 4, "retention": "24 months", "drop_detached": True}),
    "range-daily": _base(target={"partition": {"by": "range", "column": "logged_at", "interval": "1 Day",
                                               "premake": 0}}),
    "range-weekly-named": _base(target={"partition": {"by": "range", "column": "c", "interval": "1 week",
                                                      "name": "{table}_w{YYYY}{MM}{DD}"}}),
    "range-yearly": _base(target={"partition": {"by": "range", "column": "c", "interval": "1 year"}}),
    "range-integer": _base(target={"partition": {"by": "range", "column": "id", "interval": 100_000}},
                           partitions={"manager": "pg_partman"}),
    "hash": _base(target={"partition": {"by": "hash", "columns": ["tenant_id"], "modulus": 16}}),
    "list-one-column": _base(target={"partition": {"by": "list", "column": "region", "default": True,
                                                   "values": {"eu": ["de", "fr"], "us": ["us"]}}}),
    "list-two-columns": _base(target={"partition": {"by": "list", "columns": ["a", "b"], "name": "{table}_{N}",
                                                    "values": {"x": [["a", 1], ["b", 2]], "y": [["c", 3]]}}}),
    "pg-partman": _base(target={"partition": MONTHLY},
                        partitions={"manager": "pg_partman", "retention": "12 months", "premake": 2}),
    "hooks": _base(hooks={"before_cutover": {"command": "true"}, "after_cutover": {"sql": "SELECT 1", "timeout": "2s"},
                          "before_rollback": {"command": "echo b"}, "after_rollback": {"sql": "SELECT 2"},
                          "before_retire": {"command": "x", "timeout": "1h"},
                          "after_retire": {"sql": "SELECT 3", "timeout": "1ms"}}),
}

# Stored canonical forms of older mover versions, with keys that did not exist yet left out.
def _older() -> dict[str, dict[str, Any]]:
    stored = parse_plan(GOOD["every-key"]).canonical()
    out = {}
    for name, drop in [("no-reconcile", [("reconcile",)]), ("no-index-builds", [("backfill", "index_builds")]),
                       ("no-drop-foreign-keys", [("drop_foreign_keys",)]),
                       ("no-accept-parity", [("cutover", "accept_parity")]),
                       ("no-accept-lossy", [("target", "accept_lossy")]),
                       ("no-partitions", [("partition",), ("partitions",), ("hooks",)])]:
        doc = json.loads(json.dumps(stored))
        for path in drop:
            (doc[path[0]] if len(path) == 2 else doc).pop(path[-1])
        out[name] = doc
    chunk = json.loads(json.dumps(stored))
    chunk["backfill"] = {("chunk_rows" if k == "range_rows" else "target_chunk_ms" if k == "target_range_ms" else k): v
                         for k, v in chunk["backfill"].items()}
    out["chunk-keys"] = chunk
    return out


# Bad plans: the problems each reports (message and hint), whatever their order.
BAD: dict[str, dict[str, Any]] = {
    "unknown-section": _base(extra={"x": 1}),
    "section-not-a-table": {"migration": "orders", "rollback": {"window": "1h"}},
    "rollback-not-a-table": {"migration": {"name": "m", "source": "t"}, "rollback": "1h"},
    "unknown-keys": _base(migration={"name": "m", "source": "t", "sorce": "t"}, target={"column": {}},
                          backfill={"range_size": 10}, cutover={"lock_timeout_ms": 200},
                          rollback={"window": "1h", "keep": True}, reconcile={"worker": 1},
                          partitions={"retain": 1}),
    "missing-everything": {},
    "missing-window": {"migration": {"name": "m", "source": "t"}, "rollback": {}},
    "wrong-types": _base(migration={"name": 7, "source": ["t"]},
                         target={"name": 1, "columns": "id bigint", "accept_lossy": "code", "drop_foreign_keys": "fk",
                                 "partition": "range"},
                         backfill={"range_rows": "10", "min_rows": True, "max_rows": 1.5, "workers": "2",
                                   "max_rows_per_second": "x", "max_replica_lag": 30, "max_attempts": False,
                                   "synchronous_commit": 0, "index_builds": "0", "target_range_ms": []},
                         cutover={"auto": "yes", "lock_timeout": 200, "attempts": "3", "terminate_blockers": 1,
                                  "blocker_grace": 5, "accept_parity": "x"},
                         rollback={"window": 24, "old_name": 5, "keep_old": "no"},
                         reconcile={"workers": "1", "range_rows": 1.0, "before_cutover": "yes", "settle_rounds": "2",
                                    "max_attempts": "3", "max_rows_per_second": True},
                         partitions={"premake": "3", "retention": 12, "drop_detached": "no", "manager": 1},
                         hooks={"before_cutover": "true"}),
    "out-of-range": _base(backfill={"range_rows": 0, "min_rows": 20_000_000, "max_rows": -1, "workers": 65,
                                    "max_rows_per_second": -1, "max_attempts": 101, "index_builds": 65,
                                    "target_range_ms": 9},
                          cutover={"lock_timeout": "2min", "attempts": 0, "blocker_grace": "11min",
                                   "accept_parity": ["", "x"]},
                          reconcile={"workers": 0, "range_rows": 99, "settle_rounds": 1001, "max_attempts": 0,
                                     "max_rows_per_second": -5}),
    "min-above-max": _base(backfill={"min_rows": 5000, "max_rows": 4000}),
    "zero-lock-timeout": _base(cutover={"lock_timeout": "0s"}),
    "bad-durations": _base(rollback={"window": "1 week"}, cutover={"lock_timeout": "fast", "blocker_grace": "-1s"},
                           backfill={"max_replica_lag": "30"}),
    "bad-names": _base(migration={"name": "has space", "source": "a.b.c"}, target={"name": '""'},
                       rollback={"window": "1h", "old_name": "1old"}),
    "bad-columns": _base(target={"columns": {"id": 8, "x": "  ", "ok": "int"}, "accept_lossy": ["nope", 7, "ok"]}),
    "bad-drop-foreign-keys": _base(target={"drop_foreign_keys": ["fk", "fk"]}),
    "partitions-without-partition": _base(partitions={"premake": 2, "retention": "12 months"}),
    "bad-partitions": _base(target={"partition": {"by": "range", "column": "id", "interval": 10}},
                            partitions={"premake": 1001, "retention": "soon", "manager": "cron"}),
    "bad-retention": _base(target={"partition": MONTHLY}, partitions={"retention": "soon"}),
    "partman-hash": _base(target={"partition": {"by": "hash", "column": "c", "modulus": 4}},
                          partitions={"manager": "pg_partman"}),
    "partman-week": _base(target={"partition": {**MONTHLY, "interval": "1 week"}},
                          partitions={"manager": "pg_partman"}),
    "partman-name": _base(target={"partition": {**MONTHLY, "name": "{table}_m{YYYY}{MM}"}},
                          partitions={"manager": "pg_partman"}),
    "partman-premake": _base(target={"partition": MONTHLY}, partitions={"manager": "pg_partman", "premake": 0}),
    "partition-by": _base(target={"partition": {"by": "tree", "column": "a"}}),
    "partition-unknown-key": _base(target={"partition": {**MONTHLY, "bogus": 1}}),
    "partition-type": _base(target={"partition": {**MONTHLY, "default": "yes"}}),
    "partition-modulus": _base(target={"partition": {"by": "hash", "column": "a", "modulus": 1}}),
    "partition-name": _base(target={"partition": {**MONTHLY, "name": "{table}_{YYYY}"}}),
    "hook-both": _base(hooks={"before_cutover": {"command": "true", "sql": "SELECT 1"}}),
    "hook-unknown-key": _base(hooks={"before_cutover": {"command": "true", "retries": "2"}}),
    "hook-empty": _base(hooks={"before_cutover": {"command": ""}}),
    "hook-timeout": _base(hooks={"before_cutover": {"command": "true", "timeout": "2h"},
                                 "after_cutover": {"command": "true", "timeout": "soon"}}),
    "hook-unknown-event": _base(hooks={"during_cutover": {"command": "true"}}),
}


def _problems(document: dict[str, Any]) -> list[list[str]]:
    with pytest.raises(PlanError) as info:
        parse_plan(document)
    return sorted([p.message, p.hint or ""] for p in info.value.problems)


def compute() -> dict[str, Any]:
    """What the fixture records, computed with the code at hand."""
    plans = {f"plans/{p.name}": load_plan(p) for p in sorted((ROOT / "plans").glob("*.toml"))}
    plans.update({name: parse_plan(doc) for name, doc in GOOD.items()})
    good = {}
    for name, plan in plans.items():
        canonical = plan.canonical()
        good[name] = {
            "canonical": json.dumps(canonical),
            "shape_hash": plan.shape_hash(),
            "shape_hash_public": plan.shape_hash("public"),
            "document": json.dumps(to_document(plan)),
            "reloaded": json.dumps(plan_from_canonical(json.loads(json.dumps(canonical))).canonical()),
        }
    older = {}
    for name, stored in _older().items():
        plan = plan_from_canonical(stored)
        older[name] = {"canonical": json.dumps(plan.canonical()), "shape_hash": plan.shape_hash("public")}
    return {"good": good, "older": older, "bad": {name: _problems(doc) for name, doc in BAD.items()}}


EXPECTED = json.loads(FIXTURE.read_text())


@functools.cache
def now() -> dict[str, Any]:
    return compute()


def test_the_fixture_covers_every_example_plan_and_case():
    examples = {f"plans/{p.name}" for p in (ROOT / "plans").glob("*.toml")}
    assert examples <= set(EXPECTED["good"]), "an example plan without a recorded canonical form"
    assert set(EXPECTED["good"]) == examples | set(GOOD)
    assert set(EXPECTED["bad"]) == set(BAD) and set(EXPECTED["older"]) == set(_older())


@pytest.mark.parametrize("name", sorted(EXPECTED["good"]))
def test_canonical_form_and_hash_are_unchanged(name):
    expected, got = EXPECTED["good"][name], now()["good"][name]
    assert got["canonical"] == expected["canonical"]  # byte for byte, key order included
    assert got["shape_hash"] == expected["shape_hash"]
    assert got["shape_hash_public"] == expected["shape_hash_public"]
    assert got["reloaded"] == expected["reloaded"]


@pytest.mark.parametrize("name", sorted(EXPECTED["good"]))
def test_document_for_mover_set_is_unchanged(name):
    """What `mover set` edits and parses again: the same tables and values (TOML has no key order)."""
    assert json.loads(now()["good"][name]["document"]) == json.loads(EXPECTED["good"][name]["document"])


@pytest.mark.parametrize("name", sorted(EXPECTED["older"]))
def test_plans_stored_by_older_versions_read_back_the_same(name):
    assert now()["older"][name] == EXPECTED["older"][name]


@pytest.mark.parametrize("name", sorted(EXPECTED["bad"]))
def test_bad_plans_report_the_same_problems(name):
    assert now()["bad"][name] == EXPECTED["bad"][name]
