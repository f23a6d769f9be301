"""Encoders for the client-to-server commands without a message body (§1.2, §2).

Every encoder validates its arguments, raises an
:class:`~nsq_ha.errors.InvalidArgumentError` subclass when nsqd would refuse them, and returns
the exact bytes to write. The publish family lives in :mod:`nsq_ha.protocol.publish`.

Durations in the API are float seconds; this module is the one place that converts them to the
milliseconds on the wire (:func:`seconds_to_ms`, :func:`ms_to_seconds`).
"""

from __future__ import annotations

import enum
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from nsq_ha.errors import BodyTooLargeError, InvalidArgumentError
from nsq_ha.protocol.names import (
    DEFAULT_PARTITION,
    MAX_PARTITION,
    validate_channel,
    validate_message_id,
    validate_partition,
    validate_topic,
)

__all__ = [
    "MAGIC_V2",
    "StartKind",
    "StartPosition",
    "encode_auth",
    "encode_cls",
    "encode_fin",
    "encode_fin_delivered",
    "encode_identify",
    "encode_internal_create_topic",
    "encode_nop",
    "encode_rdy",
    "encode_req",
    "encode_sub",
    "encode_sub_advanced",
    "encode_sub_ordered",
    "encode_touch",
    "ms_to_seconds",
    "seconds_to_ms",
]

#: The four bytes a client sends first.
MAGIC_V2 = b"  V2"

_U32 = struct.Struct(">I")
#: nsqd reads body lengths as a signed 32-bit integer.
MAX_WIRE_LENGTH = 0x7FFF_FFFF


# --- shared helpers (also used by publish.py and identify.py) --------------------------------


def seconds_to_ms(seconds: float, what: str) -> int:
    """Convert a non-negative duration in seconds to whole milliseconds (rounded)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgumentError(f"{what} must be a number of seconds, not {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgumentError(f"{what} must be a finite number >= 0, got {seconds!r}")
    return round(seconds * 1000)


def ms_to_seconds(milliseconds: int) -> float:
    """Convert milliseconds from the wire to float seconds."""
    return milliseconds / 1000


def command_line(name: bytes, *params: bytes) -> bytes:
    """Return ``NAME p1 p2\\n`` with single spaces and no trailing space."""
    return b" ".join((name, *params)) + b"\n"


def partition_params(partition: int | None) -> tuple[bytes, ...]:
    """Return the partition token tuple for a validated partition (empty for ``None``)."""
    checked = validate_partition(partition)
    return () if checked is None else (str(checked).encode("ascii"),)


def check_size(what: str, size: int, limit: int | None) -> None:
    """Raise BodyTooLargeError if ``size`` exceeds ``limit`` (or what a u32/i32 length holds)."""
    if limit is not None and size > limit:
        raise BodyTooLargeError(what, size, limit)
    if size > MAX_WIRE_LENGTH:
        raise BodyTooLargeError(what, size, MAX_WIRE_LENGTH)


def with_body(line: bytes, body: bytes) -> bytes:
    """Append ``[u32 len][body]`` to a command line."""
    return line + _U32.pack(len(body)) + body


def as_bytes(value: object, what: str) -> bytes:
    """Return ``value`` as bytes if it is bytes-like; refuse str and everything else."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidArgumentError(f"{what} must be bytes, not {type(value).__name__}")


