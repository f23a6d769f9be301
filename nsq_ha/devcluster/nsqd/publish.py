"""The emulated nsqd's publish commands, parsed as the fork parses them (PROTOCOL.md §2.10-2.16).

Pure functions from a decoded :class:`~nsq_ha.protocol.command_decoder.ClientCommand` to the
messages to store and back to the answer: ``PUB``, ``PUB_TRACE``, ``PUB_EXT`` and their ``MPUB``
forms (no DPUB: the fork has none), with the fork's error texts and check order, the 30-byte
traced answers, and the ``MPUB_EXT`` stream desynchronisation after a non-fatal header error
(the rest of the body goes back to the command decoder, as nsqd parses it as commands).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from nsq_ha.protocol.broker import encode_traced_response
from nsq_ha.protocol.command_decoder import ClientCommand
from nsq_ha.protocol.trace import TracedResponse

from ..model import DevPartition, Limits, ServerError
from ..store import StoredMessage
from .args import parse_atoi, partition_token
from .header_json import HeaderJsonError, RawString, parse_header, trace_id_value

__all__ = [
    "PUBLISH",
    "Publish",
    "check_ext_header",
    "publish_answer",
    "publish_body_wanted",
    "publish_target",
    "read_publish",
]

PUBLISH = frozenset({b"PUB", b"PUB_TRACE", b"PUB_EXT", b"MPUB", b"MPUB_TRACE", b"MPUB_EXT"})
_TRACED = frozenset({b"PUB_TRACE", b"MPUB_TRACE"})
_EXT = frozenset({b"PUB_EXT", b"MPUB_EXT"})
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

#: ``(body, trace_id, header)`` of one message to store
Item = tuple[bytes, int, bytes | None]


@dataclass(frozen=True, slots=True)
class Publish:
    """The messages of one publish command and whether an ext header carried a trace id."""

    messages: list[Item]
    traced_ext: bool = False


def publish_body_wanted(name: bytes, params: tuple[bytes, ...]) -> bool:
    """nsqd answers a publish without a topic, or with a malformed partition token, before
    reading its body."""
    if name not in PUBLISH:
        return True
    if not params:
        return False
    if len(params) == 2:
        try:
            parse_atoi(params[1])
        except ValueError:
            return False
    return True


def publish_target(command: ClientCommand, limits: Limits) -> tuple[str, int]:
    """The topic and partition (-1: none) of a publish, after the checks nsqd makes before it
    looks the topic up."""
    params = command.params
    if not params:
        raise ServerError("E_INVALID", "insufficient number of parameters")
    partition = partition_token(params, 3)
    if command.body is None and command.refusal is None:
        _refused_size(command, command.name.startswith(b"MPUB"), limits)
    return params[0].decode("latin-1"), partition


def read_publish(
    command: ClientCommand, part: DevPartition, limits: Limits, unread: Callable[[bytes], None]
) -> Publish:
    """The messages of a publish to ``part``; ``unread`` takes back the body's tail when an
    ``MPUB_EXT`` header error leaves the rest of the body to be parsed as commands."""
    name = command.name
    batch = name.startswith(b"MPUB")
    if command.refusal is not None:
        _refused_batch(command.refusal, limits.max_msg_size)
    body = command.body
    if body is None:  # publish_target raised this already
        _refused_size(command, batch, limits)
    items = _split_batch(body) if batch else [(body, 0)]
    messages: list[Item] = []
    traced_ext = False
    for index, (data, end) in enumerate(items):
        if name in _TRACED:
            messages.append(_traced_message(data, index, batch))
        elif name in _EXT:
            try:
                message, has_trace = _ext_message(part, data, batch)
            except ServerError as error:
                if batch and not error.fatal:
                    unread(body[end:])
                raise
            traced_ext = traced_ext or has_trace
            messages.append(message)
        else:
            messages.append((data, 0, None))
    return Publish(messages, traced_ext)


def publish_answer(name: bytes, stored: list[StoredMessage], traced_ext: bool) -> bytes:
    """``OK``, or the traced answer of ``PUB_TRACE``/``MPUB_TRACE``/a traced ``PUB_EXT``."""
    if name == b"PUB_TRACE" or (name == b"PUB_EXT" and traced_ext):
        first = stored[0]
        answer = TracedResponse(first.internal_id, first.trace_id, first.offset, first.raw_size)
        return encode_traced_response(answer)
    if name == b"MPUB_TRACE":
        first, total = stored[0], sum(m.raw_size for m in stored)
        return encode_traced_response(TracedResponse(first.internal_id, 0, first.offset, total))
    return b"OK"


def check_ext_header(header: bytes, *, ext_topic: bool) -> int | None:
    """Validate a PUB_EXT/MPUB_EXT/``/pub_ext`` JSON header as nsqd does; return its trace id.

    Returns the ``##trace_id`` value (``None`` when absent).  Any JSON value is accepted (an
    array or a string too, as the fork's parser does).  Raises the non-fatal
    ``E_INVALID_JSON_HEADER`` (not JSON; an empty header is a parse error),
    ``INVALID_TRACE_ID`` (not a string / not a decimal u64) or ``E_EXT_NOT_SUPPORT``
    (the topic is not ext; the caller adds the topic name to the description).
    """
    try:
        value = parse_header(header)
    except HeaderJsonError as exc:
        raise ServerError(
            "E_INVALID_JSON_HEADER", f"fail to parse json header:{exc}", fatal=False
        ) from None
    trace_id: int | None = None  # any JSON value is a header (fastjson.ParseBytes)
    found, raw = trace_id_value(value)
    if found:
        if not isinstance(raw, RawString):
            raise ServerError("INVALID_TRACE_ID", "passin trace id should be string", fatal=False)
        text = raw.text()
        if not (text.isascii() and text.isdigit()) or int(text) >= 1 << 64:
            raise ServerError("INVALID_TRACE_ID", "invalid trace id", fatal=False)
        trace_id = int(text)
    if not ext_topic:
        raise ServerError("E_EXT_NOT_SUPPORT", "ext content not supported in topic", fatal=False)
    return trace_id


def _refused_size(command: ClientCommand, batch: bool, limits: Limits) -> NoReturn:
    size = command.declared_size or 0
    if size <= 0:
        raise ServerError("E_BAD_BODY", f"invalid body size {size}")
    if batch:
        raise ServerError("E_BAD_BODY", f"body too big {size} > {limits.max_body_size}")
    raise ServerError("E_BAD_MESSAGE", f"message too big {size} > {limits.max_msg_size}")


def _refused_batch(refusal: tuple[str, ...], max_msg_size: int) -> NoReturn:
    kind = refusal[0]
    if kind == "count":
        raise ServerError("E_BAD_BODY", f"MPUB invalid message count {refusal[1]}")
    index, size = refusal[1], refusal[2]
    if kind == "message_size":
        raise ServerError("E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size}")
    raise ServerError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")


def _split_batch(body: bytes) -> list[tuple[bytes, int]]:
    """The messages of an MPUB* body (already validated structurally by the decoder), each
    with the body position where it ends."""
    (count,) = _U32.unpack_from(body)
    position = 4
    items: list[tuple[bytes, int]] = []
    for _ in range(count):
        (size,) = _U32.unpack_from(body, position)
        position += 4
        items.append((body[position : position + size], position + size))
        position += size
    return items


def _traced_message(data: bytes, index: int, batch: bool) -> Item:
    if len(data) <= 8:
        if batch:
            raise ServerError(
                "E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {len(data)} for tracing"
            )
        raise ServerError("E_BAD_BODY", f"invalid body size {len(data)} with trace id enabled")
    return (data[8:], int.from_bytes(data[:8], "big"), None)


def _ext_message(part: DevPartition, data: bytes, batch: bool) -> tuple[Item, bool]:
    if len(data) <= 2:
        raise ServerError(
            "E_BAD_BODY", f"invalid body size {len(data)} with ext json header enabled"
        )
    (length,) = _U16.unpack_from(data)
    if len(data) <= 2 + length:
        raise ServerError(
            "E_BAD_BODY", f"invalid body size {len(data)} in ext json header content length"
        )
    header, body = data[2 : 2 + length], data[2 + length :]
    if batch and not header:
        return (body, 0, None), False
    topic = part.topic
    try:
        trace_id = check_ext_header(header, ext_topic=topic.ext)
    except ServerError as error:
        if error.code == "E_EXT_NOT_SUPPORT":
            raise ServerError(
                error.code, f"{error.description} {topic.name}", fatal=False
            ) from None
        raise
    return (body, trace_id or 0, header), trace_id is not None
