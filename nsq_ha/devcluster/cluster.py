"""The embedded fork cluster: nodes, topics, placement, leaders, faults and the event log.

:class:`DevCluster` is the whole emulated cluster.  It owns

* the **nodes**: one nsqd-compatible TCP server and HTTP API each (:mod:`.nsqd`,
  :mod:`.nsqd_http`), with a state (running / paused / stopped);
* the **topics**: N partitions each, placed on ``replica`` nodes with one leader, every
  partition's log and channels in a :class:`~nsq_ha.devcluster.store.Partition` that all its
  replicas share (replication is perfect and synchronous: a new leader has every acknowledged
  message and every channel cursor, as the fork's ISR replication promises);
* one nsqlookupd-compatible HTTP server (:mod:`.lookupd`), whose answers this module assembles
  (:meth:`DevCluster.lookup_answer`);
* the **fault switches** (:class:`NodeFaults`, :class:`LookupdFaults`) the servers consult;
* the **event log** (:attr:`DevCluster.events`): every admin action and fault, and every
  connection outcome worth seeing, as :class:`Event` records.

Everything runs on one asyncio loop.  Methods that change state are plain functions meant to be
called on that loop (tests on the same loop call them directly; :class:`.threaded.DevClusterThread`
forwards them from other threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Self

from nsq_ha.errors import ConfigError
from nsq_ha.protocol.names import is_valid_name

from .store import Channel, Partition, StoredMessage

if TYPE_CHECKING:
    from types import TracebackType

    from .http import HttpServer
    from .nsqd import ClientConnection, NsqdServer

__all__ = [
    "FORK_VERSION",
    "DevCluster",
    "DevNode",
    "DevPartition",
    "DevTopic",
    "Event",
    "LookupdFaults",
    "NodeFaults",
    "ServerError",
]

log = logging.getLogger("nsq_ha.devcluster")

#: the version string the emulated servers report (the fork build PROTOCOL.md was checked on)
FORK_VERSION = "0.3.7-HA.1.13.0"
MAX_PARTITIONS = 254
MAX_REPLICAS = 5
#: nsqlookupd clamps a topic's ``syncdisk`` to this
MAX_SYNC_EVERY = 4000


class ServerError(Exception):
    """An error the emulated nsqd answers with: ``code``, ``description``, fatal or not.

    The error frame's text is ``code + " " + description`` (a trailing space when the
    description is empty, as on the real server).  ``fatal`` means the connection is closed
    after the frame (PROTOCOL.md §2.19).  ``description=None`` sends the bare code (only
    ``E_BAD_PROTOCOL`` does that).
    """

    def __init__(self, code: str, description: str | None = "", *, fatal: bool = True) -> None:
        text = code if description is None else f"{code} {description}"
        super().__init__(text)
        self.code = code
        self.description = description or ""
        self.fatal = fatal
        self.text = text


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the cluster's event log."""

    #: seconds since the cluster started (monotonic)
    at: float
    #: what happened: ``topic_created``, ``leader_moved``, ``node_stopped``, ``fault_set`` ...
    kind: str
    #: free-form details (topic, partition, node index, fault parameters, peer address ...)
    detail: dict[str, Any]

    def __str__(self) -> str:
        detail = " ".join(f"{k}={v}" for k, v in self.detail.items())
        return f"{self.at:9.3f} {self.kind} {detail}"


@dataclass
class NodeFaults:
    """Fault switches of one node's TCP server.

    * ``delay``: seconds to hold every response/error frame (not message frames) before writing;
      only for commands in ``commands`` when that is set;
    * ``drop``: how many of the next responses/errors to swallow (``-1``: all), same filter;
    * ``cut_after``: close each connection once the server has written this many more bytes
      to it (counted from when the fault was set; ``None``: off), possibly mid-frame;
    * ``unwritable``: partitions (``(topic, partition)``) whose publishes answer
      ``E_FAILED_ON_NOT_WRITABLE`` (non-fatal).
    """

    delay: float = 0.0
    drop: int = 0
    commands: frozenset[str] | None = None
    cut_after: int | None = None
    cut_epoch: int = 0

    def applies_to(self, command: str) -> bool:
        """True when the delay/drop filter covers ``command``."""
        return self.commands is None or command in self.commands


