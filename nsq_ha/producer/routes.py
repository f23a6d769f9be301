"""Where a topic's messages can go: routes built from a partition map, and the refusals that
follow from them, decided before anything is sent (pure: no I/O).

A keyed message is routed by the topic's partition *count*, and that count is only ever taken
from lookupd's ``meta.partition_num``: a lookup without ``meta`` (or with a count of 0) lists
only the partitions that have a writable leader now, so "highest listed + 1" would be a guess
that re-hashes keys whenever the highest partition's leader is missing. The producer keeps the
last count ``meta`` gave (:class:`PartitionCounts`); until one is known, keyed publishes wait.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from nsq_ha import events
from nsq_ha.errors import (
    ConfigError,
    PartitionNotAvailableError,
    ProducerClosedError,
    TopicNotWritableError,
    UnsupportedByServerError,
)
from nsq_ha.lookup import LookupClient, NodeInfo, PartitionMap
from nsq_ha.producer.batch import OutgoingMessage
from nsq_ha.protocol.names import validate_topic
from nsq_ha.routing import ShardingKey, ShardingStrategy

__all__ = [
    "MEMO_KEY_LENGTH",
    "MEMO_SIZE",
    "ConnKey",
    "PartitionCounts",
    "RouteTable",
    "Routes",
    "SlotMemo",
    "check_features",
]

log = logging.getLogger(__name__)

#: keys whose slot :class:`SlotMemo` remembers: str and bytes up to this length, and int keys
MEMO_KEY_LENGTH: Final = 128
#: the most keys :class:`SlotMemo` remembers (every partition count together)
MEMO_SIZE: Final = 16_384

#: A connection's identity: nsqd address, and on the fork the topic and partition it serves.
ConnKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class Routes:
    """Where one topic's messages can go now; a *slot* is a partition (fork) or a node."""

    topic: str
    #: True: fork partitions; False: vanilla nodes; None: static nsqd= nodes of unknown kind.
    fork: bool | None
    nodes: Mapping[int, NodeInfo]
    #: how many slots keys are spread over; 0 on the fork while the count is not known
    count: int
    ext: bool | None = None
    #: lookup's ``meta`` says the topic is ordered (per-partition order, SUB_ORDERED)
    ordered: bool = False
    #: slots that have a writable node now, in order (round-robin walks these)
    writable: tuple[int, ...] = field(init=False)
    #: every message kind and target goes here (a fork, or unknown, topic not known to lack
    #: ext headers): :func:`check_features` has nothing to refuse but a DPUB
    unrestricted: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "writable", tuple(sorted(self.nodes)))
        object.__setattr__(self, "unrestricted", self.fork is not False and self.ext is not False)

    @classmethod
    def from_map(cls, pmap: PartitionMap, known_count: int = 0) -> Routes:
        """Routes of ``pmap``; a fork map without a usable ``meta`` count uses ``known_count``
        (the last count ``meta`` gave, 0 when none did), never the listed partitions."""
        if pmap.fork:
            count = pmap.meta.partition_num if pmap.meta is not None else 0
            ext = pmap.extend_support if pmap.meta is not None else None
            nodes = dict(pmap.partitions)
            return cls(pmap.topic, True, nodes, count or known_count, ext, pmap.ordered)
        nodes = dict(enumerate(pmap.producers))
        return cls(pmap.topic, False, nodes, len(nodes))

    def wire_partition(self, slot: int) -> int | None:
        """The partition a command names for ``slot`` (None on vanilla and static nodes)."""
        return slot if self.fork else None

    def key(self, slot: int, node: NodeInfo) -> ConnKey:
        """The connection that serves ``slot`` on ``node``."""
        return (node.address, self.topic, slot) if self.fork else (node.address, "", -1)


class PartitionCounts:
    """The last partition count lookupd's ``meta`` gave per topic, and routes built with it."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def routes(self, pmap: PartitionMap) -> Routes:
        """Remember ``pmap``'s count if it has one, and build its routes."""
        if pmap.fork and pmap.meta is not None and pmap.meta.partition_num > 0:
            self.counts[pmap.topic] = pmap.meta.partition_num
        return Routes.from_map(pmap, self.counts.get(pmap.topic, 0))

    def forget(self, topic: str) -> None:
        """Drop what is known of ``topic`` (it expired)."""
        self.counts.pop(topic, None)


