"""LookupClient against real nsqlookupd: vanilla 1.3.0 and the fork."""

from __future__ import annotations

import asyncio
import collections

import httpx
import pytest

from nsq_ha.errors import TopicNotFoundError
from nsq_ha.lookup import LookupClient, PartitionMap
from nsq_ha.testing.process import free_ports
from nsq_ha.testing.servers import ForkCluster, VanillaCluster


def counting_http() -> tuple[httpx.AsyncClient, collections.Counter[str]]:
    """An HTTP client for ``LookupClient(http=...)`` that counts the requests sent, per path."""
    sent: collections.Counter[str] = collections.Counter()

    async def count(request: httpx.Request) -> None:
        sent[request.url.path] += 1

    return httpx.AsyncClient(event_hooks={"request": [count]}), sent


@pytest.fixture(scope="module")
def vanilla_topic(vanilla_cluster: VanillaCluster) -> str:
    vanilla_cluster.create_topic("lookup_vanilla")
    return "lookup_vanilla"


async def test_vanilla_lookup_gives_one_route_per_nsqd(
    vanilla_cluster: VanillaCluster, vanilla_topic: str
) -> None:
    """Vanilla lookupd has no /listlookup (404): the seed is kept; producers become routes."""
    http, sent = counting_http()
    async with http, LookupClient(vanilla_cluster.lookupd_http, http=http) as client:
        assert await client.discover() == [vanilla_cluster.lookupd_http]
        pmap = await client.writable(vanilla_topic)
    assert not pmap.fork
    assert [r.partition for r in pmap.routes()] == [None, None]
    assert sorted(r.node.address for r in pmap.routes()) == sorted(
        n.tcp_address for n in vanilla_cluster.nodes
    )
    assert sent == {"/listlookup": 1, "/lookup": 1}


async def test_vanilla_unknown_topic_says_how_to_create_it(vanilla_cluster: VanillaCluster) -> None:
    async with LookupClient([vanilla_cluster.lookupd_http]) as client:
        with pytest.raises(TopicNotFoundError, match="nsqd= addresses"):
            await client.writable("lookup_no_such_topic")


async def test_concurrent_refreshes_share_one_request(
    vanilla_cluster: VanillaCluster, vanilla_topic: str
) -> None:
    """Fifty callers refreshing at once cause one /lookup request."""
    http, sent = counting_http()
    async with http, LookupClient(vanilla_cluster.lookupd_http, http=http) as client:
        await client.discover()
        maps = await asyncio.gather(*(client.refresh(vanilla_topic, "w") for _ in range(50)))
        assert sent["/lookup"] == 1
        assert all(m is maps[0] for m in maps)
        await client.refresh(vanilla_topic, "w")
        assert sent["/lookup"] == 2
        cached = await client.lookup(vanilla_topic, "w")  # cached: no request
        assert sent["/lookup"] == 2
        assert cached is client.cached(vanilla_topic, "w")


async def test_a_dead_lookupd_is_skipped_and_retried_later(
    vanilla_cluster: VanillaCluster, vanilla_topic: str
) -> None:
    (dead_port,) = free_ports(1)
    dead = f"http://127.0.0.1:{dead_port}"
    http, sent = counting_http()
    seeds = [dead, vanilla_cluster.lookupd_http]
    async with http, LookupClient(seeds, max_backoff=30, http=http) as client:
        pmap = await client.writable(vanilla_topic)
        assert len(pmap.routes()) == 2
        status = {url: (fails, wait) for url, fails, wait in client.lookupd_status()}
        assert status[dead][0] >= 1
        assert status[dead][1] > 0.1
        assert status[vanilla_cluster.lookupd_http] == (0, 0.0)
        before = sent["/lookup"]
        await client.writable(vanilla_topic, force=True)
        assert sent["/lookup"] == before + 1  # only the live lookupd was asked


async def test_watch_reports_a_changed_map(vanilla_cluster: VanillaCluster) -> None:
    """The timer refresh notices a topic appearing on an nsqd and tells the listener."""
    topic = "lookup_watched"
    seen: asyncio.Queue[PartitionMap] = asyncio.Queue()
    async with LookupClient(vanilla_cluster.lookupd_http, refresh_interval=0.2) as client:
        client.watch(topic, "r", seen.put_nowait)
        with pytest.raises(TopicNotFoundError):
            await client.writable(topic)
        await asyncio.to_thread(vanilla_cluster.create_topic, topic)
        pmap = await asyncio.wait_for(seen.get(), timeout=10)
    assert len(pmap.routes()) == 2


async def test_fork_discovery_and_partition_map(
    fork_cluster: ForkCluster, fork_topic4: str
) -> None:
    async with LookupClient(fork_cluster.lookupd_http) as client:
        assert await client.discover() == [fork_cluster.lookupd_http]
        pmap = await client.writable(fork_topic4)
        readers = await client.lookup(fork_topic4, "r")
    assert pmap.fork
    assert pmap.partition_num == 4
    assert pmap.meta is not None
    assert pmap.meta.replica == 1
    assert [r.partition for r in pmap.routes()] == [0, 1, 2, 3]
    nodes = {n.tcp_address: n.distributed_id for n in fork_cluster.nodes}
    for route in pmap.routes():
        assert nodes[route.node.address] == route.node.distributed_id
        assert route.node.is_fork
    assert readers.partitions.keys() == pmap.partitions.keys()


async def test_fork_unknown_topic_is_typed(fork_cluster: ForkCluster) -> None:
    """access=w: lookupd says 404 Key not found; access=r: an empty map (partition_num 0)."""
    async with LookupClient(fork_cluster.lookupd_http) as client:
        with pytest.raises(TopicNotFoundError, match="created by an operator"):
            await client.writable("lookup_no_such_fork_topic")
        pmap = await client.lookup("lookup_no_such_fork_topic", "r")
        assert pmap.fork
        assert pmap.partition_num == 0
        assert pmap.routes() == []
