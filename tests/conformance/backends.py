"""The two clusters the conformance cases run on, behind one small interface.

* :class:`ForkBackend`: the real fork (etcd + nsqlookupd + 3 nsqd) started by
  :class:`nsq_ha.testing.servers.ForkCluster`, private to the conformance module because the
  last cases move leaders and stop nodes.
* :class:`DevBackend`: the in-process emulator :class:`nsq_ha.devcluster.DevClusterThread`.

Both create every topic the module needs up front (:data:`TOPICS`) and answer the same
questions: who leads a partition, who holds a replica of it, which node holds none of it,
the HTTP URL of a node, and the two faults (move a leader, stop a node).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from nsq_ha.testing.servers import V1_ACCEPT, ForkCluster

if TYPE_CHECKING:
    from nsq_ha.devcluster import DevClusterThread
    from nsq_ha.testing.build import ServerBinaries


@dataclass(frozen=True)
class TopicDef:
    """A topic as lookupd's ``/topic/create`` makes it."""

    name: str
    partitions: int = 1
    replicas: int = 1
    ordered: bool = False
    ext: bool = False
    channel_auto_create: bool = True


#: 1 partition, replica 1: most command and error cases
PLAIN = "cf_plain"
#: 2 partitions, replica 2: "replica, not leader" and "node not hosting" cases; leader move
REP = "cf_rep"
#: ordered (orderedmulti), 2 partitions
ORDERED = "cf_ord"
#: ext topic (JSON headers), 1 partition
EXT = "cf_ext"
#: fresh partitions, each used by exactly one case that checks absolute ids/offsets
FRESH_TRACE = "cf_fresh_trace"
FRESH_EXT = "cf_fresh_ext"
FRESH_OFFSET = "cf_fresh_offset"
#: never published to: a partition with an empty commit log
EMPTY = "cf_empty"
#: replica 1: its node is stopped by the very last case
STOP = "cf_stop"

TOPICS: tuple[TopicDef, ...] = (
    TopicDef(PLAIN),
    TopicDef(REP, partitions=2, replicas=2),
    TopicDef(ORDERED, partitions=2, ordered=True),
    TopicDef(EXT, ext=True),
    TopicDef(FRESH_TRACE),
    TopicDef(FRESH_EXT, ext=True),
    TopicDef(FRESH_OFFSET),
    TopicDef(EMPTY),
    TopicDef(STOP),
)


class Backend(ABC):
    """What a conformance case may ask of a cluster."""

    name: str

    @property
    @abstractmethod
    def lookupd_http(self) -> str:
        """Base URL of (the leader) lookupd's HTTP API."""

    @abstractmethod
    def node_addresses(self) -> list[str]:
        """TCP ``host:port`` of every nsqd, in node order."""

    @abstractmethod
    def http_url(self, tcp_address: str) -> str:
        """Base HTTP URL of the nsqd listening on ``tcp_address``."""

    @abstractmethod
    def create_topics(self, topics: Sequence[TopicDef]) -> None:
        """Create every topic and return once all are writable."""

    @abstractmethod
    def leader(self, topic: str, partition: int = 0) -> str:
        """TCP address of the partition's leader."""

    @abstractmethod
    def hosts(self, topic: str, partition: int = 0) -> list[str]:
        """TCP addresses of every node holding the partition (leader included)."""

    @abstractmethod
    def move_leader(self, topic: str, partition: int = 0) -> str:
        """Move the partition's leadership to another replica; the new leader's address."""

    def wait_stable(self) -> None:  # noqa: B027 - most clusters are always stable
        """Wait until the cluster accepts a leader move (the real one refuses while unstable)."""

    @abstractmethod
    def stop_node(self, tcp_address: str) -> None:
        """Stop (SIGTERM-like, graceful) the nsqd at ``tcp_address``."""

    @abstractmethod
    def start_node(self, tcp_address: str) -> None:
        """Start a stopped nsqd again."""

    @abstractmethod
    def close(self) -> None:
        """Stop the whole cluster."""

    # -- derived -------------------------------------------------------------------------------

    def replica(self, topic: str, partition: int = 0) -> str:
        """TCP address of a node holding a replica of the partition without leading it."""
        leader = self.leader(topic, partition)
        others = [a for a in self.hosts(topic, partition) if a != leader]
        assert others, f"{topic}/{partition} has no replica besides its leader {leader}"
        return others[0]

    def non_host(self, topic: str, partition: int = 0) -> str:
        """TCP address of a node that holds no replica of the partition."""
        hosts = set(self.hosts(topic, partition))
        others = [a for a in self.node_addresses() if a not in hosts]
        assert others, f"every node holds {topic}/{partition}"
        return others[0]

    def leader_http(self, topic: str, partition: int = 0) -> str:
        """HTTP URL of the partition's leader."""
        return self.http_url(self.leader(topic, partition))


