"""pgoutput's binary messages, protocol version 1, parsed (PostgreSQL's "Logical Replication
Message Formats"): what `pg_logical_slot_peek_binary_changes(slot, ..., 'proto_version', '1',
'publication_names', ...)` returns in its `data` column, one message a row.

Pure: bytes in, frozen dataclasses out, no I/O. Column values stay bytes in the server's encoding
(the text form the type's output function wrote): mover hands them back to the server to convert,
so no value is decoded or re-encoded here. Names (relations, columns, types) are decoded with the
server's encoding, given by the caller.

Parsed: Begin, Commit, Relation, Insert, Update, Delete, Truncate, and Origin, Type and logical
Message, which a reader skips. Anything else (streaming and two-phase messages need options mover
never asks for) raises ProtocolError: never a message silently misread.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# Seconds between the Unix epoch and PostgreSQL's (2000-01-01): timestamps are microseconds since it.
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class ProtocolError(ValueError):
    """A message that is not pgoutput protocol version 1 as this module reads it."""


class _Unchanged:
    """A TOASTed value the UPDATE did not change: pgoutput sends no data for it ('u')."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()
Value = bytes | None | _Unchanged  # the text form, NULL, or unchanged TOAST


@dataclass(frozen=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_ts: int  # microseconds since 2000-01-01 UTC
    xid: int


@dataclass(frozen=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int  # the end of the commit record: where decoding after this transaction starts
    commit_ts: int


@dataclass(frozen=True)
class Column:
    flags: int  # 1: part of the replica identity
    name: str
    type_oid: int
    typmod: int

    @property
    def identity(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True)
class Relation:
    relid: int
    namespace: str
    name: str
    replident: str  # d default, n nothing, f full, i index
    columns: tuple[Column, ...]

    def position(self, column: str) -> int | None:
        for i, c in enumerate(self.columns):
            if c.name == column:
                return i
        return None


@dataclass(frozen=True)
class Insert:
    relid: int
    new: tuple[Value, ...]


@dataclass(frozen=True)
class Update:
    relid: int
    old: tuple[Value, ...] | None  # the old key ('K', replica identity default or index) or row ('O', full)
    old_kind: str | None
    new: tuple[Value, ...]


@dataclass(frozen=True)
class Delete:
    relid: int
    old: tuple[Value, ...]
    old_kind: str


@dataclass(frozen=True)
class Truncate:
    relids: tuple[int, ...]
    options: int  # 1 CASCADE, 2 RESTART IDENTITY


@dataclass(frozen=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True)
class Type:
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate | Origin | Type | LogicalMessage


def timestamp(us: int) -> datetime:
    """A pgoutput timestamp (microseconds since 2000-01-01 UTC) as an aware datetime."""
    return PG_EPOCH + timedelta(microseconds=us)


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL prints it (pg_lsn's text form)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_int(text: str) -> int:
    hi, _, lo = text.partition("/")
    if not lo:
        raise ValueError(f"{text!r} is not an LSN")
    return (int(hi, 16) << 32) | int(lo, 16)


class _Reader:
    def __init__(self, data: bytes, encoding: str):
        self.data, self.pos, self.encoding = data, 0, encoding

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ProtocolError(f"message {self.data[:1]!r} ends after {len(self.data)} bytes, {n} more expected "
                                f"at {self.pos}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def byte(self) -> str:
        return chr(self.take(1)[0])

    def int8(self) -> int:
        return self.take(1)[0]

    def int16(self) -> int:
        value: int = struct.unpack(">h", self.take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack(">i", self.take(4))[0]
        return value

    def uint32(self) -> int:
        value: int = struct.unpack(">I", self.take(4))[0]
        return value

    def int64(self) -> int:
        value: int = struct.unpack(">q", self.take(8))[0]
        return value

    def uint64(self) -> int:
        value: int = struct.unpack(">Q", self.take(8))[0]
        return value

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolError(f"message {self.data[:1]!r}: a string without its terminating zero at {self.pos}")
        out = self.data[self.pos:end].decode(self.encoding)
        self.pos = end + 1
        return out

    def tuple(self) -> tuple[Value, ...]:
        values: list[Value] = []
        for _ in range(self.int16()):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind in ("t", "b"):
                values.append(self.take(self.int32()))
            else:
                raise ProtocolError(f"unknown column kind {kind!r} in tuple data")
        return tuple(values)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(f"message {self.data[:1]!r}: {len(self.data) - self.pos} bytes left over")


def parse(data: bytes, encoding: str = "utf-8") -> Message:
    """One message. `encoding`: the server's, for the names it carries."""
    r = _Reader(bytes(data), encoding)
    kind = r.byte()
    msg: Message
    if kind == "B":
        msg = Begin(r.uint64(), r.int64(), r.uint32())
    elif kind == "C":
        msg = Commit(r.int8(), r.uint64(), r.uint64(), r.int64())
    elif kind == "R":
        relid, namespace, name, replident = r.uint32(), r.string(), r.string(), r.byte()
        columns = tuple(Column(r.int8(), r.string(), r.uint32(), r.int32()) for _ in range(r.int16()))
        msg = Relation(relid, namespace, name, replident, columns)
    elif kind == "I":
        relid = r.uint32()
        if r.byte() != "N":
            raise ProtocolError("Insert without its new tuple ('N')")
        msg = Insert(relid, r.tuple())
    elif kind == "U":
        relid = r.uint32()
        marker = r.byte()
        old, old_kind = None, None
        if marker in ("K", "O"):
            old, old_kind = r.tuple(), marker
            marker = r.byte()
        if marker != "N":
            raise ProtocolError(f"Update with {marker!r} where its new tuple ('N') belongs")
        msg = Update(relid, old, old_kind, r.tuple())
    elif kind == "D":
        relid = r.uint32()
        marker = r.byte()
        if marker not in ("K", "O"):
            raise ProtocolError(f"Delete with {marker!r} where its old key or row ('K', 'O') belongs")
        msg = Delete(relid, r.tuple(), marker)
    elif kind == "T":
        n, options = r.int32(), r.int8()
        msg = Truncate(tuple(r.uint32() for _ in range(n)), options)
    elif kind == "O":
        msg = Origin(r.uint64(), r.string())
    elif kind == "Y":
        msg = Type(r.uint32(), r.string(), r.string())
    elif kind == "M":
        flags, lsn, prefix = r.int8(), r.uint64(), r.string()
        msg = LogicalMessage(bool(flags & 1), lsn, prefix, r.take(r.int32()))
    else:
        raise ProtocolError(f"unknown pgoutput message {kind!r} (protocol version 1 without streaming or "
                            f"two-phase has no such message)")
    r.done()
    return msg


class KeyUnreadable(ProtocolError):
    """A change whose key cannot be read from the message (the replica identity does not cover it)."""


def key_positions(rel: Relation, key: tuple[str, ...]) -> tuple[int, ...]:
    """Where each key column sits in `rel`'s tuples; every one must be part of the replica identity
    (its old value is then sent whenever it changes, and on every delete)."""
    out = []
    for column in key:
        i = rel.position(column)
        if i is None or not rel.columns[i].identity:
            raise KeyUnreadable(
                f"the key column {column!r} of {rel.namespace}.{rel.name} is "
                + ("not published" if i is None else f"not part of its replica identity ({rel.replident!r})")
                + ": the old key of an UPDATE that changes it, and of a DELETE, would not be sent")
        out.append(i)
    return tuple(out)


Key = tuple[bytes, ...]


def _key(values: tuple[Value, ...], positions: tuple[int, ...]) -> tuple[Value, ...]:
    return tuple(values[i] for i in positions)


def _readable(key: tuple[Value, ...]) -> bool:
    return all(isinstance(v, bytes) for v in key)


def keys_of(change: Insert | Update | Delete, positions: tuple[int, ...], rel: Relation) -> list[Key]:
    """The keys the capture trigger logs for this change (mover/sql/capture.py): the new key on
    INSERT and UPDATE, the old one on DELETE, both on an UPDATE that changes the key. Keys only:
    replay reads each one's state, so the rest of the row is never needed. A key that cannot be
    read raises KeyUnreadable: a change is never dropped."""
    where = f"{rel.namespace}.{rel.name}"
    if isinstance(change, Delete):
        gone = _key(change.old, positions)
        if not _readable(gone):
            raise KeyUnreadable(f"a DELETE on {where} came without its old key")
        return [gone]  # type: ignore[list-item]
    new = _key(change.new, positions)
    if isinstance(change, Insert):
        if not _readable(new):
            raise KeyUnreadable(f"an INSERT on {where} came without its key")
        return [new]  # type: ignore[list-item]
    old = _key(change.old, positions) if change.old is not None else None
    if not _readable(new) and old is not None:
        # A key column stored out of line and not changed is sent as 'unchanged'; its value is
        # in the old key, sent for that reason.
        new = tuple(o if n is UNCHANGED else n for n, o in zip(new, old, strict=True))
    if not _readable(new):
        raise KeyUnreadable(f"an UPDATE on {where} came without its new key")
    if old is None or old == new:
        return [new]  # type: ignore[list-item]
    if not _readable(old):
        raise KeyUnreadable(f"an UPDATE on {where} came with an unreadable old key")
    return [new, old]  # type: ignore[list-item]


__all__ = ["UNCHANGED", "Begin", "Column", "Commit", "Delete", "Insert", "Key", "KeyUnreadable", "LogicalMessage",
           "Message", "Origin", "ProtocolError", "Relation", "Truncate", "Type", "Update", "Value", "key_positions",
           "keys_of", "lsn_int", "lsn_text", "parse", "timestamp"]
