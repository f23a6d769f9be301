"""The publish commands (§2.10-§2.15, vanilla DPUB in §8).

:class:`Publish` is the typed command the session takes: one of ``PUB``, ``PUB_TRACE``,
``PUB_EXT``, ``MPUB``, ``MPUB_TRACE``, ``MPUB_EXT`` for messages already checked where they came
in (the producer's ``prepare_message``): encoding it checks nothing again. :class:`Dpub` is
vanilla's deferred publish. The ``encode_*`` functions check their arguments and encode.

Size limits are optional keyword arguments: pass the server's ``max_msg_size`` (per message,
trace id and JSON header included) and ``max_body_size`` (whole MPUB* body) to get a
:class:`~nsq_ha.errors.BodyTooLargeError` naming the size and the limit instead of a fatal
``E_BAD_MESSAGE`` / ``E_BAD_BODY`` from nsqd. Empty bodies are refused (nsqd closes the
connection on a zero-length body).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Protocol, TypeAlias

from nsq_ha.errors import InvalidArgumentError
from nsq_ha.protocol.commands import (
    MAX_WIRE_LENGTH,
    as_bytes,
    check_size,
    check_uint,
    checked_seconds_to_ms,
    command_line,
    compact_json,
    partition_params,
    seconds_to_ms,
    with_body,
)
from nsq_ha.protocol.names import validate_partition, validate_topic

__all__ = [
    "MAX_EXT_HEADER_LENGTH",
    "PUBLISH_COMMANDS",
    "TRACE_ID_HEADER",
    "Dpub",
    "ExtHeader",
    "Publish",
    "PublishMessage",
    "PublishedMessage",
    "encode_dpub",
    "encode_ext_header",
    "encode_mpub",
    "encode_mpub_ext",
    "encode_mpub_trace",
    "encode_pub",
    "encode_pub_ext",
    "encode_pub_trace",
    "frame_batch",
]

#: A JSON header: a mapping (serialised compactly, key order kept) or ready-made JSON bytes.
ExtHeader: TypeAlias = Mapping[str, object] | bytes
#: Header key carrying the trace id as a decimal string.
TRACE_ID_HEADER = "##trace_id"
#: Longest JSON header nsqd delivers (the ext length is a u16 below 65535).
MAX_EXT_HEADER_LENGTH = 65534

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_DECIMAL_U64 = re.compile(r"[0-9]{1,20}")
#: The six publish commands :class:`Publish` encodes.
PUBLISH_COMMANDS = frozenset(
    {b"PUB", b"PUB_TRACE", b"PUB_EXT", b"MPUB", b"MPUB_TRACE", b"MPUB_EXT"}
)


class PublishedMessage(Protocol):
    """One checked message of a :class:`Publish` (the producer's ``OutgoingMessage`` is one)."""

    @property
    def body(self) -> bytes:
        """The body: non-empty bytes."""

    @property
    def trace_id(self) -> int | None:
        """A u64 trace id (PUB_TRACE, MPUB_TRACE; ``None`` sends 0 there)."""

    @property
    def ext(self) -> bytes | None:
        """The JSON header exactly as it goes on the wire (PUB_EXT, MPUB_EXT)."""


class PublishMessage(NamedTuple):
    """A checked message (see :class:`PublishedMessage`)."""

    body: bytes
    trace_id: int | None = None
    ext: bytes | None = None


class Publish(NamedTuple):
    """One publish command of checked messages; answered (``OK`` or the traced answer).

    ``name`` is one of :data:`PUBLISH_COMMANDS`: a ``PUB*`` sends the first message only, an
    ``MPUB*`` all of them (at least one). ``topic`` and ``partition`` are checked names, the
    messages were checked (bodies non-empty, sizes under the server's limits, trace ids u64,
    headers JSON objects nsqd accepts) where they came in: encoding trusts them. A named tuple
    (immutable): one is made per batch published, and a tuple is the cheapest to make.
    """

    name: bytes
    topic: str
    partition: int | None
    messages: Sequence[PublishedMessage]

    def encode(self) -> bytes:
        """The command's bytes."""
        name = self.name
        topic = self.topic.encode("ascii")
        if self.partition is None:
            line = b"%s %s\n" % (name, topic)
        else:
            line = b"%s %s %d\n" % (name, topic, self.partition)
        messages = self.messages
        if name == b"PUB":
            body = messages[0].body
        elif name == b"MPUB":
            body = _batch([m.body for m in messages])
        elif name == b"PUB_TRACE":
            body = _U64.pack(messages[0].trace_id or 0) + messages[0].body
        elif name == b"MPUB_TRACE":
            body = _batch([_U64.pack(m.trace_id or 0) + m.body for m in messages])
        elif name == b"PUB_EXT":
            body = _with_header(messages[0].ext or b"", messages[0].body)
        else:
            body = _batch([_with_header(m.ext or b"", m.body) for m in messages])
        return line + _U32.pack(len(body)) + body


def _with_header(header: bytes, body: bytes) -> bytes:
    """``[u16 json len][json][body]``: one message of PUB_EXT or MPUB_EXT."""
    return _U16.pack(len(header)) + header + body


def _batch(messages: list[bytes]) -> bytes:
    """``[u32 count]{[u32 len][msg]}``: the lengths and the messages in alternate slots (two
    slice assignments instead of a Python loop over the messages)."""
    parts: list[bytes] = [b""] * (2 * len(messages) + 1)
    parts[0] = _U32.pack(len(messages))
    parts[1::2] = map(_U32.pack, map(len, messages))
    parts[2::2] = messages
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class Dpub:
    """``DPUB <topic> <delay ms>`` of one checked message (vanilla only; ``delay`` in seconds,
    checked when made)."""

    name: ClassVar[bytes] = b"DPUB"
    topic: str
    body: bytes
    delay: float

    def __post_init__(self) -> None:
        """Check the delay (the one field a publish does not prepare)."""
        seconds_to_ms(self.delay, "DPUB delay")

    def encode(self) -> bytes:
        """The command's bytes."""
        line = b"DPUB %s %d\n" % (self.topic.encode("ascii"), checked_seconds_to_ms(self.delay))
        return line + _U32.pack(len(self.body)) + self.body


def _line(name: bytes, topic: str, partition: int | None) -> bytes:
    """Return ``NAME <topic> [<partition>]\\n``."""
    topic_token = validate_topic(topic).encode("ascii")
    return command_line(name, topic_token, *partition_params(validate_partition(partition)))


def _body(value: object, what: str) -> bytes:
    """Return a non-empty message body as bytes."""
    body = as_bytes(value, what)
    if not body:
        raise InvalidArgumentError(f"{what} must not be empty (nsqd refuses empty messages)")
    return body


def _check_trace_value(value: object) -> None:
    """Refuse a ``##trace_id`` nsqd would answer with INVALID_TRACE_ID."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{TRACE_ID_HEADER} must be a decimal string, not {value!r}")
    if _DECIMAL_U64.fullmatch(value) is None or int(value) >= 1 << 64:
        raise InvalidArgumentError(f"{TRACE_ID_HEADER} {value!r} is not a decimal u64")


def encode_ext_header(header: ExtHeader) -> bytes:
    """Return the JSON bytes of an ext header, checked as nsqd checks them.

    The header must be a JSON object of at most 65534 bytes; ``##trace_id``, when present,
    must be a string holding a decimal u64. Bytes are checked and returned verbatim.
    """
    if isinstance(header, Mapping):
        data = compact_json(dict(header), "ext header")
        parsed: object = header
    else:
        data = as_bytes(header, "ext header")
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise InvalidArgumentError(f"ext header is not valid JSON: {exc}") from exc
    if not isinstance(parsed, Mapping):
        raise InvalidArgumentError("ext header must be a JSON object")
    if TRACE_ID_HEADER in parsed:
        _check_trace_value(parsed[TRACE_ID_HEADER])
    if len(data) > MAX_EXT_HEADER_LENGTH:
        raise InvalidArgumentError(
            f"ext header is {len(data)} bytes, over the limit of {MAX_EXT_HEADER_LENGTH}"
        )
    return data


def encode_pub(
    topic: str, body: bytes, partition: int | None = None, *, max_msg_size: int | None = None
) -> bytes:
    """Return ``PUB <topic> [<partition>]\\n[len][body]``."""
    data = _body(body, "PUB body")
    check_size("PUB body", len(data), max_msg_size)
    return with_body(_line(b"PUB", topic, partition), data)


def encode_pub_trace(
    topic: str,
    body: bytes,
    trace_id: int,
    partition: int | None = None,
    *,
    max_msg_size: int | None = None,
) -> bytes:
    """Return ``PUB_TRACE <topic> [<partition>]\\n[len][u64 trace id][body]`` (fork only).

    nsqd answers with the 30-byte traced response (:mod:`nsq_ha.protocol.trace`).
    """
    data = _U64.pack(check_uint(trace_id, "trace id", 64)) + _body(body, "PUB_TRACE body")
    check_size("PUB_TRACE body (with the 8-byte trace id)", len(data), max_msg_size)
    return with_body(_line(b"PUB_TRACE", topic, partition), data)


def encode_pub_ext(
    topic: str,
    body: bytes,
    header: ExtHeader,
    partition: int | None = None,
    *,
    max_msg_size: int | None = None,
) -> bytes:
    """Return ``PUB_EXT <topic> [<partition>]\\n[len][u16 json len][json][body]`` (fork only).

    The header must not be empty (nsqd cannot parse an empty header). With a valid
    ``##trace_id`` nsqd answers with the traced response, otherwise ``OK``.
    """
    json_header = encode_ext_header(header)
    data = _U16.pack(len(json_header)) + json_header + _body(body, "PUB_EXT body")
    check_size("PUB_EXT body (with the JSON header)", len(data), max_msg_size)
    return with_body(_line(b"PUB_EXT", topic, partition), data)


def frame_batch(
    name: bytes,
    topic: str,
    partition: int | None,
    messages: list[bytes],
    max_msg_size: int | None,
    max_body_size: int | None,
) -> bytes:
    """Frame already-encoded messages as ``[u32 count]{[u32 len][msg]}`` and check sizes.

    ``name`` is the batch command (``MPUB``, ``MPUB_TRACE``, ``MPUB_EXT``); each message must
    already be what that command carries (non-empty bytes: the encoders above check that).
    """
    if not messages:
        raise InvalidArgumentError(f"{name.decode()} needs at least one message")
    lengths = list(map(len, messages))
    limit = MAX_WIRE_LENGTH if max_msg_size is None else min(max_msg_size, MAX_WIRE_LENGTH)
    if max(lengths) > limit:
        for index, length in enumerate(lengths):  # name the first one too large
            check_size(f"{name.decode()} message {index}", length, max_msg_size)
    body = _batch(messages)
    check_size(f"{name.decode()} body", len(body), max_body_size)
    return with_body(_line(name, topic, partition), body)


def encode_mpub(
    topic: str,
    bodies: Iterable[bytes],
    partition: int | None = None,
    *,
    max_msg_size: int | None = None,
    max_body_size: int | None = None,
) -> bytes:
    """Return ``MPUB <topic> [<partition>]\\n[len][u32 count]{[u32 len][body]}``."""
    messages = list(bodies)
    if not all(type(body) is bytes and body for body in messages):  # else say which is wrong
        messages = [_body(body, "MPUB message") for body in messages]
    return frame_batch(b"MPUB", topic, partition, messages, max_msg_size, max_body_size)


def encode_mpub_trace(
    topic: str,
    messages: Iterable[tuple[int, bytes]],
    partition: int | None = None,
    *,
    max_msg_size: int | None = None,
    max_body_size: int | None = None,
) -> bytes:
    """Return ``MPUB_TRACE`` for ``(trace_id, body)`` pairs (fork only).

    nsqd answers with one traced response: the first message's id and offset, trace id 0 and
    the raw size of the whole batch.
    """
    encoded = [
        _U64.pack(check_uint(trace_id, "trace id", 64)) + _body(body, "MPUB_TRACE message")
        for trace_id, body in messages
    ]
    return frame_batch(b"MPUB_TRACE", topic, partition, encoded, max_msg_size, max_body_size)


def encode_mpub_ext(
    topic: str,
    messages: Iterable[tuple[ExtHeader | None, bytes]],
    partition: int | None = None,
    *,
    max_msg_size: int | None = None,
    max_body_size: int | None = None,
) -> bytes:
    """Return ``MPUB_EXT`` for ``(header, body)`` pairs (fork only; answer is plain ``OK``).

    A ``None`` header is sent with JSON length 0 (allowed here, unlike PUB_EXT). Any error
    frame after MPUB_EXT means the stream is out of sync: reconnect (§2.15).
    """
    encoded: list[bytes] = []
    for header, body in messages:
        json_header = b"" if header is None else encode_ext_header(header)
        encoded.append(_U16.pack(len(json_header)) + json_header + _body(body, "MPUB_EXT message"))
    return frame_batch(b"MPUB_EXT", topic, partition, encoded, max_msg_size, max_body_size)


def encode_dpub(topic: str, body: bytes, delay: float, *, max_msg_size: int | None = None) -> bytes:
    """Return ``DPUB <topic> <delay ms>\\n[len][body]`` (vanilla only; ``delay`` in seconds).

    The fork has no DPUB: it answers with a fatal ``E_INVALID invalid command``.
    """
    milliseconds = seconds_to_ms(delay, "DPUB delay")
    data = _body(body, "DPUB body")
    check_size("DPUB body", len(data), max_msg_size)
    line = command_line(b"DPUB", validate_topic(topic).encode("ascii"), str(milliseconds).encode())
    return with_body(line, data)
