"""Plan files without a database: parsing, defaults, durations, names, and the shape hash."""

from __future__ import annotations

import textwrap

import pytest

from mover.errors import PlanError
from mover.names import NAMEDATALEN, QualifiedName, derived, display_ident, parse_qualified
from mover.plan import Plan, load_plan, parse_duration_ms, parse_plan, plan_from_canonical, to_document

MINIMAL = {"migration": {"name": "orders-bigint", "source": "orders"}, "rollback": {"window": "24h"}}


def doc(**sections) -> dict:
    """MINIMAL with some sections replaced or added (a value of None removes the section)."""
    out = {k: dict(v) for k, v in MINIMAL.items()}
    for section, value in sections.items():
        if value is None:
            out.pop(section, None)
        else:
            out[section] = value
    return out


def bad(document: dict) -> PlanError:
    with pytest.raises(PlanError) as info:
        parse_plan(document)
    assert info.value.exit_code == 2
    return info.value


# ---------------------------------------------------------------------------------------------
# Good plans


def test_old_chunk_keys_are_read_as_the_range_keys_for_one_release(caplog):
    plan = parse_plan(doc(backfill={"chunk_rows": 777, "target_chunk_ms": 250}))
    assert (plan.backfill.range_rows, plan.backfill.target_range_ms) == (777, 250)
    assert "chunk_rows is now called range_rows" in caplog.text
    # a plan stored before the rename (canonical form with the old keys) still loads
    stored = plan.canonical()
    stored["backfill"]["chunk_rows"] = stored["backfill"].pop("range_rows")
    assert plan_from_canonical(stored).backfill.range_rows == 777
    # the new spelling wins over the old when both are given
    both = parse_plan(doc(backfill={"chunk_rows": 1, "range_rows": 2}))
    assert both.backfill.range_rows == 2


def test_minimal_plan_gets_defaults():
    plan = parse_plan(doc())
    assert plan.name == "orders-bigint"
    assert plan.source == QualifiedName(None, "orders")
    assert plan.target is None
    assert plan.columns == {}
    assert plan.backfill.range_rows == 10_000
    assert plan.cutover.auto is False
    assert plan.cutover.lock_timeout_ms == 200
    assert plan.cutover.attempts == 30
    assert plan.rollback.window_ms == 24 * 3_600_000
    assert plan.rollback.old_name is None
    assert plan.rollback.keep_old is False


def test_full_plan(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(textwrap.dedent('''
        [migration]
        name = "orders_v2"
        source = 'Sales."Order Items"'

        [target]
        name = '"Order Items_v2"'
        columns = { id = "bigint", "Total Amount" = " numeric(14,2) " }

        [backfill]
        range_rows = 500

        [cutover]
        auto = true
        lock_timeout = "1.5s"
        attempts = 7

        [rollback]
        window = "0s"
        old_name = "order_items_before"
        keep_old = true
    '''))
    plan = load_plan(path)
    assert plan.source == QualifiedName("sales", "Order Items")
    assert plan.target == QualifiedName(None, "Order Items_v2")
    assert plan.columns == {"id": "bigint", "Total Amount": "numeric(14,2)"}
    assert plan.backfill.range_rows == 500
    assert (plan.cutover.auto, plan.cutover.lock_timeout_ms, plan.cutover.attempts) == (True, 1500, 7)
    assert plan.rollback.window_ms == 0
    assert plan.rollback.old_name == QualifiedName(None, "order_items_before")
    assert plan.rollback.keep_old is True
    # The canonical form round-trips, and so does its hash.
    again = plan_from_canonical(plan.canonical())
    assert again == plan
    assert again.shape_hash() == plan.shape_hash()


@pytest.mark.parametrize("text, ms", [
    ("200ms", 200), ("0s", 0), ("0", 0), ("30s", 30_000), ("30 sec", 30_000), ("5min", 300_000),
    ("5m", 300_000), ("24h", 86_400_000), ("2d", 172_800_000), ("1.5s", 1500), (" 10ms ", 10),
])
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "10", "-1s", "1e3s", "5 minutes", "ms", "1.s", "1,5s", "24 hours", "0x10s"])
def test_invalid_durations(text):
    with pytest.raises(ValueError):
        parse_duration_ms(text)