class SlotMemo:
    """The slot of keys routed before, per partition count, so that a repeated key is not
    hashed (nor checked) again: a keyed publish's routing is then one dict lookup.

    Only exact ``int`` keys and exact ``str`` and ``bytes`` keys up to
    :data:`MEMO_KEY_LENGTH` are kept, and only once the strategy has accepted them; a key
    that merely compares equal to one (``True``, ``1.0``) is not of those types, so it is
    still checked. At most :data:`MEMO_SIZE` keys are kept; the memo starts over when full.
    The strategy must be a function of the key and the count (every built-in one is).
    """

    __slots__ = ("_by_count", "_size", "strategy")

    def __init__(self, strategy: ShardingStrategy) -> None:
        self.strategy = strategy
        self._by_count: dict[int, dict[ShardingKey, int]] = {}
        self._size = 0

    def slot(self, key: ShardingKey, count: int) -> int:
        """``strategy.partition(key, count)``, from the memo when the key was routed before."""
        if type(key) is str or type(key) is bytes:
            if len(key) > MEMO_KEY_LENGTH:
                return self.strategy.partition(key, count)
        elif type(key) is not int:  # bool, float, subclasses: the strategy checks them
            return self.strategy.partition(key, count)
        memo = self._by_count.get(count)
        if memo is None:
            memo = self._by_count[count] = {}
        slot = memo.get(key)
        if slot is None:
            slot = self.strategy.partition(key, count)
            if self._size >= MEMO_SIZE:
                self._by_count.clear()
                self._size = 0
                memo = self._by_count[count] = {}
            memo[key] = slot
            self._size += 1
        return slot


def check_features(
    fork: bool | None,
    topic: str,
    messages: Sequence[OutgoingMessage],
    *,
    defer: float | None,
    partition: int | None,
    ext_topic: bool | None = None,
) -> None:
    """Refuse what the server kind (or the topic, as lookup described it) cannot take, before
    anything is sent. ``ext_topic`` False: lookup's ``meta`` says the topic has no ext headers."""
    if fork is True and defer is not None:
        raise UnsupportedByServerError(
            f"defer= (DPUB) is not available on the fork (topic {topic!r}): its nsqd has no "
            "DPUB; delay on the consumer side instead (REQ with a timeout)"
        )
    if fork is not False and ext_topic is not False:
        return  # nothing below applies: no per-message check
    if fork is False and partition is not None:
        raise UnsupportedByServerError(f"vanilla nsqd has no partitions (topic {topic!r})")
    for m in messages:
        if fork is False and m.trace_id is not None:
            raise UnsupportedByServerError("trace ids (PUB_TRACE) exist only on the fork")
        if m.ext is None:
            continue
        if fork is False:
            raise UnsupportedByServerError("ext headers (PUB_EXT) exist only on the fork")
        raise UnsupportedByServerError(
            f"topic {topic!r} is not an ext topic (lookup: extend_support=false), so nsqd "
            "would refuse ext headers (E_EXT_NOT_SUPPORT): publish without ext=, or use a "
            "topic created with ext support"
        )


