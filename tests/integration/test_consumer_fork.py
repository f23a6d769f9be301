"""Consumer against a fork cluster: every test runs on the embedded broker and on the real
fork (etcd + nsqlookupd + 3 nsqd, the session's; the ``fork``-marked half)."""

from __future__ import annotations

import asyncio
import collections
import time
import uuid

import pytest

from nsq_ha.admin import TopicSpec
from nsq_ha.consumer import Consumer, Message
from nsq_ha.errors import MessageAlreadyRespondedError
from nsq_ha.producer import Producer

from .backend import Backend
from .helpers import channel_totals, collect, run_and_close_under_load, wait_for_count

ORDERED = "cf_ordered"  # 4 partitions, ordered
PLAIN = "cf_plain"  # 4 partitions
SIX = "cf_six"  # 6 partitions
EXT = "cf_ext"  # 2 partitions, ext
LOAD = "cf_load"  # 2 partitions
TOPICS = [
    TopicSpec(ORDERED, partitions=4, ordered=True),
    TopicSpec(PLAIN, partitions=4),
    TopicSpec(SIX, partitions=6),
    TopicSpec(EXT, partitions=2, ext=True),
    TopicSpec(LOAD, partitions=2),
]


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    """The backend with this module's topics created and writable."""
    backend.ensure_topics(TOPICS)
    return backend


def _channel() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


async def test_ordered_topic_all_partitions_in_key_order_with_offsets_and_traces(
    cluster: Backend,
) -> None:
    channel = _channel()
    keys = [f"key{i}" for i in range(12)]
    async with Consumer(ORDERED, channel, lookupd=cluster.lookupd_http) as consumer:
        assert consumer.is_ordered  # from meta.ordered: SUB_ORDERED without being told
        assert {k[1] for k in consumer.connections} == {0, 1, 2, 3}
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            for seq in range(20):
                for index, key in enumerate(keys):
                    await producer.publish(
                        ORDERED,
                        f"{key}:{seq}".encode(),
                        sharding_key=key,
                        trace_id=1000 * index + seq + 1,
                    )
        received = await collect(consumer, 240, within=60)
    last: dict[str, int] = {}
    offsets: dict[int | None, list[int]] = collections.defaultdict(list)
    for message in received:
        key, seq_text = message.body.decode().split(":")
        seq = int(seq_text)
        assert seq == last.get(key, -1) + 1, f"{key}: {seq} after {last.get(key)}"
        last[key] = seq
        assert message.trace_id == 1000 * keys.index(key) + seq + 1
        assert message.offset is not None
        assert message.raw_size is not None
        offsets[message.partition].append(message.offset)
    assert set(offsets) == {0, 1, 2, 3}
    for partition, values in offsets.items():
        assert values == sorted(values), partition


async def test_three_members_split_six_partitions_without_overlap(cluster: Backend) -> None:
    channel = _channel()
    consumers = [
        Consumer(SIX, channel, lookupd=cluster.lookupd_http, member=(i, 3)) for i in range(3)
    ]
    for consumer in consumers:
        await consumer.start()
    try:
        for index, consumer in enumerate(consumers):
            assert {k[1] for k in consumer.connections} == {index, index + 3}
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await asyncio.gather(
                *(
                    producer.publish(SIX, b"p%d-%d" % (p, i), partition=p)
                    for p in range(6)
                    for i in range(30)
                )
            )
        got: list[set[bytes]] = [set(), set(), set()]
        published = {b"p%d-%d" % (p, i) for p in range(6) for i in range(30)}

        async def drain(index: int) -> None:
            """Read until 3 s pass without a message, or 0.5 s once every message came (time
            enough for a duplicate at another member to show)."""
            loop = asyncio.get_running_loop()
            last = loop.time()
            while True:
                message = await consumers[index].get(timeout=0.1)
                if message is None:
                    complete = got[0] | got[1] | got[2] == published
                    if loop.time() - last >= (0.5 if complete else 3):
                        return
                    continue
                last = loop.time()
                assert message.partition is not None
                assert message.partition % 3 == index
                got[index].add(message.body)
                await message.finish()

        await asyncio.gather(*(drain(i) for i in range(3)))
    finally:
        await asyncio.gather(*(c.close() for c in consumers))
    assert not (got[0] & got[1])
    assert not (got[1] & got[2])
    assert not (got[0] & got[2])
    assert got[0] | got[1] | got[2] == published