@dataclass
class LookupdFaults:
    """Fault switches of the lookupd HTTP server.

    * ``fail_status``: answer every request with this HTTP status (``None``: off), for
      ``fail_count`` more requests (``None``: until cleared);
    * ``stale``: answer ``/lookup`` from the snapshot taken when the fault was set.
    """

    fail_status: int | None = None
    fail_count: int | None = None
    stale: dict[tuple[str, str, str], Any] | None = None
    delay: float = 0.0


@dataclass(eq=False)
class DevNode:
    """One emulated nsqd."""

    index: int
    host: str
    tcp_port: int = 0
    http_port: int = 0
    worker_id: int = 0
    state: Literal["running", "paused", "stopped"] = "stopped"
    faults: NodeFaults = field(default_factory=NodeFaults)
    server: NsqdServer | None = field(default=None, repr=False)
    http: HttpServer | None = field(default=None, repr=False)
    started_at: float = 0.0

    @property
    def tcp_address(self) -> str:
        """``host:port`` of the TCP protocol."""
        return f"{self.host}:{self.tcp_port}"

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP API."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def distributed_id(self) -> str:
        """``ip:rpc_port:tcp_port:worker_id`` as the fork names nodes; there is no RPC port
        in the emulator, so the HTTP port stands in for it."""
        return f"{self.host}:{self.http_port}:{self.tcp_port}:{self.worker_id}"

    @property
    def running(self) -> bool:
        """True when the node serves (a paused node is up but answers nothing)."""
        return self.state != "stopped"

    def clients(self) -> list[ClientConnection]:
        """The open TCP connections of this node."""
        return [] if self.server is None else list(self.server.clients)

    def node_object(self) -> dict[str, Any]:
        """The node as lookupd lists it (key order as on the real server)."""
        return {
            "id": f"{self.host}:{self.tcp_port}",
            "remote_address": f"{self.host}:{self.tcp_port}",
            "hostname": f"devnode{self.index}",
            "broadcast_address": self.host,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": FORK_VERSION,
            "distributed_id": self.distributed_id,
        }


class ChannelHub:
    """The subscribers of one channel of one partition and the delivery loop between them.

    :meth:`dispatch` is called whenever something may let a message go out (publish, RDY,
    FIN, REQ, a timer); it hands messages round-robin to subscribers with RDY room.
    """

    def __init__(self, partition: DevPartition, channel: Channel) -> None:
        self.partition = partition
        self.channel = channel
        self.clients: list[ClientConnection] = []
        self._turn = 0
        self.paused = False

    def add(self, client: ClientConnection) -> None:
        """A SUB succeeded."""
        self.clients.append(client)

    def remove(self, client: ClientConnection, now: float) -> None:
        """A subscriber left: what it held is requeued at once."""
        if client in self.clients:
            self.clients.remove(client)
        self.channel.release(client, now)

    def dispatch(self, now: float) -> None:
        """Deliver while a message is ready and some subscriber has room."""
        if self.paused:
            return
        channel = self.channel
        while self.clients and channel.has_ready(now):
            count = len(self.clients)
            for step in range(count):
                client = self.clients[(self._turn + step) % count]
                if client.has_room():
                    self._turn = (self._turn + step + 1) % count
                    break
            else:
                return
            flight = channel.take(client, client.msg_timeout, now)
            if flight is None:
                return
            client.deliver(flight)


@dataclass(eq=False)
class DevPartition:
    """One partition of a topic: where it lives and its shared log."""

    topic: DevTopic
    number: int
    replicas: list[DevNode]
    leader: DevNode
    store: Partition
    hubs: dict[str, ChannelHub] = field(default_factory=dict)
    #: leader unknown (killed, failover pending): absent from ``access=w`` lookups
    leaderless: bool = False

    @property
    def key(self) -> tuple[str, int]:
        """``(topic, partition)``."""
        return (self.topic.name, self.number)

    def hub(self, name: str) -> ChannelHub:
        """The channel ``name``'s hub, creating the channel (at the partition end) if new."""
        hub = self.hubs.get(name)
        if hub is None:
            hub = ChannelHub(self, self.store.channel(name))
            self.hubs[name] = hub
        return hub


