"""This project's producer and consumer, unchanged, against the embedded broker; and each
fault of its injection API, seen on the wire and in the event log."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import struct
from dataclasses import dataclass, field

import httpx
import pytest

from nsq_ha import sync
from nsq_ha.connection import NsqdConnection
from nsq_ha.consumer import Consumer, Message
from nsq_ha.devcluster import DevCluster, DevClusterThread, EventKind
from nsq_ha.errors import ConfigError, NotLeaderError, NotWritableError, PublishError
from nsq_ha.producer import Producer, RetryPolicy

from .helpers import publish_keyed
from .publishes import publish

KEYS = [f"k{i}" for i in range(20)]
PER_KEY = 50


@dataclass
class Counts:
    published: int = 0
    acknowledged: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


async def consume_keyed_through(cluster: DevCluster, fault: str) -> dict[str, int]:
    """Keyed publishes and an ordered consumer on a 4-partition replica-2 topic while
    ``fault`` happens; returns the tallies."""
    cluster.create_topic("orders", 4, 2, ordered=True)
    cluster.create_channel("orders", "audit")
    seen: set[tuple[str, int]] = set()
    highest: dict[str, int] = {}
    tally = collections.Counter[str]()
    midway = asyncio.Event()  # a fifth of the messages went through

    async def handle(message: Message) -> None:
        key, seq_text = message.body.decode().split(":")
        seq = int(seq_text)
        tally["deliveries"] += 1
        if (key, seq) in seen:
            tally["duplicates"] += 1
            return
        if seq < highest.get(key, -1):
            tally["order_violations"] += 1
        seen.add((key, seq))
        highest[key] = max(seq, highest.get(key, -1))
        if len(seen) >= len(KEYS) * PER_KEY // 5:
            midway.set()

    consumer = Consumer("orders", "audit", lookupd=cluster.lookupd_http, lookup_interval=0.5)
    await consumer.start()
    assert consumer.is_ordered
    consuming = asyncio.create_task(consumer.run(handle))
    counts = Counts()
    acked: set[tuple[str, int]] = set()
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        publishing = asyncio.create_task(
            publish_keyed(producer, "orders", KEYS, PER_KEY, counts, acked)
        )
        await asyncio.wait_for(midway.wait(), 30)  # the fault lands mid-stream
        if fault == "move":
            cluster.move_leader("orders", 0)
            cluster.move_leader("orders", 1)
        else:
            await cluster.stop_node(cluster.leader_of("orders", 0), kill=True)
        await publishing
    async with asyncio.timeout(30):
        while not acked <= seen:  # noqa: ASYNC110 - polling the handler's set
            await asyncio.sleep(0.05)
    stats = consumer.stats
    await consumer.close()
    await consuming
    tally["acknowledged"] = counts.acknowledged
    tally["lost"] = len(acked - seen)
    tally["leader_changes"] = sum(p.get("leader_changes", 0) for p in stats["partitions"].values())
    print("DEVCLUSTER_TALLY", fault, json.dumps(dict(tally)))
    return tally


@pytest.mark.parametrize("fault", ["move", "kill"])
async def test_producer_and_consumer_keep_order_through_faults(fault: str) -> None:
    """The real client stack (lookup, keyed producer, ordered consumer) against the emulator,
    with leaders moved or a leader killed mid-stream: nothing lost, per-key order kept."""
    async with DevCluster(nodes=3, failover_delay=0.5) as cluster:
        tally = await consume_keyed_through(cluster, fault)
        kinds = [e.kind for e in cluster.events]
    assert tally["acknowledged"] == len(KEYS) * PER_KEY
    assert tally["lost"] == 0
    assert tally["order_violations"] == 0
    assert tally["leader_changes"] >= 1
    assert "leader_moved" in kinds
    assert fault == "move" or "node_killed" in kinds


def test_sync_clients_with_the_devcluster_fixture(devcluster: DevClusterThread) -> None:
    """The pytest fixture users get: a sync producer and consumer, unchanged."""
    devcluster.create_topic("plain", 2, 1)
    devcluster.call(devcluster.cluster.create_channel, "plain", "c")
    with sync.Producer(lookupd=devcluster.lookupd_http) as producer:
        for i in range(20):
            producer.publish("plain", f"m{i}".encode())
    got: list[bytes] = []
    with sync.Consumer("plain", "c", lookupd=devcluster.lookupd_http) as consumer:
        for message in consumer:
            got.append(message.body)
            message.finish()
            if len(got) == 20:
                break
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))


@pytest.mark.devcluster(nodes=1, msg_timeout=1.0)
def test_fixture_marker_passes_options(devcluster: DevClusterThread) -> None:
    assert len(devcluster.nodes) == 1
    assert devcluster.cluster.msg_timeout == 1.0


# -- faults, one by one -------------------------------------------------------------------


async def raw(cluster: DevCluster, node: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(cluster.host, cluster.nodes[node].tcp_port)
    writer.write(b"  V2")
    return reader, writer


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    size, frame_type = struct.unpack(">iI", await reader.readexactly(8))
    return frame_type, await reader.readexactly(size - 4)


def pub(topic: str, partition: int, body: bytes) -> bytes:
    return f"PUB {topic} {partition}\n".encode() + struct.pack(">I", len(body)) + body


@contextlib.asynccontextmanager
async def cluster_with(topic: str, partitions: int = 1, replicas: int = 2, **options: object):  # type: ignore[no-untyped-def]
    async with DevCluster(nodes=3, **options) as cluster:  # type: ignore[arg-type]
        cluster.create_topic(topic, partitions, replicas)
        yield cluster


async def test_move_leader_old_leader_refuses_publish_and_drops_subscribers() -> None:
    async with cluster_with("t") as cluster:
        old = cluster.leader_of("t", 0).index
        reader, writer = await raw(cluster, old)
        sub_reader, sub_writer = await raw(cluster, old)
        sub_writer.write(b"SUB t c 0\n")
        assert await read_frame(sub_reader) == (0, b"OK")
        new = cluster.move_leader("t", 0)
        writer.write(pub("t", 0, b"x"))
        assert await read_frame(reader) == (1, b"E_FAILED_ON_NOT_LEADER ")
        writer.write(b"NOP\n" + pub("t", 0, b"y"))
        assert await read_frame(reader) == (1, b"E_FAILED_ON_NOT_LEADER ")  # still open
        assert await asyncio.wait_for(sub_reader.read(), 2) == b""  # closed, no error frame
        r2, w2 = await raw(cluster, new.index)
        w2.write(pub("t", 0, b"z"))
        assert await read_frame(r2) == (0, b"OK")
        for w in (writer, sub_writer, w2):
            w.close()
        assert cluster.events_of("leader_moved")[0].detail["new"] == new.index
        assert cluster.events_of("connection_dropped")


async def test_kill_then_failover_and_lookup_follows() -> None:
    async with cluster_with("t", failover_delay=0.3) as cluster:
        old = cluster.leader_of("t", 0)
        async with httpx.AsyncClient() as http:

            async def writers() -> dict[str, object]:
                resp = await http.get(
                    f"{cluster.lookupd_http}/lookup", params={"topic": "t", "access": "w"}
                )
                data: dict[str, object] = resp.json()
                partitions = data.get("partitions")
                if partitions is None and isinstance(data.get("data"), dict):
                    partitions = data["data"].get("partitions")  # type: ignore[union-attr]
                assert isinstance(partitions, dict)
                return partitions

            await cluster.stop_node(old, kill=True)
            assert await writers() == {}  # leaderless until the failover
            await cluster.wait_for(EventKind.LEADER_MOVED, reason="failover", timeout=5)
            after = await writers()
        assert after["0"]["tcp_port"] != old.tcp_port  # type: ignore[index]
        assert [e.kind for e in cluster.events][-2:] == ["node_killed", "leader_moved"]
        await cluster.start_node(old)
        assert cluster.events[-1].kind == "node_started"


async def test_unwritable_partition_answers_not_writable_and_the_producer_retries() -> None:
    async with cluster_with("t", replicas=1) as cluster:
        cluster.set_writable("t", 0, False)
        leader = cluster.leader_of("t", 0)
        async with NsqdConnection(leader.tcp_address) as conn:
            with pytest.raises(NotWritableError):
                await publish(conn, "t", b"x", partition=0)
            assert not conn.closed  # non-fatal
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            publishing = asyncio.create_task(producer.publish("t", b"y"))
            # letting time pass is the point: the publish keeps retrying while unwritable
            await asyncio.sleep(0.3)
            assert not publishing.done()
            cluster.set_writable("t", 0, True)
            result = await asyncio.wait_for(publishing, 10)
        assert result.partition == 0
        assert [e.detail["writable"] for e in cluster.events_of("writable_set")] == [False, True]


async def test_delayed_and_dropped_responses() -> None:
    async with cluster_with("t", replicas=1) as cluster:
        node = cluster.leader_of("t", 0).index
        reader, writer = await raw(cluster, node)
        cluster.drop_responses(node, 1, commands=["PUB"])
        writer.write(pub("t", 0, b"a") + pub("t", 0, b"b"))
        assert await read_frame(reader) == (0, b"OK")  # only the second answer arrives
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(read_frame(reader), 0.3)
        cluster.delay_responses(node, 0.5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        writer.write(pub("t", 0, b"c"))
        assert await read_frame(reader) == (0, b"OK")
        assert loop.time() - started >= 0.45
        assert cluster.partition("t", 0).store.next_id == 5  # all three were stored
        assert [e.detail["fault"] for e in cluster.events_of("fault_set")] == ["drop", "delay"]
        assert cluster.events_of("response_dropped")
        writer.close()


async def test_cut_after_n_bytes_and_pause() -> None:
    async with cluster_with("t", replicas=1) as cluster:
        node = cluster.leader_of("t", 0).index
        reader, writer = await raw(cluster, node)
        cluster.cut_after(node, 5)
        writer.write(pub("t", 0, b"a"))
        assert await asyncio.wait_for(reader.read(), 2) == bytes.fromhex("0000000600")
        writer.close()
        cluster.cut_after(node, None)
        cluster.pause_node(node)
        reader, writer = await raw(cluster, node)
        writer.write(pub("t", 0, b"b"))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(read_frame(reader), 0.3)
        cluster.resume_node(node)
        assert await asyncio.wait_for(read_frame(reader), 2) == (0, b"OK")
        kinds = [e.kind for e in cluster.events]
        assert {"connection_cut", "node_paused", "node_resumed"} <= set(kinds)
        writer.close()


async def test_lookupd_failure_and_stale_answers() -> None:
    async with cluster_with("t") as cluster, httpx.AsyncClient() as http:
        url = f"{cluster.lookupd_http}/lookup"
        params = {"topic": "t", "access": "w"}
        cluster.lookupd_fail(500, count=2)
        codes = [(await http.get(url, params=params)).status_code for _ in range(3)]
        assert codes == [500, 500, 200]
        cluster.lookupd_stale(True)
        before = (await http.get(url, params=params)).json()
        cluster.move_leader("t", 0)
        assert (await http.get(url, params=params)).json() == before
        cluster.lookupd_stale(False)
        assert (await http.get(url, params=params)).json() != before
        assert len(cluster.events_of("lookupd_fault_hit")) == 2


async def test_producer_rides_out_lookupd_failures() -> None:
    async with cluster_with("t", replicas=1) as cluster:
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            await producer.publish("t", b"first")
            cluster.lookupd_fail(503, count=3)
            cluster.move_leader("t", 0, to=(cluster.leader_of("t", 0).index + 1) % 3)
            result = await asyncio.wait_for(producer.publish("t", b"second"), 20)
        assert result.partition == 0
        assert cluster.partition("t", 0).store.log[-1].body == b"second"


async def test_not_leader_error_class_on_the_wire() -> None:
    async with cluster_with("t") as cluster:
        replica = cluster.replica_of("t", 0)
        assert replica is not None
        async with NsqdConnection(replica.tcp_address) as conn:
            with pytest.raises(NotLeaderError):
                await publish(conn, "t", b"x", partition=0)


async def test_a_partition_missing_from_the_lookup_makes_the_producer_look_again() -> None:
    """After its leader is killed a partition is absent from ``access=w`` until failover; a
    keyed publish then must refresh the lookup on each retry rather than wait for the periodic
    refresh (30 s): with a 10 s retry deadline it reaches the new leader, and the producer
    counts the lookups it forced."""
    async with DevCluster(nodes=3, failover_delay=1.0) as cluster:
        cluster.create_topic("gap", partitions=2, replicas=2)
        retry = RetryPolicy(deadline=10.0)
        async with Producer(lookupd=cluster.lookupd_http, retry=retry) as producer:
            first = await producer.publish("gap", b"before", sharding_key="k")
            await cluster.stop_node(cluster.leader_of("gap", first.partition or 0), kill=True)
            forced = producer.stats["lookups_forced"]
            after = await producer.publish("gap", b"after", sharding_key="k")
            assert after.partition == first.partition
            assert producer.stats["lookups_forced"] > forced


async def test_a_topic_with_no_writable_partition_is_looked_up_again_on_each_retry() -> None:
    """Found by the chaos suite (seed 3195334330): when a kill left *every* partition of a
    topic out of ``access=w``, the producer cached that empty map and failed each retry from
    it until the 30 s refresh timer, although the node was back within a second.  Each retry
    must ask lookupd again: with a 10 s retry deadline the publish lands once the node is up
    (the cluster's own failover is held off for 60 s, so only a fresh lookup can find it)."""
    async with DevCluster(nodes=3, failover_delay=60.0) as cluster:
        cluster.create_topic("allgone", partitions=2, replicas=2, placement=[[1, 2], [1, 0]])
        retry = RetryPolicy(deadline=10.0, max_backoff=0.2)
        async with Producer(lookupd=cluster.lookupd_http, retry=retry) as producer:
            await producer.publish("allgone", b"before")
            await cluster.stop_node(1, kill=True)
            async with Producer(lookupd=cluster.lookupd_http, retry=RetryPolicy.no_retry()) as once:
                with pytest.raises(PublishError, match="none is writable now"):
                    await once.publish("allgone", b"x")

            async def restart_soon() -> None:
                # the point: the node returns while the publish is retrying, not before
                await asyncio.sleep(0.5)
                await cluster.start_node(1)

            restart = asyncio.create_task(restart_soon())
            result = await producer.publish("allgone", b"after")
            await restart
            assert result.address == cluster.nodes[1].tcp_address


async def test_get_many_hands_out_one_message_per_ordered_partition_until_answered() -> None:
    """``get_many`` on an ordered topic: at most one message of each partition in a batch,
    and a partition's next one only after the batch's message of it is answered."""
    async with DevCluster(nodes=3) as cluster:
        cluster.create_topic("seq", partitions=2, replicas=2, ordered=True)
        cluster.create_channel("seq", "c")
        async with Producer(lookupd=cluster.lookupd_http) as producer:
            for partition in (0, 1):
                await producer.publish_many(
                    "seq", [b"%d-%d" % (partition, i) for i in range(3)], partition=partition
                )
        async with Consumer("seq", "c", lookupd=cluster.lookupd_http, max_in_flight=10) as c:
            seen: list[bytes] = []
            while len(seen) < 6:
                batch = await c.get_many(10, timeout=10)
                assert batch, f"nothing after {seen}"
                partitions = [m.partition for m in batch]
                assert len(partitions) == len(set(partitions)), batch  # one per partition
                for message in batch:
                    seen.append(message.body)
                    await message.finish()
            for partition in (0, 1):
                own = [b for b in seen if b.startswith(b"%d-" % partition)]
                assert own == [b"%d-%d" % (partition, i) for i in range(3)]
            with pytest.raises(ConfigError, match="max_count"):
                await c.get_many(0)
