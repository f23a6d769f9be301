"""Publish batches without I/O: message preparation, batch forming, commands and receipts.

A producer queues :class:`OutgoingMessage` values; :class:`BatchBuilder` decides how many of them
fit one command (the server's ``max_msg_size``/``max_body_size`` and a count cap), and
:func:`encode_batch` picks the command:

========================  ===========================  ===========================
messages                  one message                  several messages
========================  ===========================  ===========================
plain                     ``PUB``                      ``MPUB``
some traced (or tracing)  ``PUB_TRACE``                ``MPUB_TRACE`` (others: 0)
some with an ext header   ``PUB_EXT``                  ``MPUB_EXT`` (others: none)
========================  ===========================  ===========================

A trace id given together with an ext header travels as the header's ``##trace_id`` (as the
fork's SDKs do). :func:`receipts_from_answer` turns nsqd's answer into one :class:`Receipt` per
message. For ``MPUB_TRACE`` nsqd reports only the first message's id and offset and the batch's
total size; the other messages' values follow from the stored record layout (PROTOCOL.md §4.6:
ids are consecutive, each record is ``4 + 26 + len(body)`` bytes, one more on an ext topic) and
are given only when that layout adds up to the total nsqd reported.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import operator
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol, TypeVar, cast

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError
from nsq_ha.protocol.commands import as_bytes, check_size, check_uint, compact_json
from nsq_ha.protocol.frames import OK
from nsq_ha.protocol.publish import (
    TRACE_ID_HEADER,
    ExtHeader,
    encode_ext_header,
    encode_mpub_ext,
    encode_mpub_trace,
    encode_pub,
    encode_pub_ext,
    encode_pub_trace,
    frame_batch,
)
from nsq_ha.protocol.trace import TracedResponse, parse_traced_response

__all__ = [
    "PLAIN_RECEIPT",
    "BatchBuilder",
    "OutgoingMessage",
    "Receipt",
    "batch_body_size",
    "batch_command",
    "encode_batch",
    "mpub_sizes",
    "plain_size",
    "prepare_batch",
    "prepare_message",
    "prepare_messages",
    "prepare_one",
    "receipts_from_answer",
    "record_size",
]

log = logging.getLogger(__name__)

_U64 = struct.Struct(">QQ")
_NO_LIMIT = float("inf")
#: Bytes of a stored record before the body: length prefix, timestamp, attempts, id, trace id.
_RECORD_OVERHEAD = 4 + 26


class OutgoingMessage(NamedTuple):
    """One message ready to publish: validated body, optional trace id, encoded ext header.

    A named tuple rather than a frozen dataclass: one is made per published message, and a
    tuple is several times cheaper to build.
    """

    body: bytes
    trace_id: int | None = None
    #: The JSON header exactly as it goes on the wire (``##trace_id`` already merged in).
    ext: bytes | None = None


def prepare_message(
    body: object,
    *,
    trace_id: int | None = None,
    ext: ExtHeader | None = None,
    max_msg_size: int | None = None,
) -> OutgoingMessage:
    """Validate one message before it is queued; every problem raises a typed error.

    ``body`` must be non-empty bytes; ``trace_id`` a u64; ``ext`` a JSON object (a mapping, or
    JSON bytes) that nsqd will accept. A trace id and an ext header together put the trace id
    into the header as ``##trace_id`` (a header that already names a different one is refused).
    The size checked against ``max_msg_size`` is what nsqd compares: the body plus the 8-byte
    trace id or the ``2 + len(header)`` ext prefix.
    """
    if isinstance(body, str):
        raise InvalidArgumentError("message body must be bytes, not str: encode it: body.encode()")
    data = as_bytes(body, "message body")
    if not data:
        raise InvalidArgumentError("message body must not be empty (nsqd refuses empty messages)")
    if trace_id is not None:
        check_uint(trace_id, "trace id", 64)
    header: bytes | None = None
    if ext is not None:
        header = encode_ext_header(ext)
        if trace_id is not None:
            header = _with_trace_id(header, trace_id)
        else:
            trace_id = _header_trace_id(header)
        check_size("message body (with the ext header)", 2 + len(header) + len(data), max_msg_size)
    elif trace_id is not None:
        check_size("message body (with the 8-byte trace id)", 8 + len(data), max_msg_size)
    else:
        check_size("message body", len(data), max_msg_size)
    return OutgoingMessage(data, trace_id, header)


#: an OutgoingMessage from (body, trace_id, ext), without a Python-level call per message
_new_message = functools.partial(tuple.__new__, OutgoingMessage)


def prepare_one(
    body: object,
    trace_id: int | None = None,
    ext: ExtHeader | None = None,
    *,
    max_msg_size: int | None = None,
) -> OutgoingMessage:
    """:func:`prepare_message` of one publish call's message: a plain body (non-empty
    ``bytes`` within ``max_msg_size``, no trace id, no header) is ready as it is."""
    if (
        trace_id is None
        and ext is None
        and type(body) is bytes
        and 0 < len(body) <= (_NO_LIMIT if max_msg_size is None else max_msg_size)
    ):
        return _new_message((body, None, None))
    return prepare_message(body, trace_id=trace_id, ext=ext, max_msg_size=max_msg_size)


def prepare_messages(
    bodies: Sequence[object],
    trace_ids: Sequence[int | None] | None = None,
    exts: Sequence[ExtHeader | None] | None = None,
    *,
    max_msg_size: int | None = None,
) -> list[OutgoingMessage]:
    """:func:`prepare_message` of each body with its trace id and ext header (``None``: none
    for any message; else one per body): what every publish, of one message or many, sends."""
    return prepare_batch(bodies, trace_ids, exts, max_msg_size=max_msg_size)[0]


def prepare_batch(
    bodies: Sequence[object],
    trace_ids: Sequence[int | None] | None = None,
    exts: Sequence[ExtHeader | None] | None = None,
    *,
    max_msg_size: int | None = None,
) -> tuple[list[OutgoingMessage], int | None]:
    """:func:`prepare_messages`, and what the messages add to an ``MPUB`` body (a length and
    the body each) when none has a trace id or an ext header (else ``None``).

    Bodies that are all non-empty ``bytes`` within ``max_msg_size``, with no trace ids and no
    headers, are ready as they are: that is checked for all at once (the common case, in
    C-level passes); anything else goes through :func:`prepare_message` one by one.
    """
    count = len(bodies)
    if trace_ids is None and exts is None and count and set(map(type, bodies)) == _ONLY_BYTES:
        limit = max_msg_size if max_msg_size is not None else _NO_LIMIT
        lengths = list(map(len, cast("Sequence[bytes]", bodies)))
        if min(lengths) > 0 and max(lengths) <= limit:
            plain = zip(bodies, itertools.repeat(None), itertools.repeat(None))
            return list(map(_new_message, plain)), 4 * count + sum(lengths)
    messages = [
        prepare_message(b, trace_id=t, ext=h, max_msg_size=max_msg_size)
        for b, t, h in zip(bodies, trace_ids or [None] * count, exts or [None] * count, strict=True)
    ]
    return messages, plain_size(messages)


def plain_size(messages: Sequence[OutgoingMessage]) -> int | None:
    """What ``messages`` add to an ``MPUB`` body (a length and the body each), or ``None``
    when one of them has a trace id or an ext header."""
    if len(messages) == 1:  # the same sums, without four iterator objects
        body, trace_id, ext = messages[0]
        return 4 + len(body) if trace_id is None and ext is None else None
    if all(map(_IS_NONE, map(_TRACE_ID_OF, messages))) and all(
        map(_IS_NONE, map(_EXT_OF, messages))
    ):
        return 4 * len(messages) + sum(map(len, map(_BODY_OF, messages)))
    return None


_ONLY_BYTES: Final = {bytes}
_BODY_OF = operator.itemgetter(0)
_TRACE_ID_OF = operator.itemgetter(1)
_EXT_OF = operator.itemgetter(2)
_IS_NONE = functools.partial(operator.is_, None)


def _with_trace_id(header: bytes, trace_id: int) -> bytes:
    parsed = json.loads(header)
    existing = parsed.get(TRACE_ID_HEADER)
    if existing is not None:
        if existing != str(trace_id):
            raise InvalidArgumentError(
                f"trace_id={trace_id} conflicts with the header's {TRACE_ID_HEADER}={existing!r}"
            )
        return header
    parsed[TRACE_ID_HEADER] = str(trace_id)
    return encode_ext_header(compact_json(parsed, "ext header"))


def _header_trace_id(header: bytes) -> int | None:
    value = json.loads(header).get(TRACE_ID_HEADER)
    return None if value is None else int(value)  # checked by encode_ext_header


def _kind(traced: bool, ext: bool) -> str:
    return "ext" if ext else "trace" if traced else "plain"


def batch_body_size(bodies: int, body_bytes: int, ext_bytes: int, kind: str) -> int:
    """Size of an ``MPUB*`` body: count, then a length and the encoded message per message.

    ``ext_bytes`` is the total length of the JSON headers in the batch (used by ``ext``).
    """
    size = 4 + 4 * bodies + body_bytes
    if kind == "trace":
        size += 8 * bodies
    elif kind == "ext":
        size += 2 * bodies + ext_bytes
    return size


class _HasMessage(Protocol):
    @property
    def message(self) -> OutgoingMessage: ...


_Item = TypeVar("_Item", bound=_HasMessage)


class BatchBuilder:
    """Take as many queued messages as one command may carry, in queue order.

    ``tracing`` makes every batch traced (so every publish is answered with its offset).
    ``ext_topic`` says whether the topic is known to be an ext topic: only then are messages
    with a header sent in a batch with others (nsqd rejects a header on other topics, and that
    error must reach only the message that carried it). ``checks_each``: ``max_msg_size`` is a
    limit an nsqd named, lower than the one messages were checked against when they were
    queued: every message is measured, and one over it goes in a batch of its own (nsqd refuses
    only that one).
    """

    def __init__(
        self,
        *,
        max_msg_size: int,
        max_body_size: int,
        max_count: int = 1000,
        tracing: bool = False,
        ext_topic: bool = False,
        checks_each: bool = False,
    ) -> None:
        if max_count < 1:
            raise InvalidArgumentError(f"max_count must be >= 1, got {max_count}")
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.max_count = max_count
        self.tracing = tracing
        self.ext_topic = ext_topic
        self.checks_each = checks_each

    def take(self, queue: deque[_Item]) -> list[_Item]:
        """Pop the next batch from the left of ``queue`` (never empty when the queue is not)."""
        if not queue:
            return []
        first = queue.popleft()
        batch = [first]
        if first.message.ext is not None and not self.ext_topic:
            return batch
        plain = not self.tracing and first.message.trace_id is None and first.message.ext is None
        if plain and not self.checks_each and self._take_plain(queue, batch):
            return batch
        # traced or ext messages (first, or next after plain ones): the general rules below
        traced = self.tracing or first.message.trace_id is not None
        has_ext = first.message.ext is not None
        if self.checks_each and _encoded_size(first.message, _kind(traced, has_ext)) > (
            self.max_msg_size
        ):
            return batch  # over the limit nsqd named: alone, so that nsqd refuses only it
        body_bytes = sum(len(item.message.body) for item in batch)
        ext_bytes = len(first.message.ext or b"")
        while queue and len(batch) < self.max_count:
            msg = queue[0].message
            if msg.ext is not None and not self.ext_topic:
                break
            n_traced = traced or msg.trace_id is not None
            n_ext = has_ext or msg.ext is not None
            kind = _kind(n_traced, n_ext)
            n_body = body_bytes + len(msg.body)
            n_ext_bytes = ext_bytes + len(msg.ext or b"")
            if batch_body_size(len(batch) + 1, n_body, n_ext_bytes, kind) > self.max_body_size:
                break
            # a batch of another kind frames every message differently: each must still fit
            if _encoded_size(msg, kind) > self.max_msg_size:
                break
            if kind != _kind(traced, has_ext) and any(
                _encoded_size(item.message, kind) > self.max_msg_size for item in batch
            ):
                break
            batch.append(queue.popleft())
            traced, has_ext, body_bytes, ext_bytes = n_traced, n_ext, n_body, n_ext_bytes
        return batch

    def _take_plain(self, queue: deque[_Item], batch: list[_Item]) -> bool:
        """Extend a plain batch with the plain messages at the head of ``queue`` (the common
        case, kept to one check per message): an ``MPUB`` body is a u32 count, then a u32
        length and the body of each message. False if it stopped at a traced or ext message
        (the general rules decide whether that one joins), True if the batch is complete."""
        room = self.max_body_size - 4 - 4 - len(batch[0].message.body)
        limit = self.max_count
        while queue and len(batch) < limit:
            msg = queue[0].message
            if msg.trace_id is not None or msg.ext is not None:
                return False
            room -= 4 + len(msg.body)
            if room < 0:
                return True
            batch.append(queue.popleft())
        return True


def _encoded_size(msg: OutgoingMessage, kind: str) -> int:
    """Length of one message inside an ``MPUB*`` body of ``kind`` (what max_msg_size limits)."""
    if kind == "trace":
        return 8 + len(msg.body)
    if kind == "ext":
        return 2 + len(msg.ext or b"") + len(msg.body)
    return len(msg.body)


def mpub_sizes(messages: Sequence[OutgoingMessage], name: bytes) -> tuple[int, int]:
    """The body size of the ``name`` command (``b"MPUB"``, ``b"MPUB_TRACE"``, ``b"MPUB_EXT"``)
    carrying ``messages``, and its largest message as nsqd measures it (``max_msg_size``)."""
    kind = "ext" if name == b"MPUB_EXT" else "trace" if name == b"MPUB_TRACE" else "plain"
    sizes = [_encoded_size(m, kind) for m in messages]
    return 4 + 4 * len(sizes) + sum(sizes), max(sizes, default=0)


def record_size(msg: OutgoingMessage, *, ext_topic: bool) -> int:
    """Bytes nsqd's disk queue uses for ``msg``: the raw size a traced answer reports (§4.6)."""
    if not ext_topic:
        return _RECORD_OVERHEAD + len(msg.body)
    if msg.ext is None:
        return _RECORD_OVERHEAD + 1 + len(msg.body)
    return _RECORD_OVERHEAD + 3 + len(msg.ext) + len(msg.body)


