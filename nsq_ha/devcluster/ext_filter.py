"""The fork's ``ext_filter`` (an IDENTIFY option) and ``desired_tag`` routing key: what a
subscriber of an ext topic gets, by the JSON header of each message (PROTOCOL.md §3.2, §6.10;
``nsqd/ext_filter.go`` and ``parseTagIfAny`` in youzan/nsq b16e68eb).

``type`` 1 compares a header value with ``filter_data``, 2 searches it with a regular
expression, 3 matches it as a glob; 4 combines ``filter_data_list`` terms (exact matches) with
``filter_ext_key`` ``"all"`` or ``"any"`` (any other relation never matches).  As on the fork:

* a filter nsqd cannot build (no ``filter_ext_key``, no ``filter_data`` outside type 4, an
  empty or incomplete list, an unknown type, a pattern that does not compile) filters
  **nothing**, and its ``inverse`` is ignored;
* a message without a JSON header never matches, so an ``inverse`` filter delivers it;
* a missing key or a non-string value is matched as ``""`` by types 2 and 3 (a pattern that
  matches the empty string passes it).

Regular expressions are Python's (RE2 syntax mostly agrees; lookarounds and backreferences,
which RE2 does not compile, build no filter as on the fork); keys are looked up as gjson paths
with ``.`` separating nested object keys.  A key using more of gjson's path syntax is refused
at IDENTIFY (:func:`unsupported_key`) rather than matched differently.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from .store import StoredMessage

__all__ = ["TAG_KEY", "filter_matches", "message_tag", "unsupported_key"]

_EXACT, _REGEXP, _GLOB, _MULTI = 1, 2, 3, 4
_JSON_HEADER = 4
#: the header key ``desired_tag`` consumers are routed by
TAG_KEY = "##client_dispatch_tag"
#: regular expression syntax Python has and RE2 refuses
_NOT_RE2 = re.compile(r"\(\?<?[=!]|\(\?P=|\\[1-9]")
#: gjson path syntax beyond ``.`` (wildcards, escapes, modifiers, queries, multipaths)
_GJSON_SYNTAX = re.compile(r"[*?\\|#@!{}\[\]]")


def unsupported_key(ext_filter: dict[str, Any]) -> str | None:
    """The first ``filter_ext_key`` of ``ext_filter`` (a ``filter_data_list`` term's too)
    that uses gjson path syntax the emulator does not implement, or None."""
    keys = [] if ext_filter.get("type") == _MULTI else [ext_filter.get("filter_ext_key", "")]
    keys += [t.get("filter_ext_key", "") for t in ext_filter.get("filter_data_list") or []]
    return next((k for k in keys if _GJSON_SYNTAX.search(k)), None)


def filter_matches(ext_filter: dict[str, Any], message: StoredMessage) -> bool:
    """True when ``message`` passes ``ext_filter`` (always, when nsqd could not build it)."""
    built = _build(json.dumps(ext_filter, sort_keys=True))
    if built is None:
        return True
    kind, key, pattern, terms, inverse = built
    matched = False
    if message.ext_version == _JSON_HEADER:
        header = _header(message)
        if kind == _MULTI:
            results = (_value(header, k) == v for k, v in terms)
            matched = all(results) if key == "all" else any(results) if key == "any" else False
        elif kind == _EXACT:
            matched = _value(header, key) == pattern
        else:
            assert isinstance(pattern, re.Pattern)  # noqa: S101 - _build compiled it
            matched = pattern.search(_value(header, key) or "") is not None
    return matched != inverse


def message_tag(message: StoredMessage) -> str:
    """The ``##client_dispatch_tag`` of a message's JSON header (``""``: untagged)."""
    if message.ext_version != _JSON_HEADER:
        return ""
    return _value(_header(message), TAG_KEY) or ""


#: (type, filter_ext_key, exact value or compiled pattern, multi terms, inverse)
_Built = tuple[int, str, Any, tuple[tuple[str, str], ...], bool]


@lru_cache(maxsize=256)
def _build(spec: str) -> _Built | None:
    """``NewExtFilter``: the filter, or None when nsqd would refuse it."""
    data = json.loads(spec)
    kind, key, pattern = (
        data.get("type", 0),
        data.get("filter_ext_key", ""),
        data.get("filter_data", ""),
    )
    if not key or (not pattern and kind != _MULTI):
        return None
    terms: tuple[tuple[str, str], ...] = ()
    compiled: Any = pattern
    try:
        if kind == _REGEXP:
            if _NOT_RE2.search(pattern):
                return None
            compiled = re.compile(pattern)
        elif kind == _GLOB:
            compiled = re.compile(_glob_regex(pattern), re.DOTALL)
        elif kind == _MULTI:
            items = data.get("filter_data_list") or []
            terms = tuple((t.get("filter_ext_key", ""), t.get("filter_data", "")) for t in items)
            if not terms or not all(k and v for k, v in terms):
                return None
        elif kind != _EXACT:
            return None
    except (re.error, ValueError):
        return None
    return kind, key, compiled, terms, bool(data.get("inverse", False))


def _glob_regex(pattern: str) -> str:
    """A gobwas/glob pattern (no separators) as an anchored regular expression; ValueError
    for a pattern it would not compile."""
    out, i = ["^"], 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            if i + 1 >= len(pattern):
                raise ValueError("trailing escape")
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise ValueError("unclosed [")
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            i = end
        elif char == "{":
            end = pattern.find("}", i + 1)
            if end < 0:
                raise ValueError("unclosed {")
            options = pattern[i + 1 : end].split(",")
            out.append("(?:" + "|".join(_glob_regex(o)[1:-1] for o in options) + ")")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out) + "$"


def _header(message: StoredMessage) -> object:
    try:
        return json.loads(message.ext_data)
    except ValueError:
        return None


def _value(header: object, key: str) -> str | None:
    """The string at gjson path ``key`` (None: missing or not a string)."""
    value = header
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value if isinstance(value, str) else None