def test_window_duration_in_plan():
    assert parse_plan(doc(rollback={"window": "200ms"})).rollback.window_ms == 200
    assert parse_plan(doc(rollback={"window": "0s"})).rollback.window_ms == 0
    assert parse_plan(doc(cutover={"lock_timeout": "60s"})).cutover.lock_timeout_ms == 60_000
    assert parse_plan(doc(cutover={"lock_timeout": "1ms"})).cutover.lock_timeout_ms == 1


@pytest.mark.parametrize("text, expected", [
    ('public."Orders"', QualifiedName("public", "Orders")),
    ("Public.Orders", QualifiedName("public", "orders")),
    ("ORDERS", QualifiedName(None, "orders")),
    ('"Sales"."Order Items"', QualifiedName("Sales", "Order Items")),
    ('"a.b"."c.d"', QualifiedName("a.b", "c.d")),
    ('"say ""hi"""', QualifiedName(None, 'say "hi"')),
    ('  public . orders  ', QualifiedName("public", "orders")),
    ("t$1._x9", QualifiedName("t$1", "_x9")),
    ('"; DROP TABLE x; --"', QualifiedName(None, "; DROP TABLE x; --")),
    # PostgreSQL folds only ASCII letters of an unquoted name (in a UTF-8 database).
    ("ÉTÉ.Straße", QualifiedName("ÉtÉ", "straße")),
    ("café", QualifiedName(None, "café")),
])
def test_parse_qualified(text, expected):
    assert parse_qualified(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("a.b.c", "3 dot-separated parts"),
    ('db."s".t', "3 dot-separated parts"),
    ("", "expected a name"),
    ("   ", "expected a name"),
    ("a.", "expected a name"),
    (".a", "invalid unquoted identifier"),
    ("a..b", "invalid unquoted identifier"),
    ('"abc', "unterminated quoted identifier"),
    ('""', "empty quoted identifier"),
    ("1abc", "invalid unquoted identifier"),
    ("$x", "invalid unquoted identifier"),
    ("order items", "unexpected 'i'"),
    ("orders;drop", "unexpected ';'"),
    ('"a"b', "unexpected 'b'"),
    ("x" * 64, "longer than 63 bytes"),
    ('"' + "é" * 32 + '"', "longer than 63 bytes"),  # 64 bytes, 32 characters
])
def test_parse_qualified_rejects(text, fragment):
    with pytest.raises(ValueError) as info:
        parse_qualified(text)
    assert fragment in str(info.value)


def test_longest_names_fit():
    assert parse_qualified("x" * 63) == QualifiedName(None, "x" * 63)
    assert parse_qualified('"' + "é" * 31 + 'x"').name == "é" * 31 + "x"  # 63 bytes


def test_display_and_str_quote_like_sql():
    assert display_ident('a"b') == '"a""b"'
    assert str(QualifiedName("Sales", "Order Items")) == '"Sales"."Order Items"'
    assert str(QualifiedName(None, "orders")) == '"orders"'
    # What str() prints parses back to the same name.
    for qn in (QualifiedName("Sa.les", 'it"s'), QualifiedName(None, "UPPER")):
        assert parse_qualified(str(qn)) == qn


def test_derived_short_names_are_plain():
    assert derived("orders", "_new") == "orders_new"
    exact = "a" * (NAMEDATALEN - 4)
    assert derived(exact, "_new") == exact + "_new"


def test_derived_long_names_fit_and_stay_unique():
    a = "x" * 70 + "_alpha"
    b = "x" * 70 + "_beta"
    da, db = derived(a, "_new"), derived(b, "_new")
    for d in (da, db):
        assert len(d.encode()) <= NAMEDATALEN
        assert d.endswith("_new")
    assert da != db  # same first 63 bytes, told apart by the hash
    assert derived(a, "_new") == da  # deterministic
    assert derived(a, "_old") != da
    # One character over the limit is already shortened.
    just_over = "y" * (NAMEDATALEN - 3)
    assert len(derived(just_over, "_new").encode()) <= NAMEDATALEN
    assert derived(just_over, "_new") != derived(just_over[:-1] + "z", "_new")


def test_derived_multibyte_names_are_cut_on_character_boundaries():
    base = "ü" * 40  # 80 bytes
    d = derived(base, "_old")
    assert len(d.encode()) <= NAMEDATALEN
    d.encode().decode()  # valid UTF-8
    assert d.startswith("ü") and d.endswith("_old")


# ---------------------------------------------------------------------------------------------
# Bad plans: every message names the key


