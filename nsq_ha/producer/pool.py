"""Opening and closing a producer's nsqd connections (:class:`ConnectionPool`). On the fork a
connection serves one partition of one topic and is kept by that
:class:`~nsq_ha.producer.topic.Topic` (its ``conns``); on vanilla nsqd one connection per node
serves every topic and is kept here (:attr:`ConnectionPool.shared`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.errors import BrokerError, ConnectionClosedError, ProducerClosedError
from nsq_ha.producer.routes import ConnKey
from nsq_ha.redact import redact_text as redact

log = logging.getLogger(__name__)

#: a topic's fork connections: partition -> the open connection to its leader
Conns = MutableMapping[int, NsqdConnection]


class ConnectionPool:
    """Opens, drops and closes connections (``stats["connections"]`` counts the opened); once
    :attr:`aborting` is set (the producer gave up on its publishes), :meth:`get` opens none."""

    __slots__ = ("_background", "_opening", "aborting", "config", "shared", "stats")

    def __init__(self, config: ConnectionConfig, stats: MutableMapping[str, int]) -> None:
        self.config = config
        self.stats = stats
        self.aborting = False
        #: vanilla nsqd: address -> the connection that serves every topic there
        self.shared: dict[str, NsqdConnection] = {}
        self._opening: dict[ConnKey, asyncio.Task[NsqdConnection]] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def get(self, key: ConnKey, conns: Conns) -> NsqdConnection:
        """A new connection for ``key`` (the caller found none open there), kept in ``conns``
        (fork) or :attr:`shared` (vanilla); concurrent callers share the opening."""
        task = self._opening.get(key)
        if task is None:
            if self.aborting:  # a graceful close still lets in-flight publishes connect
                raise ProducerClosedError("the producer closed before this publish was sent")
            task = asyncio.get_running_loop().create_task(
                self._open(key, conns), name=f"nsq_ha-producer-connect-{key[0]}"
            )
            task.add_done_callback(_retrieve)
            self._opening[key] = task
        return await asyncio.shield(task)

    async def _open(self, key: ConnKey, conns: Conns) -> NsqdConnection:
        address, topic, slot = key
        try:
            conn = NsqdConnection(address, config=self.config, on_error=_on_conn_error)
            await conn.connect()
            self.stats["connections"] += 1
            if self.aborting:
                await conn.close()
                raise ProducerClosedError("the producer closed while connecting")
            if self._opening.get(key) is not asyncio.current_task():
                # dropped while connecting (the partition map moved, or an error on this key):
                # the caller retries through a fresh lookup
                await conn.close()
                raise ConnectionClosedError(f"connection to {address} dropped while it was opening")
            if topic:
                conns[slot] = conn
            else:
                self.shared[address] = conn
        finally:
            if self._opening.get(key) is asyncio.current_task():
                del self._opening[key]
        kind, where = "fork" if conn.is_fork else "vanilla", f" for {topic}/{slot}" if topic else ""
        log.info("producer connected to %s (%s)%s", address, kind, where)
        return conn

    def opening(self, topic: str) -> list[ConnKey]:
        return [key for key in self._opening if key[1] == topic]

    def drop(self, key: ConnKey, conns: Conns) -> None:
        """Forget the connection of ``key`` and close it in the background (its pending
        answers finish); one being opened is abandoned."""
        address, topic, slot = key
        self._opening.pop(key, None)  # its _open sees it is no longer wanted
        held: MutableMapping[Any, NsqdConnection] = conns if topic else self.shared
        index: int | str = slot if topic else address
        conn = held.get(index)
        if conn is not None and conn.address == address:
            del held[index]
            name = f"nsq_ha-producer-close-{address}"  # wait_closed() waits for it
            task = asyncio.get_running_loop().create_task(conn.close(), name=name)
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def follow(self, topic: str, leaders: Mapping[int, str], conns: Conns) -> None:
        """Drop ``topic``'s connections (open or opening) to nodes that no longer lead their
        partition (``leaders``: partition -> address)."""
        for key in self.opening(topic):
            if leaders.get(key[2]) != key[0]:
                self.drop(key, conns)
        for slot, conn in list(conns.items()):
            leader = leaders.get(slot)
            if leader != conn.address:
                log.info(
                    "%s partition %d: leader %s -> %s; closing the old connection",
                    topic,
                    slot,
                    conn.address,
                    leader or "none",
                )
                self.drop((conn.address, topic, slot), conns)

    async def close(self, conns: Iterable[NsqdConnection] = ()) -> None:
        """Close the shared connections and ``conns`` (an opening one is cancelled)."""
        closing = [*self.shared.values(), *conns]
        for task in self._opening.values():
            task.cancel()
        self._opening.clear()
        self.shared.clear()
        await asyncio.gather(*(c.close() for c in closing), return_exceptions=True)

    async def wait_closed(self) -> None:
        """Wait for the connections :meth:`drop` closes in the background."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _on_conn_error(error: BrokerError) -> None:
    log.warning("producer connection got an unsolicited error: %s", redact(str(error)))


def _retrieve(task: asyncio.Task[NsqdConnection]) -> None:
    if not task.cancelled():
        task.exception()
