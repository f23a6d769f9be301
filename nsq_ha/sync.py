"""Blocking facade over the asyncio client, for scripts and Spark executors.

Every object here drives its asyncio twin on one shared event loop that runs in a daemon thread
(started on first use, started again in a forked child process), so many blocking callers in
many threads share the same connections. Called from a coroutine on that loop, they raise
RuntimeError (they would wait for themselves): from asyncio code, use the async classes.

At interpreter exit, every object still open is closed (a :class:`Producer` flushes first),
even one the program dropped without closing it. Every duration argument is checked before
anything is sent: ConfigError for NaN, infinities, negatives and non-numbers (``None``: no
limit).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypedDict, Unpack

from nsq_ha import _sync_runtime
from nsq_ha._sync_handout import Answers, Message, gone, hand_one, hand_out
from nsq_ha._sync_runtime import Closable, LoopThread, loop_thread, register, unregister
from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer import Consumer as AsyncConsumer
from nsq_ha.consumer import ConsumerConfig
from nsq_ha.consumer import Message as AsyncMessage
from nsq_ha.consumer.config import ConsumerOptions, consumer_config
from nsq_ha.durations import optional_seconds
from nsq_ha.errors import ConsumerClosedError, MessageResponseError, ProducerClosedError
from nsq_ha.producer import Producer as AsyncProducer
from nsq_ha.producer import ProducerConfig, PublishResult, RetryPolicy
from nsq_ha.producer.config import ProducerOptions
from nsq_ha.protocol.publish import ExtHeader
from nsq_ha.routing import ShardingKey

__all__ = ["Consumer", "Message", "Producer", "PublishResult", "RetryPolicy", "shared_loop"]

log = logging.getLogger(__name__)

#: the most messages one hand-over from the loop fetches
_MAX_BATCH = 1024


def shared_loop() -> asyncio.AbstractEventLoop:
    """The event loop the blocking objects of this process run on (started if needed)."""
    return loop_thread().loop


def _backstop(close: float, connection: ConnectionConfig) -> float:
    """How long a blocking close waits for its asyncio close: its limits twice + CLOSE_BACKSTOP."""
    limits = close + connection.close_timeout + connection.command_timeout
    return min(2 * limits + _sync_runtime.CLOSE_BACKSTOP, threading.TIMEOUT_MAX)


class _PublishOptions(TypedDict, total=False):
    sharding_key: ShardingKey | None
    partition: int | None
    trace_id: int | None
    ext: ExtHeader | None
    defer: float | None


class _PublishManyOptions(TypedDict, total=False):
    sharding_key: ShardingKey | None
    sharding_keys: Sequence[ShardingKey] | None
    partition: int | None
    trace_ids: Sequence[int | None] | None
    ext: ExtHeader | None
    exts: Sequence[ExtHeader | None] | None


class Producer(Closable):
    """Blocking :class:`nsq_ha.producer.Producer`: the same options and results. A ``lookup=``
    client is used on :func:`shared_loop`.

    ``publish_async`` returns a :class:`concurrent.futures.Future` at once, so one thread can
    keep many publishes in flight (keyed ones still reach nsqd in call order).

    In a process forked after it was made, the producer opens its own connections on first use
    (never touching the parent's); publishes the parent had in flight at the fork settle in the
    parent.
    """

    def __init__(
        self, *, config: ProducerConfig | None = None, **options: Unpack[ProducerOptions]
    ) -> None:
        #: every option (checked as the async producer checks them)
        self.producer_config = ProducerConfig.from_options(config, options)
        self._closed_here = False  # closed in a forked child before it ever published there
        self._runner = loop_thread()
        self._producer = self._runner.run(self._create())
        register(self)

    async def _create(self) -> AsyncProducer:
        return AsyncProducer(config=self.producer_config)

    def _bound(self) -> tuple[LoopThread, AsyncProducer]:
        """The loop and the asyncio producer of this process (made again in a forked child)."""
        if self._runner.stale:
            with _sync_runtime.rebind_lock:
                if self._runner.stale:  # not done by another thread of this child meanwhile
                    if self.closed:
                        raise ProducerClosedError("the producer is closed")
                    runner = loop_thread()
                    self._producer = runner.run(self._create())  # set first: read after the runner
                    self._runner = runner
                    log.debug("producer made again in forked process %d", os.getpid())
        return self._runner, self._producer

    def __repr__(self) -> str:
        return f"<sync {self._producer!r}>"

    @property
    def aio(self) -> AsyncProducer:
        """The asyncio producer underneath (use it only on :func:`shared_loop`)."""
        return self._bound()[1]

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has started."""
        return self._closed_here or self._producer.closed

    def publish(
        self,
        topic: str,
        body: bytes,
        *,
        timeout: float | None = None,
        **options: Unpack[_PublishOptions],
    ) -> PublishResult:
        """:meth:`nsq_ha.producer.Producer.publish`, blocking. ``timeout`` (seconds, default:
        none beyond the retry policy) cancels the publish and raises NsqTimeoutError; the
        message may or may not have been written."""
        limit = optional_seconds(timeout, "timeout")
        return LoopThread.wait(self.publish_async(topic, body, **options), limit)

    def publish_async(
        self, topic: str, body: bytes, **options: Unpack[_PublishOptions]
    ) -> concurrent.futures.Future[PublishResult]:
        """Start a publish and return a future of its :class:`PublishResult` at once."""
        runner, producer = self._bound()
        return runner.submit(producer.publish(topic, body, **options))

    def publish_many(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        timeout: float | None = None,
        **options: Unpack[_PublishManyOptions],
    ) -> list[PublishResult]:
        """:meth:`nsq_ha.producer.Producer.publish_many`, blocking; ``timeout`` as in publish."""
        limit = optional_seconds(timeout, "timeout")
        runner, producer = self._bound()
        return runner.run(producer.publish_many(topic, bodies, **options), limit)

    def close(self, timeout: float | None = None) -> None:
        """:meth:`nsq_ha.producer.Producer.close`, blocking (NsqTimeoutError if that never ends);
        in a forked child that never published, only marks it closed (connections: the parent's)."""
        self._close(optional_seconds(timeout, "timeout"))

    def _start_close(self, limit: float | None = None) -> _sync_runtime.Begun:
        unregister(self)
        runner, settings = self._runner, self.producer_config
        if not runner.alive_here:
            self._closed_here = True
            return None
        wait = _backstop(settings.close_timeout if limit is None else limit, settings.connection)
        return runner.submit(self._producer.close(limit)), wait


class Consumer(Closable):
    """Blocking :class:`nsq_ha.consumer.Consumer`: same arguments; iterate it.

    ``for message in consumer: ...; message.finish()`` blocks for each message and ends when
    :meth:`close` is called (from any thread). :meth:`run` calls a plain function per message
    in the calling thread (return finishes, an exception requeues). In a process forked after
    it was made, its methods raise ConsumerClosedError at once (its subscriptions belong to the
    parent): make a new Consumer in the child.
    """

    def __init__(
        self,
        topic: str | None = None,
        channel: str | None = None,
        *,
        config: ConsumerConfig | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        self._settings = settings = consumer_config(topic, channel, config, options)
        self._runner = loop_thread()

        async def create() -> AsyncConsumer:
            consumer = AsyncConsumer(config=settings)
            await consumer.start()
            return consumer

        self._consumer = self._runner.run(create())
        #: fetched from the loop, not handed out yet
        self._fetched: collections.deque[AsyncMessage] = collections.deque()
        #: the answers given to the messages handed out, on their way to the loop
        self._answers = Answers(self._runner)
        self._batch = max(1, min(settings.max_in_flight, _MAX_BATCH))
        self._closing = False
        register(self)

    def __repr__(self) -> str:
        return f"<sync {self._consumer!r}>"

    @property
    def aio(self) -> AsyncConsumer:
        """The asyncio consumer underneath (use it only on :func:`shared_loop`)."""
        return self._consumer

    @property
    def config(self) -> ConsumerConfig:
        """Every option of this consumer."""
        return self._settings

    def _live(self) -> LoopThread:
        if self._runner.stale:
            raise ConsumerClosedError(
                f"this consumer cannot be used here: {gone(self._runner)}; make a new Consumer"
            )
        return self._runner

    @property
    def stats(self) -> dict[str, Any]:
        """The consumer's counters."""

        async def read() -> dict[str, Any]:  # on the loop, where the counters change
            return self._consumer.stats

        return self._live().run(read())

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or ``None`` once closed (or after ``timeout`` seconds).

        Messages are fetched from the loop in batches (up to ``max_in_flight``) and handed out
        one by one; :meth:`close` requeues at once what was not handed out. A call interrupted
        while it waits (Ctrl-C, or any exception raised in this thread) loses nothing: its fetch
        is cancelled, and what it took anyway is handed out next (or requeued by :meth:`close`)."""
        limit = None if timeout is None else optional_seconds(timeout, "timeout")
        runner = self._live()
        while (handed := hand_one(self._fetched, self._answers)) is None:
            if not self._fetch(runner, limit):
                return None
        return handed

    def _fetch(self, runner: LoopThread, limit: float | None) -> bool:
        """Wait for the next batch (see :meth:`get`); False once closed or after ``limit``."""
        if self._closing:
            return False
        future = runner.submit(self._fetch_on_loop(limit))
        try:
            return future.result()
        except BaseException:
            future.cancel()  # get_many gives back what it holds when cancelled
            raise

    async def _fetch_on_loop(self, limit: float | None) -> bool:
        batch = await self._consumer.get_many(self._batch, limit)
        self._fetched.extend(batch)
        if self._closing:  # requeued, as what close() found fetched
            self._requeue_fetched()
        return bool(batch)

    def sync(self, timeout: float | None = None) -> None:
        """Block until nsqd has processed every answer given so far (:meth:`Message.finish`
        and :meth:`Message.requeue` return before theirs are written): see
        :meth:`nsq_ha.consumer.Consumer.sync`."""
        limit = optional_seconds(timeout, "timeout")
        self._live().run(self._consumer.sync(limit))

    def __iter__(self) -> Iterator[Message]:
        # get() without its per-call checks, compiled (nsq_ha._sync_handout): once per message
        return hand_out(self, self._live(), self._fetched, self._answers)

    def run(self, handler: Callable[[Message], object]) -> None:
        """Call ``handler(message)`` in this thread for each message until :meth:`close`."""
        for message in self:
            failed = False
            try:
                handler(message)
            except Exception as exc:
                log.warning("handler failed on %r: %r; requeueing it", message, exc)
                failed = True
            if not message.responded:
                with contextlib.suppress(Exception):
                    message.requeue() if failed else message.finish()

    def close(self, drain_timeout: float | None = None) -> None:
        """Drain and close (see the async method); ends every iteration. Does nothing in a
        forked child, like :meth:`Producer.close`."""
        self._close(optional_seconds(drain_timeout, "drain_timeout"))

    def _start_close(self, limit: float | None = None) -> _sync_runtime.Begun:
        unregister(self)
        self._closing = True
        if not self._runner.alive_here:
            return None
        self._runner.loop.call_soon_threadsafe(self._requeue_fetched)
        close = self._settings.drain_timeout if limit is None else limit
        wait = _backstop(close, self._settings.connection_config())
        return self._runner.submit(self._consumer.close(drain_timeout=limit)), wait

    def _requeue_fetched(self) -> None:
        """On the loop, closing: requeue at once what was fetched and not handed out."""
        fetched = self._fetched
        while True:
            try:
                message = fetched.popleft()
            except IndexError:  # none left (another thread may have taken the last one)
                return
            if message.outcome is None:
                with contextlib.suppress(MessageResponseError):
                    message.requeue_nowait(0.0, backoff=False)
