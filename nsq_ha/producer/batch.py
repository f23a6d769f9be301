"""Publish batches without I/O: a call's messages prepared (:func:`prepare_batch`), queued on a
lane as one :class:`Call`, cut into batches (:func:`take`), each made one command
(:func:`batch_command`), whose answer gives one result per message (:func:`results_from_answer`)
and the callers their outcomes (:func:`settle`). The command:

========================  ===========================  ===========================
messages                  one message                  several messages
========================  ===========================  ===========================
plain                     ``PUB``                      ``MPUB``
some traced (or tracing)  ``PUB_TRACE``                ``MPUB_TRACE`` (others: 0)
some with an ext header   ``PUB_EXT``                  ``MPUB_EXT`` (others: none)
========================  ===========================  ===========================
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Sequence
from typing import TypeAlias, cast

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError
from nsq_ha.producer.message import (
    BatchBuilder,
    PublishResult,
    Where,
    derive_batch,
    prepare_message,
)
from nsq_ha.protocol.frames import OK
from nsq_ha.protocol.publish import PublishMessage
from nsq_ha.protocol.trace import parse_traced_response


def prepare_batch(
    bodies: Sequence[object],
    trace_ids: Sequence[object] | None = None,
    exts: Sequence[object] | None = None,
    *,
    max_msg_size: int | None = None,
) -> tuple[list[PublishMessage], int | None]:
    """:func:`prepare_message` of each body with its trace id and ext header, and what the
    messages add to an ``MPUB`` body (see :func:`plain_size`). Plain bytes bodies are checked
    all at once (the common case, in C-level passes), anything else one by one."""
    count = len(bodies)
    if trace_ids is None and exts is None and count:
        limit = max_msg_size if max_msg_size is not None else sys.maxsize  # no limit
        total = 4 * count
        for body in bodies:  # one pass (compiled, a C loop; pure, cheaper than four)
            if type(body) is not bytes or not 0 < len(body) <= limit:
                break
            total += len(body)
        else:
            return [PublishMessage(body) for body in bodies], total  # type: ignore[arg-type]
    messages = [
        prepare_message(b, trace_id=t, ext=h, max_msg_size=max_msg_size)
        for b, t, h in zip(bodies, trace_ids or [None] * count, exts or [None] * count, strict=True)
    ]
    return messages, plain_size(messages)


def plain_size(messages: Sequence[PublishMessage]) -> int | None:
    """What ``messages`` add to an ``MPUB`` body (a length and the body each), or ``None``
    when one of them has a trace id or an ext header."""
    total = 4 * len(messages)
    for m in messages:
        if m.trace_id is not None or m.ext is not None:
            return None
        total += len(m.body)
    return total


def batch_command(messages: Sequence[PublishMessage], *, tracing: bool = False) -> bytes:
    """The command that carries ``messages``: ``b"PUB"``, ``b"MPUB_TRACE"``... (the table)."""
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


def results_from_answer(
    answer: bytes,
    messages: Sequence[PublishMessage],
    name: bytes,
    where: Where,
    ext_topic: bool | None = None,
) -> list[PublishResult]:
    """One result per message from nsqd's answer to the ``name`` command carrying ``messages``
    (``where``: the results' topic, partition, address and attempts); an answer of the wrong shape
    raises RemoteProtocolError. ``ext_topic`` (None: unknown): ``MPUB_TRACE``'s record layout."""
    traced = name in (b"PUB_TRACE", b"MPUB_TRACE")
    if not traced and not (name == b"PUB_EXT" and messages[0].trace_id is not None):
        if answer != OK:
            raise RemoteProtocolError(
                f"nsqd answered {bytes(answer[:40])!r} to {name.decode()}, which is answered OK"
            )
        if name in (b"PUB", b"MPUB") or all(m.trace_id is None for m in messages):
            return [PublishResult(*where)] * len(messages)  # immutable: one for all
        return [PublishResult(*where, None, m.trace_id) for m in messages]
    response = parse_traced_response(answer)
    if name != b"MPUB_TRACE":
        sent = messages[0].trace_id or 0
        if response.trace_id != sent:
            raise RemoteProtocolError(
                f"nsqd echoed trace id {response.trace_id} for a {name.decode()} "
                f"sent with trace id {sent}"
            )
        return [
            PublishResult(*where, response.internal_id, sent, response.offset, response.raw_size)
        ]
    return derive_batch(response, messages, ext_topic, where)


#: what one message of a publish call came to
Outcome: TypeAlias = PublishResult | BaseException
#: what one publish call waits for: the outcome of each message it queued, in order
Outcomes: TypeAlias = list[Outcome]


class Call:
    """One publish call waiting in a lane: its messages, the future its caller waits on for
    their outcomes, and its :func:`plain_size`; ``taken``: how many of its messages batches
    have taken. A call split over batches gathers its ``outcomes`` until ``pending`` is 0."""

    __slots__ = ("future", "messages", "outcomes", "pending", "plain_bytes", "taken")

    def __init__(
        self, messages: list[PublishMessage], future: asyncio.Future[Outcomes], plain: int | None
    ) -> None:
        self.messages = messages
        self.future = future
        self.taken = 0
        self.pending = len(messages)
        self.outcomes: list[Outcome | None] | None = None
        self.plain_bytes = plain


#: messages ``start:end`` of a call, in one batch (a plain tuple: one is made per call per batch)
Run = tuple[Call, int, int]


def take(queue: deque[Call], builder: BatchBuilder, share: int | None) -> tuple[list[Run], int]:
    """Take the next batch off a lane's ``queue``: its runs, and how many messages they hold.
    Plain calls go whole while they fit (one sum per call), the first that does not is cut message
    by message; otherwise (traced or ext messages, tracing, a learned message limit) messages are
    taken one by one under :meth:`BatchBuilder.take`'s rules. ``share`` (None: none) ends the batch
    at the first call boundary at or past that many messages (only a command's limits cut calls)."""
    runs: list[Run] = []
    if share is None:
        share = sys.maxsize
    if not builder.tracing and not builder.checks_each:
        room = builder.max_body_size - 4  # the MPUB body's count
        left = builder.max_count
        while queue and left:
            call = queue[0]
            plain_bytes = call.plain_bytes
            if plain_bytes is None:
                break
            size = len(call.messages)
            if runs and builder.max_count - left + size - call.taken > share:
                break  # the share is full; the next call goes in another batch
            if not call.taken and size <= left and plain_bytes <= room:
                queue.popleft()
                runs.append((call, 0, size))
                room -= plain_bytes
                left -= size
                continue
            # cut this call: its messages while they fit (a batch's first always goes)
            start = end = call.taken
            for message in call.messages[start : start + left]:
                room -= 4 + len(message.body)
                if room < 0 and (runs or end > start):
                    break
                end += 1
            runs.append((call, start, end))
            left -= end - start
            call.taken = end
            if end == size:
                queue.popleft()
            break
        if runs:
            return runs, builder.max_count - left
    if not queue:
        return runs, 0
    # message by message, over as many queued messages as one batch may carry: whole calls
    # up to the share, and at least the first
    items: deque[PublishMessage] = deque()
    for call in queue:
        if items and len(items) + len(call.messages) - call.taken > share:
            break
        items.extend(call.messages[call.taken : call.taken + builder.max_count - len(items)])
        if len(items) >= builder.max_count:
            break
    taken = left = len(builder.take(items))
    while left:  # the batch's messages, call by call
        call = queue[0]
        count = min(left, len(call.messages) - call.taken)
        runs.append((call, call.taken, call.taken + count))
        call.taken += count
        left -= count
        if call.taken == len(call.messages):
            queue.popleft()
    return runs, taken


def live(runs: list[Run], splits: set[Call]) -> list[Run]:
    """``runs`` without those of calls that stopped waiting (cancelled)."""
    for call, _, _ in runs:
        if call.future.done():
            for gone, _, _ in runs:
                if gone.future.done():
                    splits.discard(gone)
            return [run for run in runs if not run[0].future.done()]
    return runs


def messages_of(runs: list[Run]) -> list[PublishMessage]:
    """The messages of ``runs``, in order (a whole call's own list when it is the batch)."""
    if len(runs) == 1:
        call, start, end = runs[0]
        return (
            call.messages if start == 0 and end == len(call.messages) else call.messages[start:end]
        )
    messages: list[PublishMessage] = []
    for call, start, end in runs:
        if end - start == 1:
            messages.append(call.messages[start])
        else:
            messages += call.messages[start:end]
    return messages


def settle(runs: list[Run], outcomes: Sequence[Outcome], splits: set[Call]) -> None:
    """Give each run's messages their outcomes (the batch's, in order): a call wholly in it at once,
    a call split over batches when its last run settles."""
    position = 0
    for call, start, end in runs:
        count = end - start
        future = call.future
        if future.done():
            splits.discard(call)  # cancelled meanwhile
        elif count == call.pending and call.outcomes is None:
            future.set_result(cast("Outcomes", outcomes[position : position + count]))
        else:
            if call.outcomes is None:
                call.outcomes = [None] * len(call.messages)
                splits.add(call)
            call.outcomes[start:end] = outcomes[position : position + count]
            call.pending -= count
            if not call.pending:
                splits.discard(call)
                future.set_result(cast("Outcomes", call.outcomes))
        position += count
