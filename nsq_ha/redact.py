"""Credentials in URLs: show them redacted, send them apart (pure functions).

``http://user:secret@host:4161`` is shown as ``http://user:***@host:4161`` (a user-only
userinfo, often a token, as ``http://***@host:4161``) and requested as ``http://host:4161``
with HTTP basic auth, so that no URL that reaches a log, a repr or an exception text (ours or
httpx's) carries the secret.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection
from typing import Any, Final

__all__ = ["REDACTED", "redact_text", "redact_url", "redacted_repr"]

REDACTED: Final = "***"

# scheme://userinfo@: the user info runs to the last "@" before the authority ends ("/", "?", "#",
# whitespace, a quote, a bracket or a brace: the edges of a URL inside a container's repr)
_USERINFO: Final = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s'\"<>\[\]{}]*@")


def redact_text(text: str) -> str:
    """``text`` with the user info of every URL in it replaced by ``***`` (for texts built
    from another layer's errors, which may quote a URL anywhere)."""
    if "@" not in text:
        return text
    return _USERINFO.sub(rf"\g<scheme>{REDACTED}@", text)


def redact_url(url: str) -> str:
    """``url`` with the password (or a user-only userinfo) replaced by ``***``.

    Works on any string, parseable or not: everything between ``scheme://`` (or the start) and
    the last ``@`` is userinfo. A string without ``@`` is returned unchanged.
    """
    scheme_end = url.find("://")
    start = scheme_end + 3 if scheme_end >= 0 else 0
    at = url.rfind("@")
    if at < start:
        return url
    user, colon, _password = url[start:at].partition(":")
    return url[:start] + (f"{user}:{REDACTED}" if colon else REDACTED) + url[at:]


def _redact_value(value: Any, redact: Callable[[str], str]) -> Any:
    """A URL field's value (a string, or a tuple or list of them) with every URL redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, tuple | list):
        return type(value)(redact(v) if isinstance(v, str) else v for v in value)
    return value


def redacted_repr(
    obj: Any, urls: Collection[str] = ("lookupd",), redact: Callable[[str], str] = redact_url
) -> str:
    """The repr a dataclass would have (its ``repr=True`` fields), with the passwords of the URLs
    in the fields named in ``urls`` shown as ``***`` (by ``redact``); nested values keep theirs."""
    shown = ", ".join(
        f"{f.name}={(_redact_value(value, redact) if f.name in urls else value)!r}"
        for f in dataclasses.fields(obj)
        if f.repr
        for value in (getattr(obj, f.name),)
    )
    return f"{type(obj).__qualname__}({shown})"
