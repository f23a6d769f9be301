"""The embedded cluster's model: nodes, topics, partitions, channel hubs, faults and events.

Plain data and the little behaviour that belongs to it; no sockets and no servers.  The TCP and
HTTP servers see a cluster through :class:`~nsq_ha.devcluster.view.ClusterView` and meet these
classes through it; a server's connection enters the model only as a :class:`Subscriber` of a
:class:`ChannelHub`.

* :class:`DevNode` (with its :class:`NodeState` and :class:`NodeFaults`), :class:`DevTopic`,
  :class:`DevPartition` (whose log and channels are a :class:`~nsq_ha.devcluster.store.Partition`
  every replica shares) and :class:`ChannelHub` (one channel's subscribers and the delivery
  round-robin between them);
* :class:`LookupdFaults`, the lookupd's fault switches;
* :class:`Event` records with an :class:`EventKind`, kept by an :class:`EventLog` that tests can
  wait on (:meth:`EventLog.wait_for`) instead of sleeping;
* :class:`ServerError`, the error the emulated servers answer with, and :class:`Limits`, the
  settings every node shares.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .ext_filter import message_tag
from .store import Channel, InFlight, Partition

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "FORK_VERSION",
    "ChannelHub",
    "DevNode",
    "DevPartition",
    "DevTopic",
    "Event",
    "EventKind",
    "EventLog",
    "Limits",
    "LookupdFaults",
    "NodeFaults",
    "NodeState",
    "ServerError",
    "Subscriber",
]

log = logging.getLogger("nsq_ha.devcluster")

#: the version string the emulated servers report (the fork build PROTOCOL.md was checked on)
FORK_VERSION = "0.3.7-HA.1.13.0"


def monotonic() -> float:
    """The monotonic clock every deadline uses."""
    return time.monotonic()


def wall_ns() -> int:
    """The wall clock message timestamps use (Unix nanoseconds)."""
    return time.time_ns()


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


class NodeState(enum.StrEnum):
    """What an emulated nsqd is doing (a paused node is up but answers nothing)."""

    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"


class EventKind(enum.StrEnum):
    """The kinds of :class:`Event` (their values are what the log prints)."""

    # the cluster and its nodes
    CLUSTER_STARTED = "cluster_started"
    CLUSTER_CLOSED = "cluster_closed"
    NODE_STOPPED = "node_stopped"
    NODE_KILLED = "node_killed"
    NODE_STARTED = "node_started"
    NODE_PAUSED = "node_paused"
    NODE_RESUMED = "node_resumed"
    # topics, partitions, channels
    TOPIC_CREATED = "topic_created"
    TOPIC_EXPANDED = "topic_expanded"
    TOPIC_DELETED = "topic_deleted"
    TOPIC_TOMBSTONED = "topic_tombstoned"
    LEADER_MOVED = "leader_moved"
    REPLICA_MOVED = "replica_moved"
    CHANNEL_CREATED = "channel_created"
    CHANNEL_DELETED = "channel_deleted"
    CHANNEL_EMPTIED = "channel_emptied"
    CHANNEL_PAUSED = "channel_paused"
    CHANNEL_UNPAUSED = "channel_unpaused"
    CHANNEL_SKIPPED = "channel_skipped"
    CHANNEL_UNSKIPPED = "channel_unskipped"
    CHANNEL_OFFSET_SET = "channel_offset_set"
    CHANNEL_ORDER_SET = "channel_order_set"
    CHANNEL_REGISTERED = "channel_registered"
    CHANNEL_UNREGISTERED = "channel_unregistered"
    CLUSTER_WRITE_DISABLED = "cluster_write_disabled"
    LOOKUPD_LOGLEVEL_SET = "lookupd_loglevel_set"
    # faults
    WRITABLE_SET = "writable_set"
    FAULT_SET = "fault_set"
    FAULTS_CLEARED = "faults_cleared"
    LOOKUPD_FAULT_HIT = "lookupd_fault_hit"
    RESPONSE_DROPPED = "response_dropped"
    CONNECTION_CUT = "connection_cut"
    # connections
    SUBSCRIBED = "subscribed"
    CONNECTION_DROPPED = "connection_dropped"
    CLIENT_TIMED_OUT = "client_timed_out"


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the cluster's event log."""

    #: seconds since the cluster started (monotonic)
    at: float
    #: what happened
    kind: EventKind
    #: free-form details (topic, partition, node index, fault parameters, peer address ...)
    detail: dict[str, Any]

    def __str__(self) -> str:
        detail = " ".join(f"{k}={v}" for k, v in self.detail.items())
        return f"{self.at:9.3f} {self.kind} {detail}"

    def matches(self, kind: EventKind, detail: dict[str, Any]) -> bool:
        """True for an event of ``kind`` whose details include every item of ``detail``."""
        return self.kind == kind and all(
            key in self.detail and self.detail[key] == value for key, value in detail.items()
        )


