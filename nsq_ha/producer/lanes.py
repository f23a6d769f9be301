"""Where publishes wait: the per-partition window of unkeyed commands, and the lanes of queued
messages that leave as batches (group commit).

Every publish goes through :meth:`Lanes.submit`, one message or many: its messages join the
lane of their (topic, slot) and the call waits on one :class:`Ticket` that holds an outcome per
message. A lane's senders cut the queue into batches (:class:`~nsq_ha.producer.batch.BatchBuilder`)
and hand each to the ``send`` callback they were given; nothing here routes or connects.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import operator
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from nsq_ha.errors import NsqError, PublishError
from nsq_ha.producer.batch import BatchBuilder, OutgoingMessage
from nsq_ha.producer.result import PublishResult
from nsq_ha.producer.routes import Routes

__all__ = ["Lane", "Lanes", "Outcome", "Queued", "Ticket", "Window"]

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


class Ticket:
    """What one publish call waits for: an outcome per message it queued (a PublishResult, or
    the exception that stopped that message), in order. ``future`` gets the ticket itself once
    every message has one; ``error`` is the first exception among them (None: all went)."""

    __slots__ = ("error", "future", "outcomes", "pending")

    def __init__(self, future: asyncio.Future[Ticket], count: int) -> None:
        self.future = future
        self.outcomes: list[Outcome | None] = [None] * count
        self.pending = count
        self.error: BaseException | None = None

    def settle(self, position: int, outcomes: Sequence[Outcome], error: bool = False) -> None:
        """Record the outcomes of messages ``position``, ``position + 1``, ... (one run of this
        call's messages that went, or failed, together; ``error``: they are exceptions)."""
        mine = self.outcomes
        if mine[position] is not None:
            return  # settled already (a run is only ever settled whole)
        count = len(outcomes)
        mine[position : position + count] = outcomes
        if error and self.error is None:
            self.error = cast("BaseException", outcomes[0])
        self.pending -= count
        if not self.pending and not self.future.done():
            self.future.set_result(self)


class Queued(NamedTuple):
    """One message waiting in a lane: message number ``position`` of ``ticket``'s call."""

    message: OutgoingMessage
    ticket: Ticket
    position: int


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

    __slots__ = ("_builder", "_lanes", "_routes", "_send", "linger", "max_batch")

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

    def submit(
        self, topic: str, slot: int | None, messages: list[OutgoingMessage]
    ) -> asyncio.Future[Ticket]:
        """Queue ``messages`` (in order) on the lane of (topic, slot); the future gets their
        outcomes once all are settled."""
        lane = self._lanes.get((topic, slot))
        if lane is None:
            lane = self._lanes[(topic, slot)] = Lane(topic, slot, asyncio.get_running_loop())
        count = len(messages)
        ticket = Ticket(lane.loop.create_future(), count)
        if count == 1:  # the same entry, without four iterator objects
            lane.queue.append(_new_queued((messages[0], ticket, 0)))
        else:
            items = zip(messages, itertools.repeat(ticket), itertools.count())
            lane.queue.extend(map(_new_queued, items))
        if not lane.senders or (slot is None and lane.sending >= len(lane.senders)):
            self._start_sender(lane)  # no sender will take these with its next batch
        return ticket.future

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
                live, runs = _live(batch)
                if not live:
                    continue
                lane.sending += 1
                if share is not None and lane.queue:
                    self._start_sender(lane)  # the rest goes to other partitions meanwhile
                try:
                    results = await self._send(lane.topic, list(map(_MESSAGE, live)), lane.slot)
                except NsqError as exc:
                    _settle(live, runs, [exc] * len(live), error=True)
                    live = []
                    continue
                finally:
                    lane.sending -= 1
                _settle(live, runs, results)
                live = []
        except asyncio.CancelledError:
            closed = PublishError(
                f"publish to {lane.topic!r} partition {lane.slot}: the producer closed before "
                "nsqd acknowledged it",
                attempts=0,
            )
            _fail([*live, *lane.queue], closed)
            lane.queue.clear()
            raise
        except BaseException as exc:  # a bug: never leave callers waiting forever
            _fail([*live, *lane.queue], exc)
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
            _fail(lane.queue, error)  # a sender cancelled before it ran settles none
            lane.queue.clear()

    def forget(self, topics: Iterable[str]) -> None:
        """Drop the lanes of ``topics`` (idle: nothing queued, no sender)."""
        names = set(topics)
        for key in [k for k in self._lanes if k[0] in names]:
            del self._lanes[key]


#: a Queued from (message, ticket, position), without a Python-level call per message
_new_queued = functools.partial(tuple.__new__, Queued)
_MESSAGE = operator.itemgetter(0)


#: a run of one call's messages in a batch: (its ticket, start index, end index)
_Run = tuple[Ticket, int, int]


def _runs(batch: list[Queued]) -> tuple[list[_Run], bool]:
    """``batch`` as runs of one call's messages, and whether every call still waits."""
    runs: list[_Run] = []
    waiting = True
    start, count = 0, len(batch)
    while start < count:
        ticket = batch[start].ticket
        end = start + 1
        while end < count and batch[end].ticket is ticket:
            end += 1
        runs.append((ticket, start, end))
        waiting = waiting and not ticket.future.done()
        start = end
    return runs, waiting


def _live(batch: list[Queued]) -> tuple[list[Queued], list[_Run]]:
    """``batch`` without the messages of calls that stopped waiting (cancelled), and its runs."""
    runs, waiting = _runs(batch)
    if waiting:
        return batch, runs
    live = [q for ticket, start, end in runs if not ticket.future.done() for q in batch[start:end]]
    return live, _runs(live)[0]


def _settle(
    batch: list[Queued], runs: list[_Run], outcomes: Sequence[Outcome], *, error: bool = False
) -> None:
    """Give each queued message of ``batch`` its outcome: each run of one call's at once."""
    for ticket, start, end in runs:
        ticket.settle(batch[start].position, outcomes[start:end], error)


def _fail(queued: Iterable[Queued], error: BaseException) -> None:
    batch = list(queued)
    _settle(batch, _runs(batch)[0], [error] * len(batch), error=True)
