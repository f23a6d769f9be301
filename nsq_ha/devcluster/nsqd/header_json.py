"""The fork's JSON header parser, as its answers show it: what it accepts and how it words a
refusal.

nsqd parses a PUB_EXT/MPUB_EXT/``/pub_ext`` header with valyala/fastjson 1.6.1
(``fastjson.ParseBytes``), which is more lenient than JSON: a number is any run of digits,
``.``, ``-``, ``+``, ``e`` and ``E`` (or ``inf``/``nan``), a string ends at the first unescaped
``"`` and its escapes are not checked, nesting stops at 300 levels. A refusal reads
``cannot parse JSON: <why>; unparsed tail: <Go-quoted rest>``, or ``unexpected tail: <...>``
after a whole value; ``<why>`` nests the way the parser descended (``cannot parse object: cannot
parse object value: cannot parse empty string``). :func:`parse_header` follows that grammar and
those texts (checked against the real fork, ``tests/conformance``) on bytes, as Go does.

A parsed value is what :func:`trace_id_value` needs: an object is a :class:`JsonObject` of
``(raw key, value)`` pairs in order, an array a list, a string :class:`RawString` (escapes as
sent), a number its text, ``true``/``false``/``null`` Python's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HeaderJsonError",
    "JsonObject",
    "RawString",
    "go_quote",
    "parse_header",
    "trace_id_value",
]

MAX_DEPTH = 300
_WS = b" \n\t\r"
_NUMBER = frozenset(b"0123456789.-eE+")
_QUOTE_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}


class HeaderJsonError(ValueError):
    """The parser's refusal, worded as the fork's."""


@dataclass(frozen=True, slots=True)
class RawString:
    """A JSON string as sent (escapes not applied)."""

    raw: bytes

    def text(self) -> str:
        """Its value, escapes applied where they are valid (fastjson's best effort)."""
        try:
            value = json.loads(b'"' + self.raw + b'"')
        except ValueError:
            return self.raw.decode("utf-8", "surrogateescape")
        return str(value)


@dataclass(frozen=True, slots=True)
class JsonObject:
    """A JSON object: its ``(raw key, value)`` pairs in order (duplicates kept)."""

    pairs: list[tuple[bytes, Any]]


class _Refused(Exception):
    def __init__(self, why: str, tail: bytes) -> None:
        super().__init__(why)
        self.why = why
        self.tail = tail


def go_quote(data: bytes) -> str:
    """``data`` as Go's ``%q`` (strconv.Quote) prints a string."""
    out = ['"']
    i = 0
    while i < len(data):
        char, size = _rune(data, i)
        if char is None:
            out.append(f"\\x{data[i]:02x}")
        elif char in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
        i += size
    out.append('"')
    return "".join(out)


def _rune(data: bytes, i: int) -> tuple[str | None, int]:
    """The UTF-8 character at ``i`` and its length; ``None`` for an invalid byte."""
    for size in (1, 2, 3, 4):
        try:
            return data[i : i + size].decode("utf-8"), size
        except UnicodeDecodeError:
            continue
    return None, 1


def _shown(tail: bytes) -> str:
    """fastjson's ``startEndString``: a tail over 80 bytes as its first and last 40."""
    if len(tail) > 80:
        tail = tail[:40] + b"..." + tail[-40:]
    return go_quote(tail)


def _skip(s: bytes) -> bytes:
    return s.lstrip(_WS) if s and s[0] <= 0x20 else s


def parse_header(data: bytes) -> Any:
    """The header's value, or :class:`HeaderJsonError` with the fork's text."""
    s = _skip(data)
    try:
        value, tail = _value(s, 0)
    except _Refused as refused:
        raise HeaderJsonError(
            f"cannot parse JSON: {refused.why}; unparsed tail: {_shown(refused.tail)}"
        ) from None
    tail = _skip(tail)
    if tail:
        raise HeaderJsonError(f"unexpected tail: {_shown(tail)}")
    return value


def _value(s: bytes, depth: int) -> tuple[Any, bytes]:
    if not s:
        raise _Refused("cannot parse empty string", s)
    depth += 1
    if depth > MAX_DEPTH:
        raise _Refused(f"too big depth for the nested JSON; it exceeds {MAX_DEPTH}", s)
    first = s[:1]
    if first in (b"{", b"["):
        what = "object" if first == b"{" else "array"
        try:
            return (_object if first == b"{" else _array)(s[1:], depth)
        except _Refused as refused:
            raise _Refused(f"cannot parse {what}: {refused.why}", refused.tail) from None
    if first == b'"':
        try:
            raw, tail = _raw_string(s[1:])
        except _Refused as refused:
            raise _Refused(f"cannot parse string: {refused.why}", refused.tail) from None
        return RawString(raw), tail
    for word, literal in ((b"true", True), (b"false", False), (b"null", None)):
        if first == word[:1]:
            if s.startswith(word):
                return literal, s[len(word) :]
            if word == b"null" and s[:3].lower() == b"nan":
                return s[:3].decode(), s[3:]
            raise _Refused(f"unexpected value found: {go_quote(s)}", s)
    number, tail = _number(s)
    return number, tail


def _array(s: bytes, depth: int) -> tuple[list[Any], bytes]:
    s = _skip(s)
    if not s:
        raise _Refused("missing ']'", s)
    if s[:1] == b"]":
        return [], s[1:]
    items: list[Any] = []
    while True:
        try:
            item, s = _value(_skip(s), depth)
        except _Refused as refused:
            raise _Refused(f"cannot parse array value: {refused.why}", refused.tail) from None
        items.append(item)
        s = _skip(s)
        if not s:
            raise _Refused("unexpected end of array", s)
        if s[:1] == b",":
            s = s[1:]
            continue
        if s[:1] == b"]":
            return items, s[1:]
        raise _Refused("missing ',' after array value", s)


def _object(s: bytes, depth: int) -> tuple[JsonObject, bytes]:
    s = _skip(s)
    if not s:
        raise _Refused("missing '}'", s)
    if s[:1] == b"}":
        return JsonObject([]), s[1:]
    pairs: list[tuple[bytes, Any]] = []
    while True:
        s = _skip(s)
        if not s or s[:1] != b'"':
            raise _Refused('cannot find opening \'"" for object key', s)
        try:
            key, s = _raw_key(s[1:])
        except _Refused as refused:
            raise _Refused(f"cannot parse object key: {refused.why}", refused.tail) from None
        s = _skip(s)
        if not s or s[:1] != b":":
            raise _Refused("missing ':' after object key", s)
        try:
            value, s = _value(_skip(s[1:]), depth)
        except _Refused as refused:
            raise _Refused(f"cannot parse object value: {refused.why}", refused.tail) from None
        pairs.append((key, value))
        s = _skip(s)
        if not s:
            raise _Refused("unexpected end of object", s)
        if s[:1] == b",":
            s = s[1:]
            continue
        if s[:1] == b"}":
            return JsonObject(pairs), s[1:]
        raise _Refused("missing ',' after object value", s)


def _raw_key(s: bytes) -> tuple[bytes, bytes]:
    for i, byte in enumerate(s):
        if byte == 0x22:  # '"'
            return s[:i], s[i + 1 :]
        if byte == 0x5C:  # '\\': the string's own rules
            return _raw_string(s)
    raise _Refused("missing closing '\"'", b"")


def _raw_string(s: bytes) -> tuple[bytes, bytes]:
    """Up to the first ``"`` not escaped by an odd run of backslashes."""
    start = 0
    while True:
        n = s.find(b'"', start)
        if n < 0:
            raise _Refused("missing closing '\"'", b"")
        slashes = len(s[start:n]) - len(s[start:n].rstrip(b"\\"))
        if slashes % 2 == 0:
            return s[:n], s[n + 1 :]
        start = n + 1


def _number(s: bytes) -> tuple[str, bytes]:
    for i, byte in enumerate(s):
        if byte in _NUMBER:
            continue
        if i == 0 or (i == 1 and s[:1] in (b"-", b"+")):
            if s[i : i + 3].lower() in (b"inf", b"nan"):
                return s[: i + 3].decode(), s[i + 3 :]
            raise _Refused(f"cannot parse number: unexpected char: {go_quote(s[:1])}", s)
        return s[:i].decode(), s[i:]
    return s.decode(), b""


def trace_id_value(value: Any) -> tuple[bool, Any]:
    """``(found, value)`` of the header's ``##trace_id``: the first pair whose raw key is it,
    else the first whose key is it once unescaped (fastjson's ``Get``)."""
    if not isinstance(value, JsonObject):
        return False, None
    for key, item in value.pairs:
        if key == b"##trace_id":
            return True, item
    for key, item in value.pairs:
        if RawString(key).text() == "##trace_id":
            return True, item
    return False, None
