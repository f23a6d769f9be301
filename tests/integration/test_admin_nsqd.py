"""nsqd's HTTP admin calls, written once in ``nsq_ha.admin.NsqdAdmin``: the same test on the
embedded broker and on the real fork."""

from __future__ import annotations

import asyncio

import pytest

from nsq_ha import Producer
from nsq_ha.admin import AdminError, NsqdAdmin, TopicSpec
from nsq_ha.lookup import LookupClient

from .backend import TOPIC4, Backend


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics([TOPIC4])
    return backend


async def _leader_http(cluster: Backend, topic: TopicSpec, partition: int) -> str:
    async with LookupClient([cluster.lookupd_http]) as lookup:
        pmap = await lookup.lookup(topic.name, "w", force=True)
    return pmap.partitions[partition].http_url


async def test_topic_stats_lists_the_leaders_partition_and_counts_a_publish(
    cluster: Backend,
) -> None:
    url = await _leader_http(cluster, TOPIC4, 1)
    async with NsqdAdmin(url) as nsqd:
        (old,) = [e for e in await nsqd.topic_stats(TOPIC4.name, 1) if _is_p1(e)]
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await producer.publish(TOPIC4.name, b"counted", partition=1)
        # the fork's counters follow a write when the partition flushes: poll (bounded)
        async with asyncio.timeout(10):
            while True:
                (entry,) = [e for e in await nsqd.topic_stats(TOPIC4.name, 1) if _is_p1(e)]
                if entry["message_count"] > old["message_count"]:
                    break
                await asyncio.sleep(0.1)
    assert entry["topic_name"] == TOPIC4.name
    assert entry["message_count"] == old["message_count"] + 1
    assert int(entry["backend_depth"]) > int(old["backend_depth"])


def _is_p1(entry: dict[str, object]) -> bool:
    return entry["topic_partition"] == "1"


async def test_topic_stats_of_a_topic_the_node_does_not_hold_is_empty(cluster: Backend) -> None:
    async with NsqdAdmin(cluster.http_urls()[0]) as nsqd:
        assert await nsqd.topic_stats("nsqha_no_such_topic") == []


async def test_an_unreachable_nsqd_is_an_admin_error() -> None:
    async with NsqdAdmin("http://127.0.0.1:9", timeout=2.0) as nsqd:
        with pytest.raises(AdminError, match="unreachable"):
            await nsqd.topic_stats("t")
        with pytest.raises(AdminError, match="unreachable"):
            await nsqd.create_channel("t", "c", 0)
