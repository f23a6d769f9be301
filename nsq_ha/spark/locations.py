"""A file system location as it is shown (``repr``, logs, error texts): without credentials.

The driver source's ``walPath`` (:mod:`nsq_ha.spark.source.wal`) may be a URI with a secret in
it (``s3://key:secret@bucket/...``, ``?secret_key=...``); the read options
(:class:`~nsq_ha.spark.options.ReadOptions`) and the write-ahead log show it through
:func:`redact_location`.
"""

from __future__ import annotations

import re
from typing import Final

from ..redact import REDACTED, redact_text

__all__ = ["redact_location"]

_AUTHORITY: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# query parameters whose value may be a credential (S3's and Azure's, and the usual names)
_SECRET_PARAM: Final = re.compile(
    r"(?i)([?&][^=&#\s]*(?:secret|key|token|passw|pwd|credential|sig|auth)[^=&#\s]*=)"
    r"[^&#\s'\"]*"
)


def redact_location(text: str) -> str:
    """``text`` (a location, or a message that quotes one) without the credentials in it.

    For a location, the user info is everything between ``scheme://`` and the last ``@``
    before the query: a secret with an unescaped ``/`` in it is hidden too (and an ``@`` in
    a path hides a little more than needed)."""
    head, mark, query = text.partition("?")
    scheme = _AUTHORITY.match(head)
    if scheme is not None and "@" in head[scheme.end() :]:
        head = head[: scheme.end()] + REDACTED + head[head.rfind("@") :]
    else:
        head = redact_text(head)
    return head + _SECRET_PARAM.sub(rf"\g<1>{REDACTED}", mark + query)
