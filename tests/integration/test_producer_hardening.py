"""Producer hardening: keyed routing never guesses a partition count, a fork nsqd
given as ``nsqd=`` refuses keys, idle topics expire, lookupd credentials stay hidden, and bad
input is refused before anything is sent.

The embedded broker plays the cluster; a small lying lookupd (:mod:`.lookupd_proxy`) in front
of it drops ``meta`` or counts lookups. Fork-only behaviour runs on the real fork.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from nsq_ha.devcluster import DevCluster
from nsq_ha.errors import (
    ConfigError,
    InvalidArgumentError,
    LookupdUnavailableError,
    PublishError,
    UnsupportedByServerError,
)
from nsq_ha.lookup import LookupClient
from nsq_ha.producer import Producer, RetryPolicy
from nsq_ha.routing import get_strategy
from nsq_ha.testing.servers import ForkCluster

from .helpers import Subscriber, drain
from .lookupd_proxy import LookupdProxy
from .tcp_relay import TcpRelay

MURMUR3 = get_strategy("murmur3")
KEYS = [f"user-{i}" for i in range(24)]
FAST_RETRY = RetryPolicy(deadline=20.0, max_backoff=0.2, jitter=0.0)


def stored(cluster: DevCluster, topic: str, partitions: int) -> dict[bytes, list[int]]:
    """Body -> the partitions that stored it."""
    where: dict[bytes, list[int]] = {}
    for p in range(partitions):
        for message in cluster.partition(topic, p).store.log:
            where.setdefault(message.body, []).append(p)
    return where


# -- a keyed publish never routes by a guessed partition count ---------------------------------


async def test_keys_keep_their_partition_when_lookup_drops_meta_and_the_last_leader() -> None:
    """Seen on main: with ``meta`` gone from the lookup and the highest partition's leader lost,
    the count became "highest listed + 1" and every key was re-hashed over 2 partitions."""
    async with (
        DevCluster(nodes=3, failover_delay=60.0) as cluster,
        LookupdProxy(cluster.lookupd_http) as proxy,
    ):
        cluster.create_topic("keyed", partitions=3, replicas=1, placement=[[0], [1], [2]])
        lookup = LookupClient(proxy.url)
        async with Producer(lookup=lookup, retry=FAST_RETRY) as producer:
            first = {
                k: (await producer.publish("keyed", f"{k}:0".encode(), sharding_key=k)).partition
                for k in KEYS
            }
            assert first == {k: MURMUR3.partition(k, 3) for k in KEYS}
            # the lookup loses meta, then partition 2's only node dies (gone from access=w)
            proxy.strip_meta = True
            await cluster.stop_node(2, kill=True)
            pmap = await lookup.refresh("keyed", "w")
            assert pmap.meta is None
            assert sorted(pmap.partitions) == [0, 1]
            on_live = [k for k in KEYS if first[k] != 2]
            on_dead = [k for k in KEYS if first[k] == 2]
            assert on_live
            assert on_dead
            second = {
                k: (await producer.publish("keyed", f"{k}:1".encode(), sharding_key=k)).partition
                for k in on_live
            }
            assert second == {k: first[k] for k in on_live}
            # keys of the lost partition wait for it rather than move
            waiting = [
                asyncio.create_task(producer.publish("keyed", f"{k}:1".encode(), sharding_key=k))
                for k in on_dead
            ]
            await asyncio.sleep(0.5)
            assert not any(t.done() for t in waiting)
            await cluster.start_node(2)
            results = await asyncio.wait_for(asyncio.gather(*waiting), 15)
            assert [r.partition for r in results] == [2] * len(on_dead)
        await lookup.close()
        where = stored(cluster, "keyed", 3)
    for k in KEYS:
        assert where[f"{k}:0".encode()] == where[f"{k}:1".encode()] == [first[k]], k


async def test_a_keyed_publish_waits_until_the_partition_count_is_known() -> None:
    """A producer that never saw ``meta`` does not guess: its keyed publish waits (looking up
    again on each retry) until the lookup tells the count, then goes where the count says;
    if the count never comes, the publish fails with a PublishError that says why."""
    async with (
        DevCluster(nodes=3, failover_delay=60.0) as cluster,
        LookupdProxy(cluster.lookupd_http) as proxy,
    ):
        cluster.create_topic("late", partitions=3, replicas=1, placement=[[0], [1], [2]])
        proxy.strip_meta = True
        proxy.hide_partitions = {2}
        moved = [k for k in KEYS if MURMUR3.partition(k, 3) != MURMUR3.partition(k, 2)]
        key = next(k for k in moved if MURMUR3.partition(k, 3) in (0, 1))
        async with Producer(
            lookupd=proxy.url, retry=RetryPolicy(deadline=1.0, max_backoff=0.1)
        ) as impatient:
            with pytest.raises(PublishError, match="partition count"):
                await impatient.publish("late", b"never", sharding_key=key)
            assert impatient.stats["commands"] == 0
        async with Producer(lookupd=proxy.url, retry=FAST_RETRY) as producer:
            publishing = asyncio.create_task(
                producer.publish("late", b"late-key", sharding_key=key)
            )
            await asyncio.sleep(0.8)
            assert not publishing.done()
            assert producer.stats["commands"] == 0
            asked = proxy.lookups["late"]
            assert asked >= 3  # looked up again while waiting, not only on the timer
            proxy.strip_meta = False
            result = await asyncio.wait_for(publishing, 10)
        assert result.partition == MURMUR3.partition(key, 3)
        assert stored(cluster, "late", 3)[b"late-key"] == [result.partition]
        assert b"never" not in stored(cluster, "late", 3)


# -- nsqd= with a fork node cannot route a key -------------------------------------------------


async def read_partitions(
    cluster: ForkCluster, topic: str, channel: str, partitions: int
) -> list[Subscriber]:
    conns: list[Subscriber] = []
    for p in range(partitions):
        conn = Subscriber(cluster.leader_of(topic, p).tcp_address)
        await conn.connect()
        await conn.subscribe(topic, channel, p)
        conns.append(conn)
    return conns


async def bodies_of(conns: list[Subscriber]) -> list[bytes]:
    bodies = [m.body for c in conns for m in await drain(c, idle=1.5)]
    await asyncio.gather(*(c.close() for c in conns))
    return bodies


@pytest.mark.fork
async def test_a_sharding_key_through_a_fork_nsqd_address_is_refused_before_sending(
    fork_cluster: ForkCluster, fork_topic4: str
) -> None:
    """Seen on main: the PUB carried no partition, nsqd used its default partition, one key
    landed in two partitions with ``result.partition`` None."""
    tag = uuid.uuid4().hex[:8]
    conns = await read_partitions(fork_cluster, fork_topic4, f"nsqd{tag}", 4)
    node = fork_cluster.leader_of(fork_topic4, 0)
    async with Producer(nsqd=node.tcp_address) as producer:
        with pytest.raises(UnsupportedByServerError, match="lookupd="):
            await producer.publish(fork_topic4, f"{tag}-keyed".encode(), sharding_key="user-1")
        with pytest.raises(UnsupportedByServerError, match="lookupd="):
            await producer.publish_many(
                fork_topic4, [f"{tag}-many-{i}".encode() for i in range(3)], sharding_key=7
            )
        assert producer.stats["commands"] == 0
        # unkeyed publishes still go: nsqd picks one of its partitions
        unkeyed = await producer.publish(fork_topic4, f"{tag}-unkeyed".encode())
        assert unkeyed.partition is None
    got = [b for b in await bodies_of(conns) if b.startswith(tag.encode())]
    assert got == [f"{tag}-unkeyed".encode()]


# -- idle topics expire ------------------------------------------------------------------------


async def test_idle_topics_are_freed_and_no_longer_looked_up() -> None:
    """Seen on main: an idle producer refreshed every topic it ever used, for ever (500 topics:
    868 lookups in 3.2 s) and kept their state."""
    topics = [f"idle{i}" for i in range(60)]
    async with (
        DevCluster(nodes=2) as cluster,
        LookupdProxy(cluster.lookupd_http) as proxy,
    ):
        for topic in topics:
            cluster.create_topic(topic, partitions=2, replicas=1)
        lookup = LookupClient(proxy.url, refresh_interval=0.2)
        async with Producer(lookup=lookup, topic_idle_timeout=2.0) as producer:
            await asyncio.gather(
                *(producer.publish(t, b"x", sharding_key=i) for i, t in enumerate(topics))
            )
            assert len(producer.topics) == len(topics)
            assert len(producer.connections) >= len(topics)
            async with asyncio.timeout(10):  # idle timeout + a sweep (every 1 s)
                while producer.topics:  # noqa: ASYNC110 - polling the producer's state
                    await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # a refresh round under way at expiry may finish
            before = proxy.total_lookups
            await asyncio.sleep(1.0)  # five refresh intervals
            assert proxy.total_lookups == before
            assert producer.topics == frozenset()
            assert producer.connections == ()
            assert lookup.cached_keys == frozenset()  # nor a partition map per topic ever used
            # a topic used again is looked up afresh and works
            again = proxy.lookups["idle7"]
            result = await producer.publish("idle7", b"again", sharding_key=7)
            assert result.partition == MURMUR3.partition(7, 2)
            assert proxy.lookups["idle7"] > again
            assert producer.topics == frozenset({"idle7"})
        await lookup.close()


# -- lookupd credentials never shown -----------------------------------------------------------


async def test_lookupd_credentials_stay_out_of_repr_logs_and_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In the producer's repr, its retry logs (a lookupd that answered once, then went away)
    and its errors, and in the error of a lookupd that never answered."""
    secret = "s3cr3t-pw"  # noqa: S105 - the test's own fake credential
    caplog.set_level(logging.DEBUG)
    retry = RetryPolicy(attempts=3, deadline=5.0, initial_backoff=0.01, max_backoff=0.01)
    async with DevCluster(nodes=1) as cluster, LookupdProxy(cluster.lookupd_http) as proxy:
        cluster.create_topic("creds", partitions=1, replicas=1)
        cluster.create_topic("creds_later", partitions=1, replicas=1)
        async with TcpRelay("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])) as relay:
            url = f"http://alice:{secret}@127.0.0.1:{relay.port}"
            async with Producer(lookupd=url, retry=retry) as producer:
                await producer.publish("creds", b"x")
                assert secret not in repr(producer)
                assert "alice:***@" in repr(producer) or "***" in repr(producer)
                await relay.down()
                with pytest.raises(PublishError) as caught:
                    await producer.publish("creds_later", b"x")
    async with Producer(lookupd=f"http://alice:{secret}@127.0.0.1:1") as producer:
        with pytest.raises(LookupdUnavailableError) as never:
            await producer.publish("creds", b"x")
        assert secret not in repr(producer)
    assert secret not in str(caught.value)
    assert secret not in str(caught.value.__cause__)
    assert secret not in str(never.value)
    assert "alice:***@127.0.0.1:1" in str(never.value)
    logs = [r.getMessage() for r in caplog.records if r.name.startswith("nsq_ha")]
    assert any("lookup of 'creds_later' failed" in line for line in logs)
    assert not [line for line in logs if secret in line]


# -- bad input refused before anything is sent -------------------------------------------------


@pytest.mark.fork
async def test_bad_keys_bodies_and_ext_are_refused_before_sending(
    fork_cluster: ForkCluster, fork_topic4: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    conns = await read_partitions(fork_cluster, fork_topic4, f"bad{tag}", 4)
    async with Producer(lookupd=fork_cluster.lookupd_http) as producer:
        await producer.publish(fork_topic4, f"{tag}-warm".encode())  # meta now known
        commands = producer.stats["commands"]
        with pytest.raises(InvalidArgumentError, match="surrogate"):
            await producer.publish(fork_topic4, f"{tag}-surrogate".encode(), sharding_key="a\ud800")
        with pytest.raises(InvalidArgumentError, match="surrogate"):
            await producer.publish_many(
                fork_topic4, [f"{tag}-surrogate-many".encode()], sharding_key="\udfff"
            )
        with pytest.raises(ConfigError, match="sequence"):
            await producer.publish_many(fork_topic4, {f"{tag}-dict".encode(): b"v"})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="sequence"):
            await producer.publish_many(fork_topic4, {f"{tag}-set".encode()})  # type: ignore[arg-type]
        with pytest.raises(UnsupportedByServerError, match="not an ext topic"):
            await producer.publish(fork_topic4, f"{tag}-ext".encode(), ext={"k": "v"})
        with pytest.raises(UnsupportedByServerError, match="not an ext topic"):
            await producer.publish_many(
                fork_topic4, [f"{tag}-ext-many".encode()], sharding_key="k", ext={"k": "v"}
            )
        assert producer.stats["commands"] == commands  # nothing was sent
        assert (await producer.publish(fork_topic4, f"{tag}-after".encode())).partition is not None
    got = sorted(b for b in await bodies_of(conns) if b.startswith(tag.encode()))
    assert got == [f"{tag}-after".encode(), f"{tag}-warm".encode()]