@pytest.mark.parametrize("document, fragments", [
    (doc(extra={"x": 1}), ["unknown section [extra]", "known sections"]),
    (doc(migration={"name": "m", "source": "t", "sorce": "t"}), ["unknown key [migration] sorce"]),
    (doc(target={"name": "t2", "column": {}}), ["unknown key [target] column"]),
    (doc(backfill={"range_size": 10}), ["unknown key [backfill] range_size"]),
    (doc(cutover={"lock_timeout_ms": 200}), ["unknown key [cutover] lock_timeout_ms"]),
    (doc(rollback={"window": "1h", "keep": True}), ["unknown key [rollback] keep"]),
    (doc(migration={"source": "t"}), ["missing required key [migration] name"]),
    (doc(migration={"name": "m"}), ["missing required key [migration] source"]),
    (doc(migration=None), ["missing required key [migration] name"]),
    (doc(rollback={}), ["missing required key [rollback] window"]),
    (doc(rollback=None), ["missing required key [rollback] window"]),
    (doc(backfill={"range_rows": "10"}), ["[backfill] range_rows must be an integer", "'10'"]),
    (doc(backfill={"range_rows": True}), ["[backfill] range_rows must be an integer", "boolean"]),
    (doc(backfill={"range_rows": 10.5}), ["[backfill] range_rows must be an integer"]),
    (doc(backfill={"range_rows": 0}), ["[backfill] range_rows must be between 1 and"]),
    (doc(backfill={"range_rows": -5}), ["[backfill] range_rows must be between 1 and"]),
    (doc(cutover={"auto": "yes"}), ["[cutover] auto must be a boolean", "'yes'"]),
    (doc(cutover={"auto": 1}), ["[cutover] auto must be a boolean"]),
    (doc(cutover={"attempts": 0}), ["[cutover] attempts must be between 1 and 1000"]),
    (doc(cutover={"attempts": "3"}), ["[cutover] attempts must be an integer"]),
    (doc(cutover={"lock_timeout": 200}), ["[cutover] lock_timeout must be a string"]),
    (doc(cutover={"lock_timeout": "200"}), ["[cutover] lock_timeout", "not a duration"]),
    (doc(cutover={"lock_timeout": "fast"}), ["[cutover] lock_timeout", "not a duration"]),
    (doc(cutover={"lock_timeout": "0s"}), ["[cutover] lock_timeout must be between 1ms and 60s", "'0s'"]),
    (doc(cutover={"lock_timeout": "2min"}), ["[cutover] lock_timeout must be between 1ms and 60s", "'2min'"]),
    (doc(rollback={"window": "1 week"}), ["[rollback] window", "not a duration"]),
    (doc(rollback={"window": 24}), ["[rollback] window must be a string"]),
    (doc(rollback={"window": "-1h"}), ["[rollback] window", "not a duration"]),
    (doc(rollback={"window": "1h", "keep_old": "no"}), ["[rollback] keep_old must be a boolean"]),
    (doc(rollback={"window": "1h", "old_name": 5}), ["[rollback] old_name must be a string"]),
    (doc(migration={"name": 7, "source": "t"}), ["[migration] name must be a string"]),
    (doc(migration={"name": "m", "source": ["t"]}), ["[migration] source must be a string"]),
    (doc(migration={"name": "", "source": "t"}), ["[migration] name ''"]),
    (doc(migration={"name": "has space", "source": "t"}), ["[migration] name 'has space'"]),
    (doc(migration={"name": "m#3", "source": "t"}), ["[migration] name 'm#3'"]),
    (doc(migration={"name": "x" * 64, "source": "t"}), ["[migration] name"]),
    (doc(migration={"name": "m", "source": "a.b.c"}), ["[migration] source", "3 dot-separated parts"]),
    (doc(migration={"name": "m", "source": '"Orders'}), ["[migration] source", "unterminated"]),
    (doc(migration={"name": "m", "source": "orders; drop table x"}), ["[migration] source", "unexpected"]),
    (doc(migration={"name": "m", "source": ""}), ["[migration] source", "expected a name"]),
    (doc(target={"name": "x.y.z"}), ["[target] name", "3 dot-separated parts"]),
    (doc(target={"name": '""'}), ["[target] name", "empty quoted identifier"]),
    (doc(target={"columns": "id bigint"}), ["[target] columns must be a table"]),
    (doc(target={"columns": {"id": 8}}), ["[target] columns", "'id'", "non-empty string"]),
    (doc(target={"columns": {"id": "  "}}), ["[target] columns", "'id'", "non-empty string"]),
    (doc(rollback={"window": "1h", "old_name": "1old"}), ["[rollback] old_name", "invalid unquoted identifier"]),
    ({"migration": "orders", "rollback": {"window": "1h"}}, ["[migration] must be a table"]),
])
def test_bad_plans_name_the_key(document, fragments):
    message = str(bad(document))
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_error_names_the_file(tmp_path):
    path = tmp_path / "orders.toml"
    path.write_text('[migration]\nname = "m"\nsource = "t"\n[rollback]\nwindow = "1h"\n[backfill]\nrange_rows = "10"\n')
    with pytest.raises(PlanError) as info:
        load_plan(path)
    assert str(path) in info.value.message
    assert "[backfill] range_rows" in info.value.message


