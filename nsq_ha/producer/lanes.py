"""Where publishes wait: the per-partition window of unkeyed commands, and the lanes of queued
messages that leave as batches (group commit).

Every publish goes through :meth:`Lanes.submit`, one message or many: its messages join the
lane of their (topic, slot) and the call waits on one future for the outcome of each of its
messages, in order. A lane's senders cut the queue into batches
(:class:`~nsq_ha.producer.batch.BatchBuilder`) and hand each to the ``send`` callback they were
given; nothing here routes or connects.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import operator
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from nsq_ha.errors import NsqError, PublishError
from nsq_ha.producer.batch import BatchBuilder, OutgoingMessage
from nsq_ha.producer.result import PublishResult
from nsq_ha.producer.routes import Routes

__all__ = ["Lane", "Lanes", "Outcome", "Outcomes", "Queued", "Window"]

log = logging.getLogger(__name__)

#: what one message of a publish call came to
Outcome = PublishResult | BaseException


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


#: what one publish call waits for: the outcome of each message it queued, in order
Outcomes = list[Outcome]


class _Split:
    """The outcomes gathered so far of a call whose messages went in several batches."""

    __slots__ = ("outcomes", "pending")

    def __init__(self, count: int) -> None:
        self.outcomes: list[Outcome | None] = [None] * count
        self.pending = count


class Queued(NamedTuple):
    """One message waiting in a lane: message number ``position`` of a call of ``size``
    messages, which waits on ``future`` for their outcomes."""

    message: OutgoingMessage
    future: asyncio.Future[Outcomes]
    position: int
    size: int


@dataclass(slots=True)
class Lane:
    """Queued messages of one (topic, slot), sent as batches (group commit).

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


#: ``send(topic, messages, slot)``: one batch, retried; its results in order, or it raises
SendBatch = Callable[[str, list[OutgoingMessage], "int | None"], Awaitable[list[PublishResult]]]


