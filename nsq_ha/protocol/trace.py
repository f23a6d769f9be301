"""The 30-byte traced publish response (§2.16) of PUB_TRACE, PUB_EXT with a ``##trace_id`` and
MPUB_TRACE: ``"OK" | u64 internal id | u64 trace id | u64 disk-queue offset | u32 raw size``
(for MPUB_TRACE the first message's id and offset, trace id 0, the whole batch's raw size).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from nsq_ha.errors import RemoteProtocolError

_LAYOUT = struct.Struct(">2sQQQI")


@dataclass(frozen=True, slots=True)
class TracedResponse:
    """What nsqd reports about a traced publish."""

    internal_id: int
    trace_id: int
    offset: int
    raw_size: int

    @property
    def message_id(self) -> bytes:
        """The 16-byte id consumers will see (meaningful for PUB_TRACE and PUB_EXT)."""
        return struct.pack(">QQ", self.internal_id, self.trace_id)


def parse_traced_response(data: bytes) -> TracedResponse:
    """Parse the data of a traced response frame; anything else raises RemoteProtocolError."""
    if len(data) != _LAYOUT.size or not data.startswith(b"OK"):
        raise RemoteProtocolError(
            f"expected a {_LAYOUT.size}-byte traced response starting with OK, "
            f"got {len(data)} bytes: {bytes(data[:32])!r}"
        )
    _, internal_id, trace_id, offset, raw_size = _LAYOUT.unpack(data)
    return TracedResponse(internal_id, trace_id, offset, raw_size)