@pytest.mark.parametrize("text, fragment", [
    ("[migration\nname = 'm'\n", "not valid TOML"),
    ("[migration]\nname = m\n", "not valid TOML"),
    ("[migration]\nname = 'a'\nname = 'b'\n", "not valid TOML"),  # duplicate key
    ("[rollback]\nwindow = \"1h\"\n", "missing required key [migration] name"),
    ("", "missing required key [migration] name"),
])
def test_load_plan_rejects_bad_files(tmp_path, text, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(PlanError) as info:
        load_plan(path)
    assert info.value.exit_code == 2
    assert fragment in info.value.message


def test_load_plan_missing_file(tmp_path):
    with pytest.raises(PlanError) as info:
        load_plan(tmp_path / "nope.toml")
    assert "cannot read plan file" in info.value.message and "nope.toml" in info.value.message


# ---------------------------------------------------------------------------------------------
# The shape hash


def _hash(**sections) -> str:
    return parse_plan(doc(**sections)).shape_hash()


def test_shape_hash_ignores_tunables():
    base = _hash()
    assert _hash(backfill={"range_rows": 7}) == base
    assert _hash(cutover={"auto": True, "lock_timeout": "1s", "attempts": 3}) == base
    assert _hash(rollback={"window": "0s", "keep_old": True}) == base


def test_shape_hash_includes_the_old_name_and_qualifies_names_with_the_source_schema():
    assert _hash(rollback={"window": "1h", "old_name": "orders_before"}) != _hash()
    plain = parse_plan(doc(migration={"name": "orders-bigint", "source": "orders"}))
    qualified = parse_plan(doc(migration={"name": "orders-bigint", "source": "public.orders"}))
    assert plain.shape_hash("public") == qualified.shape_hash("public")
    assert plain.shape_hash("sales") != qualified.shape_hash("sales")


@pytest.mark.parametrize("sections", [
    {"migration": {"name": "orders-bigint", "source": "sales.orders"}},
    {"migration": {"name": "orders-bigint", "source": "invoices"}},
    {"migration": {"name": "orders-bigint", "source": '"Orders"'}},
    {"target": {"name": "orders_v2"}},
    {"target": {"columns": {"id": "bigint"}}},
    {"target": {"columns": {"id": "int8"}}},
    {"target": {"columns": {"other": "bigint"}}},
])
def test_shape_hash_changes_with_the_shape(sections):
    assert _hash(**sections) != _hash()


def test_shape_hash_does_not_depend_on_column_order():
    a = _hash(target={"columns": {"a": "bigint", "b": "text"}})
    b = _hash(target={"columns": {"b": "text", "a": "bigint"}})
    assert a == b


def test_plans_compare_without_their_document():
    a = parse_plan(doc())
    b = parse_plan({**doc(), "backfill": {}})
    assert isinstance(a, Plan) and a == b


# ---------------------------------------------------------------------------------------------
# [target] drop_foreign_keys: outbound foreign keys the operator accepts to lose at the swap


def test_drop_foreign_keys_parse_store_and_survive_mover_set():
    from mover.plan import to_document
    plan = parse_plan(doc(target={"drop_foreign_keys": ["invoices_customer_id_fkey", 'Odd "FK"']}))
    assert plan.drop_foreign_keys == ("invoices_customer_id_fkey", 'Odd "FK"')
    assert plan_from_canonical(plan.canonical()).drop_foreign_keys == plan.drop_foreign_keys
    assert parse_plan(to_document(plan)).drop_foreign_keys == plan.drop_foreign_keys  # `mover set` rebuilds it
    assert parse_plan(doc()).drop_foreign_keys == ()
    # Older stored plans have no such key: none acknowledged.
    stored = parse_plan(doc()).canonical()
    del stored["drop_foreign_keys"]
    assert plan_from_canonical(stored).drop_foreign_keys == ()


@pytest.mark.parametrize("value, fragment", [
    ("fk", "[target] drop_foreign_keys must be an array"),
    ([1], "must list distinct constraint names"),
    ([""], "must list distinct constraint names"),
    (["fk", "fk"], "must list distinct constraint names"),
])
def test_drop_foreign_keys_bad_values(value, fragment):
    assert fragment in str(bad(doc(target={"drop_foreign_keys": value})))


# ---------------------------------------------------------------------------------------------
# [target] accept_lossy


def test_accept_lossy_is_kept_out_of_the_shape_hash_and_round_trips():
    plan = parse_plan(doc(target={"columns": {"code": "varchar(5)", "n": "bigint"}, "accept_lossy": ["code"]}))
    assert plan.accept_lossy == ("code",)
    again = plan_from_canonical(plan.canonical())
    assert again.accept_lossy == ("code",)
    plain = parse_plan(doc(target={"columns": {"code": "varchar(5)", "n": "bigint"}}))
    assert plain.accept_lossy == () and plan_from_canonical(plain.canonical()).accept_lossy == ()
    assert plan.shape_hash() == plain.shape_hash()


@pytest.mark.parametrize("accept, words", [
    (["nope"], ["[target] accept_lossy", "'nope'", "not a column of [target] columns"]),
    ([7], ["[target] accept_lossy", "7"]),
    ("code", ["[target] accept_lossy must be an array"]),
])
def test_accept_lossy_names_planned_columns(accept, words):
    err = bad(doc(target={"columns": {"code": "varchar(5)"}, "accept_lossy": accept}))
    for w in words:
        assert w in str(err), str(err)


def test_accept_parity_round_trips_and_leaves_older_canonical_forms_alone():
    plan = parse_plan(doc(cutover={"accept_parity": ["grant:SELECT TO PUBLIC", "grant:SELECT TO PUBLIC", "owner"]}))
    assert plan.cutover.accept_parity == ("grant:SELECT TO PUBLIC", "owner")
    assert plan_from_canonical(plan.canonical()).cutover.accept_parity == plan.cutover.accept_parity
    plain = parse_plan(doc())
    assert "accept_parity" not in plain.canonical()["cutover"]  # plans registered before read the same
    assert plan_from_canonical(plain.canonical()).cutover.accept_parity == ()
    assert "accept_parity" in bad(doc(cutover={"accept_parity": ["", "x"]})).message


def test_index_builds_default_to_one_governed_else_the_workers_at_least_two_and_round_trip():
    plain = parse_plan(doc(backfill={"workers": 3}))
    assert plain.throttle.governed and plain.backfill.index_builds == 0
    assert (plain.backfill.index_sessions(True), plain.backfill.index_sessions(False)) == (1, 3)
    ungoverned = parse_plan(doc(backfill={"workers": 3}, throttle={"max_latency_increase": "off"}))
    assert not ungoverned.throttle.governed
    assert parse_plan(doc(throttle={"max_latency_increase": "off", "probe_latency": "5ms"})).throttle.governed
    assert parse_plan(doc(throttle={"max_latency_increase": "off", "max_wal_per_second": "50MB"})).throttle.governed
    assert parse_plan(doc(backfill={"workers": 1})).backfill.index_sessions(False) == 2
    assert parse_plan(doc(backfill={"workers": 1, "index_builds": 1})).backfill.index_sessions(False) == 1
    own = parse_plan(doc(backfill={"workers": 1, "index_builds": 4}))
    assert own.backfill.index_sessions(True) == own.backfill.index_sessions(False) == 4
    assert plan_from_canonical(own.canonical()).backfill.index_sessions(True) == 4
    assert parse_plan(to_document(own)).backfill.index_builds == 4  # what `mover set` re-parses
    stored = plain.canonical()  # a plan registered before the key existed
    del stored["backfill"]["index_builds"]
    assert plan_from_canonical(stored).backfill.index_sessions(False) == 3
    assert "index_builds must be between 0 and 64" in bad(doc(backfill={"index_builds": 65})).message


@pytest.mark.parametrize(("ms", "text"), [(7_200_000, "2h"), (90_000, "90s"), (86_400_000, "1d"), (0, "0"),
                                         (1_500, "1500ms"), (300_000, "5min")])
def test_durations_are_shown_as_the_plan_writes_them(ms, text):
    from mover.plan import duration_text
    assert duration_text(ms) == text and parse_duration_ms(text) == ms
