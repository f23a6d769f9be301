"""A topic that grows while keyed, ordered publishing and an ordered consumer run, on the
embedded broker and the real fork: nothing is lost (a message may be delivered twice, as NSQ
delivers at least once), no producer or consumer is restarted, and each key keeps the order the
docs promise across the expansion.

The promise (docs/operating.md, "Adding partitions"): a key's messages stay in publish order
within each partition; a key the new count moves goes to its new partition once the producer has
seen the new count and the partition is writable, and never back, so its messages on the old
partition were all published before those on the new one. Across the two partitions a consumer
may deliver the new partition's first messages before the old partition's last ones.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import defaultdict

import pytest

from nsq_ha import Consumer, Producer
from nsq_ha.admin import LookupdAdmin
from nsq_ha.lookup import LookupClient

from .backend import Backend

KEYS = 48
BEFORE = 20  # messages per key before the expansion starts
AFTER = 20  # messages per key once the producer routes by the new count
PACE = 0.05  # seconds between a key's messages while the topic grows


async def test_keys_keep_their_order_while_the_topic_grows_from_4_to_6(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nsq_ha")
    topic = f"grow_{secrets.token_hex(3)}"
    async with LookupdAdmin(backend.lookupd_http, timeout=60) as admin:
        await admin.create_topic(topic, 4, ordered=True, timeout=120)
    backend.wait_stable()

    received: dict[int, list[tuple[int, int]]] = defaultdict(list)  # key -> (seq, partition)
    published: dict[int, int] = {}
    got = 0
    all_published = asyncio.Event()
    all_received = asyncio.Event()
    before_done: set[int] = set()
    half_way = asyncio.Event()
    grown = asyncio.Event()  # the expansion returned and the producer routes by 6 partitions

    # the producer and the consumer look the topic up again every second, so that the new count
    # reaches them within the test's time (the defaults are 30 s and 15 s)
    lookup = LookupClient(backend.lookupd_http, refresh_interval=1.0)
    async with (
        Producer(lookup=lookup) as producer,
        Consumer(
            topic,
            "grow",
            lookup=lookup,
            ordered=True,
            max_in_flight=64,
            lookup_interval=1.0,
            start="earliest",
        ) as consumer,
    ):

        async def publish_key(key: int) -> None:
            seq = 0
            after = 0
            while after < AFTER:
                await producer.publish(topic, f"{key}:{seq}".encode(), sharding_key=key)
                seq += 1
                if seq == BEFORE:
                    before_done.add(key)
                    if len(before_done) == KEYS:
                        half_way.set()
                if grown.is_set():
                    after += 1
                elif seq >= BEFORE:
                    await asyncio.sleep(PACE)  # keep publishing while the topic grows
            published[key] = seq

        def check_done() -> None:
            if all_published.is_set() and got >= sum(published.values()):
                all_received.set()

        async def consume() -> None:
            nonlocal got
            async for message in consumer:
                key, seq = map(int, message.body.split(b":"))
                received[key].append((seq, message.partition))
                await message.finish()
                got += 1
                check_done()

        reader = asyncio.create_task(consume())
        writers = [asyncio.create_task(publish_key(k)) for k in range(KEYS)]
        await asyncio.wait_for(half_way.wait(), 120)
        async with LookupdAdmin(backend.lookupd_http, timeout=60) as admin:
            started = time.monotonic()
            await admin.expand_topic(topic, 6, timeout=120)
            writable_after = time.monotonic() - started
        deadline = time.monotonic() + 60
        while (await producer.topic_routes(topic)).count != 6:
            assert time.monotonic() < deadline, "the producer never saw 6 partitions"
            await asyncio.sleep(0.2)
        seen_after = time.monotonic() - started
        grown.set()
        await asyncio.wait_for(asyncio.gather(*writers), 180)
        all_published.set()
        check_done()
        await asyncio.wait_for(all_received.wait(), 180)
        reader.cancel()
    await lookup.close()
    total = sum(published.values())

    # nothing lost; a message delivered again (at least once: a FIN that failed) only right
    # after itself in its partition's order
    seen = sorted({(k, s) for k, items in received.items() for s, _ in items})
    assert seen == [(k, s) for k in range(KEYS) for s in range(published[k])]
    again = sum(len(items) for items in received.values()) - len(seen)
    moved = 0
    new_partitions_used = set()
    for key, items in received.items():
        by_partition: dict[int, list[int]] = defaultdict(list)
        for seq, partition in items:
            by_partition[partition].append(seq)
        # in publish order within each partition (a redelivery repeats the message before it)
        for partition, seqs in by_partition.items():
            assert seqs == sorted(seqs), (key, partition, seqs)
            by_partition[partition] = sorted(set(seqs))
        # at most one move, forward in time: every message on the old partition came first
        assert len(by_partition) <= 2, (key, dict(by_partition))
        if len(by_partition) == 2:
            moved += 1
            (first, a), (second, b) = sorted(by_partition.items(), key=lambda kv: kv[1][0])
            assert max(a) < min(b), (key, first, second)
            new_partitions_used.add(second)
    assert new_partitions_used <= {0, 1, 2, 3, 4, 5}
    assert moved > 0  # the new count was used
    # a partition waiting for its first leader is expected while the topic grows, not an error
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    print(
        f"{backend.name}: {total} messages of {KEYS} keys, all delivered ({again} again); "
        f"{moved} of {KEYS} keys moved (murmur3, 4 -> 6); every partition writable "
        f"{writable_after:.1f} s and the producer on 6 partitions {seen_after:.1f} s "
        "after the expansion began"
    )
