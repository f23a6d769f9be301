"""What only traced, ext or over-limit messages need (plain ones take :mod:`nsq_ha.producer.batch`'s
fast path): their checks (:func:`prepare_message`), encoded and stored sizes and batch rules
(:class:`BatchBuilder`), and the :class:`PublishResult` a publish returns.

For ``MPUB_TRACE`` nsqd reports only the first message's id and offset and the batch's total
size; the others follow from the stored record layout (PROTOCOL.md §4.6: consecutive ids, each
record ``4 + 26 + len(body)`` bytes, one more on an ext topic) when it adds up to that total."""

from __future__ import annotations

import itertools
import json
import logging
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError
from nsq_ha.protocol.commands import as_bytes, check_size, check_uint, compact_json
from nsq_ha.protocol.publish import TRACE_ID_HEADER, PublishMessage, encode_ext_header
from nsq_ha.protocol.trace import TracedResponse

log = logging.getLogger(__name__)

#: Bytes of a stored record before the body: length prefix, timestamp, attempts, id, trace id.
_RECORD_OVERHEAD = 4 + 26


def prepare_message(
    body: object, *, trace_id: object = None, ext: object = None, max_msg_size: int | None = None
) -> PublishMessage:
    """Validate one message before it is queued; every problem raises a typed error (the values are
    typed ``object``: a compiled build would raise TypeError before these checks).

    ``body``: non-empty bytes; ``trace_id``: a u64; ``ext``: a JSON object (a mapping, or JSON
    bytes) nsqd will accept. With both, the trace id goes into the header as ``##trace_id`` (a
    header naming another is refused). ``max_msg_size`` limits what nsqd measures: the body plus the
    8-byte trace id or the ``2 + len(header)`` ext prefix."""
    if isinstance(body, str):
        raise InvalidArgumentError("message body must be bytes, not str: encode it: body.encode()")
    data = as_bytes(body, "message body")
    if not data:
        raise InvalidArgumentError("message body must not be empty (nsqd refuses empty messages)")
    traced: int | None = None
    if trace_id is not None:
        traced = check_uint(trace_id, "trace id", 64)
    header: bytes | None = None
    if ext is not None:
        header = encode_ext_header(ext)
        parsed = json.loads(header)
        named = parsed.get(TRACE_ID_HEADER)
        if traced is None:
            traced = None if named is None else int(named)  # checked by encode_ext_header
        elif named is None:
            parsed[TRACE_ID_HEADER] = str(traced)
            header = encode_ext_header(compact_json(parsed, "ext header"))
        elif named != str(traced):
            raise InvalidArgumentError(
                f"trace_id={traced} conflicts with the header's {TRACE_ID_HEADER}={named!r}"
            )
        check_size("message body (with the ext header)", 2 + len(header) + len(data), max_msg_size)
    elif traced is not None:
        check_size("message body (with the 8-byte trace id)", 8 + len(data), max_msg_size)
    else:
        check_size("message body", len(data), max_msg_size)
    return PublishMessage(data, traced, header)


def _kind(traced: bool, ext: bool) -> str:
    return "ext" if ext else "trace" if traced else "plain"


@dataclass(frozen=True, slots=True)
class BatchBuilder:
    """Take as many queued messages as one command may carry, in queue order.

    ``tracing``: every batch is traced. ``ext_topic``: only on a known ext topic does a message with
    a header share a batch (elsewhere nsqd refuses it, and only its message must get that error).
    ``checks_each``: ``max_msg_size`` is a lower limit an nsqd named: every message is measured, and
    one over it goes alone (nsqd refuses only it). ``max_count`` caps a batch."""

    max_msg_size: int
    max_body_size: int
    max_count: int = 1000
    tracing: bool = False
    ext_topic: bool = False
    checks_each: bool = False

    def take(self, queue: deque[PublishMessage]) -> list[PublishMessage]:
        """Pop the next batch from the left of ``queue`` (never empty when the queue is not)."""
        if not queue:
            return []
        first = queue.popleft()
        batch = [first]
        if first.ext is not None and not self.ext_topic:
            return batch
        traced = self.tracing or first.trace_id is not None
        has_ext = first.ext is not None
        if self.checks_each and _encoded_size(first, _kind(traced, has_ext)) > self.max_msg_size:
            return batch  # over the limit nsqd named: alone, so that nsqd refuses only it
        body_bytes = len(first.body)
        ext_bytes = len(first.ext or b"")
        while queue and len(batch) < self.max_count:
            msg = queue[0]
            if msg.ext is not None and not self.ext_topic:
                break
            n_traced = traced or msg.trace_id is not None
            n_ext = has_ext or msg.ext is not None
            kind = _kind(n_traced, n_ext)
            n_body = body_bytes + len(msg.body)
            n_ext_bytes = ext_bytes + len(msg.ext or b"")
            # the MPUB* body: the count, then a length and the encoded message per message
            n = len(batch) + 1
            framing = 8 * n if kind == "trace" else 2 * n + n_ext_bytes if kind == "ext" else 0
            if 4 + 4 * n + n_body + framing > self.max_body_size:
                break
            # a batch of another kind frames every message differently: each must still fit
            if _encoded_size(msg, kind) > self.max_msg_size:
                break
            if kind != _kind(traced, has_ext) and any(
                _encoded_size(m, kind) > self.max_msg_size for m in batch
            ):
                break
            batch.append(queue.popleft())
            traced, has_ext, body_bytes, ext_bytes = n_traced, n_ext, n_body, n_ext_bytes
        return batch


