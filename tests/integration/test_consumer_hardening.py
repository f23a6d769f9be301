"""Consumer hardening (issue 20): answers validated before anything changes, unknown partitions
refused."""

from __future__ import annotations

import asyncio
import math
import uuid

import pytest

from nsq_ha.consumer import Consumer
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.errors import ConfigError
from nsq_ha.producer import Producer
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

# -- 8. a bad requeue delay changes nothing ----------------------------------------------------


@pytest.mark.vanilla
@pytest.mark.parametrize("delay", [-1, math.nan, math.inf, -math.inf, 1e300, True, "5"])
async def test_bad_requeue_delay_is_refused_and_the_message_stays_answerable(
    vanilla_cluster: VanillaCluster, delay: object
) -> None:
    topic = f"ch_{uuid.uuid4().hex[:10]}"
    address = vanilla_cluster.nodes[0].tcp_address
    async with Consumer(topic, "c", nsqd=address, max_in_flight=1) as consumer:
        async with Producer(nsqd=address) as producer:
            await producer.publish_many(topic, [b"first", b"second"])
        message = await consumer.get(timeout=10)
        assert message is not None
        with pytest.raises(ConfigError, match="requeue delay"):
            await message.requeue(delay)  # type: ignore[arg-type]
        assert not message.responded
        assert consumer.stats["in_flight"] == 1
        assert consumer.stats["requeued"] == 0
        await message.requeue(0, backoff=False)  # still held, and answerable
        seen: list[bytes] = []
        async with asyncio.timeout(15):
            while set(seen) != {b"first", b"second"}:
                got = await consumer.get()
                assert got is not None
                seen.append(got.body)
                await got.finish()
        assert seen.count(message.body) == 1  # it came back once, after the good requeue
        assert consumer.stats["in_flight"] == 0
        assert consumer.stats["requeued"] == 1


# -- 18. a partition the topic does not have is refused at start ---------------------------------


@pytest.mark.parametrize("partitions", [[999], [0, 2]])
async def test_devcluster_unknown_partition_is_refused_at_start(
    devcluster: DevClusterThread, partitions: list[int]
) -> None:
    devcluster.create_topic("two_parts", 2, 1)
    consumer = Consumer("two_parts", "c", lookupd=devcluster.lookupd_http, partitions=partitions)
    async with asyncio.timeout(15):
        with pytest.raises(ConfigError, match=r"has 2 partitions.*\[2|has 2 partitions.*999"):
            await consumer.start()
        assert consumer.connections == {}
        await consumer.close()


@pytest.mark.fork
async def test_fork_unknown_partition_is_refused_at_start(fork_cluster: ForkCluster) -> None:
    topic = "ch_two_parts"
    if topic not in fork_cluster.topics:
        await asyncio.to_thread(fork_cluster.create_topic, topic, 2, 1)
    consumer = Consumer(topic, "c", lookupd=fork_cluster.lookupd_http, partitions=[1, 999])
    async with asyncio.timeout(30):
        with pytest.raises(ConfigError, match=r"has 2 partitions \(0\.\.1\).*\[999\]"):
            await consumer.start()
        assert consumer.connections == {}
        await consumer.close()
    async with Consumer(topic, "c", lookupd=fork_cluster.lookupd_http, partitions=[1]) as good:
        assert [key[1] for key in good.connections] == [1]
