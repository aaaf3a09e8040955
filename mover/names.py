"""SQL names: parsing a plan's `schema."Table"` text, quoting, and the names mover derives.

Identifiers reach SQL text through psycopg.sql.Identifier (QualifiedName.ident). The quoted form
of str(QualifiedName) is for messages, and for the one other place a name may go: a bound
parameter read as regclass text (`%s::regclass`, `to_regclass(%s)`), never SQL text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from psycopg import sql

NAMEDATALEN = 63  # PostgreSQL truncates identifiers to 63 bytes; derived names must fit.


def display_ident(name: str) -> str:
    """Quote like quote_ident() would for messages (always quoted: unambiguous for the reader)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, order=True)
class QualifiedName:
    schema: str | None
    name: str

    @property
    def ident(self) -> sql.Identifier:
        if self.schema is None:
            return sql.Identifier(self.name)
        return sql.Identifier(self.schema, self.name)

    def with_schema(self, schema: str) -> QualifiedName:
        return QualifiedName(schema, self.name)

    def __str__(self) -> str:
        if self.schema is None:
            return display_ident(self.name)
        return f"{display_ident(self.schema)}.{display_ident(self.name)}"


def parse_qualified(text: str) -> QualifiedName:
    """Parse `schema.table` the way PostgreSQL does: unquoted parts fold to lower case,
    double-quoted parts keep case and may contain dots, spaces and doubled quotes."""
    parts = _split_identifiers(text)
    if len(parts) == 1:
        return QualifiedName(None, parts[0])
    if len(parts) == 2:
        return QualifiedName(parts[0], parts[1])
    raise ValueError(f"{text!r} has {len(parts)} dot-separated parts; expected table or schema.table")


_SPACE = " \t\n\r\f\v"  # what the SQL scanner skips; a no-break space is part of a name


def _split_identifiers(text: str) -> list[str]:
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _SPACE:
            i += 1
        if i >= n:
            raise ValueError(f"{text!r}: expected a name")
        if text[i] == '"':
            i += 1
            buf = []
            while True:
                j = text.find('"', i)
                if j < 0:
                    raise ValueError(f"{text!r}: unterminated quoted identifier")
                buf.append(text[i:j])
                if j + 1 < n and text[j + 1] == '"':
                    buf.append('"')
                    i = j + 2
                    continue
                i = j + 1
                break
            part = "".join(buf)
            if not part:
                raise ValueError(f"{text!r}: empty quoted identifier")
        else:
            j = i
            while j < n and _ident_char(text[j]):
                j += 1
            part = text[i:j]
            if not part or part[0] in "0123456789$":
                raise ValueError(f"{text!r}: invalid unquoted identifier at position {i + 1};"
                                 " quote it with double quotes")
            part = _fold(part)
            i = j
        if len(part.encode()) > NAMEDATALEN:
            raise ValueError(f"{text!r}: identifier {display_ident(part)} is longer than {NAMEDATALEN} bytes")
        parts.append(part)
        while i < n and text[i] in _SPACE:
            i += 1
        if i >= n:
            return parts
        if text[i] != ".":
            raise ValueError(f"{text!r}: unexpected {text[i]!r} at position {i + 1}")
        i += 1


def _ident_char(ch: str) -> bool:
    """What PostgreSQL's scanner takes into an unquoted identifier: ASCII letters, digits, '_'
    and '$', and every non-ASCII character."""
    return ch.isascii() and (ch.isalnum() or ch in "_$") or not ch.isascii()


def _fold(part: str) -> str:
    """PostgreSQL folds only ASCII A-Z of an unquoted identifier (in a multibyte encoding such as
    UTF-8); str.lower() would also fold 'É' and turn 'İ' into two characters."""
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in part)


def derived(base: str, suffix: str) -> str:
    """`base` + `suffix`, shortened with a hash so that it fits in 63 bytes and stays unique."""
    name = base + suffix
    if len(name.encode()) <= NAMEDATALEN:
        return name
    digest = hashlib.sha1(base.encode()).hexdigest()[:8]
    room = NAMEDATALEN - len(suffix.encode()) - len(digest) - 1
    cut = base.encode()[:room].decode(errors="ignore")
    return f"{cut}_{digest}{suffix}"


# Objects mover creates for migration `mid`, all in the control schema except the target table.
CONTROL_SCHEMA = "mover"


def change_log(mid: int, reverse: bool = False) -> QualifiedName:
    return QualifiedName(CONTROL_SCHEMA, f"m{mid}_{'reverse_' if reverse else ''}changes")


def capture_function(mid: int, reverse: bool = False) -> QualifiedName:
    return QualifiedName(CONTROL_SCHEMA, f"m{mid}_{'reverse_' if reverse else ''}capture")


def capture_trigger(mid: int, reverse: bool = False) -> str:
    return f"mover_m{mid}_{'reverse_' if reverse else ''}capture"


def applied_notes(mid: int) -> QualifiedName:
    """Keys the forward applier replayed since reconcile verified their range (mover/sql/compare.py)."""
    return QualifiedName(CONTROL_SCHEMA, f"m{mid}_applied")


def notes_function(mid: int) -> QualifiedName:
    return QualifiedName(CONTROL_SCHEMA, f"m{mid}_note_applied")


def notes_trigger(mid: int) -> str:
    return f"mover_m{mid}_note_applied"


def capture_publication(mid: int) -> str:
    """The publication logical capture decodes the source through (mover/engines/capture/logical.py): mover's
    own, of the source only, never one a subscriber should use. Its name starts as mover's triggers'
    do, so the metadata the swap carries and compares leaves it out."""
    return f"mover_m{mid}_capture"


def capture_slot(mid: int, database_oid: int) -> str:
    """The replication slot of a migration's logical capture. Slots are the cluster's, not a
    database's: the database's oid makes the name unique across databases."""
    return f"mover_m{mid}_d{database_oid}"


def feed_state(mid: int) -> QualifiedName:
    """The one row saying how far the logical capture has fed the change log (mover/engines/capture/logical.py)."""
    return QualifiedName(CONTROL_SCHEMA, f"m{mid}_feed")


def cast_probe(token: str) -> QualifiedName:
    """The conversion probes' table (mover/sql/casts.py): created in a savepoint and rolled back,
    named per probe so that two sessions probing at once never wait for each other's name."""
    return QualifiedName(CONTROL_SCHEMA, f"cast_probe_{token}")