async def test_touch_keeps_a_message_and_without_it_it_comes_back(cluster: Backend) -> None:
    channel = _channel()
    async with Consumer(
        PLAIN, channel, lookupd=cluster.lookupd_http, partitions=[1], msg_timeout=2.0
    ) as consumer:
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await producer.publish(PLAIN, b"touched", partition=1)
        touched = await consumer.get(timeout=20)
        assert touched is not None
        assert touched.body == b"touched"
        for _ in range(10):  # 4 s, twice the msg_timeout
            await asyncio.sleep(0.4)
            await touched.touch()
        await touched.finish()
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await producer.publish(PLAIN, b"untouched", partition=1)
        untouched = await consumer.get(timeout=20)
        assert untouched is not None
        again = await consumer.get(timeout=20)
        assert again is not None
        assert (again.body, again.attempts) == (b"untouched", untouched.attempts + 1)
        assert again.internal_id == untouched.internal_id
        with pytest.raises(MessageAlreadyRespondedError):
            await untouched.finish()
        await again.finish()
        stats = consumer.stats
    assert (stats["received"], stats["finished"], stats["timed_out"]) == (3, 2, 1)


async def test_give_up_on_plain_channels_and_never_by_default_on_ordered_ones(
    cluster: Backend,
) -> None:
    channel = _channel()
    given_up: list[int] = []
    for topic in (PLAIN, ORDERED):  # a new fork channel starts at the end: create them first
        async with Consumer(topic, channel, lookupd=cluster.lookupd_http, max_in_flight=0):
            pass
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        await producer.publish(PLAIN, b"poison", partition=2)
        await producer.publish(ORDERED, b"poison", partition=2)

    async def always_fails(message: Message) -> None:
        raise ValueError("fails")

    plain = Consumer(
        PLAIN,
        channel,
        lookupd=cluster.lookupd_http,
        partitions=[2],
        max_attempts=2,
        requeue_delay=0,
        backoff=None,
        on_give_up=lambda m: given_up.append(m.attempts),
    )
    runner = asyncio.create_task(plain.run(always_fails))
    await wait_for_count(plain, "given_up", 1, within=30)
    await plain.close()
    await runner
    assert given_up == [3]
    assert plain.stats["finished"] == 1

    attempts: list[int] = []
    done = asyncio.Event()

    async def fails_three_times(message: Message) -> None:
        attempts.append(message.attempts)
        if message.attempts <= 3:
            raise ValueError("fails")
        done.set()

    ordered = Consumer(
        ORDERED,
        channel,
        lookupd=cluster.lookupd_http,
        partitions=[2],
        max_attempts=2,
        requeue_delay=0,
        backoff=None,
    )
    runner = asyncio.create_task(ordered.run(fails_three_times))
    await asyncio.wait_for(done.wait(), 30)
    await ordered.close()
    await runner
    assert attempts[-4:] == [1, 2, 3, 4]  # attempts 3 and 4 still reached the handler
    assert ordered.stats["given_up"] == 0


async def test_close_under_load_leaves_nothing_in_flight(cluster: Backend) -> None:
    channel = _channel()
    published = 50_000
    # the channel must exist before the messages, or it starts at their end
    async with Consumer(LOAD, channel, lookupd=cluster.lookupd_http, max_in_flight=0):
        pass
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        for partition in (0, 1):
            for start in range(0, published // 2, 1000):
                await producer.publish_many(
                    LOAD, [b"m%d" % i for i in range(start, start + 1000)], partition=partition
                )
    consumer = Consumer(
        LOAD, channel, lookupd=cluster.lookupd_http, max_in_flight=2500, drain_timeout=5
    )
    stats = await run_and_close_under_load(consumer)
    after = await asyncio.to_thread(channel_totals, cluster.http_urls(), LOAD, channel)
    print(f"CLOSE-UNDER-LOAD {cluster.name} stats={stats} nsqd={after}")
    assert after["in_flight_count"] == 0
    assert stats["requeued"] > 0, "nothing was in flight at close: no load"
    assert stats["finished"] + after["depth"] == published


async def test_two_in_flight_over_four_partitions_starves_none(cluster: Backend) -> None:
    channel = _channel()
    async with Consumer(PLAIN, channel, lookupd=cluster.lookupd_http, max_in_flight=0):
        pass  # create the channel first
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        for partition in range(4):
            await producer.publish_many(
                PLAIN, [b"s%d-%d" % (partition, i) for i in range(300)], partition=partition
            )
    per_partition: collections.Counter[int | None] = collections.Counter()
    async with Consumer(
        PLAIN,
        channel,
        lookupd=cluster.lookupd_http,
        max_in_flight=2,
        rdy_redistribute_interval=0.1,
        low_rdy_timeout=0.5,
    ) as consumer:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
            len(per_partition) < 4 or min(per_partition.values()) < 20
        ):
            message = await consumer.get(timeout=5)
            assert message is not None
            per_partition[message.partition] += 1
            await message.finish()
            assert sum(c.in_flight for c in consumer.connections.values()) <= 2
    print(f"STARVATION max_in_flight=2 per partition: {dict(per_partition)}")
    assert set(per_partition) == {0, 1, 2, 3}
    assert min(per_partition.values()) >= 20


