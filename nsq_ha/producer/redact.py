"""Keep credentials out of the producer's repr, logs and exception texts.

A lookupd address may carry user info (``http://user:password@host:4161``); every text the
producer builds from an address or from a lower layer's error passes through :func:`redact`.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["REDACTED", "redact"]

REDACTED: Final = "***"

# scheme://userinfo@: the user info runs to the last "@" before the authority ends ("/", "?", "#",
# whitespace, a quote, a bracket or a brace: the edges of a URL inside a container's repr)
_USERINFO: Final = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s'\"<>\[\]{}]*@")


def redact(text: str) -> str:
    """``text`` with the user info of every URL in it replaced by ``***``."""
    if "@" not in text:
        return text
    return _USERINFO.sub(rf"\g<scheme>{REDACTED}@", text)
