"""An application's statement as pg_stat_statements recorded it, read as PostgreSQL's scanner
reads it: which kind of statement it is, whether it is one statement, which names it mentions,
and the same text with the references to a table pointed elsewhere (the query rehearsal,
mover/engines/swap/query_rehearsal.py).

Only the lexical level: strings (standard, E'', U&'', dollar-quoted), comments (nested /* */),
quoted and unquoted identifiers (unquoted ones fold to lower case, ASCII only, as PostgreSQL
folds them in a UTF8 database), parameters ($1), and the rest as punctuation. A name is
recognised where it stands as an identifier, never inside a string, a comment or a longer
word: `orders` does not match `orders_archive`, `"Orders"` does not match `orders`. Whether an
identifier names a table, a column or an alias is the server's to say (the rehearsal checks the
plan); what this module rewrites is only ever the schema of a qualified `schema.table` pair,
which is never a column alias.

Pure text, no I/O: the rewritten statement reaches the server through sql.trusted(...,
"pg_stat_statements") and is only ever EXPLAINed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What the rehearsal may EXPLAIN: statements that plan (EXPLAIN without ANALYZE executes none of
# them). Anything else pg_stat_statements records (utility statements, EXPLAIN itself) is left.
PLANNABLE = frozenset({"select", "insert", "update", "delete", "with", "values", "table", "merge"})


@dataclass(frozen=True)
class Token:
    kind: str  # "ident" (unquoted), "quoted" (a "quoted identifier"), "param", "string", "op"
    text: str  # as written
    start: int
    end: int

    @property
    def name(self) -> str | None:
        """The identifier it stands for (folded unless quoted), or None when it is not one."""
        if self.kind == "ident":
            return _fold(self.text)
        if self.kind == "quoted":
            body = self.text[1:-1] if not self.text.lower().startswith("u&") else self.text[3:-1]
            return body.replace('""', '"')
        return None


def _fold(word: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in word)


_IDENT_START = re.compile(r"[A-Za-z_\u0080-\U0010ffff]")
_IDENT = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_\u0080-\U0010ffff]*)?\$")
_PARAM = re.compile(r"\$\d+")
_NUMBER = re.compile(r"(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?|0[xXoObB][0-9A-Fa-f_]+")
_OPERATOR_CHARS = "+-*/<>=~!@#%^&|`?"


class Unreadable(ValueError):
    """The text does not scan (an unterminated string, comment or quoted identifier)."""


def scan(text: str) -> list[Token]:
    """The statement's tokens, comments and whitespace left out."""
    out: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith("--", i):
            nl = text.find("\n", i)
            i = n if nl < 0 else nl + 1
        elif text.startswith("/*", i):
            i = _comment_end(text, i)
        elif c == "'" or (c in "eEbBxXnN" and text.startswith("'", i + 1)):
            start = i
            i = _string_end(text, i + (0 if c == "'" else 1), backslashes=c in "eE")
            out.append(Token("string", text[start:i], start, i))
        elif c in "uU" and text.startswith("&'", i + 1):
            start = i
            i = _string_end(text, i + 2, backslashes=False)
            out.append(Token("string", text[start:i], start, i))
        elif c == '"' or (c in "uU" and text.startswith('&"', i + 1)):
            start = i
            j = i + (0 if c == '"' else 2) + 1
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise Unreadable(f"unterminated quoted identifier at character {start + 1}")
                if text.startswith('""', k):
                    j = k + 2
                    continue
                i = k + 1
                break
            out.append(Token("quoted", text[start:i], start, i))
        elif c == "$":
            if m := _PARAM.match(text, i):
                out.append(Token("param", m.group(), i, m.end()))
                i = m.end()
            elif m := _DOLLAR_TAG.match(text, i):
                close = text.find(m.group(), m.end())
                if close < 0:
                    raise Unreadable(f"unterminated dollar-quoted string at character {i + 1}")
                out.append(Token("string", text[i:close + len(m.group())], i, close + len(m.group())))
                i = close + len(m.group())
            else:
                out.append(Token("op", c, i, i + 1))
                i += 1
        elif _IDENT_START.match(c):
            m = _IDENT.match(text, i)
            assert m is not None
            out.append(Token("ident", m.group(), i, m.end()))
            i = m.end()
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            m = _NUMBER.match(text, i)
            end = m.end() if m else i + 1
            out.append(Token("number", text[i:end], i, end))
            i = end
        elif c in _OPERATOR_CHARS:
            j = i
            while j < n and text[j] in _OPERATOR_CHARS and not text.startswith(("--", "/*"), j):
                j += 1
            out.append(Token("op", text[i:j], i, j))
            i = j
        elif text.startswith("::", i):
            out.append(Token("op", "::", i, i + 2))
            i += 2
        else:  # ( ) , ; . [ ] :
            out.append(Token("op", c, i, i + 1))
            i += 1
    return out


