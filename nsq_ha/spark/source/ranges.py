"""The replayable source's range reads (the fork in cluster mode): one Spark task reads
``[start, end)`` of one partition on a channel of its own (see :func:`read_chunks`), and a
timestamp is turned into an offset the same way (:func:`resolve_timestamp`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...admin import NsqdAdmin, seek_position
from ...connection.security import Security
from ...consumer import Consumer as AsyncConsumer
from ...consumer import Message as AsyncMessage
from ...errors import DiscoveryError, NsqError, NsqTimeoutError, ProtocolError
from ...lookup.wire import NodeInfo
from ...redact import redacted_repr
from ..options import Endpoint
from ..rows import RowFormat, message_row
from .channels import range_channel
from .extents import DataLossError, Extent, _leaders_and_extents, _run

if TYPE_CHECKING:
    from ...sync import Consumer

__all__ = ["CHUNK", "READ_WINDOW", "RangeTask", "read_chunks", "read_range", "resolve_timestamp"]

log = logging.getLogger("nsq_ha.spark")


@dataclass(frozen=True, slots=True)
class RangeTask:
    """One Spark task of the replayable source: ``[start, end)`` of one partition."""

    lookupd: tuple[str, ...]
    topic: str
    channel: str
    partition: int
    start: int
    end: int
    read_timeout: float
    #: TLS, AUTH and compression of the partition's connection
    security: Security = field(default_factory=Security)
    #: where a row's ``key`` comes from
    row_format: RowFormat = field(default_factory=RowFormat)
    #: ``failOnDataLoss``: a range that ends past the partition's end (the topic re-created
    #: since the batch was planned) fails the task, or is logged and read as empty (no default:
    #: the option's is :class:`~nsq_ha.spark.options.ReadOptions`')
    fail_on_data_loss: bool = field(kw_only=True)

    def __repr__(self) -> str:
        """Every field, with a password in a ``lookupd`` URL shown as ``***`` (Spark shows
        a planned task's repr in its plans and errors)."""
        return redacted_repr(self)


async def _position(task: RangeTask, position: str) -> tuple[NodeInfo, int]:
    """Create ``task.channel`` on the partition's leader and move it to ``position`` (see
    :func:`~nsq_ha.admin.seek_position`); return the leader and the partition's write end just
    before the channel was made."""
    leaders, extents = await _leaders_and_extents(task.lookupd, task.topic, task.partition)
    node = leaders.get(task.partition)
    extent = extents.get(task.partition)
    if node is None or extent is None:
        raise DiscoveryError(f"{task.topic}/{task.partition} has no leader listed now")
    async with NsqdAdmin(node.http_url) as nsqd:
        await nsqd.create_channel(task.topic, task.channel, task.partition)
        await nsqd.set_offset(task.topic, task.channel, task.partition, position)
    return node, extent.end


async def _drop_channel(node: NodeInfo, task: RangeTask) -> None:
    try:
        async with NsqdAdmin(node.http_url) as nsqd:
            await nsqd.delete_channel(task.topic, task.channel, task.partition)
    except NsqError as exc:  # a leftover channel wastes retention, it loses nothing
        log.warning("could not delete the read channel %s: %s", task.channel, exc)


#: messages a range read lets nsqd send ahead of its answers (plain topics; an ordered topic
#: has one message out at a time whatever this says)
READ_WINDOW = 2000
#: messages handed from the event loop to the Spark task at once (one Arrow batch each)
CHUNK = 4096
#: seconds a chunk waits for more messages after its first (:func:`_take`)
LINGER = 0.05


def _subscribe(task: RangeTask) -> Consumer:
    """A blocking consumer of the task's partition, ordered (one message at a time): used to
    find the first message at a timestamp."""
    from ...sync import Consumer  # only here: a range read is asyncio

    return Consumer(
        task.topic,
        task.channel,
        lookupd=list(task.lookupd),
        partitions=[task.partition],
        ordered=True,
        max_in_flight=1,
        max_attempts=0,
        backoff=None,
        drain_timeout=1.0,
        connection=task.security.apply(),
    )


async def _open_range(task: RangeTask) -> AsyncConsumer:
    """The consumer of a range read: ``SUB_ADVANCED`` with ``READ_WINDOW`` in flight on a plain
    topic (every message carries its offset, delivery stays in queue order since nothing is
    requeued), ``SUB_ORDERED`` on an ordered topic (which refuses anything else)."""
    consumer = AsyncConsumer(
        task.topic,
        task.channel,
        lookupd=list(task.lookupd),
        partitions=[task.partition],
        with_offsets=True,
        max_in_flight=READ_WINDOW,
        max_attempts=0,
        backoff=None,
        drain_timeout=1.0,
        connection=task.security.apply(),
    )
    try:
        await consumer.start()
    except BaseException:
        await consumer.close(drain_timeout=0)
        raise
    return consumer


async def _take(consumer: AsyncConsumer, wait: float, end: int) -> list[AsyncMessage]:
    """What arrives, up to :data:`CHUNK` messages (waiting up to ``wait`` s for the first),
    each finished at once: for the channel's sake only, since the range, not the channel's
    cursor, says what is read. Right after ``setoffset`` the fork may deliver a message twice
    (what it had read ahead, then the same message from the new position, with the same id);
    the second delivery makes the first one unanswerable, which is harmless here.

    After the first message it goes on taking for up to :data:`LINGER` s, until a message
    reaching ``end``: an ordered partition has one message out at a time, the next one comes
    after the FIN, and each chunk becomes one Arrow batch in Spark (it was one per message)."""
    batch = _finished(await consumer.get_many(CHUNK, wait))
    if not batch:
        return batch
    loop = asyncio.get_running_loop()
    until = loop.time() + LINGER
    while len(batch) < CHUNK and _ends_before(batch[-1], end):
        left = until - loop.time()
        if left <= 0:
            break
        more = _finished(await consumer.get_many(CHUNK - len(batch), left))
        if not more:
            break
        batch.extend(more)
    return batch


def _ends_before(message: AsyncMessage, end: int) -> bool:
    """Whether more of the range follows ``message`` (False without an offset: the caller
    refuses such a delivery)."""
    offset, size = message.offset, message.raw_size
    return offset is not None and size is not None and offset + size < end


def _finished(batch: list[AsyncMessage]) -> list[AsyncMessage]:
    for message in batch:
        try:
            message.finish_nowait()
        except NsqError as exc:
            log.debug("not finished (harmless for a replayable read): %s", exc)
    return batch


def read_chunks(task: RangeTask) -> Iterator[list[AsyncMessage]]:
    """The messages of ``[task.start, task.end)`` of one partition, in offset order, in chunks
    of up to :data:`CHUNK` (one hand-over from the event loop each).

    The read uses a channel of its own (:func:`~nsq_ha.spark.source.channels.range_channel`; one a
    killed task leaves behind is swept by the driver), created at the partition's write end
    ``W``, moved to ``start``, deleted afterwards: no other reader's state can reach it.
    Right after ``setoffset`` the fork may first deliver what the channel had read ahead,
    which on a fresh channel lies at ``W`` or later; the positioned messages follow,
    contiguous from the first message at or after ``start``. So a message at or past
    ``end`` ends the range if it lies before ``W``, or comes a second time, or continues the
    chain of what was read; otherwise it was read ahead and is skipped.

    Raises :class:`DataLossError` at once when the range ends past the partition's write end
    (the topic was deleted and re-created since the batch was planned; with
    ``fail_on_data_loss`` false: logged, and nothing is read), and :class:`NsqTimeoutError`
    when no message arrives for ``read_timeout`` seconds before the range is complete (nsqd
    lost the range).
    """
    if task.start >= task.end:
        return
    fresh = dataclasses.replace(task, channel=range_channel(task.channel, task.partition))
    node, write_end = _run(_position(fresh, seek_position(offset=task.start)), 60.0)
    next_offset = task.start
    count = 0
    read_ahead: set[int] = set()
    try:
        if task.end > write_end:
            text = (
                f"{task.topic}/{task.partition}: the range {task.start}..{task.end} ends past "
                f"the partition's end {write_end}: the topic was deleted and re-created since "
                "the batch was planned"
            )
            if task.fail_on_data_loss:
                raise DataLossError(
                    f"{text}; restart the query to plan again (set failOnDataLoss=false to "
                    "skip the range)"
                )
            log.warning("%s; skipping the range (failOnDataLoss=false)", text)
            return
        consumer: AsyncConsumer = _run(_open_range(fresh), 60.0)
        try:
            deadline = time.monotonic() + task.read_timeout
            while next_offset < task.end:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise NsqTimeoutError(
                        f"{task.topic}/{task.partition}: nothing arrived for {task.read_timeout}"
                        f" s at offset {next_offset} (reading {task.start}..{task.end}, {count} "
                        "rows so far); raise readTimeout if nsqd is slow"
                    )
                batch = _run(_take(consumer, min(wait, 1.0), task.end), min(wait, 1.0) + 30.0)
                rows: list[AsyncMessage] = []
                for message in batch:
                    offset, size = message.offset, message.raw_size
                    if offset is None or size is None:
                        raise ProtocolError(
                            f"{task.topic}/{task.partition}: a delivery without its offset"
                        )
                    if offset >= task.end:
                        if offset < write_end or offset in read_ahead or offset == next_offset:
                            next_offset = task.end  # no message starts in [next_offset, end)
                            break
                        read_ahead.add(offset)
                        continue
                    if offset < next_offset:
                        continue  # a second delivery of what was read
                    if count and offset != next_offset:
                        log.warning(
                            "%s/%d: a gap in the queue between %d and %d",
                            task.topic,
                            task.partition,
                            next_offset,
                            offset,
                        )
                    count += 1
                    next_offset = offset + size
                    rows.append(message)
                    if next_offset >= task.end:
                        break
                if rows:
                    deadline = time.monotonic() + task.read_timeout
                    yield rows
        finally:
            _run(consumer.close(drain_timeout=1.0), 30.0)
    finally:
        _run(_drop_channel(node, fresh), 30.0)
    log.info(
        "%s/%d: read %d rows of %d..%d", task.topic, task.partition, count, task.start, task.end
    )


def read_range(task: RangeTask) -> Iterator[tuple[Any, ...]]:
    """The rows of ``[task.start, task.end)`` of one partition, in offset order (the tuples of
    :data:`SCHEMA`; :func:`read_chunks` says how the range is read)."""
    topic = task.topic
    for chunk in read_chunks(task):
        for message in chunk:
            yield message_row(topic, message, task.row_format)


def resolve_timestamp(
    endpoint: Endpoint,
    channel: str,
    partition: int,
    seconds: int,
    extent: Extent,
    wait: float,
    *,
    topic: str | None = None,
) -> int:
    """The offset of the first message at or after ``seconds`` (Unix) in one partition of
    ``topic`` (default: the endpoint's), found by moving a fresh channel there and reading one
    message; the write end if none arrives (a message read ahead at the write end or later
    says the same)."""
    if extent.start >= extent.end:
        return extent.end
    task = RangeTask(
        endpoint.lookupd,
        endpoint.topic if topic is None else topic,
        range_channel(channel, partition),
        partition,
        0,
        0,
        wait,
        endpoint.security,
        fail_on_data_loss=True,  # unused: this task only moves a channel, it reads no range
    )
    node, write_end = _run(_position(task, seek_position(timestamp=seconds)), 60.0)
    write_end = int(write_end)
    try:
        consumer = _subscribe(task)
        try:
            message = consumer.get(timeout=wait)
            if message is None or message.offset is None:
                return write_end
            return min(int(message.offset), write_end)
        finally:
            consumer.close(drain_timeout=0.5)
    finally:
        _run(_drop_channel(node, task), 30.0)
