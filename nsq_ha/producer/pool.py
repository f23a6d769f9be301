"""A producer's nsqd connections, one per :data:`~nsq_ha.producer.routes.ConnKey`: opened on
first use (concurrent callers share the opening), reused while open, dropped when an error or a
new partition map says so, and closed together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable, MutableMapping
from typing import Any

from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.errors import BrokerError, ConnectionClosedError, ProducerClosedError
from nsq_ha.producer.routes import ConnKey, Routes
from nsq_ha.redact import redact_text as redact

__all__ = ["ConnectionPool"]

log = logging.getLogger(__name__)


class ConnectionPool:
    """Connections per key. ``stats["connections"]`` counts the ones opened.

    Once :attr:`aborting` is set (the producer gave up waiting for its publishes), no new
    connection is opened: :meth:`get` raises ProducerClosedError.
    """

    __slots__ = ("_background", "_opening", "_ready", "aborting", "config", "stats")

    def __init__(self, config: ConnectionConfig, stats: MutableMapping[str, int]) -> None:
        self.config = config
        self.stats = stats
        self.aborting = False
        self._opening: dict[ConnKey, asyncio.Task[NsqdConnection]] = {}
        self._ready: dict[ConnKey, NsqdConnection] = {}
        self._background: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._ready)

    @property
    def open_keys(self) -> tuple[ConnKey, ...]:
        """Keys of the connections open now."""
        return tuple(key for key, conn in self._ready.items() if not conn.closed)

    @property
    def keys(self) -> set[ConnKey]:
        """Keys of every connection kept, open or opening."""
        return {*self._opening, *self._ready}

    async def get(self, key: ConnKey) -> NsqdConnection:
        """The open connection for ``key``, opened now if there is none."""
        conn = self._ready.get(key)
        if conn is not None and not conn.closed:
            return conn
        task = self._opening.get(key)
        if (
            task is not None
            and task.done()
            and (task.cancelled() or task.exception() is not None or task.result().closed)
        ):
            del self._opening[key]
            task = None
        if task is None:
            if self.aborting:  # a graceful close still lets in-flight publishes connect
                raise ProducerClosedError("the producer closed before this publish was sent")
            task = asyncio.get_running_loop().create_task(
                self._open(key), name=f"nsq_ha-producer-connect-{key[0]}"
            )
            task.add_done_callback(_retrieve)
            self._opening[key] = task
        return await asyncio.shield(task)

    async def _open(self, key: ConnKey) -> NsqdConnection:
        conn = NsqdConnection(key[0], config=self.config, on_error=_on_conn_error)
        await conn.connect()
        self.stats["connections"] += 1
        if self.aborting:
            await conn.close()
            raise ProducerClosedError("the producer closed while connecting")
        if self._opening.get(key) is not asyncio.current_task():
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

    def drop(self, key: ConnKey) -> None:
        """Forget a connection and close it in the background (its pending answers finish)."""
        task = self._opening.pop(key, None)
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

    def drop_topics(self, topics: Iterable[str]) -> None:
        """Drop the connections that serve only ``topics`` (fork connections serve one topic;
        vanilla ones serve all and stay)."""
        names = set(topics)
        for key in self.keys:
            if key[1] in names:
                self.drop(key)

    def follow(self, routes: Routes) -> None:
        """Drop the connections of ``routes.topic`` to nodes no longer leading their partition
        (a lookup listener: the next publish there connects to the new leader)."""
        if not routes.fork:
            return
        for key in list(self._opening):
            address, topic, slot = key
            if topic != routes.topic:
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
                self.drop(key)

    async def close(self) -> None:
        """Close every connection (an opening one is cancelled) and wait for those closes."""
        conns = list(self._ready.values())
        for task in self._opening.values():
            task.cancel()
        self._opening.clear()
        self._ready.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    async def wait_closed(self) -> None:
        """Wait for the connections :meth:`drop` closes in the background."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _on_conn_error(error: BrokerError) -> None:
    log.warning("producer connection got an unsolicited error: %s", redact(str(error)))


def _retrieve(task: asyncio.Task[NsqdConnection]) -> None:
    if not task.cancelled():
        task.exception()
