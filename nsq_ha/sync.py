"""Blocking facade over the asyncio client, for scripts and Spark executors.

Every object here drives its asyncio twin on one shared event loop that runs in a daemon thread
(started on first use, started again in a forked child process). Callers never run an event loop
themselves, and many blocking callers in many threads share the same connections.

Do not call these from a coroutine running on that shared loop (they would wait for
themselves): a RuntimeError says so. From other asyncio code, prefer the async classes.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer import Consumer as AsyncConsumer
from nsq_ha.consumer import Message as AsyncMessage
from nsq_ha.errors import NsqTimeoutError
from nsq_ha.producer import Producer as AsyncProducer
from nsq_ha.producer import PublishResult, RetryPolicy
from nsq_ha.protocol.publish import ExtHeader
from nsq_ha.routing import ShardingKey, ShardingStrategy

__all__ = ["Consumer", "Message", "Producer", "PublishResult", "RetryPolicy", "shared_loop"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.thread = threading.Thread(
            target=self._run, name="nsq_ha-sync-loop", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def alive_here(self) -> bool:
        """False in a process forked after the thread started (it has no copy of the thread),
        or once the thread ended: objects bound to it can then no longer be closed from here."""
        return self.pid == os.getpid() and self.thread.is_alive()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError(
                "nsq_ha.sync called from its own event loop thread: use the async API there"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        return self.wait(self.submit(coro), timeout)

    @staticmethod
    def wait(future: concurrent.futures.Future[_T], timeout: float | None) -> _T:
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise NsqTimeoutError(
                f"no result within {timeout} s (the operation was cancelled)"
            ) from exc


_lock = threading.Lock()
_shared: _LoopThread | None = None


def shared_loop() -> asyncio.AbstractEventLoop:
    """The event loop the blocking objects of this process run on (started if needed)."""
    return _loop_thread().loop


def _loop_thread() -> _LoopThread:
    global _shared
    with _lock:
        if _shared is None or not _shared.alive_here:
            _shared = _LoopThread()  # first use, or a forked child (threads do not survive fork)
        return _shared


_open_producers: weakref.WeakSet[Producer] = weakref.WeakSet()


_open_consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()


@atexit.register
def _close_open_producers() -> None:
    """At interpreter exit, close producers still open so queued publishes are not lost, and
    consumers so that nothing stays in flight on nsqd."""
    closers: list[Callable[[], None]] = [p.close for p in _open_producers]
    closers += [c.close for c in _open_consumers]
    for close in closers:
        with contextlib.suppress(Exception):
            close()


class Producer:
    """Blocking :class:`nsq_ha.producer.Producer`; same arguments, same results.

    ``publish``/``publish_many`` block until nsqd acknowledged (or the retry policy gave up);
    ``publish_async`` returns a :class:`concurrent.futures.Future` at once, so one thread can
    keep many publishes in flight (keyed ones still reach nsqd in call order).
    """

    def __init__(
        self,
        *,
        lookupd: str | Sequence[str] | None = None,
        nsqd: str | Sequence[str] | None = None,
        strategy: str | ShardingStrategy = "murmur3",
        config: ConnectionConfig | None = None,
        retry: RetryPolicy | None = None,
        trace: bool = False,
        unkeyed_window: int = 1024,
        max_batch: int = 1000,
        close_timeout: float = 10.0,
    ) -> None:
        self._runner = _loop_thread()

        async def create() -> AsyncProducer:
            return AsyncProducer(
                lookupd=lookupd,
                nsqd=nsqd,
                strategy=strategy,
                config=config,
                retry=retry,
                trace=trace,
                unkeyed_window=unkeyed_window,
                max_batch=max_batch,
                close_timeout=close_timeout,
            )

        self._producer = self._runner.run(create())
        _open_producers.add(self)

    def __repr__(self) -> str:
        return f"<sync {self._producer!r}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def aio(self) -> AsyncProducer:
        """The asyncio producer underneath (use it only on :func:`shared_loop`)."""
        return self._producer

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has started."""
        return self._producer.closed

    def publish(
        self,
        topic: str,
        body: bytes,
        *,
        sharding_key: ShardingKey | None = None,
        partition: int | None = None,
        trace_id: int | None = None,
        ext: ExtHeader | None = None,
        defer: float | None = None,
        timeout: float | None = None,
    ) -> PublishResult:
        """Publish one message and wait for nsqd's acknowledgement (see the async method).

        ``timeout`` (seconds, default: none beyond the retry policy) cancels the publish and
        raises NsqTimeoutError; the message may or may not have been written.
        """
        future = self.publish_async(
            topic,
            body,
            sharding_key=sharding_key,
            partition=partition,
            trace_id=trace_id,
            ext=ext,
            defer=defer,
        )
        return self._runner.wait(future, timeout)

    def publish_async(
        self,
        topic: str,
        body: bytes,
        *,
        sharding_key: ShardingKey | None = None,
        partition: int | None = None,
        trace_id: int | None = None,
        ext: ExtHeader | None = None,
        defer: float | None = None,
    ) -> concurrent.futures.Future[PublishResult]:
        """Start a publish and return a future of its :class:`PublishResult` at once."""
        return self._runner.submit(
            self._producer.publish(
                topic,
                body,
                sharding_key=sharding_key,
                partition=partition,
                trace_id=trace_id,
                ext=ext,
                defer=defer,
            )
        )

    def publish_many(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        sharding_key: ShardingKey | None = None,
        partition: int | None = None,
        trace_ids: Sequence[int | None] | None = None,
        ext: ExtHeader | None = None,
        exts: Sequence[ExtHeader | None] | None = None,
        timeout: float | None = None,
    ) -> list[PublishResult]:
        """Publish several messages in as few batches as possible and wait for all of them."""
        return self._runner.run(
            self._producer.publish_many(
                topic,
                bodies,
                sharding_key=sharding_key,
                partition=partition,
                trace_ids=trace_ids,
                ext=ext,
                exts=exts,
            ),
            timeout,
        )

    def close(self, timeout: float | None = None) -> None:
        """Wait for in-flight publishes (up to ``timeout``), then close every connection.

        In a process forked after this producer was made, this does nothing: the connections
        and the loop thread belong to the parent (a forked child has no copy of that thread).
        """
        _open_producers.discard(self)
        if not self._runner.alive_here:
            return
        self._runner.run(self._producer.close(timeout))