class RouteTable:
    """Where each topic's messages go: the cached routes of every topic in use, kept fresh
    through the lookup's watch, and the slot of each message.

    ``lookup`` None: the topics live on the ``static`` nodes (``nsqd=`` addresses).
    ``on_routes(routes)`` hears each new map the lookup's watch brings (the connection pool
    drops connections to nodes that no longer lead their partition);
    ``closing()`` says the producer is closing (a cancelled lookup then says so).
    Unkeyed messages placed on an ordered topic are logged once per topic (a warning: they
    are not kept in order).
    """

    __slots__ = (
        "_cache",
        "_closing",
        "_counts",
        "_leaders",
        "_on_routes",
        "_round_robin",
        "_slots",
        "_static",
        "_static_routes",
        "_unkeyed_warned",
        "_valid",
        "last_used",
        "lookup",
        "strategy",
        "watched",
    )

    def __init__(
        self,
        *,
        lookup: LookupClient | None,
        static: Sequence[NodeInfo],
        strategy: ShardingStrategy,
        last_used: dict[str, float],
        on_routes: Callable[[Routes], None] | None = None,
        closing: Callable[[], bool] = lambda: False,
    ) -> None:
        self.lookup = lookup
        self.strategy = strategy
        #: topic -> time.monotonic() of its last publish (shared with the idle-topic sweep)
        self.last_used = last_used
        #: topics whose map the lookup refreshes for us
        self.watched: set[str] = set()
        self._static = tuple(static)
        self._on_routes = on_routes
        self._closing = closing
        self._valid: set[str] = set()  # names validate_topic() accepted
        self._cache: dict[str, tuple[PartitionMap, Routes]] = {}
        self._static_routes: dict[str, Routes] = {}
        self._counts = PartitionCounts()
        #: fork topics: the last leader seen per partition (a move is a LeaderChanged event)
        self._leaders: dict[str, dict[int, str]] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._slots = SlotMemo(strategy)
        #: ordered topics whose unkeyed messages were warned about
        self._unkeyed_warned: set[str] = set()

    @property
    def topics(self) -> set[str]:
        """Every topic something is kept for here."""
        names = set(self.last_used) | self._valid | self.watched
        names.update(self._cache, self._static_routes, self._round_robin, self._counts.counts)
        return names

    def ready(self, topic: str, keyed: bool) -> Routes | None:
        """The topic's routes if they serve a publish now without asking lookupd: the name was
        checked before, the topic is watched (not expired) and, when ``keyed``, its partition
        count is known. Marks the topic used."""
        if topic not in self._valid:
            return None
        routes = self.cached(topic)
        if routes is None or (self.lookup is not None and topic not in self.watched):
            return None
        if keyed and routes.count < 1:
            return None
        self.last_used[topic] = time.monotonic()
        return routes

    def check(self, topic: str, key: ShardingKey | None, partition: int | None) -> None:
        """Refuse a bad topic name, a key the strategy cannot hash or a partition that is not
        an int, before anything is looked up or sent. Marks the topic used."""
        validate_topic(topic)
        self.last_used[topic] = time.monotonic()
        if key is not None:
            if partition is not None:
                raise ConfigError("give sharding_key= or partition=, not both")
            self.strategy.partition(key, 1)  # type, range and encoding checks, no routing
        elif partition is not None and (
            isinstance(partition, bool) or not isinstance(partition, int)
        ):
            raise ConfigError(f"partition must be an int, not {partition!r}")

    def cached(self, topic: str) -> Routes | None:
        """The routes of the topic's cached map (None when there is none, or no writable
        partition in it)."""
        if self.lookup is None:
            routes = self._static_routes.get(topic)
            if routes is None:
                nodes = dict(enumerate(self._static))
                routes = self._static_routes[topic] = Routes(topic, None, nodes, len(nodes))
            return routes
        pmap = self.lookup.cached(topic, "w")
        if pmap is None:
            return None
        cached = self._cache.get(topic)
        if cached is not None and cached[0] is pmap:  # every publish: keep it to dict hits
            return cached[1] if cached[1].nodes else None
        if not pmap.routes():
            return None
        routes = self._counts.routes(pmap)
        self._store(pmap, routes)
        return routes

    async def current(self, topic: str, *, keyed: bool = False) -> Routes:
        """The topic's routes, asking lookupd when the cache cannot serve; a typed error when
        the topic has no writable partition or, ``keyed``, no known partition count."""
        routes = self.cached(topic)
        usable = routes is not None and (self.lookup is None or topic in self.watched)
        if routes is not None and usable and (not keyed or routes.count > 0):
            self._valid.add(topic)
            return routes
        lookup = self.lookup
        assert lookup is not None  # noqa: S101 - static routes are always usable
        # a cached map without a writable partition (or without a count, or of an expired
        # topic) is what sent us here: ask lookupd again (each retry does), rather than fail
        # from it until the refresh timer
        stale = lookup.cached(topic, "w") is not None
        try:
            pmap = await lookup.writable(topic, force=stale)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closing() and task is not None and not task.cancelling():
                # the producer closed the lookup client under us: say so, not "cancelled"
                raise ProducerClosedError(
                    f"the producer closed while looking up {topic!r}"
                ) from None
            raise
        if topic not in self.watched:
            self.watched.add(topic)
            self.last_used.setdefault(topic, time.monotonic())
            lookup.watch(topic, "w", self._on_map)
        routes = self._counts.routes(pmap)
        self._store(pmap, routes)
        self._valid.add(topic)
        if keyed and routes.count < 1:
            raise PartitionNotAvailableError(
                f"the partition count of topic {topic!r} is not known: lookupd answered "
                "without meta.partition_num, and a keyed publish never routes by a count "
                "guessed from the partitions listed; waiting for lookupd to tell it"
            )
        return routes

    async def refresh(self, topic: str) -> None:
        """Ask lookupd about ``topic`` now (after an error that says the map is stale)."""
        if self.lookup is not None:
            await self.lookup.refresh(topic, "w")

    def slot_for(
        self, routes: Routes, key: ShardingKey | None, partition: int | None
    ) -> int | None:
        """The fixed slot of a keyed or explicit-partition message; None for round-robin."""
        if key is not None and partition is not None:
            raise ConfigError("give sharding_key= or partition=, not both")
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise ConfigError(f"partition must be an int, not {partition!r}")
            if routes.fork is not True:
                raise UnsupportedByServerError(
                    "partition= needs the fork's partition map: use lookupd= with the fork"
                )
            if not 0 <= partition < routes.count:
                raise ConfigError(
                    f"topic {routes.topic!r} has partitions 0..{routes.count - 1}, not {partition}"
                )
            return partition
        if key is None:
            return None
        if routes.count < 1:
            raise PartitionNotAvailableError(
                f"the partition count of topic {routes.topic!r} is not known yet"
            )
        return self._slots.slot(key, routes.count)

    def place(
        self,
        routes: Routes,
        messages: Sequence[OutgoingMessage],
        key: ShardingKey | None,
        partition: int | None,
        defer: float | None = None,
    ) -> int | None:
        """Refuse what ``routes``' server kind cannot take (:func:`check_features`), then
        the slot of ``messages`` (:meth:`slot_for`; None: round-robin)."""
        if defer is not None or not routes.unrestricted:
            check_features(
                routes.fork,
                routes.topic,
                messages,
                defer=defer,
                partition=partition,
                ext_topic=routes.ext,
            )
        if key is None and partition is None:
            if routes.ordered and routes.topic not in self._unkeyed_warned:
                self._unkeyed_warned.add(routes.topic)
                log.warning(
                    "topic %r is ordered, but messages published to it without a sharding_key "
                    "go round-robin over its %d partitions, so their order is not kept: give "
                    "each message a sharding_key (one key's messages go to one partition, in "
                    "order); this is logged once per topic",
                    routes.topic,
                    routes.count,
                )
            return None  # unkeyed: round-robin
        return self.slot_for(routes, key, partition)

    def next_slot(self, routes: Routes) -> int:
        """The next writable slot of ``routes`` in round-robin order."""
        writable = routes.writable
        if not writable:
            raise TopicNotWritableError(f"topic {routes.topic!r} has no writable partition now")
        counter = self._round_robin.setdefault(routes.topic, itertools.count())
        return writable[next(counter) % len(writable)]

    def forget(self, topics: Iterable[str]) -> None:
        """Drop everything kept for ``topics``, and the lookup's refresh of them."""
        for topic in topics:
            self._valid.discard(topic)
            self._round_robin.pop(topic, None)
            self._cache.pop(topic, None)
            self._static_routes.pop(topic, None)
            self._counts.forget(topic)
            self._leaders.pop(topic, None)
            self._unkeyed_warned.discard(topic)
            self.last_used.pop(topic, None)
            if topic in self.watched:
                self.watched.discard(topic)
                if self.lookup is not None:
                    self.lookup.unwatch(topic, "w", self._on_map)

    def unwatch_all(self) -> None:
        """Stop the lookup's refresh of every topic (the producer closes)."""
        if self.lookup is not None:
            for topic in self.watched:
                self.lookup.unwatch(topic, "w", self._on_map)

    def _on_map(self, pmap: PartitionMap) -> None:
        """Lookup listener: keep the new routes; report connections to nodes that no longer
        lead their partition."""
        if pmap.topic not in self.watched:
            return  # expired meanwhile: nothing of it is kept
        routes = self._counts.routes(pmap)
        self._store(pmap, routes)
        if self._on_routes is not None:
            self._on_routes(routes)

    def _store(self, pmap: PartitionMap, routes: Routes) -> None:
        """Cache ``routes`` of ``pmap``; on the fork, a partition whose leader is not the one
        seen last is a :class:`~nsq_ha.events.LeaderChanged` event."""
        self._cache[pmap.topic] = (pmap, routes)
        if not routes.fork:
            return
        leaders = self._leaders.setdefault(pmap.topic, {})
        for slot, node in routes.nodes.items():
            old = leaders.get(slot)
            if old != node.address:
                leaders[slot] = node.address
                if old is not None:
                    events.emit(
                        events.LeaderChanged(
                            role="producer",
                            topic=pmap.topic,
                            partition=slot,
                            old=old,
                            new=node.address,
                        )
                    )
