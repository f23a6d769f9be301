"""Where publishes wait: the per-partition window of unkeyed commands, and the lanes of queued
messages that leave as batches (group commit).

Every publish goes through :meth:`Lanes.submit`, one message or many: the call joins the lane
of its (topic, slot) as one :class:`Call` and waits on one future for the outcome of each of
its messages, in order. A lane's senders cut the queue into batches (whole plain calls while
they fit; otherwise message by message under :class:`~nsq_ha.producer.batch.BatchBuilder`'s
rules) and hand each to the ``send`` callback they were given; nothing here routes or
connects.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple, cast

from nsq_ha.errors import NsqError, PublishError
from nsq_ha.producer.batch import BatchBuilder, OutgoingMessage, plain_size
from nsq_ha.producer.result import PublishResult
from nsq_ha.producer.routes import Routes

__all__ = ["UNKNOWN", "Call", "Lane", "Lanes", "Outcome", "Outcomes", "PlainBytes", "Run", "Window"]

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


class _Unknown:
    """Not given (a Call sums its plain bytes itself)."""


UNKNOWN: Final = _Unknown()
#: a call's plain (uncompressed body) bytes, None when they cannot be known, or UNKNOWN
PlainBytes = int | _Unknown | None


class Call:
    """One publish call waiting in a lane: its messages, how many of them batches have taken
    so far (``taken``), and the future its caller waits on for their outcomes.

    ``plain_bytes``: what the messages add to an ``MPUB`` body (a length and the body each)
    when none has a trace id or an ext header, else None. A call whose messages leave in
    several batches gathers their outcomes in ``outcomes`` until ``pending`` reaches 0.
    """

    __slots__ = ("future", "messages", "outcomes", "pending", "plain_bytes", "taken")

    def __init__(
        self,
        messages: list[OutgoingMessage],
        future: asyncio.Future[Outcomes],
        plain_bytes: int | _Unknown | None = UNKNOWN,
    ) -> None:
        """``plain_bytes`` when the caller knows it (:func:`~nsq_ha.producer.batch.prepare_batch`
        does), else it is summed here."""
        self.messages = messages
        self.future = future
        self.taken = 0
        self.pending = len(messages)
        self.outcomes: list[Outcome | None] | None = None
        self.plain_bytes = (
            plain_size(messages) if isinstance(plain_bytes, _Unknown) else plain_bytes
        )


#: messages ``start:end`` of a call, in one batch: ``(call, start, end)`` (a plain tuple: one
#: is made per call per batch)
Run = tuple[Call, int, int]


class _Item(NamedTuple):
    """One message of a queued call, as :meth:`BatchBuilder.take` sees it."""

    message: OutgoingMessage
    call: Call


@dataclass(slots=True)
class Lane:
    """Queued publish calls of one (topic, slot), whose messages leave as batches (group
    commit).

    A keyed lane (``slot`` set) has at most one batch out, so call order holds; the unkeyed
    lane of a topic (``slot`` None) sends each batch to the next partition, several at once.
    """

    topic: str
    slot: int | None
    loop: asyncio.AbstractEventLoop
    queue: deque[Call] = field(default_factory=deque)
    #: messages of the queued calls that no batch has taken yet
    waiting: int = 0
    senders: set[asyncio.Task[None]] = field(default_factory=set)
    #: senders waiting for nsqd's answer to their batch (the others will take the next one)
    sending: int = 0


#: ``send(topic, messages, slot)``: one batch, retried (and split when nsqd refuses it for some
#: of its messages); each message's outcome in order, or it raises (one error for them all)
SendBatch = Callable[[str, list[OutgoingMessage], "int | None"], Awaitable[Sequence[Outcome]]]


class Lanes:
    """The lanes of a producer, and their senders.

    ``send`` sends one batch; ``builder(routes)`` says how batches are cut;
    ``routes(topic)`` gives the topic's cached routes (None when unknown); ``linger``: seconds
    a batch waits for more messages (0: none); ``max_batch``: the most messages per batch.
    """

    __slots__ = ("_builder", "_lanes", "_routes", "_send", "_splits", "linger", "max_batch")

    def __init__(
        self,
        *,
        send: SendBatch,
        builder: Callable[[Routes | None], BatchBuilder],
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
        #: calls whose messages went in several batches, while some of them are still out
        self._splits: set[Call] = set()

    def submit(
        self,
        topic: str,
        slot: int | None,
        messages: list[OutgoingMessage],
        plain_bytes: int | _Unknown | None = UNKNOWN,
    ) -> asyncio.Future[Outcomes]:
        """Queue ``messages`` (in order) on the lane of (topic, slot); the future gets their
        outcomes (a PublishResult, or the exception that stopped that message), in order,
        once all are settled."""
        lane = self._lanes.get((topic, slot))
        if lane is None:
            lane = self._lanes[(topic, slot)] = Lane(topic, slot, asyncio.get_running_loop())
        future: asyncio.Future[Outcomes] = lane.loop.create_future()
        lane.queue.append(Call(messages, future, plain_bytes))
        lane.waiting += len(messages)
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
        live: list[Run] = []
        try:
            while lane.queue:
                if self.linger and lane.waiting < self.max_batch:
                    await asyncio.sleep(self.linger)
                    if not lane.queue:
                        break
                routes = self._routes(lane.topic)
                share = None
                if lane.slot is None:
                    # an unkeyed burst of calls is spread: a batch takes whole calls up to its
                    # share of what is queued among the partitions that have no batch out now;
                    # without linger, at least two shares (one batch in flight while the next
                    # is read), so callers that wait for one batch and publish again never all
                    # ride the same batch (with linger, gathering is what was asked for)
                    writable = len(routes.writable) if routes is not None else 1
                    shares = writable if self.linger else max(2, writable)
                    free = max(1, shares - lane.sending)
                    share = -(-lane.waiting // free)
                live = _live(_take(lane, self._builder(routes), share), self._splits)
                if not live:
                    continue
                lane.sending += 1
                if share is not None and lane.queue:
                    self._start_sender(lane)  # the rest goes to other partitions meanwhile
                try:
                    results = await self._send(lane.topic, _messages(live), lane.slot)
                except NsqError as exc:
                    _settle(live, _Same(exc), self._splits)
                    live = []
                    continue
                finally:
                    lane.sending -= 1
                _settle(live, results, self._splits)
                live = []
        except asyncio.CancelledError:
            closed = PublishError(
                f"publish to {lane.topic!r} partition {lane.slot}: the producer closed before "
                "nsqd acknowledged it",
                attempts=0,
            )
            _fail(lane, live, closed, self._splits)
            raise
        except BaseException as exc:  # a bug: never leave callers waiting forever
            _fail(lane, live, exc, self._splits)
            raise
        finally:
            # now, not in a done callback: a submit before that callback ran would count
            # this sender as busy and leave its messages with no sender at all
            lane.senders.discard(cast("asyncio.Task[None]", asyncio.current_task(lane.loop)))

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
        return sum(lane.waiting for lane in self._lanes.values())

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
            _fail(lane, [], error, self._splits)  # a sender cancelled before it ran settles none

    def forget(self, topics: Iterable[str]) -> None:
        """Drop the lanes of ``topics`` (idle: nothing queued, no sender)."""
        names = set(topics)
        for key in [k for k in self._lanes if k[0] in names]:
            del self._lanes[key]


def _take(lane: Lane, builder: BatchBuilder, share: int | None) -> list[Run]:
    """Take the next batch off ``lane``'s queue. Plain calls (no trace id, no ext header) go
    whole while they fit (one sum per call); the first that does not is cut message by
    message (the batch ends there). A call with traced or ext messages, a tracing producer,
    or a builder that measures every message (an nsqd named a lower message limit) is taken
    message by message under :meth:`BatchBuilder.take`'s rules.

    ``share`` (None: no share) ends the batch at the first call boundary at or past that many
    messages: a call is never cut for a share, only for the limits of one command."""
    queue = lane.queue
    runs: list[Run] = []
    if share is None:  # no share: calls are cut wherever one command is full
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
            lane.waiting -= builder.max_count - left
            return runs
    if not queue:
        return runs
    # message by message, over as many queued messages as one batch may carry: whole calls
    # up to the share, and at least the first
    items: deque[_Item] = deque()
    for call in queue:
        if items and len(items) + len(call.messages) - call.taken > share:
            break
        items.extend(
            _Item(m, call)
            for m in call.messages[call.taken : call.taken + builder.max_count - len(items)]
        )
        if len(items) >= builder.max_count:
            break
    batch = builder.take(items)
    lane.waiting -= len(batch)
    for call, group in itertools.groupby(batch, _CALL):
        count = len(list(group))
        runs.append((call, call.taken, call.taken + count))
        call.taken += count
        if call.taken == len(call.messages):
            queue.popleft()
    return runs


_CALL = operator.attrgetter("call")


def _live(runs: list[Run], splits: set[Call]) -> list[Run]:
    """``runs`` without those of calls that stopped waiting (cancelled)."""
    for call, _, _ in runs:
        if call.future.done():
            for gone, _, _ in runs:
                if gone.future.done():
                    splits.discard(gone)
            return [run for run in runs if not run[0].future.done()]
    return runs


def _messages(runs: list[Run]) -> list[OutgoingMessage]:
    """The messages of ``runs``, in order (a whole call's own list when it is the batch)."""
    if len(runs) == 1:
        call, start, end = runs[0]
        return (
            call.messages if start == 0 and end == len(call.messages) else call.messages[start:end]
        )
    messages: list[OutgoingMessage] = []
    for call, start, end in runs:
        if end - start == 1:
            messages.append(call.messages[start])
        else:
            messages += call.messages[start:end]
    return messages


class _Same:
    """``outcomes[i]`` is ``error`` for every i: one failure for a whole batch."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __getitem__(self, index: slice) -> list[Outcome]:
        return [self.error] * (index.stop - index.start)


def _settle(runs: list[Run], outcomes: Sequence[Outcome] | _Same, splits: set[Call]) -> None:
    """Give each run's messages their outcomes (``outcomes``: one per message of the batch,
    in order). A call whose messages all went in this batch (the common case) gets its
    outcomes at once; a call split over batches gets them when its last run settles."""
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


def _fail(lane: Lane, live: list[Run], error: BaseException, splits: set[Call]) -> None:
    """Fail the messages of ``live`` (a batch that was out) and every queued message of
    ``lane`` with ``error``; the lane is left empty."""
    runs = [*live, *((c, c.taken, len(c.messages)) for c in lane.queue)]
    lane.queue.clear()
    lane.waiting = 0
    _settle(runs, _Same(error), splits)