@dataclass(eq=False)
class DevTopic:
    """A topic as created through ``/topic/create``."""

    name: str
    partition_num: int
    replica: int
    ordered: bool = False
    ext: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False
    #: ``syncdisk`` and ``retention`` as created (0: nsqd's defaults); not emulated, but part of
    #: the meta a re-create must match, as on the fork
    sync_every: int = 0
    retention_days: int = 0
    partitions: list[DevPartition] = field(default_factory=list)
    registered_channels: set[str] = field(default_factory=set)

    def meta(self) -> dict[str, Any]:
        """The ``meta`` object of a lookup (keys sorted, as Go serialises that map)."""
        return {
            "disable_channel_auto_create": self.disable_channel_auto_create,
            "extend_support": self.ext,
            "multi_part": self.multi_part,
            "ordered": self.ordered,
            "partition_num": self.partition_num,
            "replica": self.replica,
        }


_EMPTY_META = {
    "disable_channel_auto_create": False,
    "extend_support": False,
    "multi_part": False,
    "ordered": False,
    "partition_num": 0,
    "replica": 0,
}


class DevCluster:
    """An in-process emulation of a fork cluster: one lookupd and ``nodes`` nsqd.

    ::

        async with DevCluster(nodes=3) as cluster:
            cluster.create_topic("orders", partitions=4, replicas=2, ordered=True)
            producer = Producer(lookupd=cluster.lookupd_http)

    Topics are writable as soon as :meth:`create_topic` returns (the real cluster needs its
    topic check first) and, unlike the real lookupd's default, partitions without a channel are
    listed for writers (``allow_write_with_nochannels``, as the test clusters run).
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        host: str = "127.0.0.1",
        lookupd_port: int = 0,
        nsqd_tcp_ports: Iterable[int] | None = None,
        nsqd_http_ports: Iterable[int] | None = None,
        max_msg_size: int = 1024 * 1024,
        max_body_size: int = 5 * 1024 * 1024,
        max_rdy_count: int = 2500,
        msg_timeout: float = 60.0,
        max_msg_timeout: float = 900.0,
        max_req_timeout: float = 3 * 24 * 3600.0,
        client_timeout: float = 60.0,
        failover_delay: float = 1.0,
        allow_write_with_nochannels: bool = True,
        tls_context: Any = None,
        tick_interval: float = 0.05,
    ) -> None:
        if nodes < 1:
            raise ConfigError(f"a cluster needs at least one node, got {nodes}")
        self.host = host
        self.lookupd_port = lookupd_port
        tcp_ports = list(nsqd_tcp_ports or [0] * nodes)
        http_ports = list(nsqd_http_ports or [0] * nodes)
        if len(tcp_ports) != nodes or len(http_ports) != nodes:
            raise ConfigError("give one TCP and one HTTP port per node (or none)")
        self.nodes = [
            DevNode(i, host, tcp_ports[i], http_ports[i], worker_id=i + 1) for i in range(nodes)
        ]
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.max_rdy_count = max_rdy_count
        self.msg_timeout = msg_timeout
        self.max_msg_timeout = max_msg_timeout
        self.max_req_timeout = max_req_timeout
        self.client_timeout = client_timeout
        self.failover_delay = failover_delay
        self.allow_write_with_nochannels = allow_write_with_nochannels
        self.tls_context = tls_context
        self.tick_interval = tick_interval
        self.topics: dict[str, DevTopic] = {}
        self.events: list[Event] = []
        self.lookupd_faults = LookupdFaults()
        self._unwritable: set[tuple[str, int]] = set()
        self._listeners: list[Callable[[Event], None]] = []
        self._lookupd: HttpServer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._t0 = time.monotonic()
        self._placement_turn = 0
        self.started = False

    # -- clocks -----------------------------------------------------------------------------

    @staticmethod
    def now() -> float:
        """The monotonic clock every deadline uses."""
        return time.monotonic()

    @staticmethod
    def wall_ns() -> int:
        """The wall clock message timestamps use (Unix nanoseconds)."""
        return time.time_ns()

    # -- life cycle -------------------------------------------------------------------------

    @property
    def lookupd_http(self) -> str:
        """Base URL of the lookupd HTTP API (what clients take as ``lookupd=``)."""
        return f"http://{self.host}:{self.lookupd_port}"

    def __repr__(self) -> str:
        return f"<DevCluster lookupd={self.lookupd_http} nodes={len(self.nodes)}>"

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start lookupd and every node on their ports (free ports when 0)."""
        from .http import HttpServer
        from .lookupd import make_lookupd_handler

        self._t0 = time.monotonic()
        self._lookupd = HttpServer(make_lookupd_handler(self), self.host, self.lookupd_port)
        self.lookupd_port = await self._lookupd.start()
        for node in self.nodes:
            await self._start_node(node)
        self._ticker = asyncio.create_task(self._tick(), name="devcluster-ticker")
        self.started = True
        self.record("cluster_started", lookupd=self.lookupd_http, nodes=len(self.nodes))

    async def close(self) -> None:
        """Stop everything; open connections are closed."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        for task in list(self._tasks):
            task.cancel()
        for node in self.nodes:
            await self._stop_node(node, kill=False)
        if self._lookupd is not None:
            await self._lookupd.close()
            self._lookupd = None
        if self.started:
            self.record("cluster_closed")
        self.started = False

    async def _start_node(self, node: DevNode) -> None:
        from .http import HttpServer
        from .nsqd import NsqdServer
        from .nsqd_http import make_nsqd_handler

        node.server = NsqdServer(self, node)
        node.tcp_port = await node.server.start(node.tcp_port)
        node.http = HttpServer(make_nsqd_handler(self, node), node.host, node.http_port)
        node.http_port = await node.http.start()
        node.state = "running"
        node.started_at = time.time()

    async def _stop_node(self, node: DevNode, *, kill: bool) -> None:
        if node.server is not None:
            await node.server.close(abort=kill)
            node.server = None
        if node.http is not None:
            await node.http.close()
            node.http = None
        node.state = "stopped"

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tick(self) -> None:
        """Time out in-flight messages and release due deferred ones."""
        while True:
            await asyncio.sleep(self.tick_interval)
            now = self.now()
            for hub in self.hubs():
                for flight in hub.channel.expire(now):
                    client = flight.client
                    if hasattr(client, "on_timeout"):
                        client.on_timeout(flight)
                hub.dispatch(now)

    # -- events -----------------------------------------------------------------------------

    def record(self, kind: str, **detail: Any) -> Event:
        """Append an event to the log (and tell listeners); returns it."""
        event = Event(round(time.monotonic() - self._t0, 6), kind, detail)
        self.events.append(event)
        log.info("devcluster %s", event)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a listener must not break the cluster
                log.exception("devcluster event listener failed")
        return event

    def on_event(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` for every new event; returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def events_of(self, kind: str) -> list[Event]:
        """The events of one kind, oldest first."""
        return [e for e in self.events if e.kind == kind]

    # -- topics -----------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replicas: int = 1,
        *,
        ordered: bool = False,
        ext: bool = False,
        multi_part: bool = True,
        disable_channel_auto_create: bool = False,
        sync_every: int = 0,
        retention_days: int = 0,
        placement: list[list[int]] | None = None,
    ) -> DevTopic:
        """Create a topic as lookupd's ``/topic/create`` does (same validation and errors,
        raised as :class:`ServerError` with the lookupd message as ``code``).

        Partition ``p``'s replicas are ``replicas`` consecutive nodes starting at a rotating
        node; the first is the leader (``placement`` gives each partition's node indexes
        instead, leader first).  Re-creating with identical parameters is a no-op; different
        parameters raise ``already exist``.  ``sync_every`` (the fork's ``syncdisk``, clamped
        to 4000 as nsqlookupd does) and ``retention_days`` are only remembered for that
        comparison: the emulator keeps every message in memory whatever they say.
        """
        if not name:
            raise ServerError("MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise ServerError("INVALID_ARG_TOPIC")
        if not 1 <= partitions <= 255:
            raise ServerError("INVALID_ARG_TOPIC_PARTITION_NUM")
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ServerError("INVALID_ARG_TOPIC_REPLICATOR")
        if partitions > MAX_PARTITIONS:
            raise ServerError("max partition allowed exceed")
        spread = ordered or multi_part
        if len(self.nodes) < replicas or (not spread and len(self.nodes) < partitions * replicas):
            raise ServerError(f"No node is available for topic: {name}")
        sync_every = min(sync_every, MAX_SYNC_EVERY)
        existing = self.topics.get(name)
        if existing is not None:
            same = (
                existing.partition_num,
                existing.replica,
                existing.ordered,
                existing.ext,
                existing.disable_channel_auto_create,
                existing.sync_every,
                existing.retention_days,
            ) == (
                partitions,
                replicas,
                ordered,
                ext,
                disable_channel_auto_create,
                sync_every,
                retention_days,
            )
            if not same:
                raise ServerError("already exist")
            return existing
        topic = DevTopic(
            name,
            partitions,
            replicas,
            ordered=ordered,
            ext=ext,
            multi_part=multi_part and not ordered,
            disable_channel_auto_create=disable_channel_auto_create,
            sync_every=sync_every,
            retention_days=retention_days,
        )
        count = len(self.nodes)
        if placement is not None and (
            len(placement) != partitions
            or any(len(set(p)) != replicas or not set(p) <= set(range(count)) for p in placement)
        ):
            raise ConfigError(f"placement must list {replicas} distinct nodes per partition")
        for number in range(partitions):
            first = (self._placement_turn + number * replicas) % count
            indexes = (
                placement[number]
                if placement is not None
                else [(first + k) % count for k in range(replicas)]
            )
            nodes = [self.nodes[i] for i in indexes]
            store = Partition(
                name, number, ordered=ordered, ext=ext, clock=self.now, wall_clock_ns=self.wall_ns
            )
            topic.partitions.append(DevPartition(topic, number, nodes, nodes[0], store))
        self._placement_turn = (self._placement_turn + 1) % count
        self.topics[name] = topic
        self.record(
            "topic_created",
            topic=name,
            partitions=partitions,
            replicas=replicas,
            ordered=ordered,
            ext=ext,
            leaders=[p.leader.index for p in topic.partitions],
        )
        return topic

    def delete_topic(self, name: str) -> None:
        """Remove a topic everywhere (its subscribers are disconnected)."""
        topic = self.topics.pop(name, None)
        if topic is None:
            raise ServerError("TOPIC_NOT_FOUND")
        for part in topic.partitions:
            for hub in part.hubs.values():
                for client in list(hub.clients):
                    client.drop("topic deleted")
        self.record("topic_deleted", topic=name)

    def topic(self, name: str) -> DevTopic:
        """The topic ``name`` (KeyError when unknown)."""
        return self.topics[name]

    def partition(self, topic: str, partition: int) -> DevPartition:
        """One partition (KeyError when unknown)."""
        return self.topics[topic].partitions[partition]

    def leader_of(self, topic: str, partition: int) -> DevNode:
        """The node leading ``topic``/``partition``."""
        return self.partition(topic, partition).leader

    def replica_of(self, topic: str, partition: int) -> DevNode | None:
        """A node holding a replica of the partition without leading it (None if replica 1)."""
        part = self.partition(topic, partition)
        return next((n for n in part.replicas if n is not part.leader), None)

    def hubs(self) -> Iterator[ChannelHub]:
        """Every channel of every partition."""
        for topic in list(self.topics.values()):
            for part in topic.partitions:
                yield from list(part.hubs.values())

    def create_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """Create ``channel`` on one partition (or all), at the partition's end."""
        top = self.topics[topic]
        parts = top.partitions if partition is None else [top.partitions[partition]]
        for part in parts:
            part.hub(channel)
        self.record("channel_created", topic=topic, channel=channel, partition=partition)

    # -- the node's view (used by the TCP and HTTP servers) ---------------------------------

    def resolve_partition(
        self, node: DevNode, topic_name: str, partition: int, *, for_write: bool
    ) -> DevPartition:
        """The partition a command on ``node`` addresses, or the error nsqd answers:
        :meth:`hosted_partition` then :meth:`check_leader`."""
        part = self.hosted_partition(node, topic_name, partition, for_write=for_write)
        self.check_leader(node, part, fatal=not for_write)
        return part

    def hosted_partition(
        self, node: DevNode, topic_name: str, partition: int, *, for_write: bool
    ) -> DevPartition:
        """The partition of ``topic_name`` held by ``node`` (leader or replica).

        ``partition`` -1 means the node's default partition: one it leads.  Raises
        ``E_TOPIC_NOT_EXIST`` when the node holds no such partition and, for writes to an
        ordered topic without a partition, the multi-partition ``E_BAD_PARTITION``.
        """
        topic = self.topics.get(topic_name)
        if topic is None:
            raise ServerError("E_TOPIC_NOT_EXIST")
        if partition == -1:
            if topic.ordered and for_write:
                raise ServerError(
                    "E_BAD_PARTITION", "topic partition is not valid for multi partition: -1"
                )
            led = [p for p in topic.partitions if p.leader is node and not p.leaderless]
            if not led:
                raise ServerError("E_TOPIC_NOT_EXIST")
            return led[0]
        if not 0 <= partition < len(topic.partitions):
            raise ServerError("E_TOPIC_NOT_EXIST")
        part = topic.partitions[partition]
        if node not in part.replicas:
            raise ServerError("E_TOPIC_NOT_EXIST")
        return part

    @staticmethod
    def check_leader(node: DevNode, part: DevPartition, *, fatal: bool) -> None:
        """``E_FAILED_ON_NOT_LEADER`` unless ``node`` leads ``part`` now."""
        if part.leader is not node or part.leaderless:
            raise ServerError("E_FAILED_ON_NOT_LEADER", fatal=fatal)

    def unwritable(self, part: DevPartition) -> bool:
        """True when publishes to ``part`` must fail with ``E_FAILED_ON_NOT_WRITABLE``."""
        return part.key in self._unwritable

    def append(
        self,
        part: DevPartition,
        messages: list[tuple[bytes, int, bytes | None]],
    ) -> list[StoredMessage]:
        """Store ``(body, trace_id, header)`` messages and wake the channels."""
        stored = [
            part.store.append(body, trace_id=trace, header=header)
            for body, trace, header in messages
        ]
        now = self.now()
        for hub in list(part.hubs.values()):
            hub.dispatch(now)
        return stored

    # -- lookup -----------------------------------------------------------------------------

    def lookup_answer(
        self,
        topic_name: str,
        *,
        access: str = "r",
        partition: str = "*",
        metainfo: bool = False,
    ) -> dict[str, Any]:
        """The ``/lookup`` result object (PROTOCOL.md §5.2), before the HTTP envelope.

        Raises :class:`ServerError` with the lookupd message as ``code`` for the 404 cases
        (``Key not found``) of ``access=w``.
        """
        topic = self.topics.get(topic_name)
        answer: dict[str, Any] = {"channels": []}
        if topic is None:
            if access == "w":
                raise ServerError("Key not found")
            if metainfo:
                answer["meta"] = dict(_EMPTY_META)
            answer["partitions"] = {}
            answer["producers"] = []
            return answer
        parts = [
            p for p in topic.partitions if partition in ("*", "") or str(p.number) == partition
        ]
        listed: dict[str, dict[str, Any]] = {}
        channels: list[str] = []
        for part in parts:
            for name in part.hubs:
                if name not in channels:
                    channels.append(name)
            leader = part.leader
            if access == "w":
                if part.leaderless or leader.state == "stopped":
                    continue
                if not part.hubs and not self.allow_write_with_nochannels:
                    continue
            listed[str(part.number)] = leader.node_object()
        answer["channels"] = channels
        if metainfo:
            answer["meta"] = topic.meta()
        if access == "w" and parts and not listed and not self.allow_write_with_nochannels:
            raise ServerError("Topic has no channel, should init at least one for the new topic")
        producers: list[dict[str, Any]] = []
        for node_object in listed.values():
            if node_object not in producers:
                producers.append(node_object)
        answer["partitions"] = listed
        answer["producers"] = producers
        return answer

    # -- faults -----------------------------------------------------------------------------

    def node(self, which: int | DevNode) -> DevNode:
        """A node by index (or the node itself)."""
        return which if isinstance(which, DevNode) else self.nodes[which]

    def move_leader(self, topic: str, partition: int, to: int | DevNode | None = None) -> DevNode:
        """Make another replica the leader of ``topic``/``partition`` now; returns it.

        As on the real cluster: the old leader's SUB connections to that partition are closed
        without an error frame, a PUB there answers ``E_FAILED_ON_NOT_LEADER`` (non-fatal), and
        the new leader's next internal id skips one.  ``to`` picks the replica (default: the
        next one); the partition must have replicas.
        """
        part = self.partition(topic, partition)
        old = part.leader
        candidates = [n for n in part.replicas if n is not old and n.state != "stopped"]
        if to is not None:
            target = self.node(to)
            if target not in part.replicas:
                # like a real move: the partition is copied to the target first
                part.replicas.append(target)
            candidates = [target]
        if not candidates:
            raise ServerError(f"no replica of {topic}/{partition} can take the leadership")
        new = candidates[0]
        self._set_leader(part, new, reason="move")
        return new

    def _set_leader(self, part: DevPartition, new: DevNode, *, reason: str) -> None:
        old = part.leader
        part.leader = new
        part.leaderless = False
        part.store.next_id += 1  # observed: the new leader's ids skip one
        for hub in part.hubs.values():
            for client in list(hub.clients):
                if client.node is old:
                    client.drop(f"leader of {part.topic.name}/{part.number} moved")
        self.record(
            "leader_moved",
            topic=part.topic.name,
            partition=part.number,
            old=old.index,
            new=new.index,
            reason=reason,
        )

    async def stop_node(self, which: int | DevNode, *, kill: bool = False) -> None:
        """Stop a node: its connections close (``kill``: reset, nothing flushed).

        A graceful stop hands each partition it leads to a running replica at once; after a
        kill, those partitions vanish from ``access=w`` lookups and get a new leader after
        ``failover_delay`` seconds (partitions without a running replica stay leaderless
        until the node returns).
        """
        node = self.node(which)
        if node.state == "stopped":
            return
        await self._stop_node(node, kill=kill)
        self.record("node_killed" if kill else "node_stopped", node=node.index)
        led = [p for t in self.topics.values() for p in t.partitions if p.leader is node]
        if not kill:
            for part in led:
                self._fail_over(part)
            return
        for part in led:
            part.leaderless = True
        self._spawn(self._delayed_failover(led), f"failover-node{node.index}")

    async def _delayed_failover(self, parts: list[DevPartition]) -> None:
        await asyncio.sleep(self.failover_delay)
        for part in parts:
            if part.leaderless:
                self._fail_over(part)

    def _fail_over(self, part: DevPartition) -> None:
        running = [n for n in part.replicas if n is not part.leader and n.state == "running"]
        if running:
            self._set_leader(part, running[0], reason="failover")
        else:
            part.leaderless = part.leader.state == "stopped"

    async def start_node(self, which: int | DevNode) -> None:
        """Start a stopped node again on the same ports; its leaderless partitions return."""
        node = self.node(which)
        if node.state != "stopped":
            return
        await self._start_node(node)
        for topic in self.topics.values():
            for part in topic.partitions:
                if part.leader is node:
                    part.leaderless = False
        self.record("node_started", node=node.index)

    def pause_node(self, which: int | DevNode) -> None:
        """Freeze a node: connections stay open, nothing is read or written, lookup still
        lists it (a hung process)."""
        node = self.node(which)
        node.state = "paused"
        self.record("node_paused", node=node.index)

    def resume_node(self, which: int | DevNode) -> None:
        """Undo :meth:`pause_node`."""
        node = self.node(which)
        if node.state == "paused":
            node.state = "running"
            if node.server is not None:
                node.server.resume()
            self.record("node_resumed", node=node.index)

    def set_writable(self, topic: str, partition: int, writable: bool) -> None:
        """Make publishes to a partition fail with ``E_FAILED_ON_NOT_WRITABLE`` (or stop it).

        Lookups keep listing the partition, so a producer meets the error and must retry.
        """
        key = (topic, partition)
        self.partition(topic, partition)
        if writable:
            self._unwritable.discard(key)
        else:
            self._unwritable.add(key)
        self.record("writable_set", topic=topic, partition=partition, writable=writable)

    def delay_responses(
        self, which: int | DevNode, seconds: float, *, commands: Iterable[str] | None = None
    ) -> None:
        """Hold each response/error frame of a node ``seconds`` before writing it (0: off)."""
        node = self.node(which)
        node.faults.delay = seconds
        node.faults.commands = None if commands is None else frozenset(commands)
        self.record(
            "fault_set",
            fault="delay",
            node=node.index,
            seconds=seconds,
            commands=sorted(node.faults.commands or []),
        )

    def drop_responses(
        self, which: int | DevNode, count: int = 1, *, commands: Iterable[str] | None = None
    ) -> None:
        """Swallow the next ``count`` response/error frames of a node (-1: all, 0: off)."""
        node = self.node(which)
        node.faults.drop = count
        node.faults.commands = None if commands is None else frozenset(commands)
        self.record(
            "fault_set",
            fault="drop",
            node=node.index,
            count=count,
            commands=sorted(node.faults.commands or []),
        )

    def cut_after(self, which: int | DevNode, nbytes: int | None) -> None:
        """Close each of a node's connections after it has written ``nbytes`` more bytes
        to it (``None``: off).  The cut can fall inside a frame."""
        node = self.node(which)
        node.faults.cut_after = nbytes
        node.faults.cut_epoch += 1
        if node.server is not None:
            node.server.arm_cut()
        self.record("fault_set", fault="cut_after", node=node.index, nbytes=nbytes)

    def lookupd_fail(self, status: int | None = 500, *, count: int | None = None) -> None:
        """Answer lookupd requests with HTTP ``status`` (``count`` times, or until cleared;
        ``None`` clears)."""
        self.lookupd_faults.fail_status = status
        self.lookupd_faults.fail_count = count
        self.record("fault_set", fault="lookupd_fail", status=status, count=count)

    def lookupd_stale(self, stale: bool = True) -> None:
        """Freeze ``/lookup`` answers as they are now (stale routing), or unfreeze."""
        self.lookupd_faults.stale = {} if stale else None
        self.record("fault_set", fault="lookupd_stale", stale=stale)

    def clear_faults(self) -> None:
        """Turn every fault off (nodes are not restarted or resumed)."""
        for node in self.nodes:
            node.faults = NodeFaults(cut_epoch=node.faults.cut_epoch + 1)
        self._unwritable.clear()
        self.lookupd_faults = LookupdFaults()
        self.record("faults_cleared")