def _comment_end(text: str, i: int) -> int:
    depth, i = 0, i
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise Unreadable("unterminated /* comment")


def _string_end(text: str, i: int, *, backslashes: bool) -> int:
    """`i` at the opening quote; the index after the closing one ('' inside is a quote)."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if backslashes and c == "\\":
            j += 2
        elif c == "'":
            if text.startswith("''", j):
                j += 2
            else:
                return j + 1
        else:
            j += 1
    raise Unreadable(f"unterminated string at character {i + 1}")


@dataclass(frozen=True)
class Statement:
    text: str
    tokens: tuple[Token, ...]

    @property
    def kind(self) -> str | None:
        """The statement's first word, folded ("select", "with", ...), past opening parentheses."""
        for t in self.tokens:
            if t.kind == "op" and t.text == "(":
                continue
            return _fold(t.text) if t.kind == "ident" else None
        return None

    @property
    def single(self) -> bool:
        """One statement: no `;` but a trailing one."""
        semis = [i for i, t in enumerate(self.tokens) if t.kind == "op" and t.text == ";"]
        return all(i >= len(self.tokens) - len(semis) for i in semis)

    @property
    def plannable(self) -> bool:
        return self.single and self.kind in PLANNABLE

    def mentions(self, name: str) -> bool:
        """Whether `name` (exact, as the catalog spells it) stands as an identifier in it."""
        return any(t.name == name for t in self.tokens)

    def qualifies(self, schema: str) -> bool:
        """Whether `schema.` qualifies a name in it."""
        return any(a.name == schema and b.kind == "op" and b.text == "."
                   for a, b in zip(self.tokens, self.tokens[1:], strict=False))

    def mentions_qualified(self, schema: str, name: str) -> bool:
        return bool(self._qualified(schema, name))

    def mentions_unqualified(self, name: str) -> bool:
        """`name` as an identifier that is not the second part of schema.name: a reference that
        the search_path resolves (or a column, an alias, a CTE: the server decides)."""
        for i, t in enumerate(self.tokens):
            if t.name == name and not (i >= 2 and self.tokens[i - 1].text == "." and self.tokens[i - 2].name):
                return True
        return False

    def _qualified(self, schema: str, name: str) -> list[tuple[Token, Token]]:
        """Each `schema . name` pair (the schema token, the name token)."""
        out = []
        for a, dot, b in zip(self.tokens, self.tokens[1:], self.tokens[2:], strict=False):
            if a.name == schema and dot.kind == "op" and dot.text == "." and b.name == name:
                out.append((a, b))
        return out

    def redirected(self, schema: str, name: str, to_schema: str) -> str:
        """The text with each `schema.name` reference as `to_schema.name` (the table's own name
        kept, so that `name.column` still resolves)."""
        out = self.text
        for a, _ in reversed(self._qualified(schema, name)):
            out = out[:a.start] + quote(to_schema) + out[a.end:]
        return out


def read(text: str) -> Statement:
    """The statement, scanned (Unreadable if it does not scan)."""
    return Statement(text, tuple(scan(text)))


def quote(name: str) -> str:
    """`name` as a quoted identifier (always quoted, as the rewrite cannot know the keywords)."""
    return '"' + name.replace('"', '""') + '"'