async def test_seek_to_the_start_of_an_ordered_partition_redelivers_from_there(
    cluster: Backend,
) -> None:
    channel = _channel()
    async with Consumer(ORDERED, channel, lookupd=cluster.lookupd_http, partitions=[3]) as consumer:
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            for i in range(5):
                await producer.publish(ORDERED, b"seek%d" % i, partition=3)
        first = await collect(consumer, 5)
        target = first[1]
        assert target.offset is not None
        await consumer.seek(3, offset=target.offset)
        replay = await collect(consumer, 4)
    assert [m.body for m in first] == [b"seek%d" % i for i in range(5)]
    assert [m.offset for m in replay] == [m.offset for m in first[1:]]
    assert [m.body for m in replay] == [b"seek1", b"seek2", b"seek3", b"seek4"]


async def test_seek_to_the_message_just_finished_reads_it_again(cluster: Backend) -> None:
    channel = _channel()
    async with Consumer(ORDERED, channel, lookupd=cluster.lookupd_http, partitions=[3]) as consumer:
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await producer.publish(ORDERED, b"last", partition=3)
        (last,) = await collect(consumer, 1)
        assert last.offset is not None
        await consumer.seek(3, offset=last.offset)
        (again,) = await collect(consumer, 1)
    assert (again.id, again.body) == (last.id, b"last")


async def test_ext_topic_consumer_identifies_with_extend_support_and_reads_headers(
    cluster: Backend,
) -> None:
    channel = _channel()
    async with Consumer(EXT, channel, lookupd=cluster.lookupd_http) as consumer:
        for conn in consumer.connections.values():
            assert conn.negotiated.extend_support
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await producer.publish(
                EXT, b"with-header", partition=0, ext={"##client_dispatch_tag": "t1", "k": "v"}
            )
        message = await consumer.get(timeout=20)
        assert message is not None
        assert message.body == b"with-header"
        assert message.ext["k"] == "v"
        assert message.tag == "t1"
        await message.finish()
    async with Consumer(PLAIN, channel, lookupd=cluster.lookupd_http) as consumer:
        for conn in consumer.connections.values():
            assert not conn.negotiated.extend_support


async def test_without_lookup_meta_nsqd_answers_switch_the_subscription_mode(
    cluster: Backend,
) -> None:
    """nsqd= straight to a leader (no meta): E_SUB_ORDER_IS_MUST switches to SUB_ORDERED and
    E_SUB_EXTEND_NEED to extend_support, and both consumers then read their topic."""
    channel = _channel()
    ordered_leader = cluster.leader(ORDERED, 0)
    ext_leader = cluster.leader(EXT, 1)
    async with (
        Consumer(ORDERED, channel, nsqd=ordered_leader, partitions=[0]) as ordered,
        Consumer(EXT, channel, nsqd=ext_leader, partitions=[1]) as ext,
    ):
        assert ordered.is_ordered
        [conn] = ext.connections.values()
        assert conn.negotiated.extend_support
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await producer.publish(ORDERED, b"direct-ordered", partition=0)
            await producer.publish(EXT, b"direct-ext", partition=1, ext={"a": "b"})
        got_ordered = await ordered.get(timeout=20)
        got_ext = await ext.get(timeout=20)
        assert got_ordered is not None
        assert got_ext is not None
        assert (got_ordered.body, got_ordered.offset is not None) == (b"direct-ordered", True)
        assert (got_ext.body, dict(got_ext.ext)) == (b"direct-ext", {"a": "b"})
        await got_ordered.finish()
        await got_ext.finish()
