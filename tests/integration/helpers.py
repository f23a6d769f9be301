"""Helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol

from nsq_ha.connection import NsqdConnection
from nsq_ha.consumer import Consumer
from nsq_ha.producer import Producer
from nsq_ha.protocol import DecodedMessage


async def take(conn: NsqdConnection, count: int, within: float = 10.0) -> list[DecodedMessage]:
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
    conn: NsqdConnection, *, rdy: int = 2500, idle: float = 3.0, within: float = 120.0
) -> list[DecodedMessage]:
    """Send RDY, then read and FIN messages until none came for ``idle`` seconds."""
    received: list[DecodedMessage] = []
    conn.rdy(rdy)
    iterator = conn.messages().__aiter__()
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        try:
            message = await asyncio.wait_for(iterator.__anext__(), idle)
        except TimeoutError:
            break
        received.append(message)
        conn.fin(message.id)
    return received


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
