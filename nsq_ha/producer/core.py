"""The asyncio producer's API (:class:`Producer`): it checks a call, routes it through its
:class:`~nsq_ha.producer.topic.Topic` and queues it on the :class:`~nsq_ha.producer.sender.Sender`
(order and retries are theirs); it closes and frees idle topics."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Self, TypeVar, Unpack, cast

from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError, ProducerClosedError, PublishError
from nsq_ha.lookup import LookupClient
from nsq_ha.producer.batch import Outcome, Outcomes, plain_size, prepare_batch
from nsq_ha.producer.config import ProducerConfig, ProducerOptions
from nsq_ha.producer.message import PublishResult, prepare_message
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.producer.routes import ConnKey, Routes
from nsq_ha.producer.sender import Sender
from nsq_ha.producer.topic import SlotMemo, Topic
from nsq_ha.protocol.commands import seconds_to_ms
from nsq_ha.protocol.names import validate_topic
from nsq_ha.protocol.publish import ExtHeader, PublishMessage
from nsq_ha.redact import redact_text as redact
from nsq_ha.routing import ShardingKey
from nsq_ha.transport import Wakeup

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_STATS = ("published", "commands", "retries", "connections", "lookups_forced", "batches_split")


class Producer:
    """Publish to NSQ topics: partitions of the HA fork (through nsqlookupd) or vanilla nsqd.

    The options are :class:`~nsq_ha.producer.config.ProducerConfig`'s fields, as keywords
    (``Producer(lookupd=..., max_batch=500)``, typed by
    :class:`~nsq_ha.producer.config.ProducerOptions`), or a whole ``config=ProducerConfig(...)``
    (then give no option); :attr:`config` holds them. Give exactly one of ``lookupd``,
    ``lookup`` or ``nsqd``. A bad value, or an option name it does not have, raises
    :class:`~nsq_ha.errors.ConfigError` here, before anything connects.

    Group commit: concurrent :meth:`publish` and :meth:`publish_many` calls are queued per
    partition and sent as one ``MPUB`` (or ``MPUB_TRACE``/``MPUB_EXT``) per batch, up to
    ``max_batch`` messages and the size limits; each caller still gets its own results or
    error. Keyed calls keep call order (one batch out per partition); unkeyed calls spread
    their batches round-robin.

    Use ``async with Producer(...) as producer`` or call :meth:`close`.
    """

    def __init__(
        self, *, config: ProducerConfig | None = None, **options: Unpack[ProducerOptions]
    ) -> None:
        settings = self._config = ProducerConfig.from_options(config, options)
        self._lookup = LookupClient(settings.lookupd) if settings.lookupd else settings.lookup
        #: counters for logs, tests and benchmarks
        self.stats: dict[str, int] = dict.fromkeys(_STATS, 0)
        self._closing_flag = asyncio.Event()  # set by close(); the sender reads is_set()
        self._pool = ConnectionPool(settings.connection, self.stats)
        self._memo = SlotMemo(settings.strategy)
        self._topics: dict[str, Topic] = {}
        self._sender = Sender(settings, self._pool, self.stats, self._closing_flag.is_set)
        self._waiting = _Waiting()
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._max_msg_size = settings.connection.max_msg_size

    @property
    def config(self) -> ProducerConfig:
        """Every option of this producer (``producer.config.connection.max_msg_size``, ...)."""
        return self._config

    def __repr__(self) -> str:
        if self._lookup is not None:
            where = f"lookupd={[redact(u) for u in self._lookup.lookupds]}"
        else:
            where = f"nsqd={[n.address for n in self._config.static_nodes]}"
        return (
            f"<Producer {where} strategy={self._config.strategy.name} "
            f"topics={len(self._topics)} conns={len(self.connections)}>"
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has started: new publishes are refused."""
        return self._closing

    @property
    def topics(self) -> frozenset[str]:
        """Topics this producer holds state for (routes, lanes, connections, lookups)."""
        return frozenset(self._topics)

    @property
    def connections(self) -> tuple[ConnKey, ...]:
        """Open nsqd connections: ``(address, topic, partition)``, or ``(address, "", -1)`` for a
        connection shared by every topic (vanilla nsqd)."""
        keys: list[ConnKey] = [(a, "", -1) for a, c in self._pool.shared.items() if not c.closed]
        for name, topic in self._topics.items():
            keys += [(c.address, name, slot) for slot, c in topic.conns.items() if not c.closed]
        return tuple(keys)

    async def topic_routes(self, topic: str) -> Routes:
        """Where ``topic``'s messages can go now: whether it is on the fork (``fork``), an ext
        topic (``ext``; ``None``: not known), its partition count and leaders. Looked up (under
        the retry policy) when not cached; the next publish uses the same routes."""
        if self._closing:
            raise ProducerClosedError("the producer is closed")
        held = self._topics.get(topic)
        if held is None or (routes := held.ready(False)) is None:
            return (await self._look_up(topic, None, None))[1]
        held.last_used = time.monotonic()
        return routes

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
        # a plain body to a topic whose routes are cached: checked, made and queued in one call
        queued: Awaitable[Outcomes] | None = None
        if trace_id is None and ext is None and defer is None:
            queued = self._sender.queue_plain(self._topics, topic, body, sharding_key, partition)
        if queued is None:  # anything else, or a body that does not pass
            limit = self._max_msg_size
            messages = [prepare_message(body, trace_id=trace_id, ext=ext, max_msg_size=limit)]
            if defer is not None:
                seconds_to_ms(defer, "defer")
                if sharding_key is not None or partition is not None:
                    raise ConfigError("defer= cannot be combined with sharding_key= or partition=")
                found, routes = await self._look_up(topic, None, None)
                found.place(routes, messages, None, None, defer)
                with self._waiting:  # DPUB carries one message: no batch to join
                    return (await self._sender.send(found, messages, slot=None, defer=defer))[0]
            plain = plain_size(messages)
            held = self._topics.get(topic)
            if held is not None:  # routes cached: queued in this one call, no lookup, no turn
                queued = self._sender.queue_ready(held, messages, sharding_key, partition, plain)
            if queued is None:
                queued = self._queue(topic, messages, sharding_key, partition, plain)
        (outcome,) = await queued
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def publish_many(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        sharding_key: ShardingKey | None = None,
        sharding_keys: Sequence[ShardingKey] | None = None,
        partition: int | None = None,
        trace_ids: Sequence[int | None] | None = None,
        ext: ExtHeader | None = None,
        exts: Sequence[ExtHeader | None] | None = None,
    ) -> list[PublishResult]:
        """Publish several messages, batched into as few ``MPUB*`` commands as the limits allow.

        Returns one result per body, in order. With a ``sharding_key`` or ``partition`` they
        all go to that partition in order; with ``sharding_keys`` (one key per body) each goes
        to its key's partition, the messages of a partition in the order given (as that many
        :meth:`publish` calls with those keys would, in one call per partition); otherwise each
        batch goes to the next partition. ``trace_ids`` and ``exts`` give per-message values;
        ``ext`` one header for all. If some batches fail, PublishError is raised after all have
        settled, with ``.results`` holding a PublishResult or the exception per message.
        """
        if self._closing:
            raise ProducerClosedError("the producer is closed")
        bodies = per_message(bodies, "bodies")
        if not bodies:
            validate_topic(topic)
            return []
        count = len(bodies)
        traces = None if trace_ids is None else per_message(trace_ids, "trace_ids", count)
        if ext is not None and exts is not None:
            raise ConfigError("give ext= (one header for all) or exts= (one each), not both")
        headers: list[ExtHeader | None] | None = None if ext is None else [ext] * count
        if exts is not None:
            headers = per_message(exts, "exts", count)
        messages, plain = prepare_batch(bodies, traces, headers, max_msg_size=self._max_msg_size)
        if sharding_keys is not None:
            if sharding_key is not None or partition is not None:
                raise ConfigError("give sharding_keys= alone, without sharding_key= or partition=")
            return await self._publish_by_key(topic, messages, sharding_keys)
        held = self._topics.get(topic)
        queued: Awaitable[Outcomes] | None = None
        if held is not None:  # routes cached: queued in this one call, as publish() does
            queued = self._sender.queue_ready(held, messages, sharding_key, partition, plain)
        if queued is None:
            queued = self._queue(topic, messages, sharding_key, partition, plain)
        outcomes = await queued
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise _failure(topic, outcomes)
        return outcomes  # type: ignore[return-value]  # no exception among them: all results

    async def _publish_by_key(
        self, topic: str, messages: list[PublishMessage], sharding_keys: Sequence[ShardingKey]
    ) -> list[PublishResult]:
        keys = per_message(sharding_keys, "sharding_keys", len(messages))
        validate_topic(topic)
        for key in keys:
            if key is None:
                raise ConfigError("sharding_keys has a None entry: every message needs a key")
            self._check_key(key, None)
        by_slot: dict[int, list[int]] = {}  # the indexes of the messages of each partition

        def submit(held: Topic, routes: Routes) -> asyncio.Future[list[Outcomes]]:
            held.place(routes, messages, keys[0], None)  # the feature and count checks, once
            for index, key in enumerate(keys):
                by_slot.setdefault(held.memo.slot(key, routes.count), []).append(index)
            parts = [(slot, [messages[i] for i in indexes]) for slot, indexes in by_slot.items()]
            futures = [self._sender.submit(held, s, p, plain_size(p)) for s, p in parts]
            return asyncio.gather(*futures)

        held = self._topics.get(topic)
        if held is not None and held.waiting is None and (routes := held.ready(True)) is not None:
            settled = await submit(held, routes)  # routes cached and no keyed call waiting
        else:
            settled = await self._in_turn(topic, keys[0], None, submit)
        outcomes: list[Outcome | None] = [None] * len(messages)
        for indexes, results in zip(by_slot.values(), settled, strict=True):
            for index, outcome in zip(indexes, results, strict=True):
                outcomes[index] = outcome
        if not all(isinstance(o, PublishResult) for o in outcomes):
            raise _failure(topic, outcomes)
        return outcomes  # type: ignore[return-value]  # every one a PublishResult

    async def _queue(
        self,
        topic: str,
        messages: list[PublishMessage],
        key: ShardingKey | None,
        partition: int | None,
        plain_bytes: int | None,
    ) -> Outcomes:
        def submit(held: Topic, routes: Routes) -> asyncio.Future[Outcomes]:
            slot = held.place(routes, messages, key, partition)
            return self._sender.submit(held, slot, messages, plain_bytes)

        return await self._in_turn(topic, key, partition, submit)

    async def _in_turn(
        self,
        name: str,
        key: ShardingKey | None,
        partition: int | None,
        submit: Callable[[Topic, Routes], asyncio.Future[_T]],
    ) -> _T:
        """``submit`` a call the cached routes do not serve now, after a lookup or, keyed, in its
        turn (:meth:`Topic.turn`), and wait for what it queued."""
        if key is None and partition is None:
            return await submit(*await self._look_up(name, key, partition))
        if name not in self._topics:  # its first call: refuse bad input before keeping anything
            validate_topic(name)
            self._check_key(key, partition)
        topic = self._topic(name)

        async def look_up() -> Routes:
            return (await self._look_up(name, key, partition))[1]

        with self._waiting:  # close() waits for a call waiting for its turn too
            future = await topic.turn(lambda: topic.ready(True), look_up, submit)
        return await future

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - drain limit
        """Stop accepting publishes, wait for the in-flight ones, then close the connections. After
        ``timeout`` (default ``close_timeout``; finite seconds >= 0) the publishes still waiting
        fail with PublishError ("producer closed before nsqd acknowledged"); none is silently
        dropped."""
        limit = self._config.close_timeout
        if timeout is not None:
            limit = seconds(timeout, "timeout", zero=True)
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        self._closing_flag.set()
        if self._sweeper is not None:
            self._sweeper.cancel()
        topics = self._topics.values()
        try:
            if not await self._drained(limit):
                log.warning(
                    "producer closing: %d messages queued in lanes and %d publish calls (lookups, "
                    "DPUBs) still unacknowledged after %.1fs; failing them",
                    sum(lane.waiting for t in topics for lane in t.lanes.values()),
                    self._waiting.active,
                    limit,
                )
                self._pool.aborting = True
                self._sender.abort(topics)
            conns = [conn for topic in topics for conn in topic.conns.values()]
            for topic in topics:
                topic.conns.clear()
            await self._pool.close(conns)
            self._pool.aborting = True
            await self._drained(self._config.connection.close_timeout)
            if self._sweeper is not None:
                await asyncio.gather(self._sweeper, return_exceptions=True)
            await self._pool.wait_closed()
            for topic in topics:
                topic.close()
            if self._lookup is not None and self._config.lookupd is not None:  # ours to close
                await self._lookup.close()
        finally:
            self._closed.set()

    def _topic(self, name: str) -> Topic:
        """The topic ``name`` (its name checked by the caller), made if it is new."""
        topic = self._topics.get(name)
        if topic is None:
            if self._sweeper is None and not self._closing:
                # frees idle topics: each within 1.5 x the timeout of its last use, looked for at
                # least every minute; it holds the producer weakly, so that a producer dropped
                # without close() can still be freed
                interval = min(self._config.topic_idle_timeout / 2, 60.0)
                self._sweeper = asyncio.get_running_loop().create_task(
                    _sweep(weakref.ref(self), interval), name="nsq_ha-producer-idle-topics"
                )
            nodes = dict(enumerate(self._config.static_nodes))  # nsqd=: every topic's routes
            static = Routes(name, None, nodes, len(nodes)) if self._lookup is None else None
            topic = self._topics[name] = Topic(
                name, lookup=self._lookup, static=static, memo=self._memo, pool=self._pool
            )
        return topic

    def _check_key(self, key: ShardingKey | None, partition: int | None) -> None:
        """Refuse a key the strategy cannot hash or a partition that is not an int."""
        if key is not None:
            if partition is not None:
                raise ConfigError("give sharding_key= or partition=, not both")
            self._config.strategy.partition(key, 1)  # type, range and encoding checks
        elif partition is not None and (
            isinstance(partition, bool) or not isinstance(partition, int)
        ):
            raise ConfigError(f"partition must be an int, not {partition!r}")

    async def _look_up(
        self, name: str, key: ShardingKey | None, partition: int | None
    ) -> tuple[Topic, Routes]:
        """The topic and its routes looked up under the retry policy (bad input refused first)."""
        validate_topic(name)
        self._check_key(key, partition)
        topic = self._topic(name)
        topic.last_used = time.monotonic()
        topic.active += 1  # never expired while it is looked up
        try:
            with self._waiting:  # close() waits for it (a publish in a lane is a lane's work)
                keyed = key is not None or partition is not None
                return topic, await self._sender.resolve(topic, keyed=keyed)
        finally:
            topic.active -= 1

    async def _drained(self, limit: float) -> bool:
        """Wait until no lane has work and no publish call is active; False after ``limit`` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            lanes = [lane for t in self._topics.values() for lane in t.lanes.values()]
            tasks = [task for lane in lanes for task in lane.senders]
            if not tasks and self._waiting.active == 0:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            idle = self._waiting.idle.wait_next()
            await asyncio.wait([*tasks, idle], timeout=remaining)  # all done, or the time
            idle.cancel()

    def _free_idle_topics(self, now: float | None = None) -> None:
        """Free the topics unused for ``topic_idle_timeout`` s (a busy one counts as used now)."""
        now = time.monotonic() if now is None else now
        cutoff = now - self._config.topic_idle_timeout
        expired: list[str] = []
        for name, topic in self._topics.items():
            if topic.busy:
                topic.last_used = now
            elif topic.last_used <= cutoff:
                expired.append(name)
        for name in expired:
            self._topics.pop(name).close()
        if expired:
            log.debug("producer: %d idle topics freed", len(expired))


class _Waiting:
    """``with``: a publish call waiting outside a lane (lookup, DPUB, keyed turn), which
    :meth:`Producer.close` waits for; one per producer: a call allocates nothing here."""

    __slots__ = ("active", "idle")

    def __init__(self) -> None:
        self.active = 0
        self.idle = Wakeup()

    def __enter__(self) -> None:
        self.active += 1

    def __exit__(self, *exc_info: object) -> None:
        self.active -= 1
        if not self.active:
            self.idle.wake()


def per_message(values: Sequence[_T], what: str, count: int | None = None) -> list[_T]:
    """``values`` as a list of ``count`` values (None: any) if a sequence, else ConfigError."""
    if isinstance(cast(object, values), str | bytes | bytearray | memoryview):
        raise ConfigError(f"publish_many takes a sequence of {what}, not one value")
    if not isinstance(cast(object, values), Sequence):
        raise ConfigError(
            f"publish_many takes a sequence (a list or tuple) of {what}, "
            f"not a {type(values).__name__}"
        )
    checked = list(values)
    if count is not None and len(checked) != count:
        raise ConfigError(f"{what} has {len(checked)} entries for {count} bodies")
    return checked


def _failure(topic: str, outcomes: Sequence[Outcome | None]) -> BaseException:
    """The error of a publish_many some of whose messages failed: a cancellation, or one
    refusal that stopped every message before anything was sent, as it is; else PublishError
    with ``.results`` (per message, its PublishResult or the exception that stopped it)."""
    errors = [o for o in outcomes if not isinstance(o, PublishResult)]
    for err in errors:
        if isinstance(err, asyncio.CancelledError):
            return err
    first = errors[0]
    if isinstance(first, ConfigError) and all(o is first for o in outcomes):
        return first
    error = PublishError(
        f"{len(errors)} of {len(outcomes)} messages to {topic!r} were not published: "
        f"{redact(str(first))}",
        attempts=max((getattr(e, "attempts", 1) for e in errors), default=1),
        last_error=cast("BaseException", first),
    )
    error.results = list(outcomes)
    return error


async def _sweep(ref: weakref.ref[Producer], interval: float) -> None:
    """Every ``interval`` seconds, free the producer's idle topics; ends with the producer."""
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