class Lanes:
    """The lanes of a producer, and their senders.

    ``send`` sends one batch; ``builder(routes, share)`` says how batches are cut;
    ``routes(topic)`` gives the topic's cached routes (None when unknown); ``linger``: seconds
    a batch waits for more messages (0: none); ``max_batch``: the most messages per batch.
    """

    __slots__ = ("_builder", "_lanes", "_routes", "_send", "_splits", "linger", "max_batch")

    def __init__(
        self,
        *,
        send: SendBatch,
        builder: Callable[[Routes | None, int | None], BatchBuilder],
        routes: Callable[[str], Routes | None],
        linger: float,
        max_batch: int,
    ) -> None:
        self._send = send
        self._builder = builder
        self._routes = routes
        self.linger = linger
        self.max_batch = max_batch
        self._lanes: dict[tuple[str, int | None], Lane] = {}
        self._splits: _Splits = {}

    def submit(
        self, topic: str, slot: int | None, messages: list[OutgoingMessage]
    ) -> asyncio.Future[Outcomes]:
        """Queue ``messages`` (in order) on the lane of (topic, slot); the future gets their
        outcomes (a PublishResult, or the exception that stopped that message), in order,
        once all are settled."""
        lane = self._lanes.get((topic, slot))
        if lane is None:
            lane = self._lanes[(topic, slot)] = Lane(topic, slot, asyncio.get_running_loop())
        count = len(messages)
        future: asyncio.Future[Outcomes] = lane.loop.create_future()
        if count == 1:  # the same entry, without four iterator objects
            lane.queue.append(_new_queued((messages[0], future, 0, 1)))
        else:
            items = zip(messages, repeat(future), count_from(), repeat(count), strict=False)
            lane.queue.extend(map(_new_queued, items))
        if not lane.senders or (slot is None and lane.sending >= len(lane.senders)):
            self._start_sender(lane)  # no sender will take these with its next batch
        return future

    def _senders_for(self, lane: Lane) -> int:
        """Batches a lane may have out at once: one keeps a keyed lane in order; the unkeyed
        lane overlaps two per writable partition (one in flight while the next fills)."""
        if lane.slot is not None:
            return 1
        routes = self._routes(lane.topic)
        return max(2, 2 * len(routes.writable)) if routes is not None else 2

    async def _run(self, lane: Lane) -> None:
        """Send a lane's queue, one batch at a time (the lane's other senders take others)."""
        live: list[Queued] = []
        try:
            while lane.queue:
                if self.linger and len(lane.queue) < self.max_batch:
                    await asyncio.sleep(self.linger)
                    if not lane.queue:
                        break
                routes = self._routes(lane.topic)
                share = None
                if lane.slot is None and routes is not None and len(routes.writable) > 1:
                    # an unkeyed burst is spread: a batch takes its share of what is queued
                    # among the partitions that have no batch out now
                    free = max(1, len(routes.writable) - lane.sending)
                    share = -(-len(lane.queue) // free)
                batch = self._builder(routes, share).take(lane.queue)
                live = _live(batch)
                if not live:
                    continue
                lane.sending += 1
                if share is not None and lane.queue:
                    self._start_sender(lane)  # the rest goes to other partitions meanwhile
                try:
                    results = await self._send(lane.topic, list(map(_MESSAGE, live)), lane.slot)
                except NsqError as exc:
                    _settle(live, [exc] * len(live), self._splits)
                    live = []
                    continue
                finally:
                    lane.sending -= 1
                _settle(live, cast("list[Outcome]", results), self._splits)
                live = []
        except asyncio.CancelledError:
            closed = PublishError(
                f"publish to {lane.topic!r} partition {lane.slot}: the producer closed before "
                "nsqd acknowledged it",
                attempts=0,
            )
            _fail([*live, *lane.queue], closed, self._splits)
            lane.queue.clear()
            raise
        except BaseException as exc:  # a bug: never leave callers waiting forever
            _fail([*live, *lane.queue], exc, self._splits)
            lane.queue.clear()
            raise
        finally:
            # now, not in a done callback: a submit before that callback ran would count
            # this sender as busy and leave its messages with no sender at all
            lane.senders.discard(cast("asyncio.Task[None]", asyncio.current_task()))

    def _start_sender(self, lane: Lane) -> None:
        """Start a sender for ``lane`` unless one is about to take the next batch anyway: a
        keyed lane has one, an unkeyed one more while the others wait for their answers."""
        senders = len(lane.senders)
        if senders == 0 or (
            lane.slot is None and lane.sending >= senders and senders < self._senders_for(lane)
        ):
            sender = lane.loop.create_task(
                self._run(lane), name=f"nsq_ha-lane-{lane.topic}-{lane.slot}"
            )
            lane.senders.add(sender)

    @property
    def senders(self) -> list[asyncio.Task[None]]:
        """Every lane's running senders."""
        return [sender for lane in self._lanes.values() for sender in lane.senders]

    @property
    def split_calls(self) -> int:
        """Calls whose messages went in several batches and that still wait for some."""
        return len(self._splits)

    @property
    def queued(self) -> int:
        """Messages waiting in lanes."""
        return sum(len(lane.queue) for lane in self._lanes.values())

    @property
    def topics(self) -> set[str]:
        """Topics that have a lane."""
        return {topic for topic, _ in self._lanes}

    def busy_topics(self) -> set[str]:
        """Topics with messages queued or a sender running."""
        return {lane.topic for lane in self._lanes.values() if lane.queue or lane.senders}

    def abort(self, error: BaseException) -> None:
        """Cancel every sender and fail every queued message with ``error``."""
        for lane in self._lanes.values():
            for sender in lane.senders:
                sender.cancel()
            _fail(lane.queue, error, self._splits)  # a sender cancelled before it ran settles none
            lane.queue.clear()

    def forget(self, topics: Iterable[str]) -> None:
        """Drop the lanes of ``topics`` (idle: nothing queued, no sender)."""
        names = set(topics)
        for key in [k for k in self._lanes if k[0] in names]:
            del self._lanes[key]


#: a Queued from (message, future, position, size), without a Python-level call per message
_new_queued = functools.partial(tuple.__new__, Queued)
_MESSAGE = operator.itemgetter(0)
repeat = itertools.repeat
count_from = itertools.count


def _live(batch: list[Queued]) -> list[Queued]:
    """``batch`` without the messages of calls that stopped waiting (cancelled)."""
    for queued in batch:
        if queued.future.done():
            return [q for q in batch if not q.future.done()]
    return batch


#: the calls whose messages went in several batches, while some of them are still out
_Splits = dict["asyncio.Future[Outcomes]", _Split]


def _settle(batch: list[Queued], outcomes: list[Outcome], splits: _Splits) -> None:
    """Give each queued message of ``batch`` its outcome, a run of one call's messages at a
    time. A call whose messages all went in this run (the common case) gets its outcomes at
    once; a call split over batches gets them when its last run settles."""
    start, count = 0, len(batch)
    while start < count:
        first = batch[start]
        future, size = first.future, first.size
        end = start + 1
        while end < count and batch[end].future is future:
            end += 1
        if future.done():
            pass  # cancelled meanwhile
        elif first.position == 0 and end - start == size:
            future.set_result(outcomes[start:end])
        else:
            split = splits.get(future)
            if split is None:
                split = splits[future] = _Split(size)
                future.add_done_callback(functools.partial(_forget_split, splits))
            split.outcomes[first.position : first.position + end - start] = outcomes[start:end]
            split.pending -= end - start
            if not split.pending:
                future.set_result(cast("Outcomes", split.outcomes))
        start = end


def _forget_split(splits: _Splits, future: asyncio.Future[Outcomes]) -> None:
    splits.pop(future, None)


def _fail(queued: Iterable[Queued], error: BaseException, splits: _Splits) -> None:
    batch = list(queued)
    _settle(batch, [error] * len(batch), splits)
