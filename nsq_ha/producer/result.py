"""What a publish returns: :class:`PublishResult`."""

from __future__ import annotations

import struct
from dataclasses import dataclass

_IDS = struct.Struct(">QQ")


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Where a message went and what nsqd said about it.

    ``partition`` is ``None`` on vanilla nsqd. ``internal_id``, ``offset`` and ``raw_size``
    are known for traced publishes on the fork (``trace_id=``, a ``##trace_id`` header, or a
    producer created with ``trace=True``); ``trace_id`` is the one sent.
    """

    topic: str
    partition: int | None
    address: str
    attempts: int
    internal_id: int | None = None
    trace_id: int | None = None
    offset: int | None = None
    raw_size: int | None = None

    @property
    def message_id(self) -> bytes | None:
        """The 16-byte id consumers see (fork: internal id + trace id), when known."""
        if self.internal_id is None:
            return None
        return _IDS.pack(self.internal_id, self.trace_id or 0)
