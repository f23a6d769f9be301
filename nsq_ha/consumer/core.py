"""The asyncio consumer: one connection per (nsqd, partition), ordered when the topic says so.
:class:`Consumer` is the face over the parts ``ARCHITECTURE.md`` lists; none calls back into it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Self, Unpack

from nsq_ha.connection import NsqdConnection
from nsq_ha.consumer.checks import check_count
from nsq_ha.consumer.config import ConsumerConfig, ConsumerOptions, consumer_config
from nsq_ha.consumer.discovery import Discovery
from nsq_ha.consumer.handout import Intake
from nsq_ha.consumer.message import Message
from nsq_ha.consumer.positions import move, move_all, nsqd_admin, seek_body
from nsq_ha.consumer.slots import TOTALS, ConnKey, Flow, SlotContext, Tally, slot_of, wait_answered
from nsq_ha.consumer.tasks import Background
from nsq_ha.durations import optional_seconds, seconds
from nsq_ha.errors import ConfigError, ConsumerClosedError, MessageResponseError
from nsq_ha.transport import Wakeup

__all__ = ["BatchHandler", "Consumer", "Handler"]

log = logging.getLogger(__name__)

Handler = Callable[[Message], Awaitable[object] | object]
BatchHandler = Callable[[list[Message]], Awaitable[object] | object]

#: Sync rounds at close: repeated while messages keep racing in after CLS.
SYNC_ROUNDS = 5


class Consumer:
    """Consume ``topic`` on ``channel`` from every partition (or a share of them).

    The options are :class:`~nsq_ha.consumer.config.ConsumerConfig`'s fields, as keywords
    (``Consumer("orders", "billing", lookupd=..., max_in_flight=50)``), or a whole
    ``config=ConsumerConfig(...)`` (then no option; topic and channel may be left out), kept
    in :attr:`config`. A bad value or unknown option raises :class:`~nsq_ha.errors.ConfigError`
    here, before a connection is made; so does :meth:`start` for a partition in ``partitions``
    that the topic does not have.

    Order: on an ordered subscription each partition is handled one message at a time, in
    offset order, however messages are consumed: a message nsqd delivers again (after
    ``msg_timeout``, a requeue or a leader move) while an earlier handler of its partition
    still runs waits for that handler, and so does everything after it in that partition.

    Use ``async with Consumer(...) as consumer`` (or :meth:`start` / :meth:`close`), then
    ``async for message in consumer``, :meth:`run` or :meth:`run_batches`.
    """

    def __init__(
        self,
        topic: str | None = None,
        channel: str | None = None,
        *,
        config: ConsumerConfig | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        self._config = cfg = consumer_config(topic, channel, config, options)
        self._tally = tally = Tally()
        self._flow = flow = Flow(cfg)
        self._background = background = Background()
        self._intake = intake = Intake(cfg, background)
        self._held_changed = changed = Wakeup()
        context = SlotContext(
            cfg, flow, flow.planner, tally, changed, intake.deliver, intake.answered
        )
        # last: every check above may refuse the options before a lookup client is made
        self._discovery = Discovery(context, background)
        self._started = False
        self._close_task: asyncio.Task[None] | None = None  # set by close()

    def __repr__(self) -> str:
        mode = "ordered" if self.is_ordered else "plain"
        state = "closed" if self._close_task else "started" if self._started else "new"
        return (
            f"<Consumer {self.topic}/{self.channel} {mode} {state} "
            f"connections={len(self._discovery.slots)} in_flight={self._in_flight()} "
            f"received={self._tally.total('received')}>"
        )

    @property
    def config(self) -> ConsumerConfig:
        """Every option of this consumer (``consumer.config.drain_timeout``, ...)."""
        return self._config

    @property
    def topic(self) -> str:
        """The topic."""
        return self._config.topic

    @property
    def channel(self) -> str:
        """The channel."""
        return self._config.channel

    @property
    def max_in_flight(self) -> int:
        """The RDY budget across all connections."""
        return self._flow.planner.max_in_flight

    def set_max_in_flight(self, value: int) -> None:
        """Change the budget (0 pauses the consumer)."""
        check_count(value, "max_in_flight", 0)
        self._flow.apply(self._flow.planner.set_max_in_flight(value))

    def is_starved(self) -> bool:
        """True when some connection holds nearly all its RDY in flight: process (answer) what
        you hold, nsqd will send that connection nothing more until then."""
        return self._flow.planner.is_starved()

    @property
    def is_ordered(self) -> bool:
        """True when the consumer subscribes with SUB_ORDERED."""
        return self._discovery.use_ordered

    @property
    def connections(self) -> dict[ConnKey, NsqdConnection]:
        """The subscribed connections, by (nsqd address, partition or -1)."""
        return {k: s.conn for k, s in self._discovery.slots.items() if s.conn is not None}

    def _in_flight(self) -> int:
        return sum(len(s.held) for s in self._discovery.slots.values())

    @property
    def stats(self) -> dict[str, Any]:
        """Counters: received, finished, requeued, timed_out, given_up, abandoned (connection
        lost while held), in_flight, queued, connections, backoff_level, rdy (the RDY given,
        summed), and the same per partition (``partitions``; key -1 on vanilla), with
        ``leader_changes`` there."""
        totals: dict[str, Any] = {name: self._tally.total(name) for name in TOTALS}
        slots = self._discovery.slots.values()
        totals["in_flight"] = self._in_flight()
        totals["queued"] = self._intake.queued
        totals["connections"] = len(slots)
        totals["backoff_level"] = self._flow.planner.level
        totals["rdy"] = self._flow.planner.total_rdy
        per: dict[int, dict[str, int]] = {
            partition: {name: value for name, value in counter.items() if value}
            for partition, counter in sorted(self._tally.partitions.items())
        }
        for slot in slots:  # key: (address, partition or -1)
            per.setdefault(slot.key[1], {})["in_flight"] = len(slot.held)
        totals["partitions"] = per
        return totals

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Look the topic up and connect to every wanted partition.

        Raises what a user must fix: an unknown fork topic, bad names, refused credentials,
        ``partitions``/``member`` on vanilla. Connections that fail for a passing reason (a node
        down, a leader moving) are retried in the background."""
        if self._close_task is not None:
            raise ConsumerClosedError(f"{self!r} is closed")
        if self._started:
            return
        self._started = True
        self._flow.start()
        try:
            await self._discovery.start()
        except BaseException:
            await self.close()
            raise

    def __aiter__(self) -> Self:
        """``async for message in consumer``: answer each message yourself."""
        return self

    async def __anext__(self) -> Message:
        # get() without its timeout check and one coroutine fewer per message (the
        # OpenTelemetry instrumentation replaces this with a call of its own get())
        if not self._started:
            await self.start()
        message = await self._intake.get(None)
        if message is None:
            raise StopAsyncIteration
        return message

    async def get(self, timeout: float | None = None) -> Message | None:  # noqa: ASYNC109
        """The next message, or ``None`` once the consumer is closing (or after ``timeout``).

        On an ordered subscription a partition's next message (or a copy) is handed out once
        the previous one is answered, or the task that got it asks again or ends: one ``async
        for`` loop handles each partition in order, concurrent loops never two of one at once.
        """
        if timeout is not None:  # no limit (async for): nothing to check per message
            timeout = optional_seconds(timeout, "timeout")
        if not self._started:
            await self.start()
        return await self._intake.get(timeout)

    async def sync(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - a limit
        """Return once nsqd has processed every answer (FIN, REQ, TOUCH) given so far, on
        every connection: nsqd acknowledges none, so a process that ends at once may lose them
        unsent and get the messages again.

        One round trip per connection, concurrently, each bounded by ``timeout`` (default: the
        connection's ``command_timeout``); the first failure (an
        :class:`~nsq_ha.errors.NsqTimeoutError`, or the connection gone: nsqd redelivers what it
        had in flight there) is raised once every connection answered.
        """
        limit = optional_seconds(timeout, "timeout")
        live = [conn for conn in self.connections.values() if not conn.closed]
        results = await asyncio.gather(
            *(conn.sync(timeout=limit) for conn in live), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def get_many(self, max_count: int = 100, timeout: float | None = None) -> list[Message]:  # noqa: ASYNC109
        """Up to ``max_count`` messages: waits for the first (an empty list once the consumer
        is closing, or after ``timeout``), then adds what else has arrived, without waiting.
        Each is answered on its own; on an ordered subscription a batch holds at most one
        message per partition, each claimed as :meth:`get` says."""
        check_count(max_count, "max_count", 1)
        if timeout is not None:
            timeout = optional_seconds(timeout, "timeout")
        if not self._started:
            await self.start()
        return await self._intake.get_many(max_count, timeout)

    async def run(self, handler: Handler, *, concurrency: int | None = None) -> None:
        """Call ``handler(message)`` for every message until :meth:`close`.

        A return finishes the message (unless the handler answered it), an exception requeues
        it (with backoff), cancelling ``run()`` requeues it at once (no backoff). ``concurrency``
        handlers run at once (default ``max_in_flight``, at most 256); on an ordered
        subscription each partition is handled one message at a time (see the class).
        """
        if concurrency is None:
            concurrency = min(max(1, self.max_in_flight), 256)
        else:
            check_count(concurrency, "concurrency", 1)
        await self.start()
        intake = self._intake

        async def worker() -> None:
            while (message := await intake.take()) is not None:
                try:
                    await _call_handler(handler, message, [message])
                except asyncio.CancelledError:
                    _give_back([message])
                    raise
                finally:
                    if message.ordered:
                        intake.release(message)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def run_batches(
        self,
        handler: BatchHandler,
        *,
        max_size: int = 100,
        max_wait: float = 0.1,
        concurrency: int = 1,
    ) -> None:
        """Call ``handler(messages)`` with lists of up to ``max_size`` messages until
        :meth:`close`; a batch is handed over when full, after ``max_wait`` s, or as soon as
        :meth:`is_starved` (nsqd will send no more until some are answered).

        A return finishes every message the handler did not answer; an exception requeues them
        (with backoff); cancelling ``run_batches()`` requeues at once (no backoff) what its
        workers took and did not answer. On an ordered subscription a batch holds at most one
        message per partition, and each partition is handled one message at a time.
        """
        check_count(max_size, "max_size", 1)
        check_count(concurrency, "concurrency", 1)
        max_wait = seconds(max_wait, "max_wait", zero=True)
        await self.start()
        intake, is_starved = self._intake, self._flow.planner.is_starved
        loop = asyncio.get_running_loop()

        async def worker() -> None:
            while (first := await intake.take()) is not None:
                batch = [first]
                try:
                    deadline = loop.time() + max_wait
                    while len(batch) < max_size:
                        message = intake.take_nowait()  # what is here already, without a timer
                        if message is None:
                            if is_starved() or intake.closing:
                                break
                            message = await intake.take(max(0.0, deadline - loop.time()))
                            if message is None:
                                break
                        batch.append(message)
                    await _call_handler(handler, batch, batch)
                except asyncio.CancelledError:  # gathering, or in the handler
                    _give_back(batch)
                    raise
                finally:
                    for message in batch:
                        if message.ordered:
                            intake.release(message)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def seek(
        self,
        partition: int | None = None,
        *,
        offset: int | None = None,
        timestamp: float | None = None,
        end: bool = False,
        count: int | None = None,
    ) -> None:
        """Move this channel's read position in ``partition``, or, without one, in every
        partition this consumer reads (``partitions=``/``member=``), at once (fork, cluster mode).

        Give one of ``offset`` (queue byte offset, e.g. a message's ``offset``; for every
        partition only ``0``, the start), ``timestamp`` (Unix seconds: the first message at or
        after it), ``count`` (the N-th message, from 1) or ``end=True`` (skip the backlog). Sent
        to each partition's leader as ``POST /channel/setoffset``; a refusal is an
        :class:`~nsq_ha.admin.AdminError` (without a partition, naming the partitions moved and
        those that failed). A partition that never had a message is at any position already.
        nsqd first delivers what it had read ahead (on ordered channels, one message).
        """
        position = seek_body(offset=offset, timestamp=timestamp, count=count, end=end)
        for slot in self._discovery.slots.values():  # what was finished last may come again
            if partition is None or slot.partition == partition:
                slot.finished = b""
        if partition is None:
            if offset:
                raise ConfigError(
                    f"offset={offset} is a queue offset of one partition: give the partition "
                    "(seek(p, offset=...)), or move every partition with offset=0, timestamp=, "
                    "count= or end=True"
                )
            moved = await move_all(
                await self._discovery.leaders(), self.topic, self.channel, position
            )
            log.info("%s/%s partitions %s: seek to %s", self.topic, self.channel, moved, position)
            return
        check_count(partition, "partition", 0)
        node = await self._discovery.leader(partition)
        async with nsqd_admin(node.http_url) as nsqd:
            await move(nsqd, self.topic, self.channel, partition, position)
        log.info("%s/%s partition %d: seek to %s", self.topic, self.channel, partition, position)

    async def close(self, *, drain_timeout: float | None = None) -> None:
        """Stop consuming without leaving anything in flight on nsqd.

        RDY 0 and CLS on every connection; messages not yet handed out are requeued; handlers
        get ``drain_timeout`` (default: the consumer's) to answer what they hold, then the rest
        is requeued; round trips make sure nsqd processed every answer; the sockets close.
        """
        if self._close_task is None:
            timeout = self._config.drain_timeout
            if drain_timeout is not None:
                timeout = seconds(drain_timeout, "drain_timeout", zero=True)
            self._close_task = asyncio.get_running_loop().create_task(self._drain(timeout))
            self._close_task.add_done_callback(lambda _: log.info("closed %r", self))
        await asyncio.shield(self._close_task)

    async def _drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the drain limit
        discovery, intake = self._discovery, self._intake
        intake.closing = True  # what arrives from now on is requeued at once
        await discovery.stop()
        await self._flow.stop()
        slots = list(discovery.slots.values())
        conns = [s.conn for s in slots if s.conn is not None]
        requeued = intake.stop()
        # nothing new: CLS everywhere (what races in is requeued by the intake)
        await asyncio.gather(*(c.stop_delivery() for c in conns), return_exceptions=True)
        log.info(
            "closing %s/%s: %d queued messages requeued, waiting up to %.1f s for %d held",
            self.topic,
            self.channel,
            requeued,
            timeout,
            sum(len(s.held) for s in slots),
        )
        await wait_answered(slots, self._held_changed, timeout)
        for slot in slots:
            for message in list(slot.held.values()):
                log.warning("closing: %r still held after %.1f s: requeueing it", message, timeout)
                slot.requeue_now(message)
        # round trips until no message raced in: then nsqd has processed every answer
        for _ in range(SYNC_ROUNDS):
            before = self._tally.total("received")
            live = [c for c in conns if not c.closed]
            results = await asyncio.gather(*(c.sync() for c in live), return_exceptions=True)
            for conn, result in zip(live, results, strict=True):
                if isinstance(result, BaseException):
                    log.warning("closing: sync with %s failed: %s", conn.address, result)
            if self._tally.total("received") == before:
                break
        else:
            log.warning("closing: messages kept arriving after CLS; some may stay in flight")
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        # watchers end with their sockets; a stuck on_give_up is cut off
        await self._background.finish(max(timeout, 1.0))
        await discovery.close()


async def _call_handler(
    handler: Callable[[Any], Awaitable[object] | object], argument: object, messages: list[Message]
) -> None:
    """Run ``handler(argument)``; finish what it left unanswered, or requeue it if it raised."""
    failed = False
    try:
        result = handler(argument)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        failed = True
        log.warning(
            "handler failed on %s: %r; requeueing",
            repr(messages[0]) if len(messages) == 1 else f"{len(messages)} messages",
            exc,
        )
    for message in messages:  # once per message: the _nowait answers, no coroutine each
        if not message.responded:
            try:
                if failed:
                    message.requeue_nowait()
                else:
                    message.finish_nowait()
            except MessageResponseError:
                pass


def _give_back(messages: list[Message]) -> None:
    """A worker was cancelled: requeue at once (no backoff) what it took and nobody answered."""
    for message in messages:
        if not message.responded:
            slot_of(message).requeue_now(message)
