"""pgoutput's messages as a real server sent them (tests/unit/pgoutput_messages.json, captured by
tests/unit/capture_pgoutput_fixtures.py with the SQL kept beside the bytes), parsed, and the keys
mover logs from each change: what the capture trigger logs for the same statements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mover.engines.capture import pgoutput as p

FIXTURES = json.loads(Path(__file__).with_name("pgoutput_messages.json").read_text())


def messages(case: str) -> list[p.Message]:
    return [p.parse(bytes.fromhex(m)) for m in FIXTURES["cases"][case]["messages"]]


def keys(case: str, key: tuple[str, ...] = ("id",)) -> list[tuple[str, ...]]:
    """The keys of every change of a case, as text, in order (the relation message before each)."""
    relations: dict[int, p.Relation] = {}
    out = []
    for m in messages(case):
        if isinstance(m, p.Relation):
            relations[m.relid] = m
        elif isinstance(m, (p.Insert, p.Update, p.Delete)):
            rel = relations[m.relid]
            out += [tuple(v.decode() for v in k) for k in p.keys_of(m, p.key_positions(rel, key), rel)]
    return out


def test_every_case_parses_whole_and_pairs_begin_with_commit():
    for case in FIXTURES["cases"]:
        ms = messages(case)
        assert isinstance(ms[0], p.Begin) and isinstance(ms[-1], p.Commit), case
        begins = [m for m in ms if isinstance(m, p.Begin)]
        commits = [m for m in ms if isinstance(m, p.Commit)]
        assert len(begins) == len(commits) == len(FIXTURES["cases"][case]["transactions"]), case
        for b, c in zip(begins, commits, strict=True):
            # The commit record begins where Begin said the transaction would end, and ends after it.
            assert b.final_lsn == c.commit_lsn < c.end_lsn and b.commit_ts == c.commit_ts, case


def test_begin_commit_and_relation_fields():
    begin, rel, ins, commit = messages("insert")
    assert isinstance(begin, p.Begin) and begin.xid > 0
    assert p.timestamp(begin.commit_ts).year >= 2024
    assert isinstance(rel, p.Relation)
    assert (rel.namespace, rel.name, rel.replident) == ("public", "t", "d")
    assert [(c.name, c.type_oid, c.identity) for c in rel.columns] == [("id", 23, True), ("v", 25, False)]
    assert isinstance(ins, p.Insert) and ins.relid == rel.relid and ins.new == (b"10", b"ten")
    assert isinstance(commit, p.Commit) and commit.flags == 0


def test_values_null_and_text_in_the_server_encoding():
    assert messages("insert_null")[2].new == (b"11", None)
    assert messages("insert_utf8")[2].new == (b"12", "ünïcødé ✓".encode())


def test_inserts_updates_deletes_give_the_keys_the_trigger_logs():
    assert keys("insert") == [("10",)]
    assert keys("update") == [("1",)]  # the key did not change: no old key sent, one key logged
    update = messages("update")[2]
    assert isinstance(update, p.Update) and update.old is None
    assert keys("update_key") == [("20",), ("2",)]  # new and old
    assert messages("update_key")[2].old_kind == "K"
    assert keys("delete") == [("3",)]
    assert keys("several_in_one_transaction") == [("30",), ("31",), ("30",), ("31",), ("30",)]
    assert keys("two_transactions") == [("40",), ("41",)]


def test_composite_keys_and_replica_identity_full():
    assert keys("composite_key", ("a", "b")) == [("1", "x"), ("1", "y"), ("1", "x"), ("1", "y")]
    full = messages("replica_identity_full")
    assert full[1].replident == "f" and all(c.identity for c in full[1].columns)
    assert full[2].old_kind == "O" and full[3].old_kind == "O"
    assert keys("replica_identity_full") == [("1",), ("1",)]  # the whole old row sent, the key unchanged


def test_unchanged_toast_value_and_an_unchanged_key_column():
    update = messages("unchanged_toast")[2]
    assert update.new[1] is p.UNCHANGED and update.new[2] == b"1"
    rel = messages("unchanged_toast")[1]
    assert p.keys_of(update, p.key_positions(rel, ("id",)), rel) == [(b"1",)]
    # A key column sent as unchanged (stored out of line) with its old key: taken from there.
    moved = p.Update(update.relid, (b"1", None, None), "K", (p.UNCHANGED, p.UNCHANGED, b"1"))
    assert p.keys_of(moved, (0,), rel) == [(b"1",)]
    with pytest.raises(p.KeyUnreadable):
        p.keys_of(p.Update(update.relid, None, None, (p.UNCHANGED, p.UNCHANGED, b"1")), (0,), rel)


def test_type_origin_and_truncate_messages():
    typ = messages("type")[1]
    assert isinstance(typ, p.Type) and (typ.namespace, typ.name) == ("public", "mood")
    assert keys("type") == [("1",)]
    origin = messages("origin")[1]
    assert isinstance(origin, p.Origin) and origin.name == "fixture_origin" and origin.lsn == p.lsn_int("0/12345678")
    trunc = messages("truncate")[3]
    rels = [m for m in messages("truncate") if isinstance(m, p.Relation)]
    assert isinstance(trunc, p.Truncate) and trunc.relids == tuple(r.relid for r in rels) and trunc.options == 0


def test_partitions_published_under_the_root():
    ms = messages("partition_via_root")
    rels = {m.relid: m.name for m in ms if isinstance(m, p.Relation)}
    changes = [m for m in ms if isinstance(m, (p.Insert, p.Update, p.Delete))]
    assert {rels[c.relid] for c in changes} == {"parted"}
    # A row moved to another partition arrives as a delete and an insert under the root.
    assert keys("partition_via_root") == [("5",), ("150",), ("5",), ("105",)]


def test_a_key_outside_the_replica_identity_is_refused_not_guessed():
    rel = messages("insert")[1]
    with pytest.raises(p.KeyUnreadable, match="not part of its replica identity"):
        p.key_positions(rel, ("v",))
    with pytest.raises(p.KeyUnreadable, match="not published"):
        p.key_positions(rel, ("nope",))


def test_malformed_and_unknown_messages_raise():
    insert = bytes.fromhex(FIXTURES["cases"]["insert"]["messages"][2])
    with pytest.raises(p.ProtocolError, match="ends after"):
        p.parse(insert[:-1])
    with pytest.raises(p.ProtocolError, match="left over"):
        p.parse(insert + b"x")
    with pytest.raises(p.ProtocolError, match="unknown pgoutput message 'S'"):
        p.parse(b"S\x00\x00\x00\x01")  # Stream Start: never asked for


def test_lsn_text_round_trip():
    for text in ("0/0", "0/1505640", "1A/FF00", "FFFFFFFF/FFFFFFFF"):
        assert p.lsn_text(p.lsn_int(text)) == text


def _decode(case: str, key=("id",), after=None, source=None):
    from mover.engines.capture.logical import _Decoder
    ms = [bytes.fromhex(m) for m in FIXTURES["cases"][case]["messages"]]
    rel = next(m for m in map(p.parse, ms) if isinstance(m, p.Relation))
    d = _Decoder(source or rel.relid, key, "utf-8", after)
    return d, [k for m in ms for k in d.keys(m)]


def test_the_feeders_decoder_skips_transactions_fed_already_and_stops_on_what_it_cannot_log():
    from mover.errors import Failed
    d, keys = _decode("two_transactions")
    assert keys == [(b"40",), (b"41",)] and d.transactions == 2 and d.changes == 2
    first_commit = next(m for m in map(p.parse, map(bytes.fromhex, FIXTURES["cases"]["two_transactions"]["messages"]))
                        if isinstance(m, p.Commit))
    # Fed up to the first transaction's end: only the second is logged again.
    d, keys = _decode("two_transactions", after=first_commit.end_lsn)
    assert keys == [(b"41",)] and d.transactions == 1 and d.last_end is not None
    # TRUNCATE t, full_t: each table's Relation, then one Truncate naming both.
    with pytest.raises(Failed, match="not of the source"):
        _decode("truncate")
    from mover.engines.capture.logical import _Decoder
    begin, rel, _, trunc, _ = FIXTURES["cases"]["truncate"]["messages"]
    d = _Decoder(p.parse(bytes.fromhex(rel)).relid, ("id",), "utf-8", None)
    d.keys(bytes.fromhex(begin))
    d.keys(bytes.fromhex(rel))
    with pytest.raises(Failed, match="TRUNCATE of the source reached logical capture"):
        d.keys(bytes.fromhex(trunc))
    with pytest.raises(Failed, match="not of the source"):
        _decode("insert", source=1)
    with pytest.raises(Failed, match="not part of its replica identity"):
        _decode("insert", key=("v",))