class Message:
    """Blocking view of a consumed :class:`nsq_ha.consumer.Message`: the same attributes;
    :meth:`finish`, :meth:`requeue` and :meth:`touch` block until sent."""

    __slots__ = ("_message", "_runner")

    def __init__(self, message: AsyncMessage, runner: _LoopThread) -> None:
        self._message = message
        self._runner = runner

    def __repr__(self) -> str:
        return repr(self._message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)

    @property
    def aio(self) -> AsyncMessage:
        """The asyncio message underneath."""
        return self._message

    def finish(self) -> None:
        """Acknowledge the message (FIN on the connection that delivered it)."""
        self._runner.run(self._message.finish())

    def requeue(self, delay: float | None = None, *, backoff: bool = True) -> None:
        """Give the message back (see :meth:`nsq_ha.consumer.Message.requeue`)."""
        self._runner.run(self._message.requeue(delay, backoff=backoff))

    def touch(self) -> None:
        """Reset the message's timeout on nsqd."""
        self._runner.run(self._message.touch())


class Consumer:
    """Blocking :class:`nsq_ha.consumer.Consumer`: same arguments; iterate it.

    ``for message in consumer: ...; message.finish()`` blocks for each message and ends when
    :meth:`close` is called (from any thread). :meth:`run` calls a plain function per message
    in the calling thread (return finishes, an exception requeues).
    """

    def __init__(self, topic: str, channel: str, **options: Any) -> None:
        self._runner = _loop_thread()

        async def create() -> AsyncConsumer:
            consumer = AsyncConsumer(topic, channel, **options)
            await consumer.start()
            return consumer

        self._consumer = self._runner.run(create())
        _open_consumers.add(self)

    def __repr__(self) -> str:
        return f"<sync {self._consumer!r}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def aio(self) -> AsyncConsumer:
        """The asyncio consumer underneath (use it only on :func:`shared_loop`)."""
        return self._consumer

    @property
    def stats(self) -> dict[str, Any]:
        """The consumer's counters."""
        return self._runner.run(_value(lambda: self._consumer.stats))

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or ``None`` once closed (or after ``timeout`` seconds)."""
        message = self._runner.run(self._consumer.get(timeout))
        return None if message is None else Message(message, self._runner)

    def __iter__(self) -> Iterator[Message]:
        while True:
            message = self.get()
            if message is None:
                return
            yield message

    def run(self, handler: Callable[[Message], object]) -> None:
        """Call ``handler(message)`` in this thread for each message until :meth:`close`."""
        for message in self:
            try:
                handler(message)
            except Exception as exc:
                log.warning("handler failed on %r: %r; requeueing it", message, exc)
                if not message.responded:
                    with contextlib.suppress(Exception):
                        message.requeue()
                continue
            if not message.responded:
                with contextlib.suppress(Exception):
                    message.finish()

    def close(self, drain_timeout: float | None = None) -> None:
        """Drain and close (see the async method); ends every iteration. Does nothing in a
        forked child, like :meth:`Producer.close`."""
        _open_consumers.discard(self)
        if not self._runner.alive_here:
            return
        self._runner.run(self._consumer.close(drain_timeout=drain_timeout))


async def _value(function: Callable[[], _T]) -> _T:
    return function()
