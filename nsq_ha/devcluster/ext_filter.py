"""The fork's ``ext_filter`` (an IDENTIFY option): which messages of an ext topic a subscriber
gets, by the JSON header of each message (PROTOCOL.md §3.1).

``type`` 1 compares a header value with ``filter_data``, 2 matches it as a regular expression,
3 as a glob; 4 combines ``filter_data_list`` terms (exact matches) with ``all`` or any;
``inverse`` flips the result.  Messages without a JSON header never match.
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any

from .store import StoredMessage

__all__ = ["filter_matches"]

_EXACT, _REGEXP, _GLOB, _MULTI = 1, 2, 3, 4


def filter_matches(ext_filter: dict[str, Any], message: StoredMessage) -> bool:
    """True when ``message`` passes ``ext_filter`` (an unknown ``type`` passes everything)."""
    kind = ext_filter.get("type", 0)
    if kind not in (_EXACT, _REGEXP, _GLOB, _MULTI):
        return True
    if message.ext_version != 4:
        return False
    try:
        header = json.loads(message.ext_data)
    except ValueError:
        return False
    if not isinstance(header, dict):
        return False
    if kind == _MULTI:
        terms = ext_filter.get("filter_data_list") or []
        results = [
            _one(header, t.get("filter_ext_key"), t.get("filter_data"), _EXACT)
            for t in terms
            if isinstance(t, dict)
        ]
        combine = all if ext_filter.get("filter_ext_key") == "all" else any
        matched = bool(results) and combine(results)
    else:
        key, pattern = ext_filter.get("filter_ext_key"), ext_filter.get("filter_data")
        matched = _one(header, key, pattern, kind)
    return matched != bool(ext_filter.get("inverse"))


def _one(header: dict[str, Any], key: object, pattern: object, how: int) -> bool:
    value = header.get(key) if isinstance(key, str) else None
    if not isinstance(value, str) or not isinstance(pattern, str):
        return False
    if how == _REGEXP:
        try:
            return re.search(pattern, value) is not None
        except re.error:
            return False
    if how == _GLOB:
        return fnmatch.fnmatchcase(value, pattern)
    return value == pattern
