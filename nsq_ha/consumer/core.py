"""The asyncio consumer: one connection per (nsqd, partition), ordered when the topic says so.

Discovery (PROTOCOL.md §6.4, §6.8): with nsqlookupd, ``lookup?access=r`` names the consume
leader of every partition; the consumer keeps one connection per (node, partition) it wants
(``partitions=``, ``member=(i, n)``), picks up new partitions and moved leaders on every lookup
refresh, and re-makes a lost connection only through a fresh lookup, waiting longer after each
failure of the same (node, partition) rather than hammering it. With ``nsqd=`` addresses
(vanilla, or a fork node addressed directly) it reconnects to the same addresses, with the same
growing wait.

Subscribing (§2.3): ``SUB_ORDERED`` when ``ordered=True``, or when ``ordered=None`` and the
lookup's ``meta.ordered`` says so, or after nsqd answered ``E_SUB_ORDER_IS_MUST``; otherwise
``SUB``. IDENTIFY carries ``extend_support`` exactly when the topic is an ext topic (``meta``,
or nsqd's ``E_SUB_EXTEND_NEED``/``E_SUB_EXTEND_FORBIDDON``): nsqd refuses a mismatch either way.

Flow control: :class:`~nsq_ha.consumer.rdy.RdyPlanner` decides every RDY (budget
``max_in_flight`` across all connections, probe then share, rotation when there are more
connections than budget, backoff). Messages are answered on the connection that delivered them.
On ordered subscriptions a :class:`~nsq_ha.consumer.ordering.PartitionGate` hands out one
message per partition at a time: a redelivered copy waits for the earlier handler.

Closing drains: RDY 0 and ``CLS`` everywhere, messages not yet handed out are requeued, handlers
get ``drain_timeout`` to answer theirs, whatever is left is requeued, then a round trip per
connection (:meth:`~nsq_ha.connection.NsqdConnection.sync`) proves nsqd processed every answer
before the sockets close. Afterwards nsqd holds nothing in flight for this consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Self

from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.consumer.backoff import BackoffStrategy, Exponential
from nsq_ha.consumer.checks import (
    check_count,
    check_member,
    check_partitions,
    check_requeue_delay,
    check_timeout,
)
from nsq_ha.consumer.message import Message, Outcome
from nsq_ha.consumer.ordering import Claims, PartitionGate
from nsq_ha.consumer.rdy import DEFAULT_MAX_RDY, RdyPlanner
from nsq_ha.consumer.seek import seek_position, set_offset
from nsq_ha.durations import seconds
from nsq_ha.errors import (
    BrokerError,
    ConfigError,
    ConsumerClosedError,
    ExtendSupportForbiddenError,
    ExtendSupportRequiredError,
    MessageCommandError,
    MessageConnectionGoneError,
    MessageResponseError,
    NsqError,
    SubOrderRequiredError,
    TopicNotFoundError,
    UnsupportedByServerError,
)
from nsq_ha.lookup import LookupClient, PartitionMap
from nsq_ha.protocol.identify import ExtFilter
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.protocol.names import validate_channel, validate_topic
from nsq_ha.retry import decide

__all__ = ["BatchHandler", "Consumer", "Handler"]

log = logging.getLogger(__name__)

#: A connection's identity: nsqd address and partition (-1 for none).
ConnKey = tuple[str, int]
Handler = Callable[[Message], Awaitable[object] | object]
BatchHandler = Callable[[list[Message]], Awaitable[object] | object]
GiveUp = Callable[[Message], Awaitable[object] | object]

#: Sync rounds at close: repeated while messages keep racing in after CLS.
_SYNC_ROUNDS = 5


class _Slot:
    """One subscribed connection: a (node, partition) of the topic."""

    __slots__ = (
        "address",
        "channel",
        "conn",
        "consumer",
        "counts",
        "held",
        "key",
        "ordered",
        "partition",
        "retired",
        "topic",
    )

    def __init__(
        self, consumer: Consumer, key: ConnKey, partition: int | None, ordered: bool
    ) -> None:
        self.consumer = consumer
        self.key = key
        self.address = key[0]
        self.partition = partition
        self.topic = consumer.topic
        self.channel = consumer.channel
        self.ordered = ordered
        self.conn: NsqdConnection | None = None
        #: delivered and not yet answered, by message id
        self.held: dict[bytes, Message] = {}
        self.retired = False
        #: the partition's counters in the consumer's stats (shared by its slots over time)
        self.counts: Counter[str] = consumer._per_partition.setdefault(
            -1 if partition is None else partition, Counter()
        )

    def __repr__(self) -> str:
        part = "-" if self.partition is None else self.partition
        return f"<slot {self.topic}/{part}@{self.address} held={len(self.held)}>"

    # the Message owner protocol
    def finish(self, message: Message) -> None:
        self.consumer._finish(self, message)

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        self.consumer._requeue(self, message, delay, backoff)

    def touch(self, message: Message) -> None:
        self.consumer._touch(self, message)

    def on_message(self, decoded: DecodedMessage) -> None:
        self.consumer._on_message(self, decoded)

    def on_error(self, error: BrokerError) -> None:
        self.consumer._on_error(self, error)


class Consumer:
    """Consume ``topic`` on ``channel`` from every partition (or a share of them).

    Give exactly one of ``lookupd`` (nsqlookupd HTTP address(es)), ``lookup`` (a shared
    :class:`~nsq_ha.lookup.LookupClient`) or ``nsqd`` (TCP address(es)).

    * ``max_in_flight``: messages out to this consumer at once, across all connections.
    * ``ordered``: ``None`` follows the topic (lookup ``meta.ordered`` / nsqd's answer), ``True``
      forces ``SUB_ORDERED`` (fork only; it marks the channel ordered on nsqd), ``False`` never
      subscribes ordered (an ordered topic then refuses the subscription).
    * ``partitions``: consume only these; ``member=(i, n)``: only partitions ``p % n == i``.
    * ``desired_tag``, ``ext_filter``, ``msg_timeout`` (s), ``sample_rate``: sent in IDENTIFY.
    * ``max_attempts`` (0 = unlimited): a message delivered more often goes to ``on_give_up``
      instead of the handler, then is finished (a failing ``on_give_up`` requeues it). The
      default ``on_give_up`` logs and finishes. On ordered channels, skipping breaks order, so
      without an explicit ``on_give_up`` such messages keep going to the handler, logged as
      errors; pass ``on_give_up`` to choose skipping.
    * ``backoff``: a :class:`~nsq_ha.consumer.backoff.BackoffStrategy` (default exponential
      1 s .. 120 s), or ``None`` to never pause on failures.
    * ``requeue_delay``: the delay of a requeue without one, per attempt (``attempts x
      requeue_delay``, at most ``max_requeue_delay``); ignored on ordered channels (0).
    * ``drain_timeout``: how long :meth:`close` lets handlers finish what they hold.

    Every duration is float seconds and must be finite and not negative (most must be above 0);
    anything else raises :class:`~nsq_ha.errors.ConfigError` here, before a connection is made.
    A partition in ``partitions`` that the topic does not have (lookup's partition count) makes
    :meth:`start` raise :class:`~nsq_ha.errors.ConfigError`.

    Order: on an ordered subscription each partition is handled one message at a time, in
    offset order, whichever way messages are consumed (:meth:`run`, :meth:`run_batches`,
    ``async for``): a message nsqd delivers again (after ``msg_timeout``, a requeue or a leader
    move) while an earlier handler of its partition still runs waits for that handler, and so
    does everything after it in that partition.

    Use ``async with Consumer(...) as consumer`` (or :meth:`start` / :meth:`close`), then
    ``async for message in consumer``, :meth:`run` or :meth:`run_batches`.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        lookupd: str | Sequence[str] | None = None,
        lookup: LookupClient | None = None,
        nsqd: str | Sequence[str] | None = None,
        max_in_flight: int = 100,
        ordered: bool | None = None,
        partitions: Iterable[int] | None = None,
        member: tuple[int, int] | None = None,
        desired_tag: str | None = None,
        ext_filter: ExtFilter | None = None,
        max_attempts: int = 15,
        backoff: BackoffStrategy | None = Exponential(),  # noqa: B008 - frozen, shared safely
        requeue_delay: float = 1.0,
        max_requeue_delay: float = 60.0,
        msg_timeout: float | None = None,
        sample_rate: int | None = None,
        on_give_up: GiveUp | None = None,
        config: ConnectionConfig | None = None,
        lookup_interval: float = 15.0,
        drain_timeout: float = 30.0,
        rdy_redistribute_interval: float = 5.0,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = 30.0,
        reconnect_interval: float = 1.0,
        max_reconnect_interval: float = 30.0,
    ) -> None:
        self.topic = validate_topic(topic)
        self.channel = validate_channel(channel)
        given = [x is not None for x in (lookupd, lookup, nsqd)]
        if sum(given) != 1:
            raise ConfigError("give exactly one of lookupd=, lookup= or nsqd=")
        if ordered and sample_rate:
            raise ConfigError("ordered consumption needs sample_rate 0 (nsqd refuses otherwise)")
        check_count(max_attempts, "max_attempts", 0)
        if backoff is not None and not isinstance(backoff, BackoffStrategy):
            raise ConfigError("backoff must have a delay(level) method, or be None")
        # every duration: finite (no NaN, no infinity) and not negative
        self.requeue_delay = check_requeue_delay(requeue_delay, "requeue_delay")
        self.max_requeue_delay = check_requeue_delay(max_requeue_delay, "max_requeue_delay")
        lookup_interval = seconds(lookup_interval, "lookup_interval")
        self.drain_timeout = seconds(drain_timeout, "drain_timeout")
        self.rdy_redistribute_interval = seconds(
            rdy_redistribute_interval, "rdy_redistribute_interval"
        )
        low_rdy_idle_timeout = seconds(low_rdy_idle_timeout, "low_rdy_idle_timeout")
        low_rdy_timeout = seconds(low_rdy_timeout, "low_rdy_timeout")
        self.reconnect_interval = seconds(reconnect_interval, "reconnect_interval")
        self.max_reconnect_interval = seconds(max_reconnect_interval, "max_reconnect_interval")
        if msg_timeout is not None:
            msg_timeout = seconds(msg_timeout, "msg_timeout")
        self._static: tuple[str, ...] = ()
        if nsqd is not None:
            addresses = [nsqd] if isinstance(nsqd, str) else list(nsqd)
            if not addresses:
                raise ConfigError("nsqd= needs at least one address")
            self._static = tuple(dict.fromkeys(addresses))
        self.partitions = check_partitions(partitions)
        self.member = check_member(member)
        if self.member is not None and self._static:
            raise ConfigError("member= needs the partition map: use lookupd= or lookup=")
        base = config or ConnectionConfig()
        if not isinstance(base, ConnectionConfig):
            raise ConfigError("config must be a ConnectionConfig")
        self.ordered = ordered
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.on_give_up = on_give_up
        self._config = dataclasses.replace(
            base,
            msg_timeout=msg_timeout if msg_timeout is not None else base.msg_timeout,
            sample_rate=sample_rate if sample_rate is not None else base.sample_rate,
            desired_tag=desired_tag if desired_tag is not None else base.desired_tag,
            ext_filter=ext_filter if ext_filter is not None else base.ext_filter,
        )
        self._planner = RdyPlanner(
            max_in_flight,
            idle_timeout=low_rdy_idle_timeout,
            hold_timeout=low_rdy_timeout,
            clock=time.monotonic,
        )
        # last: every check above may refuse the arguments before a client is made
        self._owns_lookup = lookupd is not None
        self._lookup = lookup
        if lookupd is not None:
            self._lookup = LookupClient(lookupd, refresh_interval=lookup_interval)
        # what the topic turned out to be (from lookup meta or nsqd's answers)
        self._use_ordered = bool(ordered)
        self._ext = False
        self._slots: dict[ConnKey, _Slot] = {}
        self._connecting: dict[ConnKey, asyncio.Task[None]] = {}
        self._failures: dict[ConnKey, tuple[int, float]] = {}
        self._leaders: dict[int, str] = {}
        self._queue: asyncio.Queue[Message | None] = asyncio.Queue()
        #: ordered subscriptions: one message per partition handed out at a time
        self._gate = PartitionGate()
        #: ordered messages handed out by get(), by the task that asked for them
        self._claims = Claims(self._release)
        self._held_changed = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._refresh_handle: asyncio.TimerHandle | None = None
        self._refresh_due = 0.0
        self._backoff_handle: asyncio.TimerHandle | None = None
        self._redistributor: asyncio.Task[None] | None = None
        self._started = False
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        self._warned_ordered_delay = False
        self._warned_missing = False
        self._stopped_readers = False
        self._counts: Counter[str] = Counter()
        self._per_partition: dict[int, Counter[str]] = {}

    def __repr__(self) -> str:
        """Show topic, channel, connections and counters."""
        mode = "ordered" if self._use_ordered else "plain"
        return (
            f"<Consumer {self.topic}/{self.channel} {mode} connections={len(self._slots)} "
            f"in_flight={self._planner.total_in_flight} received={self._counts['received']}>"
        )

    # -- public state -------------------------------------------------------------------------

    @property
    def max_in_flight(self) -> int:
        """The RDY budget across all connections."""
        return self._planner.max_in_flight

    def set_max_in_flight(self, value: int) -> None:
        """Change the budget (0 pauses the consumer)."""
        self._apply(self._planner.set_max_in_flight(value))

    def is_starved(self) -> bool:
        """True when some connection holds nearly all its RDY in flight: process (answer) what
        you hold, nsqd will send that connection nothing more until then."""
        return self._planner.is_starved()

    @property
    def is_ordered(self) -> bool:
        """True when the consumer subscribes with SUB_ORDERED."""
        return self._use_ordered

    @property
    def connections(self) -> dict[ConnKey, NsqdConnection]:
        """The subscribed connections, by (nsqd address, partition or -1)."""
        return {k: s.conn for k, s in self._slots.items() if s.conn is not None}

    @property
    def stats(self) -> dict[str, Any]:
        """Counters: received, finished, requeued, timed_out, given_up, abandoned (connection
        lost while held), in_flight, connections, backoff_level, and the same per partition
        (``partitions``; key -1 on vanilla), with ``leader_changes`` there."""
        totals: dict[str, Any] = {
            name: self._counts[name]
            for name in ("received", "finished", "requeued", "timed_out", "given_up", "abandoned")
        }
        totals["in_flight"] = sum(len(s.held) for s in self._slots.values())
        totals["queued"] = (
            self._queue.qsize() - (1 if self._stopped_readers else 0) + self._gate.waiting
        )
        totals["connections"] = len(self._slots)
        totals["backoff_level"] = self._planner.level
        per: dict[int, dict[str, int]] = {}
        for partition, counter in sorted(self._per_partition.items()):
            per[partition] = dict(counter)
        for slot in self._slots.values():
            part = -1 if slot.partition is None else slot.partition
            per.setdefault(part, {})["in_flight"] = len(slot.held)
        totals["partitions"] = per
        return totals

    def _count(self, slot: _Slot, name: str) -> None:
        self._counts[name] += 1
        slot.counts[name] += 1

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Start consuming."""
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Drain and close."""
        await self.close()

    async def start(self) -> None:
        """Look the topic up and connect to every wanted partition.

        Raises what a user must fix: an unknown fork topic, bad names, refused credentials,
        ``partitions``/``member`` on vanilla. Connections that fail for a passing reason
        (a node down, a leader moving) are retried in the background.
        """
        if self._closing:
            raise ConsumerClosedError(f"{self!r} is closed")
        if self._started:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        self._redistributor = loop.create_task(
            self._redistribute_loop(), name=f"nsq_ha-rdy-{self.topic}"
        )
        try:
            if self._lookup is not None:
                pmap: PartitionMap | None = None
                try:
                    pmap = await self._lookup.lookup(self.topic, "r", force=True)
                except TopicNotFoundError as exc:  # vanilla: the topic may appear later
                    log.warning("%s: %s; waiting for it to appear", self.topic, exc)
                self._lookup.watch(self.topic, "r", self._on_map)
                if pmap is not None:
                    await self._reconcile(pmap, initial=True)
            else:
                await self._reconcile_static(initial=True)
        except BaseException:
            await self.close()
            raise

    # -- discovery ----------------------------------------------------------------------------

    def _wanted_partition(self, partition: int) -> bool:
        if self.partitions is not None and partition not in self.partitions:
            return False
        return self.member is None or partition % self.member[1] == self.member[0]

    def _wanted(self, pmap: PartitionMap) -> dict[ConnKey, int | None]:
        """(address, partition) -> partition for every connection the map asks for."""
        if not pmap.fork:
            if self.partitions is not None or self.member is not None:
                raise ConfigError(
                    f"partitions=/member= need the fork; {self.topic!r} is on vanilla nsqd"
                )
            return {(node.address, -1): None for node in pmap.producers}
        if pmap.partition_num == 0 and not pmap.partitions:
            raise TopicNotFoundError(
                f"topic {self.topic!r} does not exist in the cluster: on the fork, topics are "
                "created by an operator with nsqlookupd POST /topic/create"
            )
        wanted: dict[ConnKey, int | None] = {}
        for partition, node in sorted(pmap.partitions.items()):
            if self._wanted_partition(partition):
                wanted[(node.address, partition)] = partition
        if not wanted and (self.partitions or self.member):
            log.warning(
                "%s: none of the partitions this consumer wants is listed (%s of %d)",
                self.topic,
                sorted(pmap.partitions),
                pmap.partition_num,
            )
        return wanted

    def _check_partitions_exist(self, pmap: PartitionMap, *, initial: bool) -> None:
        """``partitions=`` naming a partition the topic does not have: refused at start (once
        lookup's ``meta`` gives the partition count), logged as an error afterwards."""
        if self.partitions is None or pmap.meta is None or pmap.meta.partition_num < 1:
            return
        count = pmap.meta.partition_num
        missing = sorted(p for p in self.partitions if p >= count)
        if not missing:
            return
        text = (
            f"topic {self.topic!r} has {count} partitions (0..{count - 1}); partitions= "
            f"names {missing}, which it does not have"
        )
        if initial:
            raise ConfigError(text)
        if not self._warned_missing:
            self._warned_missing = True
            log.error("%s: consuming the others", text)

    async def _on_map(self, pmap: PartitionMap) -> None:
        """Lookup listener: the map changed."""
        if not self._closing:
            try:
                await self._reconcile(pmap)
            except NsqError as exc:
                log.error("%s: cannot follow the new partition map: %s", self.topic, exc)

    async def _reconcile(self, pmap: PartitionMap, *, initial: bool = False) -> None:
        """Connect what the map asks for and is not connected; retire moved leaders."""
        if self._closing:
            return
        if pmap.meta is not None:
            if self.ordered is None and pmap.ordered and not self._use_ordered:
                log.info("%s is an ordered topic: subscribing with SUB_ORDERED", self.topic)
                self._use_ordered = True
            self._ext = pmap.extend_support
        wanted = self._wanted(pmap)
        self._check_partitions_exist(pmap, initial=initial)
        for (address, partition), _ in wanted.items():
            if partition < 0:
                continue
            previous = self._leaders.get(partition)
            if previous is not None and previous != address:
                log.info(
                    "%s partition %d: leader moved %s -> %s",
                    self.topic,
                    partition,
                    previous,
                    address,
                )
                self._per_partition.setdefault(partition, Counter())["leader_changes"] += 1
            self._leaders[partition] = address
        for key, slot in list(self._slots.items()):
            leader = self._leaders.get(key[1]) if key[1] >= 0 else None
            if leader is not None and leader != key[0] and not slot.retired:
                self._retire(slot)  # this partition is now read from another node
        await self._connect_all(wanted, initial=initial)

    async def _reconcile_static(self, *, initial: bool = False) -> None:
        wanted: dict[ConnKey, int | None] = {}
        for address in self._static:
            if self.partitions is None:
                wanted[(address, -1)] = None
            else:
                for partition in sorted(self.partitions):
                    wanted[(address, partition)] = partition
        await self._connect_all(wanted, initial=initial)

    async def _connect_all(self, wanted: dict[ConnKey, int | None], *, initial: bool) -> None:
        now = time.monotonic()
        tasks: list[asyncio.Task[None]] = []
        for key, partition in wanted.items():
            if key in self._slots or key in self._connecting:
                continue
            not_before = self._failures.get(key, (0, 0.0))[1]
            if not_before > now:
                self._schedule_refresh(not_before - now)
                continue
            task = asyncio.get_running_loop().create_task(
                self._connect(key, partition, initial=initial), name=f"nsq_ha-sub-{key}"
            )
            self._connecting[key] = task
            task.add_done_callback(lambda t, k=key: self._connect_done(k, t))  # type: ignore[misc]
            tasks.append(task)
        if initial and tasks:
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result

    def _connect_done(self, key: ConnKey, task: asyncio.Task[None]) -> None:
        if self._connecting.get(key) is task:
            del self._connecting[key]
        if not task.cancelled():
            task.exception()  # retrieved: _connect logged it, or start() re-raises it

    def _config_for_connection(self) -> ConnectionConfig:
        return dataclasses.replace(self._config, extend_support=self._ext)

    async def _connect(self, key: ConnKey, partition: int | None, *, initial: bool) -> None:
        """Connect and subscribe one (node, partition); errors are logged and retried later,
        except during :meth:`start`, where what the user must fix is raised."""
        try:
            await self._subscribe(key, partition)
        except asyncio.CancelledError:
            raise
        except NsqError as exc:
            if decide(exc).retry:  # re-made through a fresh lookup, quietly
                self._failed(key, exc)
            elif initial:
                raise
            else:
                self._failed(key, exc, level=logging.ERROR)

    async def _subscribe(self, key: ConnKey, partition: int | None) -> None:
        for _ in range(3):  # nsqd may tell us the topic is ordered / ext: switch and retry
            ordered = self._use_ordered
            slot = _Slot(self, key, partition, ordered)
            conn = NsqdConnection(
                key[0],
                config=self._config_for_connection(),
                on_message=slot.on_message,
                on_error=slot.on_error,
            )
            slot.conn = conn
            try:
                await conn.connect()
                if ordered and not conn.is_fork:
                    raise UnsupportedByServerError(
                        f"ordered consumption needs the fork; nsqd {conn.address} is vanilla"
                    )
                await conn.subscribe(self.topic, self.channel, partition, ordered=ordered)
            except SubOrderRequiredError:
                await conn.close()
                if self.ordered is False:
                    raise
                log.info("%s: nsqd says the topic is ordered: using SUB_ORDERED", self.topic)
                self._use_ordered = True
                continue
            except ExtendSupportRequiredError:
                await conn.close()
                log.info("%s: nsqd says it is an ext topic: using extend_support", self.topic)
                self._ext = True
                continue
            except ExtendSupportForbiddenError:
                await conn.close()
                self._ext = False
                continue
            except BaseException:
                await conn.close()
                raise
            if self._closing:
                await conn.close()
                return
            self._register(slot, conn)
            return
        raise ConfigError(f"{self.topic}: nsqd keeps refusing the subscription mode")

    def _register(self, slot: _Slot, conn: NsqdConnection) -> None:
        self._slots[slot.key] = slot
        self._failures.pop(slot.key, None)
        max_rdy = conn.negotiated.max_rdy_count or DEFAULT_MAX_RDY
        log.info(
            "consuming %s/%s partition %s from %s (%s)",
            self.topic,
            self.channel,
            "-" if slot.partition is None else slot.partition,
            conn.address,
            "SUB_ORDERED" if slot.ordered else "SUB",
        )
        self._apply(self._planner.add(slot.key, max_rdy=max_rdy, cap=1 if slot.ordered else None))
        self._spawn(self._watch(slot, conn), f"nsq_ha-watch-{slot.key}")

    def _failed(self, key: ConnKey, exc: BaseException, level: int = logging.WARNING) -> None:
        failures = self._failures.get(key, (0, 0.0))[0] + 1
        wait = min(self.max_reconnect_interval, self.reconnect_interval * 2 ** (failures - 1))
        self._failures[key] = (failures, time.monotonic() + wait)
        log.log(
            level,
            "%s partition %s on %s: %s (failure %d; next try in %.1f s%s)",
            self.topic,
            key[1] if key[1] >= 0 else "-",
            key[0],
            exc,
            failures,
            wait,
            ", after a fresh lookup" if self._lookup is not None else "",
        )
        self._schedule_refresh(wait)

    def _schedule_refresh(self, delay: float) -> None:
        """Look up (or, with nsqd=, reconnect) after ``delay`` s; the earliest request wins."""
        if self._closing:
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if self._refresh_handle is not None:
            if self._refresh_due <= due:
                return
            self._refresh_handle.cancel()
        self._refresh_due = due
        self._refresh_handle = loop.call_later(delay, self._refresh_now)

    def _refresh_now(self) -> None:
        self._refresh_handle = None
        self._spawn(self._refresh(), "nsq_ha-consumer-refresh")

    async def _refresh(self) -> None:
        if self._closing:
            return
        try:
            if self._lookup is not None:
                pmap = await self._lookup.refresh(self.topic, "r")
                await self._reconcile(pmap)
            else:
                await self._reconcile_static()
        except NsqError as exc:
            log.warning("%s: lookup failed: %s; trying again", self.topic, exc)
            self._schedule_refresh(self.reconnect_interval * 5)

    async def _watch(self, slot: _Slot, conn: NsqdConnection) -> None:
        await conn.wait_closed()
        self._lost(slot, conn)

    def _lost(self, slot: _Slot, conn: NsqdConnection) -> None:
        """A connection closed: forget it, abandon what it held, find the partition again."""
        if self._slots.get(slot.key) is slot:
            del self._slots[slot.key]
        self._apply(self._planner.remove(slot.key))
        for message in slot.held.values():
            if message.outcome is None:
                message.outcome = Outcome.ABANDONED
                self._count(slot, "abandoned")
        slot.held.clear()
        self._held_changed.set()
        if self._closing or slot.retired:
            return
        reason = conn.close_reason or "closed by nsqd"
        self._failed(slot.key, reason if isinstance(reason, BaseException) else NsqError(reason))
        # the partition's leader may have moved: look again soon, not in a full interval
        self._schedule_refresh(min(1.0, self.reconnect_interval))

    def _retire(self, slot: _Slot) -> None:
        """The partition moved to another node: stop this connection gracefully."""
        slot.retired = True
        log.info("%s: leaving %s (the partition moved)", self.topic, slot)
        self._apply(self._planner.remove(slot.key))  # its budget goes to the new leader
        self._spawn(self._drain_slot(slot, self.drain_timeout), f"nsq_ha-retire-{slot.key}")

    async def _drain_slot(self, slot: _Slot, timeout: float) -> None:  # noqa: ASYNC109
        conn = slot.conn
        if conn is None:
            return
        with contextlib.suppress(NsqError):
            await conn.stop_delivery()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while slot.held and not conn.closed:
                    self._held_changed.clear()
                    await self._held_changed.wait()
        await conn.close()

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- flow control -------------------------------------------------------------------------

    def _apply(self, changes: dict[Any, int]) -> None:
        """Send the RDY changes the planner decided; start a backoff wait when it blocked."""
        for key, value in changes.items():
            slot = self._slots.get(key)
            if slot is None or slot.conn is None or slot.conn.closed:
                continue
            try:
                slot.conn.rdy(value)
            except NsqError as exc:  # closing or closed: its watcher reports it
                log.debug("RDY %d to %s not sent: %s", value, slot, exc)
        if self._planner.blocked and self._backoff_handle is None and not self._closing:
            strategy = self.backoff or Exponential()
            delay = strategy.delay(self._planner.level)
            log.warning(
                "%s/%s: backing off (level %d): every connection paused for %.2f s",
                self.topic,
                self.channel,
                self._planner.level,
                delay,
            )
            self._backoff_handle = asyncio.get_running_loop().call_later(
                delay, self._backoff_elapsed
            )

    def _backoff_elapsed(self) -> None:
        self._backoff_handle = None
        if not self._closing:
            self._apply(self._planner.backoff_elapsed())

    async def _redistribute_loop(self) -> None:
        while True:
            await asyncio.sleep(self.rdy_redistribute_interval)
            self._apply(self._planner.redistribute())

    # -- messages -----------------------------------------------------------------------------

    def _on_message(self, slot: _Slot, decoded: DecodedMessage) -> None:
        """From a connection's read loop: never blocks."""
        message = Message(decoded, slot)
        previous = slot.held.get(decoded.id)
        if previous is not None and previous.outcome is None:
            # nsqd timed it out and delivered it again while we still held it
            previous.outcome = Outcome.TIMED_OUT
            self._count(slot, "timed_out")
            self._apply(self._planner.done(slot.key, success=None))
        slot.held[decoded.id] = message
        self._counts["received"] += 1
        slot.counts["received"] += 1
        changes = self._planner.message(slot.key)
        if changes or self._planner.blocked:
            self._apply(changes)
        if self._closing:
            self._requeue_now(slot, message)
            return
        if slot.ordered and not self._gate.admit(message):
            return  # a copy, or the next one: waits until its partition's handler is done
        self._dispatch(slot, message)

    def _dispatch(self, slot: _Slot, message: Message) -> None:
        """Hand a message out: to the readers, or to ``on_give_up`` after too many attempts."""
        if self.max_attempts and message.attempts > self.max_attempts:
            if slot.ordered and self.on_give_up is None:
                log.error(
                    "%r: delivered %d times (max_attempts %d) on an ordered channel; not "
                    "skipping it, which would break order (pass on_give_up= to skip)",
                    message,
                    message.attempts,
                    self.max_attempts,
                )
            else:
                self._spawn(self._give_up(message), "nsq_ha-give-up")
                return
        self._queue.put_nowait(message)

    async def _give_up(self, message: Message) -> None:
        try:
            await self._give_up_now(message)
        finally:
            if message.ordered:
                self._release(message)

    async def _give_up_now(self, message: Message) -> None:
        slot = _slot_of(message)
        self._count(slot, "given_up")
        try:
            if self.on_give_up is None:
                log.warning(
                    "giving up on %r after %d attempts (max_attempts %d): finishing it",
                    message,
                    message.attempts,
                    self.max_attempts,
                )
            else:
                result = self.on_give_up(message)
                if inspect.isawaitable(result):
                    await result
        except Exception:
            log.exception("on_give_up failed for %r: requeueing it instead", message)
            if not message.responded:
                with contextlib.suppress(MessageResponseError):
                    self._requeue(slot, message, None, False)
            return
        if not message.responded:
            with contextlib.suppress(MessageResponseError):
                self._finish(slot, message)

    def _release(self, message: Message) -> None:
        """The handling of an ordered ``message`` ended: hand out its partition's next one."""
        following = self._gate.release(message)
        while following is not None:
            if not self._closing:
                self._dispatch(_slot_of(following), following)
                return
            self._requeue_now(_slot_of(following), following)
            following = self._gate.release(following)

    def _on_error(self, slot: _Slot, error: BrokerError) -> None:
        """Non-fatal error frames: FIN/REQ/TOUCH of a message nsqd no longer has in flight."""
        if isinstance(error, MessageCommandError):
            self._count(slot, "timed_out")
            log.warning("%s: %s (it timed out on nsqd or went to another consumer)", slot, error)
        else:
            log.warning("%s: %s", slot, error)

    def _check_answerable(self, slot: _Slot, message: Message, action: str) -> NsqdConnection:
        conn = slot.conn
        if conn is None or conn.closed or slot.held.get(message.id) is not message:
            if message.outcome is None:
                message.outcome = Outcome.ABANDONED
                self._count(slot, "abandoned")
            raise MessageConnectionGoneError(
                f"cannot {action} {message!r}: the connection to {slot.address} that delivered "
                "it is gone; nsqd redelivers the message after its msg_timeout"
            )
        return conn

    def _settled(self, slot: _Slot, message: Message, outcome: Outcome) -> None:
        message.outcome = outcome
        slot.held.pop(message.id, None)
        self._held_changed.set()
        if slot.ordered and self._claims:
            self._claims.answered(message)

    def _finish(self, slot: _Slot, message: Message) -> None:
        # the hottest answer, so _check_answerable/_gone_on_error/_settled/_count are inlined
        conn = slot.conn
        message_id = message.id
        if conn is None or slot.held.get(message_id) is not message or conn.closed:
            conn = self._check_answerable(slot, message, "finish")  # raises
        try:
            conn.fin(message_id)
        except NsqError as exc:
            raise MessageConnectionGoneError(f"cannot finish {message!r}: {exc}") from exc
        message.outcome = Outcome.FINISHED
        del slot.held[message_id]
        self._held_changed.set()
        self._counts["finished"] += 1
        slot.counts["finished"] += 1
        changes = self._planner.done(slot.key, success=True)
        if changes or self._planner.blocked:
            self._apply(changes)
        if slot.ordered and self._claims:
            self._claims.answered(message)

    def _requeue(self, slot: _Slot, message: Message, delay: float | None, backoff: bool) -> None:
        conn = self._check_answerable(slot, message, "requeue")
        if delay is None:
            delay = min(self.requeue_delay * message.attempts, self.max_requeue_delay)
        elif slot.ordered and delay > 0 and not self._warned_ordered_delay:
            self._warned_ordered_delay = True
            log.warning(
                "%s: requeue delays are ignored by nsqd on ordered channels (the message would "
                "wait for msg_timeout); requeueing with delay 0",
                slot,
            )
        if slot.ordered:
            delay = 0
        failed = False if backoff and self.backoff is not None else None
        # RDY changes first: when this starts a backoff, RDY 0 must reach nsqd before the REQ,
        # or nsqd may hand the requeued message straight back
        self._apply(self._planner.done(slot.key, success=failed))
        with _gone_on_error(message, "requeue"):
            conn.req(message.id, delay)
        self._settled(slot, message, Outcome.REQUEUED)
        self._count(slot, "requeued")

    def _requeue_now(self, slot: _Slot, message: Message) -> None:
        """Closing: give a message back at once, without backoff."""
        with contextlib.suppress(MessageResponseError):
            self._requeue(slot, message, 0, False)

    def _touch(self, slot: _Slot, message: Message) -> None:
        conn = self._check_answerable(slot, message, "touch")
        with _gone_on_error(message, "touch"):
            conn.touch(message.id)

    # -- handing messages out -----------------------------------------------------------------
    #
    # On ordered subscriptions the gate lets one message per partition out at a time. Its
    # handling ends when run()'s handler returns, when the run_batches() handler holding it
    # returns, when on_give_up returns, or, for a message handed out by get() / async for, when
    # it is answered, when the task that got it asks for another one, or when that task ends.

    def __aiter__(self) -> Self:
        """``async for message in consumer``: answer each message yourself."""
        return self

    async def __anext__(self) -> Message:
        """The next message; StopAsyncIteration once the consumer is closing (see :meth:`get`
        for the order on ordered subscriptions)."""
        message = await self.get()
        if message is None:
            raise StopAsyncIteration
        return message

    async def get(self, timeout: float | None = None) -> Message | None:  # noqa: ASYNC109
        """The next message, or ``None`` once the consumer is closing (or after ``timeout``).

        On an ordered subscription a partition's next message, or a copy nsqd delivers again
        (after ``msg_timeout``, a requeue or a leader move), is handed out only once the
        partition's previous message handed out is done with: answered (finish/requeue), or
        the task that got it asked for another message, or that task ended. So one ``async for``
        loop handles each partition in order, and several concurrent loops never handle two
        messages of one partition at once (until the first is answered).
        """
        limit = check_timeout(timeout)
        if not self._started:
            await self.start()
        task = asyncio.current_task()
        if self._claims and task is not None:
            self._claims.drop(task)  # this task is done with what it got before
        message = await self._take(limit)
        if (
            message is not None
            and message.ordered
            and task is not None
            and self._gate.holds(message)
        ):
            self._claims.add(task, message)
        return message

    async def _take(self, timeout: float | None) -> Message | None:  # noqa: ASYNC109
        """The next queued message still to answer; ``None`` when closing or after ``timeout``."""
        queue = self._queue
        while timeout is None:  # no timer to arm: the common case of async for
            message = await queue.get()
            if message is None:
                queue.put_nowait(None)  # wake the other readers too
                return None
            if message.outcome is None:
                return message
            if message.ordered:
                self._release(message)  # answered before it was handed out: the next one
        try:
            async with asyncio.timeout(timeout):
                while True:
                    message = await queue.get()
                    if message is None:
                        queue.put_nowait(None)  # wake the other readers too
                        return None
                    if message.outcome is None:
                        return message
                    if message.ordered:
                        self._release(message)
        except TimeoutError:
            return None

    def _get_nowait(self) -> Message | None:
        """The next queued message if one is there now (``None`` also when closing)."""
        queue = self._queue
        while not queue.empty():
            message = queue.get_nowait()
            if message is None:
                queue.put_nowait(None)  # the closing marker stays for every reader
                return None
            if message.outcome is None:
                return message
            if message.ordered:
                self._release(message)
        return None

    async def run(self, handler: Handler, *, concurrency: int | None = None) -> None:
        """Call ``handler(message)`` for every message until :meth:`close`.

        A return finishes the message (unless the handler answered it), an exception requeues
        it (with backoff). ``concurrency`` handlers run at once (default ``max_in_flight``, at
        most 256).

        On an ordered subscription each partition's messages go through ``handler`` one at a
        time, in offset order: the partition's next message, and a copy nsqd delivers again
        while the first call still runs (after ``msg_timeout``, a requeue or a leader move),
        wait until that call returned. Different partitions are handled concurrently.
        """
        if concurrency is None:
            count = min(max(1, self.max_in_flight), 256)
        else:
            count = check_count(concurrency, "concurrency", 1)

        async def worker() -> None:
            while (message := await self._take(None)) is not None:
                try:
                    await self._call(handler, message, [message])
                finally:
                    if message.ordered:
                        self._release(message)

        await self.start()
        await asyncio.gather(*(worker() for _ in range(count)))

    async def _call(self, handler: Any, argument: object, messages: list[Message]) -> None:
        """Run a handler; then finish the messages it left unanswered, or requeue them (with
        backoff) if it raised."""
        failed = False
        try:
            result = handler(argument)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            failed = True
            log.warning(
                "handler failed on %s: %r; requeueing",
                repr(messages[0]) if len(messages) == 1 else f"{len(messages)} messages",
                exc,
            )
        for message in messages:
            if not message.responded:
                with contextlib.suppress(MessageResponseError):
                    await (message.requeue() if failed else message.finish())

    async def run_batches(
        self,
        handler: BatchHandler,
        *,
        max_size: int = 100,
        max_wait: float = 0.1,
        concurrency: int = 1,
    ) -> None:
        """Call ``handler(messages)`` with lists of up to ``max_size`` messages until
        :meth:`close`; a batch is handed over when full, after ``max_wait`` s, or as soon as
        :meth:`is_starved` (nsqd will send no more until some are answered).

        A return finishes every message the handler did not answer; an exception requeues them
        (with backoff).

        On an ordered subscription a batch holds at most one message per partition, and the
        partition's next message (or a copy nsqd delivers again) waits until the handler call
        holding the previous one returned: with any ``concurrency``, each partition is handled
        one message at a time, in offset order.
        """
        check_count(max_size, "max_size", 1)
        check_count(concurrency, "concurrency", 1)
        max_wait = seconds(max_wait, "max_wait", zero=True)
        loop = asyncio.get_running_loop()

        async def worker() -> None:
            while (first := await self._take(None)) is not None:
                batch = [first]
                try:
                    deadline = loop.time() + max_wait
                    while len(batch) < max_size:
                        message = self._get_nowait()  # what is here already, without a timer
                        if message is None:
                            if self.is_starved() or self._closing:
                                break
                            message = await self._take(max(0.0, deadline - loop.time()))
                            if message is None:
                                break
                        batch.append(message)
                    await self._call(handler, batch, batch)
                finally:
                    for message in batch:
                        if message.ordered:
                            self._release(message)

        await self.start()
        await asyncio.gather(*(worker() for _ in range(concurrency)))

    # -- seeking ------------------------------------------------------------------------------

    async def seek(
        self,
        partition: int,
        *,
        offset: int | None = None,
        timestamp: float | None = None,
        end: bool = False,
        count: int | None = None,
    ) -> None:
        """Move this channel's read position in ``partition`` (fork, cluster mode).

        Give one of ``offset`` (queue byte offset, e.g. a message's ``offset``), ``timestamp``
        (Unix seconds: the first message at or after it), ``count`` (the N-th message, from 1)
        or ``end=True`` (skip the backlog). Sent to the partition's leader as
        ``POST /channel/setoffset``. nsqd first delivers what it had already read ahead (a
        message in flight, and possibly one more); on ordered channels that is one message.
        """
        body = seek_position(offset=offset, timestamp=timestamp, count=count, end=end)
        check_count(partition, "partition", 0)
        if self._lookup is None:
            raise UnsupportedByServerError(
                "seek needs the fork in cluster mode, found through nsqlookupd (lookupd=)"
            )
        pmap = await self._lookup.lookup(self.topic, "r", force=True)
        if not pmap.fork:
            raise UnsupportedByServerError(
                f"seek exists only on the fork; {self.topic!r} is on vanilla nsqd"
            )
        node = pmap.leader(partition)
        if node is None:
            raise ConfigError(f"{self.topic!r} has no partition {partition} listed now")
        await set_offset(node, self.topic, partition, self.channel, body)
        log.info("%s/%s partition %d: seek to %s", self.topic, self.channel, partition, body)

    # -- closing ------------------------------------------------------------------------------

    async def close(self, *, drain_timeout: float | None = None) -> None:
        """Stop consuming without leaving anything in flight on nsqd.

        RDY 0 and CLS on every connection; messages not yet handed out are requeued; handlers
        get ``drain_timeout`` (default: the consumer's) to answer what they hold, then the rest
        is requeued; a round trip per connection makes sure nsqd processed every answer; then
        the sockets close.
        """
        if self._close_task is None:
            timeout = (
                self.drain_timeout
                if drain_timeout is None
                else seconds(drain_timeout, "drain_timeout", zero=True)
            )
            self._close_task = asyncio.get_running_loop().create_task(self._close(timeout))
        await asyncio.shield(self._close_task)

    async def _close(self, timeout: float) -> None:  # noqa: ASYNC109 - the drain limit
        self._closing = True
        if self._lookup is not None:
            self._lookup.unwatch(self.topic, "r", self._on_map)
        for handle in (self._refresh_handle, self._backoff_handle):
            if handle is not None:
                handle.cancel()
        tasks: list[asyncio.Task[Any]] = [*self._connecting.values()]
        if self._redistributor is not None:
            tasks.append(self._redistributor)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._apply(self._planner.stop())
        slots = list(self._slots.values())
        requeued = 0
        self._claims.clear()
        for waiting in self._gate.clear():  # parked behind their partition's handler
            self._requeue_now(_slot_of(waiting), waiting)
            requeued += 1
        while not self._queue.empty():
            message = self._queue.get_nowait()
            if message is not None and message.outcome is None:
                self._requeue_now(_slot_of(message), message)
                requeued += 1
        self._queue.put_nowait(None)  # readers stop (each puts it back for the next)
        self._stopped_readers = True
        # nothing new: CLS everywhere (what races in is requeued by _on_message)
        await asyncio.gather(
            *(s.conn.stop_delivery() for s in slots if s.conn is not None), return_exceptions=True
        )
        held = sum(len(s.held) for s in slots)
        log.info(
            "closing %s/%s: %d queued messages requeued, waiting up to %.1f s for %d held",
            self.topic,
            self.channel,
            requeued,
            timeout,
            held,
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while any(s.held for s in slots if s.conn is not None and not s.conn.closed):
                    self._held_changed.clear()
                    await self._held_changed.wait()
        for slot in slots:
            for message in list(slot.held.values()):
                log.warning("closing: %r still held after %.1f s: requeueing it", message, timeout)
                self._requeue_now(slot, message)
        await self._sync(slots)
        await asyncio.gather(
            *(s.conn.close() for s in slots if s.conn is not None), return_exceptions=True
        )
        if self._background:  # watchers end with their sockets; a stuck on_give_up is cut off
            _, pending = await asyncio.wait(list(self._background), timeout=max(timeout, 1.0))
            for task in pending:
                log.warning("closing: cancelling %s, still running after %.1f s", task, timeout)
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._owns_lookup and self._lookup is not None:
            await self._lookup.close()
        log.info("closed %r", self)

    async def _sync(self, slots: list[_Slot]) -> None:
        """Round trips until no message raced in: then nsqd has processed every answer."""
        for _ in range(_SYNC_ROUNDS):
            before = self._counts["received"]
            live = [s.conn for s in slots if s.conn is not None and not s.conn.closed]
            results = await asyncio.gather(*(c.sync() for c in live), return_exceptions=True)
            for conn, result in zip(live, results, strict=True):
                if isinstance(result, BaseException):
                    log.warning("closing: sync with %s failed: %s", conn.address, result)
            if self._counts["received"] == before:
                return
        log.warning("closing: messages kept arriving after CLS; some may stay in flight")


@contextlib.contextmanager
def _gone_on_error(message: Message, action: str) -> Iterator[None]:
    """A FIN/REQ/TOUCH the connection refused to send: the connection is closing or gone."""
    try:
        yield
    except NsqError as exc:
        raise MessageConnectionGoneError(f"cannot {action} {message!r}: {exc}") from exc


def _slot_of(message: Message) -> _Slot:
    """The slot that delivered ``message`` (every Message this module makes has one)."""
    owner = message._owner
    if not isinstance(owner, _Slot):
        raise TypeError(f"{message!r} was not delivered by a Consumer")
    return owner
