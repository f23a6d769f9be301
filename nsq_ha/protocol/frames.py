"""Server-to-client framing (§1.3): ``[u32 size][i32 type][data]`` with ``size = 4 + len(data)``.

:class:`FrameDecoder` is incremental and sans-IO: feed it whatever bytes arrived and take out
whole frames. Any split of the same stream gives the same frames.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import NoReturn

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError

__all__ = [
    "CLOSE_WAIT",
    "DEFAULT_MAX_FRAME_SIZE",
    "FRAME_HEADER_SIZE",
    "HEARTBEAT",
    "OK",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "encode_frame",
    "max_frame_size_for",
]

#: Response data of a heartbeat; answer with ``NOP``.
HEARTBEAT = b"_heartbeat_"
#: Response data for most successful commands.
OK = b"OK"
#: Response data answering ``CLS``.
CLOSE_WAIT = b"CLOSE_WAIT"

#: Bytes before a frame's data: u32 size + i32 type.
FRAME_HEADER_SIZE = 8
_SIZE = struct.Struct(">I")
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


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: its type and its data (without size and type)."""

    frame_type: FrameType
    data: bytes

    @property
    def is_heartbeat(self) -> bool:
        """True for the ``_heartbeat_`` response frame."""
        return self.frame_type is FrameType.RESPONSE and self.data == HEARTBEAT

    def encode(self) -> bytes:
        """Return the frame's wire bytes."""
        return encode_frame(self.frame_type, self.data)


def encode_frame(frame_type: FrameType | int, data: bytes) -> bytes:
    """Return ``[size][type][data]`` for one frame (the server side of the framing)."""
    return _HEADER.pack(4 + len(data), int(frame_type)) + bytes(data)


_FRAME_TYPES = {int(t): t for t in FrameType}  # a dict lookup is far cheaper than FrameType(n)
#: consumed bytes kept before the buffer is compacted
_COMPACT_AFTER = 64 * 1024


class FrameDecoder:
    """Incremental decoder of the server-to-client frame stream.

    ``feed(data)`` adds bytes and returns the frames they completed; ``receive_data`` and
    ``next_frame`` (or ``next_parts``) do the same in two steps. A frame whose size is below 4
    or above ``max_frame_size``, or whose type is unknown, raises :class:`RemoteProtocolError`;
    after that the decoder stays broken and raises the same error again.
    """

    __slots__ = ("_buffer", "_error", "_pos", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        """Create a decoder refusing frames whose size field exceeds ``max_frame_size``."""
        if max_frame_size < 4:
            raise InvalidArgumentError(f"max_frame_size must be >= 4, got {max_frame_size}")
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        #: start of the first unreturned byte: frames are sliced from here, and the consumed
        #: prefix is cut off once it is large (a chunk of many small frames stays O(n))
        self._pos = 0
        self._error: RemoteProtocolError | None = None

    def __repr__(self) -> str:
        """Show the limit, the buffered byte count and whether the decoder failed."""
        state = "broken" if self._error is not None else "ok"
        return (
            f"<FrameDecoder {state} buffered={self.buffered} max_frame_size={self.max_frame_size}>"
        )

    @property
    def buffered(self) -> int:
        """Number of received bytes not yet returned as a frame."""
        return len(self._buffer) - self._pos

    def receive_data(self, data: bytes) -> None:
        """Append bytes received from the peer."""
        if self._error is not None:
            raise self._error
        self._buffer += data

    def next_frame(self) -> Frame | None:
        """Return the next whole frame, or ``None`` if more bytes are needed."""
        parts = self.next_parts()
        return None if parts is None else Frame(*parts)

    def next_parts(self) -> tuple[FrameType, bytes] | None:
        """:meth:`next_frame` as a ``(type, data)`` pair (cheaper: no Frame is built)."""
        if self._error is not None:
            raise self._error
        buffer, pos = self._buffer, self._pos
        available = len(buffer) - pos
        if available < _SIZE.size:
            return None
        (size,) = _SIZE.unpack_from(buffer, pos)
        if size < 4:
            self._fail(f"frame size {size} is below 4: no room for the frame type")
        if size > self.max_frame_size:
            self._fail(f"frame size {size} exceeds the limit of {self.max_frame_size} bytes")
        if available < FRAME_HEADER_SIZE:
            return None
        (_, raw_type) = _HEADER.unpack_from(buffer, pos)
        frame_type = _FRAME_TYPES.get(raw_type)
        if frame_type is None:
            self._fail(f"unknown frame type {raw_type}")
        end = pos + _SIZE.size + size
        if len(buffer) < end:
            return None
        data = bytes(buffer[pos + FRAME_HEADER_SIZE : end])
        if end == len(buffer):
            buffer.clear()
            self._pos = 0
        elif end >= _COMPACT_AFTER:
            del buffer[:end]
            self._pos = 0
        else:
            self._pos = end
        return frame_type, data

    def feed(self, data: bytes) -> list[Frame]:
        """Append ``data`` and return every frame now complete, in order."""
        self.receive_data(data)
        frames: list[Frame] = []
        while (frame := self.next_frame()) is not None:
            frames.append(frame)
        return frames

    def feed_eof(self) -> None:
        """Tell the decoder the peer closed; raise if a frame was cut off."""
        if self._error is not None:
            raise self._error
        if self.buffered:
            self._fail(f"connection closed inside a frame ({self.buffered} bytes pending)")

    def _fail(self, reason: str) -> NoReturn:
        """Remember the error, drop the buffer and raise."""
        self._error = RemoteProtocolError(reason)
        self._buffer.clear()
        self._pos = 0
        raise self._error
