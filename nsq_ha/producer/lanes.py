"""Where publishes wait: the per-partition window of unkeyed commands and the lanes of queued
messages that leave as batches (group commit)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from nsq_ha.producer.batch import OutgoingMessage
from nsq_ha.producer.result import PublishResult

__all__ = ["Carrier", "Lane", "Queued", "Window", "settle"]


class Window:
    """A FIFO counting semaphore that wakes one waiter in O(1) (asyncio.Semaphore in 3.11 scans
    its waiters on every release, which is quadratic with thousands of publishes waiting)."""

    __slots__ = ("free", "waiters")

    def __init__(self, size: int) -> None:
        self.free = size
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def __aenter__(self) -> None:
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # the slot was handed over just as we were cancelled
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._release()

    def _release(self) -> None:
        while self.waiters:
            future = self.waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.free += 1


@dataclass(slots=True)
class Queued:
    """One message waiting in a lane, and the future its caller awaits."""

    message: OutgoingMessage
    future: asyncio.Future[PublishResult]


@dataclass(slots=True)
class Lane:
    """Queued one-message publishes of one (topic, slot), sent as batches (group commit).

    A keyed lane (``slot`` set) has at most one batch out, so call order holds; the unkeyed
    lane of a topic (``slot`` None) sends each batch to the next partition, several at once.
    """

    topic: str
    slot: int | None
    loop: asyncio.AbstractEventLoop
    queue: deque[Queued] = field(default_factory=deque)
    senders: set[asyncio.Task[None]] = field(default_factory=set)
    #: senders waiting for nsqd's answer to their batch (the others will take the next one)
    sending: int = 0

    @property
    def idle_sender(self) -> bool:
        """A sender is about to take the next batch: enqueued messages will go with it."""
        return self.sending < len(self.senders)


@dataclass(frozen=True, slots=True)
class Carrier:
    """A message alone, in the shape :meth:`BatchBuilder.take` reads from a queue."""

    message: OutgoingMessage


def settle(future: asyncio.Future[PublishResult], exc: BaseException) -> None:
    """Fail ``future`` with ``exc`` unless it is already done."""
    if not future.done():
        future.set_exception(exc)