class EventLog:
    """The cluster's event log: every admin action and fault, and every connection outcome
    worth seeing, oldest first; listeners hear each new event as it is recorded."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._listeners: list[Callable[[Event], None]] = []
        self._t0 = time.monotonic()

    def __repr__(self) -> str:
        return f"<EventLog events={len(self.events)} listeners={len(self._listeners)}>"

    def restart_clock(self) -> None:
        """Count :attr:`Event.at` from now (the cluster started)."""
        self._t0 = time.monotonic()

    def record(self, kind: EventKind, **detail: Any) -> Event:
        """Append an event (and tell listeners); returns it."""
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

    def events_of(self, kind: EventKind | str) -> list[Event]:
        """The events of one kind, oldest first."""
        return [e for e in self.events if e.kind == kind]

    async def wait_for(
        self,
        kind: EventKind,
        *,
        timeout: float,  # noqa: ASYNC109 - required: a test must not wait forever
        since: int = 0,
        **detail: Any,
    ) -> Event:
        """The first event of ``kind`` whose details include ``detail``, at or after position
        ``since`` of :attr:`events` (take ``len(events)`` before acting to see only what
        follows), waiting up to ``timeout`` seconds for it; TimeoutError when none comes."""
        found = self._first(kind, detail, since)
        if found is not None:
            return found
        arrived: asyncio.Future[Event] = asyncio.get_running_loop().create_future()

        def listen(event: Event) -> None:
            if not arrived.done() and event.matches(kind, detail):
                arrived.set_result(event)

        unsubscribe = self.on_event(listen)
        try:
            async with asyncio.timeout(timeout):
                return await arrived
        finally:
            unsubscribe()

    def _first(self, kind: EventKind, detail: dict[str, Any], since: int) -> Event | None:
        return next((e for e in self.events[since:] if e.matches(kind, detail)), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The settings every emulated nsqd shares (seconds and bytes)."""

    max_msg_size: int = 1024 * 1024
    max_body_size: int = 5 * 1024 * 1024
    max_rdy_count: int = 2500
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_req_timeout: float = 3 * 24 * 3600.0
    client_timeout: float = 60.0
    #: an ``ssl.SSLContext`` for IDENTIFY's ``tls_v1`` (None: TLS is not offered)
    tls_context: Any = None


@dataclass
class NodeFaults:
    """Fault switches of one node's TCP server.

    * ``delay``: seconds to hold every response/error frame (not message frames) before writing;
      only for commands in ``commands`` when that is set;
    * ``drop``: how many of the next responses/errors to swallow (``-1``: all), same filter;
    * ``cut_after``: close each connection once the server has written this many more bytes
      to it (counted from when the fault was set; ``None``: off), possibly mid-frame;
      ``cut_epoch`` counts the settings, so a connection knows when to take a new budget.
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
    * ``stale``: answer ``/lookup`` from the snapshot taken when the fault was set;
    * ``delay``: seconds to hold every request before answering it.
    """

    fail_status: int | None = None
    fail_count: int | None = None
    stale: dict[tuple[str, str, str], Any] | None = None
    delay: float = 0.0


