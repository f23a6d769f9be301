"""The broker's side of the message formats: what nsqd writes into a message frame (§4) and a
traced publish response (§2.16), for the embedded broker and the suite's lying servers. The
client decodes these (:mod:`.message`, :mod:`.trace`) and never loads this module.
"""

from __future__ import annotations

import struct

from nsq_ha.errors import InvalidArgumentError
from nsq_ha.protocol.message import (
    _DETAIL,
    _EXT_LEN,
    _FORK_ID,
    _HEADER,
    EXT_VERSION_NONE,
    DecodedMessage,
    MessageFormat,
)
from nsq_ha.protocol.trace import _LAYOUT, TracedResponse


def join_fork_id(internal_id: int, trace_id: int = 0) -> bytes:
    """Build a fork message id from its two halves."""
    for what, value in (("internal id", internal_id), ("trace id", trace_id)):
        if not 0 <= value < 1 << 64:
            raise InvalidArgumentError(f"{what} {value} does not fit in a u64")
    return _FORK_ID.pack(internal_id, trace_id)


def encode_message(message: DecodedMessage, fmt: MessageFormat) -> bytes:
    """Encode a message frame's data in ``fmt`` (the broker side of :func:`decode_message`).

    Uses ``id`` as given; ``ext_version``/``ext_data`` default to version 0 and
    ``offset``/``raw_size`` must be set when the format has those parts.
    """
    if len(message.id) != _FORK_ID.size:
        raise InvalidArgumentError(f"message id must be 16 bytes, got {len(message.id)}")
    version = message.ext_version or EXT_VERSION_NONE
    ext_data = message.ext_data or b""
    if not 0 <= version <= 0xFF or len(ext_data) > 0xFFFF:
        raise InvalidArgumentError("ext version must fit a u8 and ext data a u16 length")
    if version == EXT_VERSION_NONE and ext_data:
        raise InvalidArgumentError("ext data needs an ext version other than 0")
    if fmt.detail and (message.offset is None or message.raw_size is None):
        raise InvalidArgumentError("this format needs the message's offset and raw_size")
    parts: list[bytes] = []
    try:
        parts.append(_HEADER.pack(message.timestamp, message.attempts, message.id))
        if fmt.ext:
            parts.append(bytes((version,)))
            if version != EXT_VERSION_NONE:
                parts.append(_EXT_LEN.pack(len(ext_data)) + ext_data)
        if fmt.detail:
            parts.append(_DETAIL.pack(message.offset, message.raw_size))
    except struct.error as exc:
        raise InvalidArgumentError(f"message field out of range: {exc}") from exc
    parts.append(message.body)
    return b"".join(parts)


def encode_traced_response(response: TracedResponse) -> bytes:
    """Return the 30 data bytes of a traced response (the broker side)."""
    try:
        return _LAYOUT.pack(
            b"OK", response.internal_id, response.trace_id, response.offset, response.raw_size
        )
    except struct.error as exc:
        raise InvalidArgumentError(f"traced response field out of range: {exc}") from exc