class ForkBackend(Backend):
    """The real fork cluster."""

    name = "fork"

    def __init__(self, binaries: ServerBinaries) -> None:
        self.cluster = ForkCluster(binaries, node_count=3)
        self.cluster.__enter__()
        self._http = httpx.Client(timeout=10.0)

    @property
    def lookupd_http(self) -> str:
        return self.cluster.lookupd_http

    def node_addresses(self) -> list[str]:
        return [n.tcp_address for n in self.cluster.nodes]

    def _node(self, tcp_address: str) -> Any:
        return next(n for n in self.cluster.nodes if n.tcp_address == tcp_address)

    def http_url(self, tcp_address: str) -> str:
        return str(self._node(tcp_address).http_url)

    def create_topics(self, topics: Sequence[TopicDef]) -> None:
        for t in topics:
            self.cluster.create_topic(
                t.name,
                t.partitions,
                t.replicas,
                t.ordered,
                t.ext,
                channel_auto_create=t.channel_auto_create,
                wait=False,
            )
        for t in topics:
            self.cluster.wait_writable(t.name, timeout=180)

    def leader(self, topic: str, partition: int = 0) -> str:
        return str(self.cluster.leader_of(topic, partition).tcp_address)

    def hosts(self, topic: str, partition: int = 0) -> list[str]:
        """Every nsqd whose ``/stats`` lists the partition (each lists only what it holds)."""
        found = []
        for node in self.cluster.nodes:
            if not node.process.running:
                continue
            resp = self._http.get(
                f"{node.http_url}/stats",
                params={"format": "json", "topic": topic},
                headers=V1_ACCEPT,
            )
            resp.raise_for_status()
            parts = [t["topic_partition"] for t in resp.json().get("topics") or []]
            if str(partition) in parts:
                found.append(node.tcp_address)
        return found

    def move_leader(self, topic: str, partition: int = 0) -> str:
        return str(self.cluster.move_leader(topic, partition).tcp_address)

    def wait_stable(self) -> None:
        self.cluster.wait_stable(timeout=240)

    def stop_node(self, tcp_address: str) -> None:
        self.cluster.stop_node(self._node(tcp_address).index)

    def start_node(self, tcp_address: str) -> None:
        self.cluster.start_node(self._node(tcp_address).index)

    def close(self) -> None:
        self._http.close()
        self.cluster.__exit__(None, None, None)


class DevBackend(Backend):
    """The in-process emulator."""

    name = "devcluster"

    def __init__(self) -> None:
        from nsq_ha.devcluster import DevClusterThread

        self.dev: DevClusterThread = DevClusterThread(nodes=3)
        self.dev.start()

    @property
    def lookupd_http(self) -> str:
        return self.dev.lookupd_http

    def node_addresses(self) -> list[str]:
        return [n.tcp_address for n in self.dev.nodes]

    def _index(self, tcp_address: str) -> int:
        return next(n.index for n in self.dev.nodes if n.tcp_address == tcp_address)

    def http_url(self, tcp_address: str) -> str:
        return self.dev.nodes[self._index(tcp_address)].http_url

    def create_topics(self, topics: Sequence[TopicDef]) -> None:
        for t in topics:
            self.dev.create_topic(
                t.name,
                t.partitions,
                t.replicas,
                ordered=t.ordered,
                ext=t.ext,
                disable_channel_auto_create=not t.channel_auto_create,
            )

    def leader(self, topic: str, partition: int = 0) -> str:
        return self.dev.leader_of(topic, partition).tcp_address

    def hosts(self, topic: str, partition: int = 0) -> list[str]:
        cluster = self.dev.cluster
        hosts: list[str] = self.dev.call(
            lambda: [n.tcp_address for n in cluster.partition(topic, partition).replicas]
        )
        return hosts

    def move_leader(self, topic: str, partition: int = 0) -> str:
        return self.dev.move_leader(topic, partition).tcp_address

    def stop_node(self, tcp_address: str) -> None:
        self.dev.stop_node(self._index(tcp_address))

    def start_node(self, tcp_address: str) -> None:
        self.dev.start_node(self._index(tcp_address))

    def close(self) -> None:
        self.dev.close()


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``predicate()`` until it returns a truthy value (returned) or fail after
    ``timeout`` seconds with ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)
