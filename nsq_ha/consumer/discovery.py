"""Finding and keeping a consumer's subscriptions: :class:`Discovery`.

One :class:`~nsq_ha.consumer.slots.Slot` per (node, partition) wanted, from the consume leaders
``lookup?access=r`` names (PROTOCOL.md §6.4, §6.8) or the ``nsqd=`` addresses; every lookup
refresh picks up new partitions and moved leaders (a moved partition's old slot drains, then
closes). A subscription is made once directly; a failed or lost one goes to its reconnect loop
(:func:`nsq_ha.retry.retry_after`), each try through a fresh lookup, until the partition is
read from another node (the lookup's watcher subscribes there). The mode (§2.3: SUB_ORDERED,
extend_support) follows ``ordered=``, the lookup's ``meta``, or what nsqd's refusals ask for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from nsq_ha import events
from nsq_ha.connection import NsqdConnection
from nsq_ha.consumer.positions import (
    channel_exists,
    move,
    nsqd_admin,
    refuse_on_vanilla,
    retriable,
    start_body,
)
from nsq_ha.consumer.slots import ConnKey, Slot, SlotContext
from nsq_ha.consumer.tasks import Background
from nsq_ha.errors import (
    ConfigError,
    ExtendSupportForbiddenError,
    ExtendSupportRequiredError,
    NsqError,
    SubOrderRequiredError,
    TopicNotFoundError,
    UnsupportedByServerError,
)
from nsq_ha.lookup import LookupClient, NodeInfo, PartitionMap
from nsq_ha.lookup.client import missing_on_fork
from nsq_ha.lookup.http import ADMIN_TIMEOUT
from nsq_ha.redact import redact_text as redact
from nsq_ha.retry import RECONNECT, decide, retry_after

if TYPE_CHECKING:
    from nsq_ha.admin import NsqdAdmin


log = logging.getLogger(__name__)

#: how often nsqd may switch the subscription mode (ordered, ext) before we give up
_MODE_SWITCHES = 3
#: after an ordered channel moved to its start: how long its pump's held message may take (s)
HELD_WAIT = 0.5


class Discovery:
    """The slots a consumer wants, made and re-made; fed by lookup (or fixed addresses)."""

    def __init__(self, ctx: SlotContext, background: Background) -> None:
        config = self._config = ctx.config
        self._ctx = ctx
        self._background = background
        self.topic = config.topic
        self.channel = config.channel
        self._lookup = config.lookup
        if config.lookupd is not None:
            self._lookup = LookupClient(config.lookupd, refresh_interval=config.lookup_interval)
        #: what the topic turned out to be (from lookup meta or nsqd's answers)
        self.use_ordered = bool(config.ordered)
        self._ext = False
        self.slots: dict[ConnKey, Slot] = {}
        self._connecting: dict[ConnKey, asyncio.Task[None]] = {}
        self._backoff = dataclasses.replace(
            RECONNECT, initial=config.reconnect_interval, cap=config.max_reconnect_interval
        )
        self._leaders: dict[int, str] = {}
        #: each (address, partition)'s node (for the start position)
        self._nodes: dict[ConnKey, NodeInfo] = {}
        #: partitions whose start position is settled (moved, existing, or none to apply)
        self._placed: set[int] = set()
        #: partitions whose channel this consumer created and has not moved yet
        self._created: set[int] = set()
        self._warned_missing = False
        self.closing = False

    # -- start and stop -----------------------------------------------------------------------

    async def start(self) -> None:
        """Look the topic up and connect every wanted partition; raise what a user must fix."""
        config = self._config
        if self._lookup is None:  # nsqd= addresses
            parts = sorted(config.partitions) if config.partitions is not None else [-1]
            wanted = [(address, p) for address in config.nsqd or () for p in parts]
            await self._connect_all(wanted, initial=True)
            return
        pmap: PartitionMap | None = None
        try:
            pmap = await self._lookup.lookup(self.topic, "r", force=True)
        except TopicNotFoundError as exc:  # vanilla: the topic may appear later
            log.warning("%s: %s; waiting for it to appear", self.topic, exc)
        if pmap is None or not pmap.fork:
            refuse_on_vanilla(config.start, pmap, self.channel)
        self._lookup.watch(self.topic, "r", self._on_map)
        if pmap is not None:
            await self._reconcile(pmap, initial=True)

    async def stop(self) -> None:
        """Make and re-make nothing any more (the slots stay, for the drain)."""
        self.closing = True
        if self._lookup is not None:
            self._lookup.unwatch(self.topic, "r", self._on_map)
        tasks = list(self._connecting.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Close the lookup client if this discovery made it."""
        if self._config.lookupd is not None and self._lookup is not None:
            await self._lookup.close()

    async def leader(self, partition: int) -> NodeInfo:
        """The leader of ``partition`` now (a fresh lookup): fork, cluster mode only."""
        node = (await self._fork_map()).leader(partition)
        if node is None:
            raise ConfigError(f"{self.topic!r} has no partition {partition} listed now")
        return node

    async def leaders(self) -> dict[int, NodeInfo]:
        """The leader of every partition this consumer reads, from a fresh lookup (fork)."""
        pmap = await self._fork_map()
        wanted = {p: n for p, n in sorted(pmap.partitions.items()) if self._config.wants(p)}
        if not wanted:
            raise ConfigError(
                f"{self.topic!r}: lookup lists none of the partitions this consumer reads "
                f"({sorted(pmap.partitions)} listed); nothing was moved"
            )
        return wanted

    async def _fork_map(self) -> PartitionMap:
        if self._lookup is None:
            raise UnsupportedByServerError(
                "seek needs the fork in cluster mode, found through nsqlookupd (lookupd=)"
            )
        pmap = await self._lookup.lookup(self.topic, "r", force=True)
        if not pmap.fork:
            raise UnsupportedByServerError(
                f"seek exists only on the fork; {self.topic!r} is on vanilla nsqd"
            )
        return pmap

    # -- the partition map --------------------------------------------------------------------

    def _wanted(self, pmap: PartitionMap) -> list[ConnKey]:
        """The (address, partition or -1) of every connection the map asks for."""
        config = self._config
        if not pmap.fork:
            if config.partitions is not None or config.member is not None:
                raise ConfigError(
                    f"partitions=/member= need the fork; {self.topic!r} is on vanilla nsqd"
                )
            return [(node.address, -1) for node in pmap.producers]
        if pmap.partition_num == 0 and not pmap.partitions:
            raise missing_on_fork(self.topic)
        wanted = [(n.address, p) for p, n in sorted(pmap.partitions.items()) if config.wants(p)]
        if not wanted and (config.partitions or config.member):
            log.warning(
                "%s: none of the partitions this consumer wants is listed (%s of %d)",
                self.topic,
                sorted(pmap.partitions),
                pmap.partition_num,
            )
        return wanted

    def _check_partitions_exist(self, pmap: PartitionMap, *, initial: bool) -> None:
        """A partition named in ``partitions=``/``start=`` that the topic lacks: refused at start,
        logged afterwards."""
        count = pmap.meta.partition_num if pmap.meta is not None else 0
        start = self._config.start
        named = {"partitions=": self._config.partitions or ()}
        named["start="] = start if isinstance(start, dict) else ()
        missing = [(o, sorted(p for p in chosen if p >= count)) for o, chosen in named.items()]
        text = "; ".join(
            f"{o} names {parts}, which it does not have" for o, parts in missing if parts
        )
        if count < 1 or not text:
            return
        text = f"topic {self.topic!r} has {count} partitions (0..{count - 1}); {text}"
        if initial:
            raise ConfigError(text)
        if not self._warned_missing:
            self._warned_missing = True
            log.error("%s: consuming the others", text)

    def _emit(self, event: type[events.LeaderChanged | events.Reconnecting], **fields: Any) -> None:
        events.emit(event(role="consumer", topic=self.topic, channel=self.channel, **fields))

    async def _on_map(self, pmap: PartitionMap) -> None:
        try:
            await self._reconcile(pmap)
        except NsqError as exc:
            log.error("%s: cannot follow the new partition map: %s", self.topic, exc)

    async def _reconcile(self, pmap: PartitionMap, *, initial: bool = False) -> None:
        """Connect what the map asks for and is not connected; retire moved leaders."""
        if self.closing:
            return
        if pmap.meta is not None:
            if self._config.ordered is None and pmap.ordered and not self.use_ordered:
                log.info("%s is an ordered topic: subscribing with SUB_ORDERED", self.topic)
                self.use_ordered = True
            self._ext = pmap.extend_support
        if pmap.fork:
            self._nodes.update(((n.address, p), n) for p, n in pmap.partitions.items())
        wanted = self._wanted(pmap)
        self._check_partitions_exist(pmap, initial=initial)
        # -1 (vanilla) is never a key of _leaders: it never moves
        moved = [(p, self._leaders[p], a) for a, p in wanted if self._leaders.get(p, a) != a]
        self._leaders.update((p, a) for a, p in wanted if p >= 0)
        for partition, old, new in moved:
            log.info("%s partition %d: leader moved %s -> %s", self.topic, partition, old, new)
            self._ctx.tally.of(partition)["leader_changes"] += 1
            self._emit(events.LeaderChanged, partition=partition, old=old, new=new)
        for (address, partition), slot in list(self.slots.items()):
            if self._leaders.get(partition, address) != address and not slot.retired:
                # the partition is now read from another node: drain this slot, then close it
                slot.retired = True
                log.info("%s: leaving %s (the partition moved)", self.topic, slot)
                self._ctx.flow.remove(slot.key)  # its budget goes to the new leader
                drain = slot.drain(self._config.drain_timeout)
                self._background.spawn(drain, f"nsq_ha-retire-{slot.key}")
        await self._connect_all(wanted, initial=initial)

    # -- connecting ---------------------------------------------------------------------------

    async def _connect_all(self, wanted: list[ConnKey], *, initial: bool) -> None:
        tasks = [  # not those subscribed, or being subscribed (or in their reconnect loop)
            self._launch(key, self._connect(key, initial=initial))
            for key in wanted
            if key not in self.slots and key not in self._connecting
        ]
        if initial:
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(result, BaseException):
                    raise result

    def _launch(self, key: ConnKey, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work, name=f"nsq_ha-sub-{key}")
        self._connecting[key] = task

        def done(task: asyncio.Task[None]) -> None:
            if self._connecting.get(key) is task:
                del self._connecting[key]
            if not task.cancelled():
                task.exception()  # retrieved: the loop logged it, or start() re-raises it

        task.add_done_callback(done)
        return task

    async def _connect(self, key: ConnKey, *, initial: bool) -> None:
        """The first subscription try; at start a failure a user must fix is raised, any other
        starts the reconnect loop in a task of its own."""
        started = time.monotonic()
        try:
            await self._subscribe(key)
        except NsqError as exc:
            if initial and not decide(exc).retry:
                raise
            if not self.closing:
                self._launch(key, self._reconnect(key, exc, started))

    async def _reconnect(self, key: ConnKey, error: NsqError, started: float) -> None:
        """Each try looks the topic up afresh and subscribes if the map still names this node
        for the partition (else the lookup's watcher subscribes to the new leader)."""
        where = f"partition {key[1] if key[1] >= 0 else '-'} on {key[0]}"
        if not decide(error).retry:
            log.error(
                "%s %s: %s: needs fixing; trying again", self.topic, where, redact(str(error))
            )

        async def again(_attempt: int) -> None:
            if self.closing:
                return
            if self._lookup is not None:
                pmap = await self._lookup.refresh(self.topic, "r")
                if key not in self._wanted(pmap) or self.closing:
                    return
            await self._subscribe(key)

        await retry_after(
            error,
            again,
            what=f"{self.topic}/{self.channel} {where}",
            backoff=self._backoff,
            started=started,
            should_retry=lambda exc: isinstance(exc, NsqError) and not self.closing,
            on_retry=lambda failure: self._emit(
                events.Reconnecting,
                partition=key[1] if key[1] >= 0 else None,
                address=key[0],
                error=redact(str(failure.error)),
                attempt=failure.attempt,
                delay=failure.wait,
            ),
            describe=lambda exc: redact(str(exc)),
            logger=log,
        )

    async def _open(
        self,
        address: str,
        partition: int | None,
        handlers: Callable[[bool], tuple[Callable[[Any], object], Callable[[Any], object]]],
        probe: bool = False,
    ) -> tuple[NsqdConnection, bool]:
        """A subscribed connection and whether it is ordered (``probe``: always); a mode nsqd
        asks for (ordered, ext) is used from then on."""
        for _ in range(_MODE_SWITCHES):
            ordered = self.use_ordered or probe
            advanced = self._config.with_offsets and not ordered
            on_message, on_error = handlers(ordered)
            config = self._config.connection_config(extend_support=self._ext)
            conn = NsqdConnection(address, config=config, on_message=on_message, on_error=on_error)
            try:
                await conn.connect()
                if (ordered or advanced) and not conn.is_fork:
                    what = "ordered consumption" if ordered else "with_offsets (SUB_ADVANCED)"
                    raise UnsupportedByServerError(
                        f"{what} needs the fork; nsqd {conn.address} is vanilla"
                    )
                await conn.subscribe(
                    self.topic, self.channel, partition, ordered=ordered, advanced=advanced
                )
            except BaseException as exc:
                await conn.close()
                if isinstance(exc, SubOrderRequiredError) and self._config.ordered is not False:
                    log.info("%s: nsqd says the topic is ordered: using SUB_ORDERED", self.topic)
                    self.use_ordered = True
                elif isinstance(exc, ExtendSupportRequiredError):
                    log.info("%s: nsqd says it is an ext topic: using extend_support", self.topic)
                    self._ext = True
                elif isinstance(exc, ExtendSupportForbiddenError):
                    self._ext = False
                else:
                    raise
                continue
            return conn, ordered
        raise ConfigError(f"{self.topic}: nsqd keeps refusing the subscription mode")

    async def _subscribe(self, key: ConnKey) -> None:
        partition = None if key[1] < 0 else key[1]
        if partition is not None and partition not in self._placed:
            await self._place(key, partition)
        tried: list[Slot] = []  # a slot per try of _open

        def handlers(ordered: bool) -> tuple[Callable[[Any], object], Callable[[Any], object]]:
            tried.append(Slot(self._ctx, key, ordered))
            return tried[-1].on_message, tried[-1].on_error

        conn, ordered = await self._open(key[0], partition, handlers)
        if self.closing:
            await conn.close()
            return
        slot = self.slots[key] = tried[-1]
        slot.conn = conn
        log.info(
            "consuming %s/%s partition %s from %s (%s)",
            self.topic,
            self.channel,
            key[1] if key[1] >= 0 else "-",
            conn.address,
            "SUB_ORDERED" if ordered else ("SUB_ADVANCED" if self._config.with_offsets else "SUB"),
        )
        self._ctx.flow.add(key, conn, max_rdy=conn.negotiated.max_rdy_count, ordered=ordered)
        self._background.spawn(self._watch(slot, conn), f"nsq_ha-watch-{key}")

    async def _place(self, key: ConnKey, partition: int) -> None:
        """Before the partition's first SUB: a new channel is created and moved to ``start``."""
        body = start_body(self._config.start, partition)
        node = self._nodes.get(key)
        if body is None or node is None:
            self._placed.add(partition)  # nothing to apply (or no map: nsqd= addresses)
            return
        topic, channel = self.topic, self.channel
        where = f"{topic}/{channel} partition {partition}"
        try:
            async with nsqd_admin(node.http_url) as admin:
                if partition not in self._created:
                    if await channel_exists(admin, topic, channel, partition):
                        log.info(
                            "%s: the channel exists and keeps its position (start= "
                            "applies to new channels)",
                            where,
                        )
                        self._placed.add(partition)
                        return
                    await admin.create_channel(topic, channel, partition)
                    self._created.add(partition)
                if self.use_ordered:  # ordered before it moves: SUB_ORDERED's own switch would
                    # reset the reader after the move and send the partition's first message twice
                    await admin.set_order(topic, channel, partition, ordered=True)
                try:
                    await move(admin, topic, channel, partition, body)
                    if self.use_ordered:
                        await self._release_held(admin, key[0], partition, body)
                except NsqError as exc:
                    if decide(retriable(exc)).retry:
                        raise
                    try:  # leave no channel at the wrong position: a later start makes it anew
                        await admin.delete_channel(topic, channel, partition)
                    except NsqError as failed:
                        log.error(
                            "%s: created, not moved to its start, and not deleted (%s): it "
                            "starts at the partition's end; seek it",
                            where,
                            failed,
                        )
                    else:
                        self._created.discard(partition)
                    raise
        except NsqError as exc:
            raise retriable(exc) from exc
        self._created.discard(partition)
        self._placed.add(partition)
        log.info("%s: new channel at %s", where, body)

    async def _release_held(
        self, admin: NsqdAdmin, address: str, partition: int, body: str
    ) -> None:
        """nsqd's channel pump holds a message read before the move across it: take it on a
        connection of our own and move again while it is in flight (the move forgets it, and an
        ordered pump reads nothing while a message is in flight)."""
        first: list[bytes] = []
        arrived = asyncio.Event()

        def take(message: Any) -> None:
            first.append(message.id)
            arrived.set()

        # in the ext mode nsqd asks for; on_error: the FIN of the message the move forgot
        conn, _ = await self._open(address, partition, lambda _: (take, lambda _e: None), True)
        try:
            conn.rdy(1)
            try:
                async with asyncio.timeout(HELD_WAIT):
                    await arrived.wait()
            except TimeoutError:
                return  # nothing held, and nothing at the start yet
            conn.rdy(0)
            await conn.sync(timeout=ADMIN_TIMEOUT)
            await move(admin, self.topic, self.channel, partition, body)
            conn.fin(first[0])  # answered "not in flight": settles it on our side
            await conn.sync(timeout=ADMIN_TIMEOUT)
        finally:
            await conn.close()

    # -- failures -----------------------------------------------------------------------------

    async def _watch(self, slot: Slot, conn: NsqdConnection) -> None:
        """Once the connection closed: forget it, abandon what it held, make it again."""
        await conn.wait_closed()
        if self.slots.get(slot.key) is slot:
            del self.slots[slot.key]
        if not slot.retired:  # a retired slot's budget went elsewhere already
            self._ctx.flow.remove(slot.key)
        slot.abandon_all()
        if self.closing or slot.retired or slot.key in self._connecting:
            return
        reason = conn.close_reason or "closed by nsqd"
        error = reason if isinstance(reason, NsqError) else NsqError(str(reason))
        self._launch(slot.key, self._reconnect(slot.key, error, time.monotonic()))
