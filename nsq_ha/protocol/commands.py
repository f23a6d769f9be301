"""The client's commands without a message body (§1.2, §2; publishes: :mod:`.publish`), typed.

Each is a frozen dataclass whose ``name`` is its wire name and whose ``encode()`` returns its
exact bytes; it is checked once, when made (an :class:`~nsq_ha.errors.InvalidArgumentError`
subclass for what nsqd would refuse). ``name`` reads a table, not a ``ClassVar``: mypyc makes
every value in a dataclass's body a field (mypyc/mypyc#1122), a constructor argument. This module
is the one place that converts the API's float seconds to and from the wire's milliseconds.
"""

from __future__ import annotations

import enum
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from nsq_ha.errors import BodyTooLargeError, InvalidArgumentError, NsqError
from nsq_ha.protocol.names import (
    DEFAULT_PARTITION,
    validate_channel,
    validate_message_id,
    validate_partition,
    validate_topic,
)

#: The four bytes a client sends first.
MAGIC_V2 = b"  V2"

_U32 = struct.Struct(">I")
#: nsqd reads body lengths as a signed 32-bit integer.
MAX_WIRE_LENGTH: Final = 0x7FFF_FFFF


class Command(Protocol):
    """What the session takes: a wire name and the bytes of the whole command."""

    @property
    def name(self) -> bytes:
        """The command's name on the wire (``b"SUB"``, ``b"FIN"``, ...)."""

    def encode(self) -> bytes:
        """The command's exact bytes."""


def seconds_to_ms(seconds: object, what: str) -> int:
    """Convert a non-negative duration in seconds to whole milliseconds (rounded); anything
    else raises InvalidArgumentError (typed ``object``: a compiled caller passes anything)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgumentError(f"{what} must be a number of seconds, not {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgumentError(f"{what} must be a finite number >= 0, got {seconds!r}")
    return checked_seconds_to_ms(seconds)


def checked_seconds_to_ms(seconds: float) -> int:
    """Whole milliseconds (rounded) of a duration :func:`seconds_to_ms` accepted."""
    return round(seconds * 1000)


def ms_to_seconds(milliseconds: int) -> float:
    """Convert milliseconds from the wire to float seconds."""
    return milliseconds / 1000


def check_size(what: str, size: int, limit: int | None) -> None:
    """Raise BodyTooLargeError if ``size`` exceeds ``limit`` (or what a u32/i32 length holds)."""
    if limit is not None and size > limit:
        raise BodyTooLargeError(what, size, limit)
    if size > MAX_WIRE_LENGTH:
        raise BodyTooLargeError(what, size, MAX_WIRE_LENGTH)


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


def json_object(data: bytes, what: str, error: type[NsqError]) -> dict[str, Any]:
    """Parse ``data`` as a JSON object; anything else raises ``error``."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise error(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise error(f"{what} is not a JSON object")
    return value


def check_uint(value: object, what: str, bits: int, minimum: int = 0) -> int:
    """Return ``value`` if it is an int in ``minimum..2**bits-1`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{what} must be an int, not {type(value).__name__}")
    if not minimum <= value < 1 << bits:
        raise InvalidArgumentError(f"{what} {value} is out of range {minimum}..{(1 << bits) - 1}")
    return value


class _Named:
    """A command whose wire name is its class's entry in :data:`_NAMES`."""

    __slots__ = ()

    @property
    def name(self) -> bytes:
        """The command's name on the wire."""
        return _NAMES[type(self)]

    def encode(self) -> bytes:
        """``NAME\\n``, for the commands without parameters."""
        return self.name + b"\n"


@dataclass(frozen=True, slots=True)
class Identify(_Named):
    """``IDENTIFY\\n[len][JSON]`` (compact, keys in order); answered. Make it with
    :meth:`of` (build the body with :func:`nsq_ha.protocol.identify.build_identify`)."""

    body: bytes

    @classmethod
    def of(cls, body: Mapping[str, object], *, max_body_size: int | None = None) -> Identify:
        """The checked IDENTIFY for ``body``."""
        what = "IDENTIFY body"
        if not isinstance(body, Mapping):
            raise InvalidArgumentError(f"{what} must be a mapping, not {type(body).__name__}")
        data = compact_json(dict(body), what)
        check_size(what, len(data), max_body_size)
        return cls(data)

    def encode(self) -> bytes:
        return b"IDENTIFY\n" + _U32.pack(len(self.body)) + self.body


@dataclass(frozen=True, slots=True)
class Auth(_Named):
    """``AUTH\\n[len][secret]``; answered. Make it with :meth:`of`; the repr hides the secret."""

    secret: bytes

    def __repr__(self) -> str:
        return "Auth(secret=<hidden>)"

    @classmethod
    def of(cls, secret: str | bytes, *, max_body_size: int | None = None) -> Auth:
        """The checked AUTH for ``secret`` (not empty)."""
        raw = secret.encode("utf-8") if isinstance(secret, str) else as_bytes(secret, "AUTH secret")
        if not raw:
            raise InvalidArgumentError("AUTH secret must not be empty")
        check_size("AUTH secret", len(raw), max_body_size)
        return cls(raw)

    def encode(self) -> bytes:
        return b"AUTH\n" + _U32.pack(len(self.secret)) + self.secret


