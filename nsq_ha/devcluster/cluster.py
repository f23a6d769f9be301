"""The embedded fork cluster: :class:`DevCluster` starts the servers around the model.

A :class:`DevCluster` owns

* the **model** (:mod:`.model`): nodes with a :class:`~nsq_ha.devcluster.model.NodeState`, the
  topics and their placement and leaders (a :class:`~nsq_ha.devcluster.topology.Topology`), the
  fault switches (:class:`~nsq_ha.devcluster.faults.FaultSwitches`) and the event log
  (:class:`~nsq_ha.devcluster.model.EventLog`: every admin action and fault, and every
  connection outcome worth seeing);
* the **servers**: per node one nsqd-compatible TCP server (:mod:`.nsqd.server`) and HTTP API
  (:mod:`.nsqd.http`), and one nsqlookupd-compatible HTTP server (:mod:`.lookupd`).  They see
  the cluster as a :class:`~nsq_ha.devcluster.view.ClusterView`, which this class implements;
* the **timers**: the ticker that times out in-flight messages and releases deferred ones, and
  the delayed failover after a kill.

Everything runs on one asyncio loop.  Methods that change state are plain functions meant to be
called on that loop (tests on the same loop call them directly; :class:`.threaded.DevClusterThread`
forwards them from other threads).  Tests wait for what the cluster does with
:meth:`DevCluster.wait_for` rather than sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from nsq_ha.errors import ConfigError

from .faults import FaultSwitches
from .http import HttpServer
from .lookupd import make_lookupd_handler
from .model import (
    ChannelHub,
    DevNode,
    DevPartition,
    DevTopic,
    Event,
    EventKind,
    EventLog,
    Limits,
    LookupdFaults,
    NodeState,
    monotonic,
    wall_ns,
)
from .nsqd import NsqdServer, make_nsqd_handler
from .store import StoredMessage
from .topology import Topology

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["EXPANSION_LISTED_AFTER", "EXPANSION_SETTLED_AFTER", "DevCluster"]

#: after an expansion, how long until ``access=r`` lookups list the new partitions (the fork:
#: about half a second)
EXPANSION_LISTED_AFTER = 0.5
#: and until they get leaders if nothing posts the topic's create again (the fork's periodic
#: topic check took about 90 s; the emulator does not make a test wait that long)
EXPANSION_SETTLED_AFTER = 5.0


@dataclass
class _NodeServers:
    """The two servers of a running node."""

    tcp: NsqdServer
    http: HttpServer


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
        self.limits = Limits(
            max_msg_size=max_msg_size,
            max_body_size=max_body_size,
            max_rdy_count=max_rdy_count,
            msg_timeout=msg_timeout,
            max_msg_timeout=max_msg_timeout,
            max_req_timeout=max_req_timeout,
            client_timeout=client_timeout,
            tls_context=tls_context,
        )
        self.failover_delay = failover_delay
        self.tick_interval = tick_interval
        self.log = EventLog()
        self.topology = Topology(
            self.nodes, self.log, allow_write_with_nochannels=allow_write_with_nochannels
        )
        self.faults = FaultSwitches(self.nodes, self.log)
        self._servers: dict[int, _NodeServers] = {}
        self._lookupd: HttpServer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.started = False

    def __repr__(self) -> str:
        state = "started" if self.started else "stopped"
        return f"<DevCluster {state} nodes={len(self.nodes)} topics={len(self.topics)}>"

    # -- settings (read-only views of :attr:`limits`) ---------------------------------------

    @property
    def max_msg_size(self) -> int:
        """Largest message body (bytes)."""
        return self.limits.max_msg_size

    @property
    def max_body_size(self) -> int:
        """Largest MPUB body (bytes)."""
        return self.limits.max_body_size

    @property
    def max_rdy_count(self) -> int:
        """Largest RDY count."""
        return self.limits.max_rdy_count

    @property
    def msg_timeout(self) -> float:
        """Default in-flight timeout (seconds)."""
        return self.limits.msg_timeout

    @property
    def max_msg_timeout(self) -> float:
        """Largest in-flight timeout a client may ask for (seconds)."""
        return self.limits.max_msg_timeout

    @property
    def max_req_timeout(self) -> float:
        """Largest REQ delay (seconds)."""
        return self.limits.max_req_timeout

    @property
    def client_timeout(self) -> float:
        """Read deadline before the first command; heartbeats default to half of it."""
        return self.limits.client_timeout

    @property
    def tls_context(self) -> Any:
        """The ``ssl.SSLContext`` offered to IDENTIFY ``tls_v1`` (None: no TLS)."""
        return self.limits.tls_context

    @property
    def allow_write_with_nochannels(self) -> bool:
        """Partitions without a channel are listed for writers."""
        return self.topology.allow_write_with_nochannels

    @property
    def topics(self) -> dict[str, DevTopic]:
        """The topics by name."""
        return self.topology.topics

    @property
    def lookupd_faults(self) -> LookupdFaults:
        """lookupd's fault switches."""
        return self.faults.lookupd

    @property
    def lookupd_http(self) -> str:
        """Base URL of lookupd's HTTP API."""
        return f"http://{self.host}:{self.lookupd_port}"

    # -- clocks -----------------------------------------------------------------------------

    @staticmethod
    def now() -> float:
        """The monotonic clock every deadline uses."""
        return monotonic()

    @staticmethod
    def wall_ns() -> int:
        """The wall clock message timestamps use (Unix nanoseconds)."""
        return wall_ns()

    # -- life cycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
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
        self.log.restart_clock()
        self._lookupd = HttpServer(make_lookupd_handler(self), self.host, self.lookupd_port)
        self.lookupd_port = await self._lookupd.start()
        for node in self.nodes:
            await self._start_node(node)
        self._ticker = asyncio.create_task(self._tick(), name="devcluster-ticker")
        self.started = True
        self.record(EventKind.CLUSTER_STARTED, lookupd=self.lookupd_http, nodes=len(self.nodes))

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
            self.record(EventKind.CLUSTER_CLOSED)
        self.started = False

    async def _start_node(self, node: DevNode) -> None:
        tcp = NsqdServer(self, node)
        node.tcp_port = await tcp.start(node.tcp_port)
        http = HttpServer(make_nsqd_handler(self, node), node.host, node.http_port)
        self._servers[node.index] = _NodeServers(tcp, http)
        node.http_port = await http.start()
        node.state = NodeState.RUNNING
        node.started_at = time.time()

    async def _stop_node(self, node: DevNode, *, kill: bool) -> None:
        servers = self._servers.pop(node.index, None)
        if servers is not None:
            await servers.tcp.close(abort=kill)
            await servers.http.close()
        node.state = NodeState.STOPPED

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
                hub.tick(now)

    # -- events -----------------------------------------------------------------------------

    @property
    def events(self) -> list[Event]:
        """The event log, oldest first."""
        return self.log.events

    def record(self, kind: EventKind, **detail: Any) -> Event:
        """Append an event to the log (and tell listeners); returns it."""
        return self.log.record(kind, **detail)

    def on_event(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` for every new event; returns a function that unsubscribes."""
        return self.log.on_event(listener)

    def events_of(self, kind: EventKind | str) -> list[Event]:
        """The events of one kind, oldest first."""
        return self.log.events_of(kind)

    async def wait_for(
        self,
        kind: EventKind,
        *,
        timeout: float,  # noqa: ASYNC109 - required: a test must not wait forever
        since: int = 0,
        **detail: Any,
    ) -> Event:
        """Wait for an event instead of sleeping: see :meth:`EventLog.wait_for`.

        ``await cluster.wait_for(EventKind.LEADER_MOVED, topic="t", timeout=5)`` returns the
        first such event in the log, or the next one to come within 5 seconds.
        """
        return await self.log.wait_for(kind, timeout=timeout, since=since, **detail)

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
        """Create a topic as lookupd's ``/topic/create`` does: :meth:`Topology.create_topic`.
        Posting a grown topic's create again runs lookupd's topic check: its listed new
        partitions get their leaders now (as the fork's check does when nudged)."""
        topic = self.topology.create_topic(
            name,
            partitions,
            replicas,
            ordered=ordered,
            ext=ext,
            multi_part=multi_part,
            disable_channel_auto_create=disable_channel_auto_create,
            sync_every=sync_every,
            retention_days=retention_days,
            placement=placement,
        )
        self.topology.settle_expansion(topic)
        return topic

    def expand_topic(self, name: str, partitions: int) -> None:
        """Grow a topic as lookupd's ``/topic/partition/expand`` does
        (:meth:`Topology.expand_topic`): the count at once, the new partitions in ``access=r``
        lookups after :data:`EXPANSION_LISTED_AFTER` seconds and writable when the topic's
        create is posted again after that, or after :data:`EXPANSION_SETTLED_AFTER` seconds."""
        listed = self.now() + EXPANSION_LISTED_AFTER
        added = self.topology.expand_topic(name, partitions, listed_after=listed)
        if added:
            self._spawn(self._settle_later(added[0].topic), f"expand-{name}")

    async def _settle_later(self, topic: DevTopic) -> None:
        await asyncio.sleep(EXPANSION_SETTLED_AFTER)
        if self.topology.topics.get(topic.name) is topic:
            self.topology.settle_expansion(topic)

    def delete_topic(self, name: str) -> None:
        """Remove a topic everywhere (its subscribers are disconnected)."""
        self.topology.delete_topic(name)

    def topic(self, name: str) -> DevTopic:
        """The topic ``name`` (KeyError when unknown)."""
        return self.topics[name]

    def partition(self, topic: str, partition: int) -> DevPartition:
        """One partition (KeyError when unknown)."""
        return self.topology.partition(topic, partition)

    def leader_of(self, topic: str, partition: int) -> DevNode:
        """The node leading ``topic``/``partition``."""
        return self.partition(topic, partition).leader

    def replica_of(self, topic: str, partition: int) -> DevNode | None:
        """A node holding a replica of the partition without leading it (None if replica 1)."""
        part = self.partition(topic, partition)
        return next((n for n in part.replicas if n is not part.leader), None)

    def hubs(self) -> list[ChannelHub]:
        """Every channel of every partition."""
        return self.topology.hubs()

    def create_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """Create ``channel`` on one partition (or all), at the partition's end."""
        self.topology.create_channel(topic, channel, partition)

    # -- the node's view (used by the TCP and HTTP servers) ---------------------------------

    def resolve_partition(
        self, node: DevNode, topic_name: str, partition: int, *, for_write: bool
    ) -> DevPartition:
        """The partition a command on ``node`` addresses, and ``node`` must lead it."""
        return self.topology.resolve_partition(node, topic_name, partition, for_write=for_write)

    def hosted_partition(
        self, node: DevNode, topic_name: str, partition: int, *, for_write: bool
    ) -> DevPartition:
        """The partition of ``topic_name`` held by ``node``: :meth:`Topology.hosted_partition`."""
        return self.topology.hosted_partition(node, topic_name, partition, for_write=for_write)

    @staticmethod
    def check_leader(node: DevNode, part: DevPartition, *, fatal: bool) -> None:
        """``E_FAILED_ON_NOT_LEADER`` unless ``node`` leads ``part`` now."""
        Topology.check_leader(node, part, fatal=fatal)

    def unwritable(self, part: DevPartition) -> bool:
        """True when publishes to ``part`` must fail with ``E_FAILED_ON_NOT_WRITABLE``."""
        return self.faults.unwritable(part)

    def append(
        self, part: DevPartition, messages: list[tuple[bytes, int, bytes | None]]
    ) -> list[StoredMessage]:
        """Store ``(body, trace_id, header)`` messages and wake the channels."""
        return self.topology.append(part, messages)

    def lookup_answer(
        self, topic_name: str, *, access: str = "r", partition: str = "*", metainfo: bool = False
    ) -> dict[str, Any]:
        """The ``/lookup`` result object: :meth:`Topology.lookup_answer`."""
        return self.topology.lookup_answer(
            topic_name, access=access, partition=partition, metainfo=metainfo
        )

    # -- nodes and leaders ------------------------------------------------------------------

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
        target = None if to is None else self.node(to)
        return self.topology.move_leader(self.partition(topic, partition), target)

    async def stop_node(self, which: int | DevNode, *, kill: bool = False) -> None:
        """Stop a node: its connections close (``kill``: reset, nothing flushed).

        A graceful stop hands each partition it leads to a running replica at once; after a
        kill, those partitions vanish from ``access=w`` lookups and get a new leader after
        ``failover_delay`` seconds (partitions without a running replica stay leaderless
        until the node returns).
        """
        node = self.node(which)
        if node.state == NodeState.STOPPED:
            return
        await self._stop_node(node, kill=kill)
        self.record(EventKind.NODE_KILLED if kill else EventKind.NODE_STOPPED, node=node.index)
        led = self.topology.led_by(node)
        if not kill:
            for part in led:
                self.topology.fail_over(part)
            return
        for part in led:
            part.leaderless = True
        self._spawn(self._delayed_failover(led), f"failover-node{node.index}")

    async def _delayed_failover(self, parts: list[DevPartition]) -> None:
        await asyncio.sleep(self.failover_delay)
        for part in parts:
            if part.leaderless:
                self.topology.fail_over(part)

    async def start_node(self, which: int | DevNode) -> None:
        """Start a stopped node again on the same ports; its leaderless partitions return."""
        node = self.node(which)
        if node.state != NodeState.STOPPED:
            return
        await self._start_node(node)
        self.topology.node_returned(node)
        self.record(EventKind.NODE_STARTED, node=node.index)

    def pause_node(self, which: int | DevNode) -> None:
        """Freeze a node: connections stay open, nothing is read or written, lookup still
        lists it (a hung process)."""
        node = self.node(which)
        node.state = NodeState.PAUSED
        self.record(EventKind.NODE_PAUSED, node=node.index)

    def resume_node(self, which: int | DevNode) -> None:
        """Undo :meth:`pause_node`."""
        node = self.node(which)
        if node.state == NodeState.PAUSED:
            node.state = NodeState.RUNNING
            servers = self._servers.get(node.index)
            if servers is not None:
                servers.tcp.resume()
            self.record(EventKind.NODE_RESUMED, node=node.index)

    # -- faults -----------------------------------------------------------------------------

    def set_writable(self, topic: str, partition: int, writable: bool) -> None:
        """Make publishes to a partition fail with ``E_FAILED_ON_NOT_WRITABLE`` (or stop it).

        Lookups keep listing the partition, so a producer meets the error and must retry.
        """
        self.faults.set_writable(self.partition(topic, partition), writable)

    def delay_responses(
        self, which: int | DevNode, seconds: float, *, commands: Iterable[str] | None = None
    ) -> None:
        """Hold each response/error frame of a node ``seconds`` before writing it (0: off)."""
        self.faults.delay_responses(self.node(which), seconds, commands=commands)

    def drop_responses(
        self, which: int | DevNode, count: int = 1, *, commands: Iterable[str] | None = None
    ) -> None:
        """Swallow the next ``count`` response/error frames of a node (-1: all, 0: off)."""
        self.faults.drop_responses(self.node(which), count, commands=commands)

    def cut_after(self, which: int | DevNode, nbytes: int | None) -> None:
        """Close each of a node's connections after it has written ``nbytes`` more bytes
        to it (``None``: off).  The cut can fall inside a frame."""
        node = self.node(which)
        self.faults.cut_after(node, nbytes)
        servers = self._servers.get(node.index)
        if servers is not None:
            servers.tcp.arm_cut()

    def lookupd_fail(self, status: int | None = 500, *, count: int | None = None) -> None:
        """Answer lookupd requests with HTTP ``status`` (``count`` times, or until cleared;
        ``None`` clears)."""
        self.faults.lookupd_fail(status, count=count)

    def lookupd_stale(self, stale: bool = True) -> None:
        """Freeze ``/lookup`` answers as they are now (stale routing), or unfreeze."""
        self.faults.lookupd_stale(stale)

    def clear_faults(self) -> None:
        """Turn every fault off (nodes are not restarted or resumed)."""
        self.faults.clear()