class Subscriber(Hashable, Protocol):
    """What a channel hub needs of a subscribed connection (the TCP server's connections)."""

    @property
    def node(self) -> DevNode:
        """The node it is connected to."""

    @property
    def msg_timeout(self) -> float:
        """Seconds a delivered message may stay in flight."""

    @property
    def desired_tag(self) -> str:
        """The tag it consumes (``""``: the untagged messages)."""

    def has_room(self) -> bool:
        """True when it may take one more message now."""

    def deliver(self, flight: InFlight) -> None:
        """Send one message (or acknowledge it when filtered out)."""

    def on_timeout(self, flight: InFlight) -> None:
        """A message it held timed out."""

    def drop(self, reason: str, *, abort: bool = False) -> None:
        """Close the connection without an error frame."""


@dataclass(eq=False)
class DevNode:
    """One emulated nsqd."""

    index: int
    host: str
    tcp_port: int = 0
    http_port: int = 0
    worker_id: int = 0
    state: NodeState = NodeState.STOPPED
    faults: NodeFaults = field(default_factory=NodeFaults)
    started_at: float = 0.0
    #: TCP connections accepted so far (nsqd numbers its clients 1, 2, ...)
    client_sequence: int = 0
    #: the open TCP connections (its TCP server keeps this set)
    connections: set[Any] = field(default_factory=set, repr=False)

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
        return self.state != NodeState.STOPPED

    def clients(self) -> list[Any]:
        """The open TCP connections of this node."""
        return list(self.connections)

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
        self.clients: list[Subscriber] = []
        self._turn = 0
        self.paused = False
        #: ``/channel/skip``: nothing is read for the channel until ``/channel/unskip``
        self.skipped = False

    def __repr__(self) -> str:
        return f"<ChannelHub {self.channel!r} clients={len(self.clients)} paused={self.paused}>"

    def add(self, client: Subscriber) -> None:
        """A SUB succeeded."""
        self.clients.append(client)

    def remove(self, client: Subscriber, now: float) -> None:
        """A subscriber left: what it held is requeued at once. The last one leaving an
        ``#ephemeral`` channel deletes the channel (nsqd's ``RemoveClient``)."""
        if client not in self.clients:
            self.channel.release(client, now)
            return
        self.clients.remove(client)
        self.channel.release(client, now)
        name = self.channel.name
        if not self.clients and name.endswith("#ephemeral"):
            self.partition.drop_channel(name, "an ephemeral channel's last consumer left")

    def drop_all(self, reason: str, *, where: Callable[[Subscriber], bool] | None = None) -> None:
        """Close the connections of every subscriber (those ``where`` accepts)."""
        for client in list(self.clients):
            if where is None or where(client):
                client.drop(reason)

    def dispatch(self, now: float) -> None:
        """Deliver while a message is ready and some subscriber has room.

        On an ext topic with tagged subscribers the message at the head goes to a subscriber
        of its ``##client_dispatch_tag`` when one is connected, else to an untagged one; while
        none of those has room, nothing behind it is delivered either (nsqd's channel pump
        blocks on that message the same way).
        """
        if self.paused or self.skipped:
            return
        channel, clients = self.channel, self.clients
        tags = {c.desired_tag for c in clients} - {""} if self.partition.topic.ext else set()
        while clients and channel.has_ready(now):
            group = clients
            if tags:
                head = channel.peek(now)
                tag = message_tag(head) if head is not None else ""
                wanted = tag if tag in tags else ""
                group = [c for c in clients if c.desired_tag == wanted]
            client = self._next_with_room(group)
            if client is None:
                return
            flight = channel.take(client, client.msg_timeout, now)
            if flight is None:
                return
            client.deliver(flight)
            again = channel.replay()
            if again is not None:
                _forget(again)

    def seek(
        self,
        now: float,
        *,
        offset: int | None = None,
        count: int | None = None,
        timestamp_ns: int | None = None,
        end: bool = False,
        read_ahead: bool = True,
    ) -> None:
        """Move the channel (:meth:`Channel.seek`); the holders of the in-flight messages it
        forgets get their RDY room back; then deliver what may go."""
        forgotten = self.channel.seek(
            offset=offset, count=count, timestamp_ns=timestamp_ns, end=end, read_ahead=read_ahead
        )
        for flight in forgotten:
            _forget(flight)
        self.dispatch(now)

    def _next_with_room(self, group: list[Subscriber]) -> Subscriber | None:
        """The next subscriber of ``group`` with RDY room, round-robin."""
        count = len(group)
        if count == 1:  # the usual case, without the round-robin arithmetic
            return group[0] if group[0].has_room() else None
        for step in range(count):
            client = group[(self._turn + step) % count]
            if client.has_room():
                self._turn = (self._turn + step + 1) % count
                return client
        return None

    def tick(self, now: float) -> None:
        """Time out in-flight messages (telling their holders), then deliver what is due."""
        for flight in self.channel.expire(now):
            on_timeout = getattr(flight.client, "on_timeout", None)
            if on_timeout is not None:
                on_timeout(flight)
        self.dispatch(now)