def batch_command(messages: Sequence[OutgoingMessage], *, tracing: bool = False) -> bytes:
    """The command :func:`encode_batch` sends for ``messages``: ``b"PUB"``, ``b"MPUB_TRACE"``..."""
    if not messages:
        raise InvalidArgumentError("a publish needs at least one message")
    has_ext, traced = False, tracing
    for m in messages:  # one pass (this runs for every batch sent)
        if m.ext is not None:
            has_ext = True  # an ext batch is PUB_EXT/MPUB_EXT, traced or not
            break
        if m.trace_id is not None:
            traced = True
    single = len(messages) == 1
    if has_ext:
        return b"PUB_EXT" if single else b"MPUB_EXT"
    if traced:
        return b"PUB_TRACE" if single else b"MPUB_TRACE"
    return b"PUB" if single else b"MPUB"


def encode_batch(
    topic: str,
    partition: int | None,
    messages: Sequence[OutgoingMessage],
    *,
    tracing: bool = False,
    max_msg_size: int | None = None,
    max_body_size: int | None = None,
    name: bytes | None = None,
) -> bytes:
    """Encode ``messages`` as one publish command (see the table in the module docstring).

    ``name``: what :func:`batch_command` returns for them, when the caller has it already.
    """
    name = name or batch_command(messages, tracing=tracing)
    limits = {"max_msg_size": max_msg_size}
    first = messages[0]
    if name == b"PUB":
        return encode_pub(topic, first.body, partition, **limits)
    if name == b"PUB_TRACE":
        return encode_pub_trace(topic, first.body, first.trace_id or 0, partition, **limits)
    if name == b"PUB_EXT" and first.ext is not None:
        return encode_pub_ext(topic, first.body, first.ext, partition, **limits)
    if name == b"MPUB":  # the bodies were checked when the messages were made
        return frame_batch(
            b"MPUB", topic, partition, list(map(_BODY_OF, messages)), max_msg_size, max_body_size
        )
    if name == b"MPUB_TRACE":
        return encode_mpub_trace(
            topic,
            [(m.trace_id or 0, m.body) for m in messages],
            partition,
            **limits,
            max_body_size=max_body_size,
        )
    return encode_mpub_ext(
        topic, [(m.ext, m.body) for m in messages], partition, **limits, max_body_size=max_body_size
    )


