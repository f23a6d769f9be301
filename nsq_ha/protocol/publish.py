"""The publish commands (§2.10-§2.15, vanilla DPUB in §8): :class:`Publish` for messages already
checked where they came in (the producer's ``prepare_message``), :class:`Dpub`.

Size limits are optional: given the server's ``max_msg_size`` (per message, trace id and JSON
header included) and ``max_body_size`` (whole MPUB* body), a too large publish raises
:class:`~nsq_ha.errors.BodyTooLargeError` instead of earning a fatal ``E_BAD_MESSAGE`` /
``E_BAD_BODY`` from nsqd.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from nsq_ha.errors import InvalidArgumentError
from nsq_ha.protocol.commands import (
    MAX_WIRE_LENGTH,
    as_bytes,
    check_size,
    checked_seconds_to_ms,
    compact_json,
    json_object,
    seconds_to_ms,
)

#: A JSON header: a mapping (serialised compactly, key order kept) or ready-made JSON bytes.
ExtHeader: TypeAlias = Mapping[str, object] | bytes
#: Header key carrying the trace id as a decimal string.
TRACE_ID_HEADER = "##trace_id"
#: Longest JSON header nsqd delivers (the ext length is a u16 below 65535).
MAX_EXT_HEADER_LENGTH: Final = 65534

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_DECIMAL_U64: Final = re.compile(r"[0-9]{1,20}")
#: what a single message's size is called in a refusal
_SINGLE: Final = {
    b"PUB": "PUB body",
    b"PUB_TRACE": "PUB_TRACE body (with the 8-byte trace id)",
    b"PUB_EXT": "PUB_EXT body (with the JSON header)",
}


class PublishMessage:
    """One checked message: a non-empty body, an optional u64 trace id (``None`` sends 0 in a
    traced command), and the JSON header as it goes on the wire (``##trace_id`` merged in).
    A plain class, which the compiled build makes natively (unlike a named tuple)."""

    __slots__ = ("body", "ext", "trace_id")

    def __init__(self, body: bytes, trace_id: int | None = None, ext: bytes | None = None) -> None:
        self.body = body
        self.trace_id = trace_id
        self.ext = ext

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PublishMessage):
            return NotImplemented
        return self.body == other.body and self.trace_id == other.trace_id and self.ext == other.ext

    def __hash__(self) -> int:
        return hash((self.body, self.trace_id, self.ext))

    def __repr__(self) -> str:
        return f"PublishMessage(body={self.body!r}, trace_id={self.trace_id!r}, ext={self.ext!r})"


class Publish:
    """One publish command of checked messages, answered: ``PUB``, ``PUB_TRACE``, ``PUB_EXT``
    (the first message) or ``MPUB``, ``MPUB_TRACE``, ``MPUB_EXT`` (all). :meth:`encode` checks
    each message's size as nsqd measures it against ``max_msg_size`` and an ``MPUB*`` body
    against ``max_body_size`` (``None``: what a length field holds)."""

    __slots__ = ("max_body_size", "max_msg_size", "messages", "name", "partition", "topic")

    def __init__(
        self,
        name: bytes,
        topic: str,
        partition: int | None,
        messages: Sequence[PublishMessage],
        max_msg_size: int | None = None,
        max_body_size: int | None = None,
    ) -> None:
        self.name = name
        self.topic = topic
        self.partition = partition
        self.messages = messages
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size

    def _fields(self) -> tuple[object, ...]:
        return (
            self.name,
            self.topic,
            self.partition,
            list(self.messages),
            self.max_msg_size,
            self.max_body_size,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Publish):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        return (
            f"Publish(name={self.name!r}, topic={self.topic!r}, partition={self.partition!r}, "
            f"messages={self.messages!r}, max_msg_size={self.max_msg_size!r}, "
            f"max_body_size={self.max_body_size!r})"
        )

    def encode(self) -> bytes:
        """The command's bytes."""
        name = self.name
        topic = self.topic.encode("ascii")
        if self.partition is None:
            line = b"%s %s\n" % (name, topic)
        else:
            line = b"%s %s %d\n" % (name, topic, self.partition)
        messages = self.messages
        limit = MAX_WIRE_LENGTH if self.max_msg_size is None else self.max_msg_size
        if name in _SINGLE:
            first = messages[0]
            if name == b"PUB":
                body = first.body
            elif name == b"PUB_TRACE":
                body = _U64.pack(first.trace_id or 0) + first.body
            else:
                body = _with_header(first.ext or b"", first.body)
            if len(body) > limit:
                check_size(_SINGLE[name], len(body), self.max_msg_size)
            return line + _U32.pack(len(body)) + body
        if name == b"MPUB":
            parts = [m.body for m in messages]
        elif name == b"MPUB_TRACE":
            parts = [_U64.pack(m.trace_id or 0) + m.body for m in messages]
        else:
            parts = [_with_header(m.ext or b"", m.body) for m in messages]
        batch = _batch(parts, limit)
        if batch is None:
            for index, part in enumerate(parts):  # name the first one too large
                check_size(f"{name.decode()} message {index}", len(part), self.max_msg_size)
            raise AssertionError("a part over the limit")  # pragma: no cover - checked above
        size = len(batch)
        if size > MAX_WIRE_LENGTH or (self.max_body_size is not None and size > self.max_body_size):
            check_size(f"{name.decode()} body", size, self.max_body_size)
        return line + _U32.pack(size) + batch


def _with_header(header: bytes, body: bytes) -> bytes:
    """``[u16 json len][json][body]``: one message of PUB_EXT or MPUB_EXT."""
    return _U16.pack(len(header)) + header + body


def _batch(parts: list[bytes], limit: int) -> bytes | None:
    """``[u32 count]{[u32 len][msg]}`` in one pass over ``parts``; None if one is longer than
    ``limit``. A length is packed once for a run of parts of that length (records of one
    format often are): a pack is a method call, the compare is not."""
    out: list[bytes] = [b""] * (2 * len(parts) + 1)
    out[0] = _U32.pack(len(parts))
    pack = _U32.pack
    last = -1
    prefix = b""
    index = 1
    for part in parts:
        length = len(part)
        if length != last:
            if length > limit:
                return None
            last = length
            prefix = pack(length)
        out[index] = prefix
        out[index + 1] = part
        index += 2
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class Dpub:
    """``DPUB <topic> <delay ms>`` of one checked message (vanilla only; the fork answers a
    fatal ``E_INVALID``); ``delay`` in seconds, checked when made."""

    topic: str
    body: bytes
    delay: float

    @property
    def name(self) -> bytes:
        return b"DPUB"

    def __post_init__(self) -> None:
        seconds_to_ms(self.delay, "DPUB delay")

    def encode(self) -> bytes:
        """The command's bytes."""
        line = b"DPUB %s %d\n" % (self.topic.encode("ascii"), checked_seconds_to_ms(self.delay))
        return line + _U32.pack(len(self.body)) + self.body


def encode_ext_header(header: ExtHeader | object) -> bytes:
    """Return the JSON bytes of an ext header, checked as nsqd checks them: a JSON object of at
    most 65534 bytes whose ``##trace_id``, if any, is a string holding a decimal u64 (anything
    else raises InvalidArgumentError, in a compiled build too). Bytes are returned verbatim."""
    parsed: Mapping[str, object]
    if isinstance(header, Mapping):
        data = compact_json(dict(header), "ext header")
        parsed = header
    else:
        data = as_bytes(header, "ext header")
        parsed = json_object(data, "ext header", InvalidArgumentError)
    if TRACE_ID_HEADER in parsed:
        value = parsed[TRACE_ID_HEADER]  # nsqd answers INVALID_TRACE_ID otherwise
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{TRACE_ID_HEADER} must be a decimal string, not {value!r}")
        if _DECIMAL_U64.fullmatch(value) is None or int(value) >= 1 << 64:
            raise InvalidArgumentError(f"{TRACE_ID_HEADER} {value!r} is not a decimal u64")
    if len(data) > MAX_EXT_HEADER_LENGTH:
        raise InvalidArgumentError(
            f"ext header is {len(data)} bytes, over the limit of {MAX_EXT_HEADER_LENGTH}"
        )
    return data
