"""Server-to-client framing (§1.3): ``[u32 size][i32 type][data]`` with ``size = 4 + len(data)``.

The decoder, :class:`~nsq_ha.protocol.session.FrameDecoder`, lives with the session that feeds it.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

from nsq_ha.errors import InvalidArgumentError

#: Response data of a heartbeat; answer with ``NOP``.
HEARTBEAT: Final = b"_heartbeat_"
#: Response data for most successful commands.
OK: Final = b"OK"
#: Response data answering ``CLS``.
CLOSE_WAIT: Final = b"CLOSE_WAIT"

#: Bytes before a frame's data: u32 size + i32 type.
FRAME_HEADER_SIZE: Final = 8
_HEADER = struct.Struct(">Ii")
# A message frame holds the 26-byte header, at most 1 + 2 + 65535 ext bytes and 12 detail bytes
# around a body bounded by max_msg_size; the 4 type bytes count in the size too.
_MESSAGE_OVERHEAD = 4 + 26 + 3 + 65535 + 12
#: Default frame size limit: room for a 4 MiB body plus every optional message part.
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024 + _MESSAGE_OVERHEAD


def max_frame_size_for(max_msg_size: int) -> int:
    """Return the largest frame ``size`` a server with this ``--max-msg-size`` can send."""
    if max_msg_size < 1:
        raise InvalidArgumentError(f"max_msg_size must be positive, got {max_msg_size}")
    return max_msg_size + _MESSAGE_OVERHEAD


class FrameType(enum.IntEnum):
    """The three frame types nsqd sends."""

    RESPONSE = 0
    ERROR = 1
    MESSAGE = 2


def encode_frame(frame_type: FrameType | int, data: bytes) -> bytes:
    """Return ``[size][type][data]`` for one frame (the server side of the framing)."""
    return _HEADER.pack(4 + len(data), int(frame_type)) + bytes(data)