@dataclass(frozen=True, slots=True)
class Receipt:
    """What nsqd told about one published message (all ``None`` for a plain ``OK``)."""

    internal_id: int | None = None
    trace_id: int | None = None
    offset: int | None = None
    raw_size: int | None = None

    @property
    def message_id(self) -> bytes | None:
        """The 16-byte id consumers will see (fork: internal id + trace id), when known."""
        if self.internal_id is None:
            return None
        return _U64.pack(self.internal_id, self.trace_id or 0)


#: the receipt of every message answered by a plain ``OK`` (immutable, so shared)
PLAIN_RECEIPT = Receipt()


def _expects_traced(name: bytes, messages: Sequence[OutgoingMessage]) -> bool:
    if name in (b"PUB_TRACE", b"MPUB_TRACE"):
        return True
    return name == b"PUB_EXT" and messages[0].trace_id is not None


def receipts_from_answer(
    answer: bytes,
    messages: Sequence[OutgoingMessage],
    *,
    tracing: bool = False,
    ext_topic: bool | None = None,
    name: bytes | None = None,
) -> list[Receipt]:
    """One receipt per message from nsqd's answer to :func:`encode_batch`'s command.

    An answer of the wrong shape (``OK`` where a traced answer is due, a traced answer to a
    plain publish, a trace id that is not the one sent) raises RemoteProtocolError.
    ``ext_topic`` (``None``: unknown) chooses the record layout for ``MPUB_TRACE`` batches.
    ``name``: the batch's command, when the caller has it already.
    """
    name = name or batch_command(messages, tracing=tracing)
    if not _expects_traced(name, messages):
        if answer != OK:
            raise RemoteProtocolError(
                f"nsqd answered {bytes(answer[:40])!r} to {name.decode()}, which is answered OK"
            )
        if name in (b"PUB", b"MPUB") or all(m.trace_id is None for m in messages):
            return [PLAIN_RECEIPT] * len(messages)
        return [Receipt(trace_id=m.trace_id) for m in messages]
    response = parse_traced_response(answer)
    if name != b"MPUB_TRACE":
        sent = messages[0].trace_id or 0
        if response.trace_id != sent:
            raise RemoteProtocolError(
                f"nsqd echoed trace id {response.trace_id} for a {name.decode()} "
                f"sent with trace id {sent}"
            )
        return [Receipt(response.internal_id, sent, response.offset, response.raw_size)]
    return _derive_batch(response, messages, ext_topic)


def _derive_batch(
    response: TracedResponse, messages: Sequence[OutgoingMessage], ext_topic: bool | None
) -> list[Receipt]:
    """Per-message receipts of an MPUB_TRACE from its single answer (see module docstring)."""
    if response.trace_id != 0:
        raise RemoteProtocolError(f"MPUB_TRACE answered with trace id {response.trace_id}, not 0")
    layouts = [False, True] if ext_topic is None else [ext_topic]
    for layout in layouts:
        sizes = [record_size(m, ext_topic=layout) for m in messages]
        if sum(sizes) == response.raw_size:
            receipts: list[Receipt] = []
            offset = response.offset
            for index, (msg, size) in enumerate(zip(messages, sizes, strict=True)):
                receipts.append(
                    Receipt(response.internal_id + index, msg.trace_id or 0, offset, size)
                )
                offset += size
            return receipts
    log.warning(
        "MPUB_TRACE of %d messages: nsqd reported %d bytes, which no known record layout gives; "
        "only the first message's id and offset are known",
        len(messages),
        response.raw_size,
    )
    first = Receipt(response.internal_id, messages[0].trace_id or 0, response.offset, None)
    return [first] + [Receipt(trace_id=m.trace_id or 0) for m in messages[1:]]
