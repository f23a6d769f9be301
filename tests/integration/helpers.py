"""Helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import collections
import sys
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

import httpx

from nsq_ha._compiled_finder import is_compiled
from nsq_ha.connection import NsqdConnection
from nsq_ha.consumer import Consumer, Message
from nsq_ha.producer import Producer
from nsq_ha.protocol import DecodedMessage
from nsq_ha.testing.servers import V1_ACCEPT

K = TypeVar("K", bound=Hashable)


class Subscriber:
    """An :class:`NsqdConnection` whose messages wait in a queue for :meth:`messages`; every
    other attribute is the connection's. A wrapper, not a subclass: under the compiled build
    ``NsqdConnection`` is a native class, which an interpreted class cannot inherit from."""

    def __init__(self, address: str | tuple[str, int], **options: Any) -> None:
        self.inbox: asyncio.Queue[DecodedMessage] = asyncio.Queue()
        self.conn = NsqdConnection(address, on_message=self.inbox.put_nowait, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    async def __aenter__(self) -> Subscriber:
        await self.conn.__aenter__()  # connects unless connected
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.conn.close()

    async def messages(self) -> AsyncIterator[DecodedMessage]:
        """Yield the messages as they come; end once the connection closed and all came out."""
        closed = asyncio.ensure_future(self.wait_closed())
        try:
            while True:
                if self.inbox.empty() and closed.done():
                    return
                get = asyncio.ensure_future(self.inbox.get())
                await asyncio.wait([get, closed], return_when=asyncio.FIRST_COMPLETED)
                if get.done():
                    yield get.result()
                else:
                    get.cancel()
        finally:
            closed.cancel()


async def connect(address: str | tuple[str, int], **options: Any) -> Subscriber:
    """A connected :class:`Subscriber`."""
    conn = Subscriber(address, **options)
    await conn.connect()
    return conn


async def take(conn: Subscriber, count: int, within: float = 10.0) -> list[DecodedMessage]:
    """Read ``count`` messages from ``conn.messages()``; TimeoutError after ``within`` s."""
    received: list[DecodedMessage] = []

    async def collect() -> None:
        async for message in conn.messages():
            received.append(message)
            if len(received) == count:
                return

    await asyncio.wait_for(collect(), within)
    return received


async def drain(
    conn: Subscriber, *, rdy: int = 2500, idle: float = 3.0, within: float = 120.0
) -> list[DecodedMessage]:
    """Send RDY, then read and FIN messages until none came for ``idle`` seconds."""
    return (await drain_all({0: conn}, rdy=rdy, idle=idle, within=within))[0]


async def drain_all(
    conns: Mapping[K, Subscriber],
    *,
    expect: int | None = None,
    prefix: bytes = b"",
    grace: float = 0.5,
    rdy: int = 2500,
    idle: float = 3.0,
    within: float = 120.0,
) -> dict[K, list[DecodedMessage]]:
    """Send RDY on every connection, then read and FIN their messages all at once.

    Reading stops when none came for ``idle`` seconds, or, once ``expect`` messages whose
    body starts with ``prefix`` arrived, when none came for ``grace`` seconds more (long enough
    to catch a stray duplicate, without idling for seconds on every test), or at ``within``.
    """
    loop = asyncio.get_running_loop()
    arrived: asyncio.Queue[tuple[K, DecodedMessage]] = asyncio.Queue()

    async def pump(key: K, conn: Subscriber) -> None:
        async for message in conn.messages():
            conn.fin(message.id)
            arrived.put_nowait((key, message))

    received: dict[K, list[DecodedMessage]] = {key: [] for key in conns}
    matched = 0
    for conn in conns.values():
        conn.rdy(rdy)
    pumps = [asyncio.create_task(pump(key, conn)) for key, conn in conns.items()]
    deadline = loop.time() + within
    try:
        while loop.time() < deadline:
            done = expect is not None and matched >= expect
            try:
                key, message = await asyncio.wait_for(arrived.get(), grace if done else idle)
            except TimeoutError:
                break
            received[key].append(message)
            matched += message.body.startswith(prefix)
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
    return received


def channel_totals(
    http_urls: Iterable[str],
    topic: str,
    channel: str,
    keys: tuple[str, ...] = ("in_flight_count", "depth"),
) -> dict[str, int]:
    """``keys`` of ``channel`` from every nsqd's ``/stats``, summed over the topic's partitions.

    On the fork a replica lists its own copy of a partition (``is_leader`` false): only the
    leaders' entries count.  Vanilla nsqd has no ``is_leader`` and every entry counts.
    """
    totals = dict.fromkeys(keys, 0)
    for url in http_urls:
        data = httpx.get(
            f"{url}/stats",
            params={"format": "json", "topic": topic, "channel": channel},
            headers=V1_ACCEPT,
            timeout=5,
        ).json()
        for entry in data.get("topics") or []:
            if entry["topic_name"] != topic or not entry.get("is_leader", True):
                continue
            for ch in entry.get("channels") or []:
                if ch["channel_name"] == channel:
                    for key in keys:
                        totals[key] += ch.get(key, 0)
    return totals


async def unfinished_and_clients(lookupd: str, topic: str, channel: str) -> tuple[int, int]:
    """``channel``'s unfinished messages (depth + in flight + deferred) and its clients, summed
    over every nsqd nsqlookupd lists for ``topic`` (raises TopicNotFoundError until it does)."""
    from nsq_ha.admin import NsqdAdmin
    from nsq_ha.lookup import LookupClient

    backlog = clients = 0
    async with LookupClient([lookupd]) as lookup, httpx.AsyncClient(timeout=10.0) as http:
        pmap = await lookup.lookup(topic, "r", force=True)
        nodes = {n.http_url for n in (*pmap.partitions.values(), *pmap.producers)}
        for url in sorted(nodes):
            for entry in await NsqdAdmin(url, http=http).topic_stats(topic):
                for found in entry.get("channels") or ():
                    if found.get("channel_name") != channel:
                        continue
                    for field in ("depth", "in_flight_count", "deferred_count"):
                        backlog += int(found.get(field) or 0)
                    clients += len(found.get("clients") or ())
    return backlog, clients


async def collect(consumer: Consumer, count: int, within: float = 30.0) -> list[Message]:
    """The next ``count`` messages of ``consumer``, each finished once received (in the
    order handed out); TimeoutError after ``within`` seconds."""
    received: list[Message] = []

    async def loop() -> None:
        async for message in consumer:
            received.append(message)
            await message.finish()
            if len(received) == count:
                return

    await asyncio.wait_for(loop(), within)
    return received


async def run_and_close_under_load(
    consumer: Consumer, *, finished: int = 10_000, concurrency: int = 200
) -> dict[str, Any]:
    """Run ``consumer`` with a handler that takes 0-4 ms per message until it finished
    ``finished`` messages, close it with thousands still in flight, and return its stats."""
    handled = 0

    async def handler(message: Message) -> None:
        nonlocal handled
        handled += 1
        await asyncio.sleep(0.001 * (handled % 5))

    runner = asyncio.create_task(consumer.run(handler, concurrency=concurrency))
    await wait_for_count(consumer, "finished", finished)
    await consumer.close()
    await runner
    return consumer.stats


async def wait_for_count(consumer: Consumer, name: str, count: int, within: float = 120) -> None:
    """Poll ``consumer.stats[name]`` until it reaches ``count`` (TimeoutError after ``within``)."""
    async with asyncio.timeout(within):
        while consumer.stats[name] < count:  # noqa: ASYNC110 - polling a counter
            await asyncio.sleep(0.05)


class PublishCounts(Protocol):
    published: int
    acknowledged: int
    errors: collections.Counter[str]


async def publish_keyed(
    producer: Producer,
    topic: str,
    keys: list[str],
    per_key: int,
    counts: PublishCounts,
    acked: set[tuple[str, int]],
) -> None:
    """Publish ``key:seq`` bodies, every key concurrently and each key in seq order (a key
    awaits its previous publish); count them and record the acknowledged ``(key, seq)``."""

    async def one_key(key: str) -> None:
        for seq in range(per_key):
            counts.published += 1
            try:
                await producer.publish(topic, f"{key}:{seq}".encode(), sharding_key=key)
            except Exception as exc:  # counted: a failed publish is not acknowledged
                counts.errors[type(exc).__name__] += 1
            else:
                counts.acknowledged += 1
                acked.add((key, seq))
            await asyncio.sleep(0.01)  # spread the run over seconds so faults land mid-stream

    await asyncio.gather(*(one_key(k) for k in keys))


def running_as_python(paths: Iterable[str]) -> set[str]:
    """The ``nsq_ha`` files among ``paths`` (relative to the package, ``"protocol/session.py"``)
    whose module runs as Python: a module compiled by mypyc has no frame for ``sys.setprofile``
    to see. Each module must be imported already."""
    return {
        path
        for path in paths
        if not is_compiled(sys.modules["nsq_ha." + path.removesuffix(".py").replace("/", ".")])
    }
