"""The asyncio producer: partition-aware, ordered per key, retried through leader changes.

Routing (PROTOCOL.md §6.2):

* a ``sharding_key`` picks the partition with the producer's strategy (``murmur3`` like the
  fork's Go SDK, ``java`` like its Java SDK, or ``jump``) over ``meta.partition_num``; an
  explicit ``partition`` is used as given. Such messages are **never rerouted**: when their
  partition has no reachable leader the publish is retried there until the policy gives up.
  The count comes only from lookupd's ``meta`` (the last one seen is kept): a lookup without
  it never makes the producer guess a count from the partitions listed, and until a count is
  known keyed publishes wait (looking up again on each retry);
* other messages go round-robin over the partitions that have a writable leader, and a retry
  may pick another one;
* on vanilla nsqd (``nsqd=`` addresses or a vanilla nsqlookupd) "partitions" are the nsqd
  nodes: a key picks one of them (stable while the set of nodes is). A fork nsqd given as an
  ``nsqd=`` address refuses keyed publishes (its partition count and leaders are unknown
  there): UnsupportedByServerError before the message is sent.

Topics not published to for ``topic_idle_timeout`` seconds expire: their routes, lanes and
connections are freed and lookupd is no longer asked about them (until the next publish).

Order: keyed and explicit-partition messages of one (topic, partition) wait in a *lane*; a lane
has at most one batch unacknowledged. Messages that queue up while a batch is out leave together
as the next ``MPUB``/``MPUB_TRACE``/``MPUB_EXT`` (all or nothing on the server), so a key's
messages are written in call order even while a batch is retried. Unkeyed messages are sent at
once, pipelined, up to ``unkeyed_window`` unacknowledged commands per partition.

Failures (§6.3): ``E_FAILED_ON_NOT_LEADER``, ``E_FAILED_ON_NOT_WRITABLE`` and
``E_TOPIC_NOT_EXIST`` drop that partition's connection and refresh the lookup at once, then the
same batch is tried again under :class:`~nsq_ha.producer.policy.RetryPolicy`; so do lost
connections and timeouts. A retriable failure that outlasts the policy raises
:class:`~nsq_ha.errors.PublishError` (``__cause__``: the last error); anything else (bad input,
``E_EXT_NOT_SUPPORT``, an unknown topic) is raised as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, Self, cast

from tenacity import RetryCallState, RetryError

from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.durations import seconds
from nsq_ha.errors import (
    BrokerError,
    ConfigError,
    ConnectionClosedError,
    NsqError,
    PartitionNotAvailableError,
    ProducerClosedError,
    PublishError,
    TopicNotWritableError,
    UnsupportedByServerError,
)
from nsq_ha.lookup import LookupClient, NodeInfo, PartitionMap
from nsq_ha.producer.args import per_message, sequence_of, static_node
from nsq_ha.producer.batch import (
    PLAIN_RECEIPT,
    BatchBuilder,
    OutgoingMessage,
    batch_command,
    encode_batch,
    prepare_message,
    receipts_from_answer,
)
from nsq_ha.producer.idle import IdleTopics
from nsq_ha.producer.lanes import Carrier, Lane, Queued, Window, settle
from nsq_ha.producer.policy import RetryPolicy
from nsq_ha.producer.result import PublishResult
from nsq_ha.producer.routes import ConnKey, PartitionCounts
from nsq_ha.producer.routes import Routes as _Routes
from nsq_ha.producer.routes import check_features as _check_features
from nsq_ha.protocol.commands import seconds_to_ms
from nsq_ha.protocol.names import validate_topic
from nsq_ha.protocol.publish import ExtHeader, encode_dpub
from nsq_ha.redact import redact_text as redact
from nsq_ha.retry import decide
from nsq_ha.routing import ShardingKey, ShardingStrategy, get_strategy

__all__ = ["Producer", "PublishResult"]

log = logging.getLogger(__name__)


class Producer:
    """Publish to NSQ topics: partitions of the HA fork (through nsqlookupd) or vanilla nsqd.

    Give exactly one of ``lookupd`` (nsqlookupd HTTP address(es)), ``lookup`` (a shared
    :class:`~nsq_ha.lookup.LookupClient`) or ``nsqd`` (TCP address(es), vanilla).

    ``strategy``: ``"murmur3"`` (default), ``"java"``, ``"jump"`` or a
    :class:`~nsq_ha.routing.ShardingStrategy`. ``config``: the connections' settings (size
    limits, TLS, AUTH, compression, timeouts). ``retry``: the
    :class:`~nsq_ha.producer.policy.RetryPolicy`. ``trace=True`` publishes every message traced
    (trace id 0 unless given) so that every result carries its id and queue offset.
    ``unkeyed_window``: unacknowledged unkeyed commands per partition. ``max_batch``: most
    messages per ``MPUB``. ``linger``: seconds a batch waits for more messages before it goes
    (0: it goes as soon as the previous batch of its partition is acknowledged).
    ``close_timeout``: how long :meth:`close` waits for in-flight publishes before failing them.
    ``topic_idle_timeout``: seconds after a topic's last publish (and once none of its messages
    is queued or in flight) when its state is freed: routes, lanes, connections, and its lookup
    is no longer refreshed; the next publish to it looks it up again. Durations are finite
    seconds: NaN, infinities and negatives are refused with ConfigError.

    Group commit: concurrent :meth:`publish` calls are queued per partition and sent as one
    ``MPUB`` (or ``MPUB_TRACE``/``MPUB_EXT``) per batch, up to ``max_batch`` messages and the
    size limits; each caller still gets its own result or error. Keyed calls keep call order
    (one batch out per partition); unkeyed calls spread their batches round-robin.

    Use ``async with Producer(...) as producer`` or call :meth:`close`.
    """

    def __init__(
        self,
        *,
        lookupd: str | Sequence[str] | None = None,
        lookup: LookupClient | None = None,
        nsqd: str | Sequence[str] | None = None,
        strategy: str | ShardingStrategy = "murmur3",
        config: ConnectionConfig | None = None,
        retry: RetryPolicy | None = None,
        trace: bool = False,
        unkeyed_window: int = 1024,
        max_batch: int = 1000,
        linger: float = 0.0,
        close_timeout: float = 10.0,
        topic_idle_timeout: float = 300.0,
    ) -> None:
        given = [x is not None for x in (lookupd, lookup, nsqd)]
        if sum(given) != 1:
            raise ConfigError("give exactly one of lookupd=, lookup= or nsqd=")
        for name, count in (("unkeyed_window", unkeyed_window), ("max_batch", max_batch)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {count!r}")
        linger = seconds(linger, "linger", zero=True)
        close_timeout = seconds(close_timeout, "close_timeout")
        topic_idle_timeout = seconds(topic_idle_timeout, "topic_idle_timeout")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        self._owns_lookup = lookupd is not None
        self._lookup: LookupClient | None = LookupClient(lookupd) if lookupd is not None else lookup
        self._static: tuple[NodeInfo, ...] = ()
        if nsqd is not None:
            addresses = [nsqd] if isinstance(nsqd, str) else list(nsqd)
            if not addresses:
                raise ConfigError("nsqd= needs at least one address")
            self._static = tuple(static_node(a) for a in dict.fromkeys(addresses))
        self.strategy = get_strategy(strategy) if isinstance(strategy, str) else strategy
        self.config = config or ConnectionConfig()
        self.retry = retry or RetryPolicy()
        self.trace = trace
        self.unkeyed_window = unkeyed_window
        self.max_batch = max_batch
        self.linger = linger
        self.close_timeout = close_timeout
        self.topic_idle_timeout = topic_idle_timeout
        self._conns: dict[ConnKey, asyncio.Task[NsqdConnection]] = {}
        self._ready: dict[ConnKey, NsqdConnection] = {}
        self._lanes: dict[tuple[str, int | None], Lane] = {}
        self._valid_topics: set[str] = set()  # names validate_topic() accepted
        self._windows: dict[tuple[str, int], Window] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._routes_cache: dict[str, tuple[PartitionMap, _Routes]] = {}
        self._static_routes: dict[str, _Routes] = {}
        self._counts = PartitionCounts()
        self._watched: set[str] = set()
        self._idle_topics = IdleTopics(topic_idle_timeout)
        #: topic -> time.monotonic() of its last publish call (idle topics expire)
        self._last_used = self._idle_topics.last_used
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._aborting = False
        self._closed = asyncio.Event()
        #: counters for logs, tests and benchmarks
        self.stats: dict[str, int] = {
            "published": 0,
            "commands": 0,
            "retries": 0,
            "connections": 0,
            "lookups_forced": 0,
        }

    def __repr__(self) -> str:
        if self._lookup is not None:
            where = f"lookupd={[redact(u) for u in self._lookup.lookupds]}"
        else:
            where = f"nsqd={[n.address for n in self._static]}"
        return (
            f"<Producer {where} strategy={self.strategy.name} topics={len(self.topics)} "
            f"conns={len(self._ready)}>"
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has started: new publishes are refused."""
        return self._closing

    @property
    def topics(self) -> frozenset[str]:
        """Topics this producer holds state for (routes, lanes, connections, lookups)."""
        names = set(self._last_used) | self._valid_topics | self._watched
        names.update(self._routes_cache, self._static_routes, self._round_robin)
        names.update(self._counts.counts)
        names.update(topic for topic, _ in self._lanes)
        names.update(topic for topic, _ in self._windows)
        names.update(topic for _, topic, _ in self._conns if topic)
        names.update(topic for _, topic, _ in self._ready if topic)
        return frozenset(names)

    @property
    def connections(self) -> tuple[ConnKey, ...]:
        """Open nsqd connections: ``(address, topic, partition)``, or ``(address, "", -1)`` for a
        connection shared by every topic (vanilla nsqd)."""
        return tuple(key for key, conn in self._ready.items() if not conn.closed)

    # -- public API -------------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        body: bytes,
        *,
        sharding_key: ShardingKey | None = None,
        partition: int | None = None,
        trace_id: int | None = None,
        ext: ExtHeader | None = None,
        defer: float | None = None,
    ) -> PublishResult:
        """Publish one message and return where it went once nsqd acknowledged it.

        ``sharding_key`` (str, bytes or int) or ``partition`` fix the partition and keep call
        order; ``trace_id`` (u64) sends PUB_TRACE; ``ext`` (a JSON object) sends PUB_EXT to an
        ext topic; ``defer`` (seconds) sends DPUB (vanilla only).

        Bad input (a key that cannot be hashed, ext headers for a topic lookup describes as not
        ext, a keyed publish through a fork nsqd given as ``nsqd=``) raises a ConfigError
        subclass before anything is sent.
        """
        if self._closing:
            raise ProducerClosedError("the producer is closed")
        self._active += 1  # what _in_flight() does, inline: this is the hottest call
        self._idle.clear()
        try:
            if (
                partition is None
                and trace_id is None
                and ext is None
                and defer is None
                and type(body) is bytes
                and body
                and len(body) <= self.config.max_msg_size
            ):
                # the common case, checked as prepare_message would, without its generality
                routes = self._cached_routes(topic) if topic in self._valid_topics else None
                if routes is not None and (sharding_key is None or routes.count > 0):
                    self._last_used[topic] = _monotonic()
                    slot = (
                        None if sharding_key is None else self._slot_for(routes, sharding_key, None)
                    )
                    return await self._enqueue_one(topic, slot, OutgoingMessage(body))
            return await self._publish(topic, body, sharding_key, partition, trace_id, ext, defer)
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def _publish(
        self,
        topic: str,
        body: bytes,
        sharding_key: ShardingKey | None,
        partition: int | None,
        trace_id: int | None,
        ext: ExtHeader | None,
        defer: float | None,
    ) -> PublishResult:
        validate_topic(topic)
        self._last_used[topic] = _monotonic()
        msg = prepare_message(
            body, trace_id=trace_id, ext=ext, max_msg_size=self.config.max_msg_size
        )
        self._check_target(sharding_key, partition)
        if defer is not None:
            seconds_to_ms(defer, "defer")
            if sharding_key is not None or partition is not None:
                raise ConfigError("defer= cannot be combined with sharding_key= or partition=")
        self._start_sweeper()
        fixed = sharding_key is not None or partition is not None
        routes = await self._resolve(topic, keyed=fixed)
        self._valid_topics.add(topic)
        _check_features(
            routes.fork, topic, [msg], defer=defer, partition=partition, ext_topic=routes.ext
        )
        slot = self._slot_for(routes, sharding_key, partition)
        if defer is not None:
            return (await self._send(topic, [msg], slot=None, defer=defer))[0]
        (future,) = self._enqueue(topic, slot, [msg])
        return await future

    async def publish_many(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        sharding_key: ShardingKey | None = None,
        partition: int | None = None,
        trace_ids: Sequence[int | None] | None = None,
        ext: ExtHeader | None = None,
        exts: Sequence[ExtHeader | None] | None = None,
    ) -> list[PublishResult]:
        """Publish several messages, batched into as few ``MPUB*`` commands as the limits allow.

        Returns one result per body, in order. With a ``sharding_key`` or ``partition`` they
        all go to that partition in order; otherwise each batch goes to the next partition.
        ``trace_ids`` and ``exts`` give per-message values; ``ext`` one header for all. If some
        batches fail, PublishError is raised after all have settled, with ``.results`` holding a
        PublishResult or the exception per message.
        """
        self._check_open()
        with self._in_flight():
            return await self._publish_many(
                topic, bodies, sharding_key, partition, trace_ids, ext, exts
            )

    async def _publish_many(
        self,
        topic: str,
        bodies: Sequence[bytes],
        sharding_key: ShardingKey | None,
        partition: int | None,
        trace_ids: Sequence[int | None] | None,
        ext: ExtHeader | None,
        exts: Sequence[ExtHeader | None] | None,
    ) -> list[PublishResult]:
        validate_topic(topic)
        self._last_used[topic] = _monotonic()
        bodies = sequence_of(bodies, "bodies")
        if not bodies:
            return []
        self._check_target(sharding_key, partition)
        traces = per_message(trace_ids, len(bodies), "trace_ids")
        if ext is not None and exts is not None:
            raise ConfigError("give ext= (one header for all) or exts= (one each), not both")
        headers: list[ExtHeader | None] = (
            per_message(exts, len(bodies), "exts") if exts is not None else [ext] * len(bodies)
        )
        size = self.config.max_msg_size
        plain = (
            trace_ids is None
            and ext is None
            and exts is None
            and all(type(b) is bytes and 0 < len(b) <= size for b in bodies)
        )
        if plain:  # bodies that prepare_message would pass unchanged
            msgs = [OutgoingMessage(b) for b in bodies]
        else:
            msgs = [
                prepare_message(b, trace_id=t, ext=h, max_msg_size=size)
                for b, t, h in zip(bodies, traces, headers, strict=True)
            ]
        self._start_sweeper()
        routes = await self._resolve(topic, keyed=sharding_key is not None or partition is not None)
        self._valid_topics.add(topic)
        _check_features(
            routes.fork,
            topic,
            [] if plain else msgs,
            defer=None,
            partition=partition,
            ext_topic=routes.ext,
        )
        slot = self._slot_for(routes, sharding_key, partition)
        if slot is not None:
            futures = self._enqueue(topic, slot, msgs)
            outcomes: list[PublishResult | BaseException] = list(
                await asyncio.gather(*futures, return_exceptions=True)
            )
        else:
            outcomes = await self._direct_many(topic, msgs, routes, plain=plain)
        errors = [o for o in outcomes if not isinstance(o, PublishResult)]
        if not errors:
            return cast("list[PublishResult]", outcomes)
        for err in errors:
            if isinstance(err, asyncio.CancelledError):
                raise err
        if (
            len(errors) == len(outcomes)
            and isinstance(errors[0], ConfigError)
            and all(e is errors[0] for e in errors)
        ):
            raise errors[0]  # one refusal for all, before anything was sent: raise it as it is
        error = PublishError(
            f"{len(errors)} of {len(msgs)} messages to {topic!r} were not published: "
            f"{redact(str(errors[0]))}",
            attempts=max((getattr(e, "attempts", 1) for e in errors), default=1),
            last_error=errors[0],
        )
        error.results = list(outcomes)
        raise error

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - drain limit
        """Stop accepting publishes, wait for the in-flight ones, then close the connections.

        After ``timeout`` (default ``close_timeout``; finite seconds >= 0) seconds, publishes
        still waiting fail with PublishError ("producer closed before nsqd acknowledged"); none
        is silently dropped.
        """
        limit = self.close_timeout
        if timeout is not None:
            limit = seconds(timeout, "timeout", zero=True)
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        try:
            if not await self._drained(limit):
                log.warning(
                    "producer closing: %d publish calls (%d messages queued in lanes) still "
                    "unacknowledged after %.1fs; failing them",
                    self._active,
                    sum(len(lane.queue) for lane in self._lanes.values()),
                    limit,
                )
                self._aborting = True
                closed = PublishError("the producer closed before nsqd acknowledged it", attempts=0)
                for lane in self._lanes.values():
                    for sender in lane.senders:
                        sender.cancel()
                    for queued in lane.queue:  # a sender cancelled before it ran settles none
                        settle(queued.future, closed)
                    lane.queue.clear()
            conns = list(self._ready.values())
            for task in self._conns.values():
                task.cancel()
            self._conns.clear()
            self._ready.clear()
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
            self._aborting = True
            await self._drained(self.config.close_timeout)
            if self._sweeper is not None:
                await asyncio.gather(self._sweeper, return_exceptions=True)
            if self._background:
                await asyncio.gather(*self._background, return_exceptions=True)
            if self._lookup is not None:
                for topic in self._watched:
                    self._lookup.unwatch(topic, "w", self._on_map)
                if self._owns_lookup:
                    await self._lookup.close()
        finally:
            self._closed.set()

    # -- routing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """Count a publish call from entry to exit: close() waits for these."""
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    def _check_open(self) -> None:
        if self._closing:
            raise ProducerClosedError("the producer is closed")

    def _check_target(self, key: ShardingKey | None, partition: int | None) -> None:
        """Refuse a key the strategy cannot hash, or a partition that is not an int, at once."""
        if key is not None:
            if partition is not None:
                raise ConfigError("give sharding_key= or partition=, not both")
            self.strategy.partition(key, 1)  # type, range and encoding checks, no routing
        elif partition is not None and (
            isinstance(partition, bool) or not isinstance(partition, int)
        ):
            raise ConfigError(f"partition must be an int, not {partition!r}")

    def _cached_routes(self, topic: str) -> _Routes | None:
        if self._lookup is None:
            routes = self._static_routes.get(topic)
            if routes is None:
                nodes = dict(enumerate(self._static))
                routes = self._static_routes[topic] = _Routes(topic, None, nodes, len(nodes))
            return routes
        pmap = self._lookup.cached(topic, "w")
        if pmap is None:
            return None
        cached = self._routes_cache.get(topic)
        if cached is not None and cached[0] is pmap:  # every publish: keep it to dict hits
            return cached[1] if cached[1].nodes else None
        if not pmap.routes():
            return None
        routes = self._counts.routes(pmap)
        self._routes_cache[topic] = (pmap, routes)
        return routes

    def _usable(self, topic: str, routes: _Routes | None, keyed: bool) -> bool:
        """Cached routes serve a publish: the topic is watched (not expired) and, for a keyed
        or explicit-partition one, its partition count is known."""
        if routes is None:
            return False
        if self._lookup is not None and topic not in self._watched:
            return False
        return not keyed or routes.count > 0

    async def _routes(self, topic: str, *, keyed: bool = False) -> _Routes:
        """The topic's current routes (cached lookup), raising a typed error if none, or, when
        ``keyed``, while the topic's partition count is not known."""
        routes = self._cached_routes(topic)
        if self._usable(topic, routes, keyed):
            assert routes is not None  # noqa: S101 - _usable says so
            return routes
        assert self._lookup is not None  # noqa: S101 - static routes are always usable
        # a cached map without a writable partition (or without a count, or of an expired
        # topic) is what sent us here: ask lookupd again (each retry of _resolve does), rather
        # than fail from it until the refresh timer
        stale = self._lookup.cached(topic, "w") is not None
        try:
            pmap = await self._lookup.writable(topic, force=stale)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closing and task is not None and not task.cancelling():
                # close() closed the lookup client under us: say so instead of "cancelled"
                raise ProducerClosedError(
                    f"the producer closed while looking up {topic!r}"
                ) from None
            raise
        if topic not in self._watched:
            self._watched.add(topic)
            self._last_used.setdefault(topic, _monotonic())
            self._lookup.watch(topic, "w", self._on_map)
        routes = self._counts.routes(pmap)
        self._routes_cache[topic] = (pmap, routes)
        if keyed and routes.count < 1:
            raise PartitionNotAvailableError(
                f"the partition count of topic {topic!r} is not known: lookupd answered "
                "without meta.partition_num, and a keyed publish never routes by a count "
                "guessed from the partitions listed; waiting for lookupd to tell it"
            )
        return routes

    async def _resolve(self, topic: str, *, keyed: bool = False) -> _Routes:
        """:meth:`_routes`, retried under the policy while the topic is not writable yet (or,
        ``keyed``, while its partition count is not known)."""
        routes = self._cached_routes(topic)
        if self._usable(topic, routes, keyed):
            assert routes is not None  # noqa: S101 - _usable says so
            return routes
        outcome: _Routes | None = None
        try:
            retrying = self.retry.retrying(
                self._should_retry, self._retry_logger(f"lookup of {topic!r}")
            )
            async for attempt in retrying:
                with attempt:
                    outcome = await self._routes(topic, keyed=keyed)
        except RetryError as exc:
            raise self._gave_up(exc, f"lookup of topic {topic!r}") from None
        assert outcome is not None  # noqa: S101 - tenacity returns only after a success
        return outcome

    def _slot_for(
        self, routes: _Routes, key: ShardingKey | None, partition: int | None
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
        return self.strategy.partition(key, routes.count)

    def _on_map(self, pmap: PartitionMap) -> None:
        """Lookup listener: close connections to nodes no longer leading their partition."""
        if pmap.topic not in self._watched:
            return  # expired meanwhile: nothing of it is kept
        routes = self._counts.routes(pmap)
        self._routes_cache[pmap.topic] = (pmap, routes)
        for key in list(self._conns):
            address, topic, slot = key
            if topic != pmap.topic or not routes.fork:
                continue
            leader = routes.nodes.get(slot)
            if leader is None or leader.address != address:
                log.info(
                    "%s partition %d: leader %s -> %s; closing the old connection",
                    topic,
                    slot,
                    address,
                    leader.address if leader else "none",
                )
                self._drop(key)

    # -- connections ------------------------------------------------------------------------

    async def _connection(self, key: ConnKey) -> NsqdConnection:
        conn = self._ready.get(key)
        if conn is not None and not conn.closed:
            return conn
        task = self._conns.get(key)
        if (
            task is not None
            and task.done()
            and (task.cancelled() or task.exception() is not None or task.result().closed)
        ):
            self._forget(key, task)
            task = None
        if task is None:
            if self._aborting:  # a graceful close still lets in-flight publishes connect
                raise ProducerClosedError("the producer closed before this publish was sent")
            task = asyncio.get_running_loop().create_task(
                self._open(key), name=f"nsq_ha-producer-connect-{key[0]}"
            )
            task.add_done_callback(_retrieve)
            self._conns[key] = task
        return await asyncio.shield(task)

    async def _open(self, key: ConnKey) -> NsqdConnection:
        conn = NsqdConnection(key[0], config=self.config, on_error=self._on_conn_error)
        await conn.connect()
        self.stats["connections"] += 1
        if self._aborting:
            await conn.close()
            raise ProducerClosedError("the producer closed while connecting")
        if self._conns.get(key) is not asyncio.current_task():
            # dropped while connecting (the partition map moved, or an error on this key):
            # the caller retries through a fresh lookup
            await conn.close()
            raise ConnectionClosedError(f"connection to {key[0]} dropped while it was opening")
        self._ready[key] = conn
        log.info(
            "producer connected to %s (%s)%s",
            key[0],
            "fork" if conn.is_fork else "vanilla",
            f" for {key[1]}/{key[2]}" if key[1] else "",
        )
        return conn

    def _on_conn_error(self, error: BrokerError) -> None:
        log.warning("producer connection got an unsolicited error: %s", redact(str(error)))

    def _forget(self, key: ConnKey, task: asyncio.Task[NsqdConnection] | None = None) -> None:
        if task is None or self._conns.get(key) is task:
            self._conns.pop(key, None)

    def _drop(self, key: ConnKey) -> None:
        """Forget a connection and close it in the background (its pending answers finish)."""
        task = self._conns.pop(key, None)
        conn = self._ready.pop(key, None)
        if (
            conn is None
            and task is not None
            and task.done()
            and not task.cancelled()
            and task.exception() is None
        ):
            conn = task.result()
        if conn is not None:
            self._spawn(conn.close(), f"nsq_ha-producer-close-{key[0]}")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- sending ----------------------------------------------------------------------------

    def _should_retry(self, exc: BaseException) -> bool:
        return not self._aborting and decide(exc).retry

    def _retry_logger(self, where: str) -> Callable[[RetryCallState], None]:
        """tenacity's before-sleep hook: count the retry and log what is retried and why."""

        def log_retry(state: RetryCallState) -> None:
            self.stats["retries"] += 1
            exc = state.outcome.exception() if state.outcome else None
            wait = state.next_action.sleep if state.next_action else 0.0
            log.warning(
                "%s failed on attempt %d (%s); retrying in %.2fs",
                where,
                state.attempt_number,
                redact(str(exc)),
                wait,
            )

        return log_retry

    def _gave_up(self, exc: RetryError, what: str) -> PublishError:
        last = exc.last_attempt.exception()
        attempts = exc.last_attempt.attempt_number
        return PublishError(
            f"{what} failed after {attempts} attempts: {redact(str(last))}",
            attempts=attempts,
            last_error=last,
        )

    async def _after_failure(self, topic: str, key: ConnKey | None, exc: BaseException) -> None:
        """Drop what the error says is stale; refresh the lookup at once when it says so."""
        decision = decide(exc)
        if key is not None and decision.reconnect:
            self._drop(key)
        if decision.refresh_lookup and self._lookup is not None and not self._closing:
            self.stats["lookups_forced"] += 1
            with contextlib.suppress(NsqError):
                await self._lookup.refresh(topic, "w")

    async def _send(
        self,
        topic: str,
        messages: list[OutgoingMessage],
        *,
        slot: int | None,
        defer: float | None = None,
    ) -> list[PublishResult]:
        """Send one batch (to ``slot``, or round-robin when None), retried under the policy."""
        attempts = 1
        where = f"publish to {topic!r}" + (f" slot {slot}" if slot is not None else "")
        try:
            try:  # the first try runs without tenacity: it is the common case, and cheap so
                return await self._attempt(topic, messages, slot, defer, attempts)
            except NsqError as exc:
                if not self._should_retry(exc):
                    raise
                first: NsqError | None = exc
            results: list[PublishResult] = []
            retrying = self.retry.retrying(self._should_retry, self._retry_logger(where))
            async for attempt in retrying:
                with attempt:
                    if first is not None:  # counts as attempt 1: the policy waits, then goes on
                        error, first = first, None
                        raise error
                    attempts += 1
                    results = await self._attempt(topic, messages, slot, defer, attempts)
            return results
        except RetryError as exc:
            raise self._gave_up(exc, where) from None
        except NsqError as exc:
            if self._aborting and decide(exc).retry:
                raise PublishError(
                    f"{where}: the producer closed before nsqd acknowledged it",
                    attempts=attempts,
                    last_error=exc,
                ) from None
            raise

    async def _attempt(
        self,
        topic: str,
        messages: list[OutgoingMessage],
        slot: int | None,
        defer: float | None,
        attempts: int,
    ) -> list[PublishResult]:
        routes = await self._routes(topic)
        windowed = slot is None  # unkeyed: up to unkeyed_window commands out per partition
        if slot is None:
            slot = self._next_slot(routes)
        node = routes.nodes.get(slot)
        if node is None:
            missing = PartitionNotAvailableError(
                f"{topic!r} partition {slot} has no writable leader in the current lookup"
            )
            # look again now (the next try reads the fresh map), not at the periodic refresh
            await self._after_failure(topic, None, missing)
            raise missing
        key = routes.key(slot, node)
        partition = routes.wire_partition(slot)
        window = self._window(topic, slot) if windowed else None
        try:
            async with window if window is not None else contextlib.nullcontext():
                conn = await self._connection(key)
                fork = conn.is_fork
                tracing = self.trace and fork
                name = batch_command(messages, tracing=tracing)
                if routes.fork is None:  # nsqd= addresses: the kind is known only now
                    if fork and not windowed:
                        raise UnsupportedByServerError(
                            f"{node.address} is a fork nsqd: a sharding key needs topic "
                            f"{topic!r}'s partition count and leaders, which only nsqlookupd "
                            "knows; publish keyed messages through lookupd= (nsqd= addresses "
                            "of the fork take unkeyed publishes only)"
                        )
                    plain = name in (b"PUB", b"MPUB")  # no trace id, no header to look for
                    _check_features(
                        fork, topic, () if plain else messages, defer=defer, partition=partition
                    )
                if defer is not None:
                    data = encode_dpub(
                        topic, messages[0].body, defer, max_msg_size=self.config.max_msg_size
                    )
                else:
                    data = encode_batch(
                        topic,
                        partition,
                        messages,
                        tracing=tracing,
                        max_msg_size=self.config.max_msg_size,
                        max_body_size=self.config.max_body_size,
                        name=name,
                    )
                self.stats["commands"] += 1
                answer = await conn.command(data, response_timeout=self.retry.attempt_timeout)
                if defer is not None:
                    receipts = receipts_from_answer(answer, messages)
                else:
                    receipts = receipts_from_answer(
                        answer, messages, tracing=tracing, ext_topic=routes.ext, name=name
                    )
        except NsqError as exc:
            await self._after_failure(topic, key, exc)
            raise
        self.stats["published"] += len(messages)
        if receipts and receipts[0] is PLAIN_RECEIPT and receipts[-1] is PLAIN_RECEIPT:
            # a plain OK tells every message the same: one (immutable) result serves them all
            shared = PublishResult(topic, partition, node.address, attempts)
            return [shared] * len(receipts)
        return [
            PublishResult(
                topic,
                partition,
                node.address,
                attempts,
                r.internal_id,
                r.trace_id,
                r.offset,
                r.raw_size,
            )
            for r in receipts
        ]

    def _next_slot(self, routes: _Routes) -> int:
        writable = routes.writable
        if not writable:
            raise TopicNotWritableError(f"topic {routes.topic!r} has no writable partition now")
        counter = self._round_robin.setdefault(routes.topic, itertools.count())
        return writable[next(counter) % len(writable)]

    def _window(self, topic: str, slot: int) -> Window:
        window = self._windows.get((topic, slot))
        if window is None:
            window = self._windows[(topic, slot)] = Window(self.unkeyed_window)
        return window

    async def _direct_many(
        self, topic: str, messages: list[OutgoingMessage], routes: _Routes, *, plain: bool
    ) -> list[PublishResult | BaseException]:
        """Unkeyed publish_many: cut into batches, each sent round-robin, concurrently."""
        builder = self._builder(routes)
        batches: list[list[OutgoingMessage]]
        if plain and not builder.tracing:
            batches = builder.split_plain(messages)
        else:
            queue = deque(Carrier(m) for m in messages)
            batches = []
            while queue:
                batches.append([q.message for q in builder.take(queue)])
        if len(batches) == 1:  # no task for the common case
            try:
                return list(await self._send(topic, batches[0], slot=None))
            except Exception as exc:  # as gather(return_exceptions=True) would hand it back
                return [exc] * len(messages)
        outcomes = await asyncio.gather(
            *(self._send(topic, batch, slot=None) for batch in batches), return_exceptions=True
        )
        flat: list[PublishResult | BaseException] = []
        for batch, outcome in zip(batches, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                flat.extend([outcome] * len(batch))
            else:
                flat.extend(outcome)
        return flat

    def _builder(self, routes: _Routes | None, share: int | None = None) -> BatchBuilder:
        return BatchBuilder(
            max_msg_size=self.config.max_msg_size,
            max_body_size=self.config.max_body_size,
            max_count=self.max_batch if share is None else max(1, min(share, self.max_batch)),
            tracing=self.trace and routes is not None and routes.fork is True,
            ext_topic=routes is not None and routes.ext is True,
        )

    # -- ordered lanes ----------------------------------------------------------------------

    def _enqueue_one(
        self, topic: str, slot: int | None, message: OutgoingMessage
    ) -> asyncio.Future[PublishResult]:
        """:meth:`_enqueue` of one message (the hot path of :meth:`publish`)."""
        lane = self._lanes.get((topic, slot))
        if lane is not None and lane.senders and (slot is not None or lane.idle_sender):
            future: asyncio.Future[PublishResult] = lane.loop.create_future()
            lane.queue.append(Queued(message, future))
            return future
        return self._enqueue(topic, slot, [message])[0]

    def _enqueue(
        self, topic: str, slot: int | None, messages: list[OutgoingMessage]
    ) -> list[asyncio.Future[PublishResult]]:
        loop = asyncio.get_running_loop()
        lane = self._lanes.get((topic, slot))
        if lane is None:
            lane = self._lanes[(topic, slot)] = Lane(topic, slot, loop)
        futures: list[asyncio.Future[PublishResult]] = []
        for msg in messages:
            future: asyncio.Future[PublishResult] = loop.create_future()
            lane.queue.append(Queued(msg, future))
            futures.append(future)
        if not lane.senders or lane.slot is None:
            self._add_sender(lane)
        return futures

    def _add_sender(self, lane: Lane) -> None:
        """Start a sender for ``lane`` unless one is about to take the next batch anyway: a
        keyed lane has one, an unkeyed one more while the others wait for their answers."""
        senders = len(lane.senders)
        if senders == 0 or (
            lane.slot is None and not lane.idle_sender and senders < self._senders_for(lane)
        ):
            sender = lane.loop.create_task(
                self._run_lane(lane), name=f"nsq_ha-lane-{lane.topic}-{lane.slot}"
            )
            lane.senders.add(sender)

    def _senders_for(self, lane: Lane) -> int:
        """Batches a lane may have out at once: one keeps a keyed lane in order; the unkeyed
        lane overlaps two per writable partition (one in flight while the next fills)."""
        if lane.slot is not None:
            return 1
        routes = self._cached_routes(lane.topic)
        return max(2, 2 * len(routes.writable)) if routes is not None else 2

    async def _run_lane(self, lane: Lane) -> None:
        """Send a lane's queue, one batch at a time (the lane's other senders take others)."""
        live: list[Queued] = []
        try:
            while lane.queue:
                if self.linger and len(lane.queue) < self.max_batch:
                    await asyncio.sleep(self.linger)
                    if not lane.queue:
                        break
                routes = self._cached_routes(lane.topic)
                share = None
                if lane.slot is None and routes is not None and len(routes.writable) > 1:
                    # an unkeyed burst is spread: a batch takes its share of what is queued
                    # among the partitions that have no batch out now
                    free = max(1, len(routes.writable) - lane.sending)
                    share = -(-len(lane.queue) // free)
                batch = self._builder(routes, share).take(lane.queue)
                live = [q for q in batch if not q.future.done()]  # done: the caller gave up
                if not live:
                    continue
                lane.sending += 1
                if share is not None and lane.queue:
                    self._add_sender(lane)  # the rest goes to other partitions meanwhile
                try:
                    results = await self._send(
                        lane.topic, [q.message for q in live], slot=lane.slot
                    )
                except NsqError as exc:
                    for q in live:
                        settle(q.future, exc)
                    live = []
                    continue
                finally:
                    lane.sending -= 1
                for q, result in zip(live, results, strict=True):
                    if not q.future.done():
                        q.future.set_result(result)
                live = []
        except asyncio.CancelledError:
            closed = PublishError(
                f"publish to {lane.topic!r} partition {lane.slot}: the producer closed before "
                "nsqd acknowledged it",
                attempts=0,
            )
            for q in [*live, *lane.queue]:
                settle(q.future, closed)
            lane.queue.clear()
            raise
        except BaseException as exc:  # a bug: never leave callers waiting forever
            for q in [*live, *lane.queue]:
                settle(q.future, exc)
            lane.queue.clear()
            raise
        finally:
            # now, not in a done callback: an _enqueue before that callback ran would count
            # this sender as busy and leave its messages with no sender at all
            lane.senders.discard(cast("asyncio.Task[None]", asyncio.current_task()))

    async def _drained(self, limit: float) -> bool:
        """Wait until no lane has work and no send is active; False after ``limit`` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            tasks = [sender for lane in self._lanes.values() for sender in lane.senders]
            if not tasks and self._active == 0:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            waiters: list[asyncio.Future[Any]] = [*tasks]
            idle = loop.create_task(self._idle.wait())
            waiters.append(idle)
            await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.ALL_COMPLETED)
            idle.cancel()

    # -- idle topics ------------------------------------------------------------------------

    def _start_sweeper(self) -> None:
        """Start the task that frees idle topics (once, on the loop of the first publish); it
        holds the producer weakly, so a producer dropped without close() can still be freed."""
        if self._sweeper is None and not self._closing:
            self._sweeper = asyncio.get_running_loop().create_task(
                _sweep(weakref.ref(self), self._idle_topics.interval),
                name="nsq_ha-producer-idle-topics",
            )

    def _free_idle_topics(self) -> None:
        busy = {lane.topic for lane in self._lanes.values() if lane.queue or lane.senders}
        busy.update(
            topic
            for (topic, _), window in self._windows.items()
            if window.waiters or window.free < self.unkeyed_window
        )
        expired = self._idle_topics.expired(self.topics, busy, _monotonic())
        if expired:
            self._forget_topics(expired)
            log.debug("producer: %d idle topics freed", len(expired))

    def _forget_topics(self, topics: set[str]) -> None:
        """Drop everything kept for ``topics``: routes, counts, lanes, windows, connections,
        and the lookup's refresh of them."""
        for topic in topics:
            self._valid_topics.discard(topic)
            self._round_robin.pop(topic, None)
            self._routes_cache.pop(topic, None)
            self._static_routes.pop(topic, None)
            self._counts.forget(topic)
            if topic in self._watched:
                self._watched.discard(topic)
                if self._lookup is not None:
                    self._lookup.unwatch(topic, "w", self._on_map)
        for lane_key in [k for k in self._lanes if k[0] in topics]:
            del self._lanes[lane_key]
        for window_key in [k for k in self._windows if k[0] in topics]:
            del self._windows[window_key]
        for conn_key in {*self._conns, *self._ready}:
            if conn_key[1] in topics:  # fork connections serve one topic; vanilla ones all
                self._drop(conn_key)


_monotonic = time.monotonic


async def _sweep(ref: weakref.ref[Producer], interval: float) -> None:
    """Every ``interval`` seconds, free the producer's topics idle for ``topic_idle_timeout``
    (nothing queued or in flight, no publish call for that long); ends with the producer."""
    while True:
        await asyncio.sleep(interval)
        producer = ref()
        if producer is None or producer.closed:
            return
        try:
            producer._free_idle_topics()
        except Exception:  # a bug must not stop the sweeps (or be lost with the task)
            log.exception("producer: freeing idle topics failed")
        del producer


def _retrieve(task: asyncio.Task[NsqdConnection]) -> None:
    if not task.cancelled():
        task.exception()