class StartKind(enum.Enum):
    """Kinds of SUB_ADVANCED start position (§2.3.1)."""

    SPECIAL = "special"
    VIRTUAL_QUEUE = "virtual_queue"
    TIMESTAMP = "timestamp"
    MSGCOUNT = "msgcount"


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a SUB_ADVANCED consumer starts, ``<kind>:<int64>``: make it with :meth:`latest`,
    :meth:`at_offset`, :meth:`at_timestamp` or :meth:`at_count`. Only ``latest`` works on a
    standalone nsqd; nsqd applies the position only when this client is alone on the channel."""

    kind: StartKind
    value: int

    def __post_init__(self) -> None:
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


@dataclass(frozen=True, slots=True)
class _Subscription(_Named):
    """What the three subscribe commands share; answered, checked when made."""

    topic: str
    channel: str
    partition: int | None = None

    def __post_init__(self) -> None:
        validate_topic(self.topic)
        validate_channel(self.channel)
        validate_partition(self.partition)

    def encode(self) -> bytes:
        line = b"%s %s %s" % (self.name, self.topic.encode("ascii"), self.channel.encode("ascii"))
        return line + b"\n" if self.partition is None else line + b" %d\n" % self.partition


@dataclass(frozen=True, slots=True)
class Sub(_Subscription):
    """``SUB <topic> <channel> [<partition>]``."""


@dataclass(frozen=True, slots=True)
class SubOrdered(_Subscription):
    """``SUB_ORDERED <topic> <channel> [<partition>]`` (fork only): marks the channel ordered,
    persistently; nsqd sends a partition's next message only after this one's FIN."""


@dataclass(frozen=True, slots=True)
class SubAdvanced(_Subscription):
    """``SUB_ADVANCED <topic> <channel> [<partition>] [<start>]`` (fork only). With a start
    position nsqd **ignores the partition token** and subscribes to its default partition for
    the topic (§2.0.3, §10 row 9); the token (``-1`` for ``None``) is written, as go-nsq does."""

    start: StartPosition | None = None

    def __post_init__(self) -> None:
        _Subscription.__post_init__(self)
        if self.start is not None and not isinstance(self.start, StartPosition):
            raise InvalidArgumentError(
                f"start must be a StartPosition, not {type(self.start).__name__}"
            )

    def encode(self) -> bytes:
        if self.start is None:
            return _Subscription.encode(self)
        partition = DEFAULT_PARTITION if self.partition is None else self.partition
        topic, channel = self.topic.encode("ascii"), self.channel.encode("ascii")
        return b"SUB_ADVANCED %s %s %d %s\n" % (topic, channel, partition, self.start.token)


@dataclass(frozen=True, slots=True)
class Rdy(_Named):
    """``RDY <count>``: how many messages nsqd may have in flight here (``0..2**63-1``)."""

    count: int

    def __post_init__(self) -> None:
        check_uint(self.count, "RDY count", 63)

    def encode(self) -> bytes:
        return b"RDY %d\n" % self.count


@dataclass(frozen=True, slots=True)
class _Answer(_Named):
    """What FIN, REQ and TOUCH share: a message id, checked when made; never answered."""

    message_id: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "message_id", validate_message_id(self.message_id))

    def encode(self) -> bytes:
        return self.name + b" " + self.message_id + b"\n"


@dataclass(frozen=True, slots=True)
class Fin(_Answer):
    """``FIN <16 raw id bytes>`` (21 bytes; the id may contain spaces or newlines)."""


@dataclass(frozen=True, slots=True)
class Req(_Answer):
    """``REQ <16 raw id bytes> <delay ms>``; ``delay`` in seconds. On ordered channels nsqd
    ignores a delay above 0: the message comes back only after ``msg_timeout``."""

    delay: float = 0.0

    def __post_init__(self) -> None:
        _Answer.__post_init__(self)
        seconds_to_ms(self.delay, "REQ delay")

    def encode(self) -> bytes:
        return b"REQ " + self.message_id + b" %d\n" % checked_seconds_to_ms(self.delay)


@dataclass(frozen=True, slots=True)
class Touch(_Answer):
    """``TOUCH <16 raw id bytes>`` (23 bytes): nsqd restarts the message's timeout."""


@dataclass(frozen=True, slots=True)
class Cls(_Named):
    """``CLS``: stop delivery; nsqd answers ``CLOSE_WAIT``."""


@dataclass(frozen=True, slots=True)
class Nop(_Named):
    """``NOP``, the answer to a heartbeat; never answered."""


_NAMES: dict[type[_Named], bytes] = {
    Identify: b"IDENTIFY",
    Auth: b"AUTH",
    Sub: b"SUB",
    SubOrdered: b"SUB_ORDERED",
    SubAdvanced: b"SUB_ADVANCED",
    Rdy: b"RDY",
    Fin: b"FIN",
    Req: b"REQ",
    Touch: b"TOUCH",
    Cls: b"CLS",
    Nop: b"NOP",
}
