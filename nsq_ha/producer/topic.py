"""Everything a producer keeps for one topic, in one :class:`Topic`, so that an idle topic is
one dict entry to drop (:meth:`Topic.close`).

A keyed message is routed by the partition count from lookupd's ``meta.partition_num`` only
(:attr:`Topic.count`, kept from the last answer that had one): a map without it lists only the
partitions with a writable leader now, so "highest listed + 1" would re-hash keys whenever the
highest partition's leader is missing. Until a count is known, keyed publishes wait; those that
wait for a lookup keep call order (:meth:`Topic.turn`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar

from nsq_ha import events
from nsq_ha.errors import (
    ConfigError,
    PartitionNotAvailableError,
    ProducerClosedError,
    TopicNotWritableError,
    UnsupportedByServerError,
)
from nsq_ha.lookup import LookupClient, PartitionMap
from nsq_ha.producer.batch import Call, plain_size
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.producer.routes import Routes, check_features
from nsq_ha.protocol.publish import PublishMessage
from nsq_ha.routing import ShardingKey, ShardingStrategy

if TYPE_CHECKING:
    from nsq_ha.connection import NsqdConnection

log = logging.getLogger(__name__)

MEMO_KEY_LENGTH: Final = 128
MEMO_SIZE: Final = 16_384

_F = TypeVar("_F", bound="asyncio.Future[Any]")


class SlotMemo:
    """The slot of keys routed before, per partition count: a repeated key is not hashed (nor
    checked) again, so a keyed publish's routing is one dict lookup. Only exact ``int``, ``str``
    and ``bytes`` keys (up to :data:`MEMO_KEY_LENGTH`) are kept, once the strategy accepted them;
    a key that merely compares equal to one (``True``, ``1.0``) is still checked. At most
    :data:`MEMO_SIZE` keys are kept (every count together), then it starts over. The strategy
    must be a function of the key and the count."""

    __slots__ = ("_by_count", "_count", "_memo", "_size", "strategy")

    def __init__(self, strategy: ShardingStrategy) -> None:
        self.strategy = strategy
        self._by_count: dict[int, dict[ShardingKey, int]] = {}
        self._size = 0
        #: the count asked last and its memo (most producers route among one count)
        self._count = -1
        self._memo: dict[ShardingKey, int] = {}

    def slot(self, key: object, count: int) -> int:
        """The slot of ``key`` among ``count``; a key of another type is the strategy's to
        refuse (typed ``object``: a compiled build would raise TypeError before that check)."""
        if type(key) is str or type(key) is bytes:
            if len(key) > MEMO_KEY_LENGTH:
                return self.strategy.partition(key, count)
        elif type(key) is not int:  # bool, float, subclasses: the strategy checks them
            unchecked: Any = key  # not a cast: a compiled build checks a cast's type
            return self.strategy.partition(unchecked, count)
        if count == self._count:
            memo = self._memo
        else:
            found = self._by_count.get(count)
            memo = self._by_count[count] = {} if found is None else found
            self._count, self._memo = count, memo
        slot = memo.get(key)
        if slot is None:
            slot = self.strategy.partition(key, count)
            if self._size >= MEMO_SIZE:
                self._by_count.clear()
                self._size = 0
                memo = self._by_count[count] = {}
                self._count, self._memo = count, memo
            memo[key] = slot
            self._size += 1
        return slot


@dataclass(slots=True)
class Lane:
    """Queued publish calls of one slot of a topic (None: its unkeyed lane), whose messages
    leave as batches (group commit)."""

    slot: int | None
    loop: asyncio.AbstractEventLoop
    #: the loop's futures are asyncio's, made by ``asyncio.Future(loop=loop)`` directly (its
    #: ``create_future`` is asyncio's own: one Python call less per publish call)
    direct_futures: bool
    queue: deque[Call] = field(default_factory=deque)
    #: messages of the queued calls that no batch has taken yet
    waiting: int = 0
    senders: set[asyncio.Task[None]] = field(default_factory=set)
    #: senders waiting for nsqd's answer to their batch (the others will take the next one)
    sending: int = 0


class Window:
    """A FIFO counting semaphore that wakes one waiter in O(1) (asyncio.Semaphore in 3.11 scans
    its waiters on every release, which is quadratic with thousands of publishes waiting)."""

    __slots__ = ("free", "size", "waiters")

    def __init__(self, size: int) -> None:
        self.size = size
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


#: a keyed call waiting behind the turn's holder: how to queue it if its routes are cached
#: (its future then, else None), and the future that gets what that gave
_Waiter = tuple[Callable[[], Any], "asyncio.Future[Any]"]


class Topic:
    """Everything a producer keeps for one topic. ``lookup`` None: the topic lives on the
    static ``nsqd=`` nodes of ``static`` (its routes)."""

    __slots__ = (
        "_leaders",
        "_round_robin",
        "_warned",
        "active",
        "conns",
        "count",
        "lanes",
        "last_used",
        "lookup",
        "memo",
        "name",
        "pool",
        "routes",
        "streaks",
        "waiting",
        "watched",
        "windows",
    )

    def __init__(
        self,
        name: str,
        *,
        lookup: LookupClient | None,
        static: Routes | None,
        memo: SlotMemo,
        pool: ConnectionPool,
    ) -> None:
        self.name = name
        self.lookup = lookup
        self.memo = memo
        self.pool = pool
        #: the routes in use (None: none, or no writable partition in them); the lookup's
        #: watch brings a changed map (:meth:`_on_map`), so a publish asks it nothing
        self.routes: Routes | None = static
        #: the last partition count lookupd's ``meta`` gave (0: none yet)
        self.count = 0
        #: the lookup refreshes this topic's map for us
        self.watched = False
        self.last_used = time.monotonic()
        #: fork: the last leader seen per partition (a move is a LeaderChanged event)
        self._leaders: dict[int, str] = {}
        self._round_robin = itertools.count()
        self._warned = False  # of unkeyed messages on an ordered topic
        self.lanes: dict[int | None, Lane] = {}
        #: slot -> the window of unacknowledged unkeyed commands there
        self.windows: dict[int, Window] = {}
        #: fork slot -> the open connection to its leader (vanilla ones are the pool's)
        self.conns: dict[int, NsqdConnection] = {}
        #: keyed calls waiting behind the one that holds the turn (None: no turn taken)
        self.waiting: deque[_Waiter] | None = None
        #: what -> failed tries, while a streak of failures of ``what`` lasts (for logs)
        self.streaks: dict[str, int] = {}
        self.active = 0  # lookups under way

    def ready(self, keyed: bool) -> Routes | None:
        """The routes if they serve a publish now without asking lookupd (when ``keyed``, with
        a partition count). A lane marks the topic used when its work ends (the sweeper counts
        a busy topic as used), not each call here: a clock read per message."""
        routes = self.routes
        if routes is None or (self.lookup is not None and not self.watched):
            return None
        return None if keyed and routes.count < 1 else routes

    async def current(self, *, keyed: bool, closing: Callable[[], bool]) -> Routes:
        """The routes, asking lookupd when the cache cannot serve; a typed error when the topic
        has no writable partition or, ``keyed``, no known partition count. ``closing()``: the
        producer is closing (a cancelled lookup then says so)."""
        routes = self.ready(keyed)
        if routes is not None:
            return routes
        lookup = self.lookup
        assert lookup is not None  # noqa: S101 - static routes are always usable
        # a cached map without a writable partition or a count (or an expired topic's) sent
        # us here: ask lookupd again (each retry does), not fail from it until the refresh
        stale = lookup.cached(self.name, "w") is not None
        try:
            pmap = await lookup.writable(self.name, force=stale)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if closing() and task is not None and not task.cancelling():
                # the producer closed the lookup client under us: say so, not "cancelled"
                raise ProducerClosedError(
                    f"the producer closed while looking up {self.name!r}"
                ) from None
            raise
        if not self.watched:
            self.watched = True
            lookup.watch(self.name, "w", self._on_map)
        routes = self._store(pmap)
        if keyed and routes.count < 1:
            raise PartitionNotAvailableError(
                f"the partition count of topic {self.name!r} is not known: lookupd answered "
                "without meta.partition_num, and a keyed publish never routes by a count "
                "guessed from the partitions listed; waiting for lookupd to tell it"
            )
        return routes

    def _on_map(self, pmap: PartitionMap) -> None:
        if self.watched and pmap.topic == self.name:
            self._store(pmap)

    def _store(self, pmap: PartitionMap) -> Routes:
        """Keep ``pmap``'s routes; a fork leader that moved: LeaderChanged, its conn dropped."""
        if pmap.fork and pmap.meta is not None and pmap.meta.partition_num > 0:
            self.count = pmap.meta.partition_num
        routes = Routes.from_map(pmap, self.count)
        self.routes = routes if routes.nodes else None
        if not routes.fork:
            return routes
        leaders = self._leaders
        for slot, address in routes.addresses.items():
            old = leaders.get(slot)
            if old != address:
                leaders[slot] = address
                if old is not None:
                    events.emit(
                        events.LeaderChanged(
                            role="producer", topic=self.name, partition=slot, old=old, new=address
                        )
                    )
        self.pool.follow(self.name, routes.addresses, self.conns)
        return routes

    def place(
        self,
        routes: Routes,
        messages: Sequence[PublishMessage],
        key: object,
        partition: object,
        defer: float | None = None,
    ) -> int | None:
        """Refuse what ``routes``' server kind cannot take, then the slot of ``messages`` (None:
        round-robin); ``key`` and ``partition`` are checked here (typed ``object`` for that)."""
        unrestricted = routes.unrestricted
        if key is not None and partition is None and defer is None:
            # a key with a known count, on routes that take everything or for messages that
            # any route takes (nothing to refuse): the key's slot, without the checks below
            count = routes.count
            if count > 0 and (unrestricted or plain_size(messages) is not None):
                return self.memo.slot(key, count)
        if defer is not None or (
            not unrestricted and (partition is not None or plain_size(messages) is None)
        ):
            check_features(routes.fork, self.name, messages, defer, partition, routes.ext)
        if key is None and partition is None:
            if routes.ordered and not self._warned:
                self._warned = True
                log.warning(
                    "topic %r is ordered, but messages published to it without a sharding_key "
                    "go round-robin over its %d partitions, so their order is not kept: give "
                    "each message a sharding_key (one key's messages go to one partition, in "
                    "order); this is logged once per topic",
                    self.name,
                    routes.count,
                )
            return None  # unkeyed: round-robin
        count = routes.count
        if key is not None and partition is not None:
            raise ConfigError("give sharding_key= or partition=, not both")
        if partition is None:
            if count < 1:
                raise PartitionNotAvailableError(
                    f"the partition count of topic {self.name!r} is not known yet"
                )
            return self.memo.slot(key, count)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise ConfigError(f"partition must be an int, not {partition!r}")
        if routes.fork is not True:
            raise UnsupportedByServerError(
                "partition= needs the fork's partition map: use lookupd= with the fork"
            )
        if not 0 <= partition < count:
            raise ConfigError(f"topic {self.name!r} has partitions 0..{count - 1}, not {partition}")
        return partition

    def next_slot(self, routes: Routes) -> int:
        writable = routes.writable
        if not writable:
            raise TopicNotWritableError(f"topic {self.name!r} has no writable partition now")
        return writable[next(self._round_robin) % len(writable)]

    def lane(self, slot: int | None) -> Lane:
        """A new lane for ``slot`` (the caller found none)."""
        loop = asyncio.get_running_loop()
        direct = type(loop).create_future is asyncio.BaseEventLoop.create_future
        return self.lanes.setdefault(slot, Lane(slot, loop, direct))

    async def turn(
        self,
        ready: Callable[[], Routes | None],
        look_up: Callable[[], Awaitable[Routes]],
        submit: Callable[[Topic, Routes], _F],
    ) -> _F:
        """Queue a keyed call after every one made before it; the future ``submit(routes)`` gave.
        ``ready()``: the cached routes (None: they do not serve); ``look_up()``: lookupd's. The
        first call takes the turn; the others wait, and the holder, once done, queues those whose
        routes are ready, in order. Their errors are their own; a call cancelled once queued cancels
        its future."""
        waiters = self.waiting
        if waiters is None:
            self.waiting = deque()
        else:

            def queue_now() -> _F | None:
                routes = ready()
                return None if routes is None else submit(self, routes)

            future: asyncio.Future[_F | None] = asyncio.get_running_loop().create_future()
            waiters.append((queue_now, future))
            try:
                queued = await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled() and future.exception() is None:
                    queued = future.result()
                    if queued is None:
                        self._pass_on()  # handed the turn just as it was cancelled
                    else:
                        queued.cancel()
                raise
            if queued is not None:
                return queued  # queued by the holder, in order
        try:
            routes = ready()
            return submit(self, routes if routes is not None else await look_up())
        finally:
            self._pass_on()

    def _pass_on(self) -> None:
        """The holder is done: queue every waiting call now, in order, until one cannot be
        queued without a lookup; that one holds the turn next. No one left: no turn taken."""
        waiters = self.waiting
        assert waiters is not None  # noqa: S101 - only the turn's holder passes it on
        while waiters:
            queue_now, future = waiters.popleft()
            if future.done():
                continue  # cancelled while it waited
            try:
                queued = queue_now()
            except Exception as exc:  # its own refusal (a bad key): the others go on
                if not future.done():
                    future.set_exception(exc)
                continue
            except BaseException:
                if future.done():
                    self._pass_on()
                else:
                    future.set_result(None)  # it holds the turn: its own try raises again
                raise
            if future.done():  # cancelled by what queued it: as if once queued
                if queued is not None:
                    queued.cancel()
                continue
            future.set_result(queued)
            if queued is None:
                return
        self.waiting = None

    @property
    def busy(self) -> bool:
        """Messages queued, a lane's sender running, an unkeyed command out or waiting for
        room in its window, a lookup, or a keyed call waiting for its turn."""
        if self.waiting is not None or self.active:
            return True
        if any(lane.queue or lane.senders for lane in self.lanes.values()):
            return True
        return any(w.waiters or w.free < w.size for w in self.windows.values())

    def close(self) -> None:
        """Stop the lookup's refresh of this topic and close its connections."""
        if self.watched and self.lookup is not None:
            self.watched = False
            self.lookup.unwatch(self.name, "w", self._on_map)
        for key in self.pool.opening(self.name):
            self.pool.drop(key, self.conns)
        for slot, conn in list(self.conns.items()):
            self.pool.drop((conn.address, self.name, slot), self.conns)