def compact_json(value: object, what: str) -> bytes:
    """Serialise ``value`` as compact UTF-8 JSON, keeping key order."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what} cannot be encoded as JSON: {exc}") from exc
    return text.encode("utf-8")


def check_uint(value: object, what: str, bits: int, minimum: int = 0) -> int:
    """Return ``value`` if it is an int in ``minimum..2**bits-1`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{what} must be an int, not {type(value).__name__}")
    if not minimum <= value < 1 << bits:
        raise InvalidArgumentError(f"{what} {value} is out of range {minimum}..{(1 << bits) - 1}")
    return value


# --- IDENTIFY and AUTH ------------------------------------------------------------------------


def encode_identify(body: Mapping[str, object], *, max_body_size: int | None = None) -> bytes:
    """Return ``IDENTIFY\\n[len][JSON]``; keys keep their order, JSON is compact.

    Build ``body`` with :func:`nsq_ha.protocol.identify.build_identify` to get its checks.
    """
    if not isinstance(body, Mapping):
        raise InvalidArgumentError(f"IDENTIFY body must be a mapping, not {type(body).__name__}")
    data = compact_json(dict(body), "IDENTIFY body")
    check_size("IDENTIFY body", len(data), max_body_size)
    return with_body(b"IDENTIFY\n", data)


def encode_auth(secret: str | bytes, *, max_body_size: int | None = None) -> bytes:
    """Return ``AUTH\\n[len][secret]``; the secret must not be empty."""
    raw = secret.encode("utf-8") if isinstance(secret, str) else as_bytes(secret, "AUTH secret")
    if not raw:
        raise InvalidArgumentError("AUTH secret must not be empty")
    check_size("AUTH secret", len(raw), max_body_size)
    return with_body(b"AUTH\n", raw)


# --- subscribing ------------------------------------------------------------------------------


class StartKind(enum.Enum):
    """Kinds of SUB_ADVANCED start position (§2.3.1)."""

    SPECIAL = "special"
    VIRTUAL_QUEUE = "virtual_queue"
    TIMESTAMP = "timestamp"
    MSGCOUNT = "msgcount"


_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a SUB_ADVANCED consumer starts: ``<kind>:<int64>``.

    Use the constructors: :meth:`latest` (``special:-1``), :meth:`at_offset` (disk-queue byte
    offset), :meth:`at_timestamp` (Unix seconds), :meth:`at_count` (the N-th message, from 1).
    Only ``latest`` works on a standalone nsqd; nsqd applies the position only when this client
    is alone on the channel.
    """

    kind: StartKind
    value: int

    def __post_init__(self) -> None:
        """Check the value against the kind."""
        if not isinstance(self.kind, StartKind):
            raise InvalidArgumentError(f"start kind must be a StartKind, not {self.kind!r}")
        if self.kind is StartKind.SPECIAL:
            if self.value != -1:
                raise InvalidArgumentError("the only special start position is -1 (latest)")
        else:
            lowest = 1 if self.kind is StartKind.MSGCOUNT else 0
            check_uint(self.value, f"{self.kind.value} start position", 63, lowest)

    @classmethod
    def latest(cls) -> StartPosition:
        """Skip the backlog: start at the channel's current end."""
        return cls(StartKind.SPECIAL, -1)

    @classmethod
    def at_offset(cls, offset: int) -> StartPosition:
        """Start at this disk-queue byte offset (cluster mode only)."""
        return cls(StartKind.VIRTUAL_QUEUE, offset)

    @classmethod
    def at_timestamp(cls, unix_seconds: int) -> StartPosition:
        """Start at the first message published at or after this Unix time (cluster mode)."""
        return cls(StartKind.TIMESTAMP, unix_seconds)

    @classmethod
    def at_count(cls, count: int) -> StartPosition:
        """Start at the ``count``-th message (1 = the first; cluster mode only)."""
        return cls(StartKind.MSGCOUNT, count)

    @property
    def token(self) -> bytes:
        """The wire token, e.g. ``b"virtual_queue:1024"``."""
        return f"{self.kind.value}:{self.value}".encode("ascii")


def _encode_subscribe(name: bytes, topic: str, channel: str, partition: int | None) -> bytes:
    """Encode one of the three subscribe commands without a start position."""
    params = (
        validate_topic(topic).encode("ascii"),
        validate_channel(channel).encode("ascii"),
        *partition_params(partition),
    )
    return command_line(name, *params)


def encode_sub(topic: str, channel: str, partition: int | None = None) -> bytes:
    """Return ``SUB <topic> <channel> [<partition>]\\n``."""
    return _encode_subscribe(b"SUB", topic, channel, partition)


def encode_sub_ordered(topic: str, channel: str, partition: int | None = None) -> bytes:
    """Return ``SUB_ORDERED <topic> <channel> [<partition>]\\n`` (fork only).

    Marks the channel ordered on nsqd, persistently; messages carry the detail part.
    """
    return _encode_subscribe(b"SUB_ORDERED", topic, channel, partition)


def encode_sub_advanced(
    topic: str,
    channel: str,
    partition: int | None = None,
    start: StartPosition | None = None,
) -> bytes:
    """Return ``SUB_ADVANCED <topic> <channel> [<partition>] [<start>]\\n`` (fork only).

    With a start position the line has five tokens, and nsqd then **ignores the partition
    token** and subscribes to its default partition for the topic (§2.0.3, §10 row 9); the
    partition (``-1`` when ``None``) is still written, as go-nsq does. Without a start position
    the partition is honoured.
    """
    if start is None:
        return _encode_subscribe(b"SUB_ADVANCED", topic, channel, partition)
    if not isinstance(start, StartPosition):
        raise InvalidArgumentError(f"start must be a StartPosition, not {type(start).__name__}")
    checked = validate_partition(partition)
    placeholder = DEFAULT_PARTITION if checked is None else checked
    return command_line(
        b"SUB_ADVANCED",
        validate_topic(topic).encode("ascii"),
        validate_channel(channel).encode("ascii"),
        str(placeholder).encode("ascii"),
        start.token,
    )


# --- flow control and acknowledgement ---------------------------------------------------------


def encode_rdy(count: int, *, max_rdy_count: int | None = None) -> bytes:
    """Return ``RDY <count>\\n``; ``count`` must be ``0..max_rdy_count`` (nsqd closes otherwise)."""
    check_uint(count, "RDY count", 63)
    if max_rdy_count is not None and count > max_rdy_count:
        raise InvalidArgumentError(f"RDY count {count} is over max_rdy_count {max_rdy_count}")
    return command_line(b"RDY", str(count).encode("ascii"))


def encode_fin(message_id: bytes) -> bytes:
    """Return ``FIN <16 raw id bytes>\\n`` (21 bytes; the id may contain spaces or newlines)."""
    return encode_fin_delivered(validate_message_id(message_id))


def encode_fin_delivered(message_id: bytes) -> bytes:
    """:func:`encode_fin` for an id nsqd delivered on this connection (16 bytes by
    construction), without checking it again: the consumer's hot path."""
    return b"FIN " + message_id + b"\n"


def encode_req(message_id: bytes, delay: float = 0.0) -> bytes:
    """Return ``REQ <16 raw id bytes> <delay ms>\\n``; ``delay`` is in seconds.

    On ordered channels nsqd ignores a REQ with a delay above 0: the message only comes back
    after ``msg_timeout``. Use ``delay=0`` there.
    """
    raw_id = validate_message_id(message_id)
    milliseconds = seconds_to_ms(delay, "REQ delay")
    return b"REQ " + raw_id + b" " + str(milliseconds).encode("ascii") + b"\n"


def encode_touch(message_id: bytes) -> bytes:
    """Return ``TOUCH <16 raw id bytes>\\n`` (23 bytes)."""
    return b"TOUCH " + validate_message_id(message_id) + b"\n"


def encode_cls() -> bytes:
    """Return ``CLS\\n``: stop delivery; nsqd answers ``CLOSE_WAIT``."""
    return b"CLS\n"


def encode_nop() -> bytes:
    """Return ``NOP\\n``, the answer to a heartbeat."""
    return b"NOP\n"


def encode_internal_create_topic(topic: str, partition: int, *, ext: bool = False) -> bytes:
    """Return ``INTERNAL_CREATE_TOPIC <topic> <partition> <true|false>\\n`` (standalone fork)."""
    checked = validate_partition(partition)
    if checked is None or checked < 0:
        raise InvalidArgumentError(
            f"INTERNAL_CREATE_TOPIC needs an explicit partition 0..{MAX_PARTITION}"
        )
    return command_line(
        b"INTERNAL_CREATE_TOPIC",
        validate_topic(topic).encode("ascii"),
        str(checked).encode("ascii"),
        b"true" if ext else b"false",
    )