def _forget(flight: InFlight) -> None:
    """Tell a message's holder that the channel forgot it (nsqd's ``RequeuedMessage``)."""
    on_forgotten = getattr(flight.client, "on_forgotten", None)
    if on_forgotten is not None:
        on_forgotten(flight)


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
    #: added by an expansion and not given a leader yet (leaderless until then)
    expanding: bool = False
    #: absent from ``access=r`` lookups before this :func:`monotonic` time (an expansion)
    listed_after: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        """``(topic, partition)``."""
        return (self.topic.name, self.number)

    def led_by(self, node: DevNode) -> bool:
        """True when ``node`` leads this partition now."""
        return self.leader is node and not self.leaderless

    def hub(self, name: str) -> ChannelHub:
        """The channel ``name``'s hub, creating the channel (at the partition end) if new."""
        hub = self.hubs.get(name)
        if hub is None:
            hub = ChannelHub(self, self.store.channel(name))
            self.hubs[name] = hub
            self.topic.registrations[(self.number, name)] = None
        return hub

    def drop_channel(self, name: str, reason: str) -> bool:
        """Delete a channel, disconnecting its subscribers; False when there was none."""
        hub = self.hubs.pop(name, None)
        self.store.channels.pop(name, None)
        self.topic.registrations.pop((self.number, name), None)
        if hub is None:
            return False
        hub.drop_all(reason)
        return True

    def dispatch(self, now: float) -> None:
        """Let every channel deliver (after a publish)."""
        for hub in list(self.hubs.values()):
            hub.dispatch(now)


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
    #: (partition, channel) in the order nsqd registered them with nsqlookupd
    registrations: dict[tuple[int, str], None] = field(default_factory=dict)

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

    def led_by(self, node: DevNode) -> list[DevPartition]:
        """The partitions ``node`` leads now."""
        return [p for p in self.partitions if p.led_by(node)]

    def channel_names(self, partitions: Iterable[int] | None = None) -> list[str]:
        """The channels of ``partitions`` (all: None), each once, in the order they were
        registered, as nsqlookupd lists them in ``/channels`` and ``/lookup``."""
        wanted = None if partitions is None else set(partitions)
        names: dict[str, None] = {}
        for number, name in self.registrations:
            if wanted is None or number in wanted:
                names.setdefault(name, None)
        return list(names)


def hubs_of(topics: Iterable[DevTopic]) -> list[ChannelHub]:
    """Every channel hub of every partition of ``topics``."""
    return [hub for topic in topics for part in topic.partitions for hub in part.hubs.values()]
