"""Keyed publishing from a cold producer: calls made before the topic's routes are known.

A service that takes requests as soon as it starts makes many keyed publishes before its
producer has looked the topic up. Those calls wait for the first lookup; once it answers they
must go out batched as they would on a producer that had published before (group commit per
partition), in call order per key, and later calls must not wait for anything.

Every test runs on the embedded broker and on the real fork (the ``backend`` fixture). The
batching is measured in commands sent per message (``Producer.stats["commands"]``), never in
wall-clock rates.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from nsq_ha.connection import NsqdConnection
from nsq_ha.producer import Producer
from nsq_ha.routing import get_strategy

from .backend import TOPIC4, Backend
from .helpers import Subscriber, drain_all

T4 = TOPIC4.name  # 4 partitions, shared with the other fork tests on the real fork
KEYS = 512


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    """The backend with the 4-partition topic created and writable."""
    backend.ensure_topics([TOPIC4])
    return backend


async def _commands_for_burst(cluster: Backend, *, warm: bool, tasks: int, each: int) -> int:
    """Commands a fresh producer sends for ``tasks`` concurrent tasks publishing ``each`` keyed
    messages one call at a time (keys spread over :data:`KEYS`); ``warm``: one keyed publish
    went first, so the routes are known when the tasks start."""
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        if warm:
            await producer.publish(T4, b"warm-up", sharding_key="warm-up")
        before = producer.stats["commands"]

        async def task(number: int) -> None:
            for i in range(each):
                key = f"key{(number * each + i) % KEYS}"
                await producer.publish(T4, b"x" * 64, sharding_key=key)

        async with asyncio.timeout(120):
            await asyncio.gather(*(task(n) for n in range(tasks)))
        return producer.stats["commands"] - before


async def test_concurrent_keyed_publishes_from_a_cold_producer_batch_as_warm_ones(
    cluster: Backend,
) -> None:
    """Many tasks publishing keyed messages from the moment the producer is made (no publish
    before them) send about as many commands as the same tasks on a producer whose routes are
    already known: the calls that waited for the first lookup leave batched, and the calls made
    after it do not queue one by one behind them."""
    tasks, each = 1000, 8
    messages = tasks * each
    cold = await _commands_for_burst(cluster, warm=False, tasks=tasks, each=each)
    warm = await _commands_for_burst(cluster, warm=True, tasks=tasks, each=each)
    assert cold <= 1.2 * warm + 4, (
        f"cold: {cold} commands for {messages} messages ({messages / cold:.1f} per command); "
        f"warm: {warm} ({messages / warm:.1f} per command)"
    )


async def test_keyed_calls_that_waited_for_routes_leave_as_one_batch_per_partition(
    cluster: Backend,
) -> None:
    """Keyed calls made while the first lookup is out are queued together once it answers:
    one command per partition carries all of them (nothing else is in flight), and each key's
    messages are stored in call order."""
    tag = uuid.uuid4().hex[:8]
    conns: dict[int, Subscriber] = {}
    try:
        for p in range(4):
            conns[p] = conn = Subscriber(cluster.leader(T4, p))
            await conn.connect()
            await conn.subscribe(T4, f"cold{tag}", p)
        await _publish_burst(cluster, conns, tag)
    finally:
        await asyncio.gather(*(c.close() for c in conns.values()))


async def _publish_burst(cluster: Backend, conns: dict[int, NsqdConnection], tag: str) -> None:
    """200 keyed calls made at once on a cold producer; the batches and the order stored."""
    keys = [f"k{i % 7}" for i in range(200)]
    bodies = [f"{tag}|{key}|{i:04d}".encode() for i, key in enumerate(keys)]
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        # every call is made (and waits) before the first one's lookup can answer
        calls = [
            asyncio.create_task(producer.publish(T4, body, sharding_key=key))
            for body, key in zip(bodies, keys, strict=True)
        ]
        async with asyncio.timeout(60):
            await asyncio.gather(*calls)
        commands = producer.stats["commands"]
    strategy = get_strategy("murmur3")
    partitions = {strategy.partition(key, 4) for key in keys}
    assert commands == len(partitions), f"{commands} commands for {len(bodies)} messages"
    stored = await drain_all(conns, expect=len(bodies), prefix=tag.encode())
    for partition, received in stored.items():
        mine = [m.body for m in received if m.body.startswith(tag.encode())]
        assert mine == [
            b for b, k in zip(bodies, keys, strict=True) if strategy.partition(k, 4) == partition
        ]
