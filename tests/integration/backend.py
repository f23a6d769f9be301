"""One small surface over the two fork clusters the ``backend`` fixture gives a test.

* :class:`ForkBackend`: the session's real fork cluster (etcd + nsqlookupd + 3 nsqd,
  :class:`nsq_ha.testing.servers.ForkCluster`), shared with every other fork test: it is never
  stopped here, and a topic another module already created is reused.
* :class:`DevBackend`: the embedded broker (:class:`nsq_ha.devcluster.DevClusterThread`,
  3 nodes) on its own loop thread, one per test module.

A test module lists the topics it needs as :class:`~nsq_ha.admin.TopicSpec` and creates them
all up front with :meth:`Backend.ensure_topics` (a new fork topic takes seconds to become
writable).  Nodes are named by their TCP ``host:port``, as lookup answers name them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from nsq_ha.admin import TopicSpec
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.testing.servers import ForkCluster, NsqdNode

#: 4 partitions, replica 1: the same name as the session topic of tests/conftest.py
#: (``fork_topic4``), so on the fork both share one topic instead of waiting for two.
TOPIC4 = TopicSpec("nsqha_t4", partitions=4)


class Backend(ABC):
    """What the fork producer and consumer tests ask of a cluster."""

    #: the fixture parameter: ``"devcluster"`` or ``"fork"``
    name: str

    @property
    @abstractmethod
    def lookupd_http(self) -> str:
        """Base URL of lookupd's HTTP API."""

    @abstractmethod
    def http_urls(self) -> list[str]:
        """Base HTTP URL of every nsqd, in node order."""

    @abstractmethod
    def leader(self, topic: str, partition: int) -> str:
        """TCP ``host:port`` of the partition's leader (as an ``access=w`` lookup names it)."""

    @abstractmethod
    def ensure_topics(self, topics: Iterable[TopicSpec]) -> None:
        """Create the topics not created yet and return once every one is writable."""

    @abstractmethod
    @contextmanager
    def paused(self, tcp_address: str) -> Iterator[None]:
        """Freeze the nsqd at ``tcp_address`` (connections open, nothing read or answered)
        for the ``with`` block, then let it go on."""

    def wait_stable(self) -> None:  # noqa: B027 - the embedded cluster is always stable
        """Return once lookupd would accept a leader move (the fork refuses one while its
        cluster is not deemed stable; the harness nudges it, see ``ForkCluster.wait_stable``)."""

    def close(self) -> None:  # noqa: B027 - the shared fork cluster is not ours to stop
        """Release what this backend started."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} lookupd={self.lookupd_http}>"


class ForkBackend(Backend):
    """The session's real fork cluster."""

    name = "fork"

    def __init__(self, cluster: ForkCluster) -> None:
        self.cluster = cluster

    @property
    def lookupd_http(self) -> str:
        return self.cluster.lookupd_http

    def http_urls(self) -> list[str]:
        return [node.http_url for node in self.cluster.nodes]

    def leader(self, topic: str, partition: int) -> str:
        return self.cluster.leader_of(topic, partition).tcp_address

    def wait_stable(self) -> None:
        self.cluster.wait_stable(120.0)

    def ensure_topics(self, topics: Iterable[TopicSpec]) -> None:
        wanted = list(topics)
        for spec in wanted:
            if spec.name not in self.cluster.topics:
                self.cluster.create_topic(
                    spec.name,
                    spec.partitions,
                    spec.replicas,
                    ordered=spec.ordered,
                    ext=spec.ext,
                    wait=False,
                )
        for spec in wanted:
            self.cluster.wait_writable(spec.name)

    def _node(self, tcp_address: str) -> NsqdNode:
        return next(n for n in self.cluster.nodes if n.tcp_address == tcp_address)

    @contextmanager
    def paused(self, tcp_address: str) -> Iterator[None]:
        process = self._node(tcp_address).process
        process.pause()  # SIGSTOP
        try:
            yield
        finally:
            process.resume()


class DevBackend(Backend):
    """The embedded broker, started by (and private to) one test module."""

    name = "devcluster"

    def __init__(self) -> None:
        self.dev = DevClusterThread(nodes=3)
        self.dev.start()

    @property
    def lookupd_http(self) -> str:
        return self.dev.lookupd_http

    def http_urls(self) -> list[str]:
        return [node.http_url for node in self.dev.nodes]

    def leader(self, topic: str, partition: int) -> str:
        return self.dev.leader_of(topic, partition).tcp_address

    def ensure_topics(self, topics: Iterable[TopicSpec]) -> None:
        existing = set(self.dev.call(lambda: list(self.dev.cluster.topics)))
        for spec in topics:
            if spec.name not in existing:  # writable as soon as it exists
                self.dev.create_topic(
                    spec.name, spec.partitions, spec.replicas, ordered=spec.ordered, ext=spec.ext
                )

    def _index(self, tcp_address: str) -> int:
        return next(n.index for n in self.dev.nodes if n.tcp_address == tcp_address)

    @contextmanager
    def paused(self, tcp_address: str) -> Iterator[None]:
        index = self._index(tcp_address)
        self.dev.call(self.dev.cluster.pause_node, index)
        try:
            yield
        finally:
            self.dev.call(self.dev.cluster.resume_node, index)

    def close(self) -> None:
        self.dev.close()