def _encoded_size(msg: PublishMessage, kind: str) -> int:
    """Length of one message inside an ``MPUB*`` body of ``kind`` (what max_msg_size limits)."""
    if kind == "trace":
        return 8 + len(msg.body)
    if kind == "ext":
        return 2 + len(msg.ext or b"") + len(msg.body)
    return len(msg.body)


def mpub_sizes(messages: Sequence[PublishMessage], name: bytes) -> tuple[int, int]:
    """The body size of the ``name`` command (``b"MPUB"``, ``b"MPUB_TRACE"``, ``b"MPUB_EXT"``)
    carrying ``messages``, and its largest message as nsqd measures it (``max_msg_size``)."""
    kind = "ext" if name == b"MPUB_EXT" else "trace" if name == b"MPUB_TRACE" else "plain"
    sizes = [_encoded_size(m, kind) for m in messages]
    return 4 + 4 * len(sizes) + sum(sizes), max(sizes, default=0)


def record_size(msg: PublishMessage, *, ext_topic: bool) -> int:
    """Bytes nsqd's disk queue uses for ``msg``: the raw size a traced answer reports (§4.6)."""
    if not ext_topic:
        return _RECORD_OVERHEAD + len(msg.body)
    if msg.ext is None:
        return _RECORD_OVERHEAD + 1 + len(msg.body)
    return _RECORD_OVERHEAD + 3 + len(msg.ext) + len(msg.body)


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Where a message went and what nsqd said about it. ``partition`` is ``None`` on vanilla.

    ``internal_id``, ``offset`` and ``raw_size`` are known for traced publishes on the fork
    (``trace_id=``, a ``##trace_id`` header, or ``trace=True``); ``trace_id`` is the one sent."""

    topic: str
    partition: int | None
    address: str
    attempts: int
    internal_id: int | None = None
    trace_id: int | None = None
    offset: int | None = None
    raw_size: int | None = None

    @property
    def message_id(self) -> bytes | None:
        """The 16-byte id consumers see (fork: internal id + trace id), when known."""
        if self.internal_id is None:
            return None
        return _IDS.pack(self.internal_id, self.trace_id or 0)


_IDS = struct.Struct(">QQ")

#: where a batch went: a :class:`PublishResult`'s first four fields
Where = tuple[str, int | None, str, int]


def derive_batch(
    response: TracedResponse,
    messages: Sequence[PublishMessage],
    ext_topic: bool | None,
    where: Where,
) -> list[PublishResult]:
    """Per-message results of an MPUB_TRACE from its single answer (see module docstring)."""
    if response.trace_id != 0:
        raise RemoteProtocolError(f"MPUB_TRACE answered with trace id {response.trace_id}, not 0")
    layouts = [False, True] if ext_topic is None else [ext_topic]
    for layout in layouts:
        sizes = [record_size(m, ext_topic=layout) for m in messages]
        if sum(sizes) == response.raw_size:
            offsets = itertools.accumulate(sizes[:-1], initial=response.offset)
            return [
                PublishResult(*where, response.internal_id + i, m.trace_id or 0, offset, size)
                for i, (m, size, offset) in enumerate(zip(messages, sizes, offsets, strict=True))
            ]
    log.warning(
        "MPUB_TRACE of %d messages: nsqd reported %d bytes, which no known record layout gives; "
        "only the first message's id and offset are known",
        len(messages),
        response.raw_size,
    )
    first = PublishResult(*where, response.internal_id, messages[0].trace_id or 0, response.offset)
    return [first] + [PublishResult(*where, None, m.trace_id or 0) for m in messages[1:]]