def check_ext_header(header: bytes, *, ext_topic: bool) -> int | None:
    """Validate a PUB_EXT/MPUB_EXT/``/pub_ext`` JSON header as nsqd does; return its trace id.

    Returns the ``##trace_id`` value (``None`` when absent).  Raises the non-fatal
    ``E_INVALID_JSON_HEADER`` (not a JSON object; an empty header is a parse error),
    ``INVALID_TRACE_ID`` (not a string / not a decimal u64) or ``E_EXT_NOT_SUPPORT``
    (the topic is not ext; the caller adds the topic name to the description).
    """
    try:
        value = json.loads(header.decode()) if header else None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ServerError(
            "E_INVALID_JSON_HEADER",
            f"fail to parse json header:cannot parse JSON: {exc}",
            fatal=False,
        ) from None
    if value is None and not header:
        raise ServerError(
            "E_INVALID_JSON_HEADER",
            "fail to parse json header:cannot parse JSON: cannot parse empty string; "
            'unparsed tail: ""',
            fatal=False,
        )
    if not isinstance(value, dict):
        raise ServerError(
            "E_INVALID_JSON_HEADER",
            "fail to parse json header:value doesn't contain object",
            fatal=False,
        )
    trace_id: int | None = None
    if "##trace_id" in value:
        raw = value["##trace_id"]
        if not isinstance(raw, str):
            raise ServerError("INVALID_TRACE_ID", "passin trace id should be string", fatal=False)
        if not (raw.isascii() and raw.isdigit()) or int(raw) >= 1 << 64:
            raise ServerError("INVALID_TRACE_ID", "invalid trace id", fatal=False)
        trace_id = int(raw)
    if not ext_topic:
        raise ServerError("E_EXT_NOT_SUPPORT", "ext content not supported in topic", fatal=False)
    return trace_id
