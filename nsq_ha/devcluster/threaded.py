"""A :class:`DevCluster` on its own loop thread, driven from synchronous code.

For blocking tests, the sync client facade, the pytest fixture and scripts::

    with DevClusterThread(nodes=3) as dev:
        dev.create_topic("orders", partitions=4, replicas=2, ordered=True)
        producer = nsq_ha.sync.Producer(lookupd=dev.lookupd_http)

Every method runs on the cluster's loop and returns its result; :meth:`call` runs any
:class:`DevCluster` method (awaiting it if it is a coroutine function).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

from .cluster import DevCluster
from .model import DevNode, DevTopic, Event, EventKind

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["DevClusterThread"]


class DevClusterThread:
    """Start a :class:`DevCluster` (same keyword arguments) on a daemon thread."""

    def __init__(self, nodes: int = 3, **options: Any) -> None:
        self._options = dict(options, nodes=nodes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._cluster: DevCluster | None = None

    @property
    def cluster(self) -> DevCluster:
        """The cluster; touch its state only through :meth:`call`."""
        if self._cluster is None:
            raise RuntimeError("the DevClusterThread is not started")
        return self._cluster

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start the loop thread and the cluster; returns once every server listens."""
        if self._thread is not None:
            return
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="devcluster", daemon=True)
        self._thread.start()
        cluster = DevCluster(**self._options)
        try:
            asyncio.run_coroutine_threadsafe(cluster.start(), loop).result()
        except BaseException:
            self._cluster = cluster
            self.close()
            raise
        self._cluster = cluster

    def close(self) -> None:
        """Stop the cluster and the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._cluster is not None:
            asyncio.run_coroutine_threadsafe(self._cluster.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = self._thread = None

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on the cluster's loop; await it if it is async."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the DevClusterThread is not started")

        async def run() -> Any:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), loop).result(60)

    # -- the common calls, typed --------------------------------------------------------

    @property
    def lookupd_http(self) -> str:
        """Base URL of lookupd's HTTP API."""
        return self.cluster.lookupd_http

    @property
    def nodes(self) -> list[DevNode]:
        """The nodes (read-only use)."""
        return self.cluster.nodes

    @property
    def events(self) -> list[Event]:
        """A copy of the event log."""
        events: list[Event] = self.call(lambda: list(self.cluster.events))
        return events

    def create_topic(
        self, name: str, partitions: int = 1, replicas: int = 1, **flags: Any
    ) -> DevTopic:
        """:meth:`DevCluster.create_topic`."""
        topic: DevTopic = self.call(self.cluster.create_topic, name, partitions, replicas, **flags)
        return topic

    def leader_of(self, topic: str, partition: int) -> DevNode:
        """:meth:`DevCluster.leader_of`."""
        node: DevNode = self.call(self.cluster.leader_of, topic, partition)
        return node

    def replica_of(self, topic: str, partition: int) -> DevNode | None:
        """:meth:`DevCluster.replica_of`."""
        node: DevNode | None = self.call(self.cluster.replica_of, topic, partition)
        return node

    def move_leader(self, topic: str, partition: int, to: int | None = None) -> DevNode:
        """:meth:`DevCluster.move_leader`."""
        node: DevNode = self.call(self.cluster.move_leader, topic, partition, to)
        return node

    def stop_node(self, index: int, *, kill: bool = False) -> None:
        """:meth:`DevCluster.stop_node`."""
        self.call(self.cluster.stop_node, index, kill=kill)

    def start_node(self, index: int) -> None:
        """:meth:`DevCluster.start_node`."""
        self.call(self.cluster.start_node, index)

    def wait_for(self, kind: EventKind, *, timeout: float, since: int = 0, **detail: Any) -> Event:
        """:meth:`DevCluster.wait_for`: block until the event is in the log (TimeoutError)."""
        coro = self.cluster.wait_for(kind, timeout=timeout, since=since, **detail)
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the DevClusterThread is not started")
        event: Event = asyncio.run_coroutine_threadsafe(coro, loop).result(timeout + 5)
        return event
