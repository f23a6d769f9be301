"""Producer against real vanilla nsqd/nsqlookupd 1.3.0: nsqd= addresses and lookupd=."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path
from types import FrameType

import pytest

import nsq_ha
from nsq_ha import sync
from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.errors import ConnectionClosedError, TopicNotFoundError, UnsupportedByServerError
from nsq_ha.lookup import LookupClient
from nsq_ha.producer import Producer, PublishResult
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.routing import get_strategy
from nsq_ha.testing.servers import VanillaCluster

from .helpers import Subscriber, drain, running_as_python, take

pytestmark = pytest.mark.vanilla
PACKAGE = Path(nsq_ha.__file__).resolve().parent


def _topic() -> str:
    return f"pv_{uuid.uuid4().hex[:10]}"


async def subscribe(address: str, topic: str) -> Subscriber:
    conn = Subscriber(address)
    await conn.connect()
    await conn.subscribe(topic, "check")
    return conn


async def test_publish_publish_many_and_defer_through_an_nsqd_address(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    conn = await subscribe(address, topic)  # creates the topic and the channel
    async with Producer(nsqd=address) as producer:
        result = await producer.publish(topic, b"one")
        assert (result.topic, result.partition, result.address) == (topic, None, address)
        assert result.message_id is None  # vanilla answers a plain OK
        many = await producer.publish_many(topic, [b"m%d" % i for i in range(500)])
        assert len(many) == 500
        assert producer.stats["commands"] == 2  # PUB + one MPUB
        await producer.publish(topic, b"deferred", defer=0.5)  # DPUB: delivered last
        # (nsqd scans a new channel's deferred queue only after its 5 s scan-list refresh)
        conn.rdy(1000)
        messages = await take(conn, 502, within=20)
    await conn.close()
    bodies = [m.body for m in messages]
    assert bodies[:501] == [b"one", *(b"m%d" % i for i in range(500))]
    assert bodies[501:] == [b"deferred"]


async def test_lookupd_spreads_unkeyed_and_pins_keyed_messages(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    vanilla_cluster.create_topic(topic)
    conns = [await subscribe(n.tcp_address, topic) for n in vanilla_cluster.nodes]
    # lookupd learns of the topic when the nsqds register it (a few ms to a second)
    async with (
        LookupClient(vanilla_cluster.lookupd_http) as lookup,
        Producer(lookup=lookup, strategy="murmur3") as producer,
    ):
        for _ in range(50):
            pmap = await lookup.lookup(topic, "w", force=True)
            if len(pmap.producers) == len(vanilla_cluster.nodes):
                break
            await asyncio.sleep(0.2)
        # concurrent unkeyed publishes go out together (group commit), a burst split evenly
        # over the writable nodes; batches go round-robin
        unkeyed: list[PublishResult] = []
        for wave in range(4):
            unkeyed += await asyncio.gather(
                *(producer.publish(topic, b"u%d" % (25 * wave + i)) for i in range(25))
            )
        assert producer.stats["commands"] == 8  # per wave, one MPUB to each of the 2 nodes
        keyed = [
            await producer.publish(topic, f"{key}:{n}".encode(), sharding_key=key)
            for key in ("alpha", "beta", "gamma", "delta")
            for n in range(5)
        ]
    per_node = {c.address: await drain(c, idle=1.5) for c in conns}
    await asyncio.gather(*(c.close() for c in conns))
    assert {r.address for r in unkeyed} == set(per_node)  # round-robin used both nodes
    for address, messages in per_node.items():
        assert sum(m.body.startswith(b"u") for m in messages) == sum(
            r.address == address for r in unkeyed
        )
    nodes = sorted(per_node)  # lookupd's producers, sorted by address: the key's "slot"
    strategy = get_strategy("murmur3")
    keys = [k for k in ("alpha", "beta", "gamma", "delta") for _ in range(5)]
    for result, key in zip(keyed, keys, strict=True):
        assert result.address == nodes[strategy.partition(key, len(nodes))]
        got = [m.body for m in per_node[result.address] if m.body.startswith(key.encode())]
        assert got == [f"{key}:{n}".encode() for n in range(5)]


async def test_fork_features_are_refused_on_vanilla_before_sending(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    async with Producer(nsqd=vanilla_cluster.nodes[0].tcp_address) as producer:
        await producer.publish(topic, b"warm-up")
        commands = producer.stats["commands"]
        with pytest.raises(UnsupportedByServerError, match="PUB_TRACE"):
            await producer.publish(topic, b"x", trace_id=1)
        with pytest.raises(UnsupportedByServerError, match="PUB_EXT"):
            await producer.publish(topic, b"x", ext={"k": "v"})
        with pytest.raises(UnsupportedByServerError, match="partition"):
            await producer.publish(topic, b"x", partition=0)
        assert producer.stats["commands"] == commands
    async with Producer(lookupd=vanilla_cluster.lookupd_http) as producer:
        with pytest.raises(TopicNotFoundError, match="nsqd="):
            await producer.publish(_topic(), b"x")


def test_sync_producer_on_vanilla(vanilla_cluster: VanillaCluster) -> None:
    topic = _topic()
    with sync.Producer(nsqd=[n.tcp_address for n in vanilla_cluster.nodes]) as producer:
        results = [producer.publish(topic, b"s%d" % i, sharding_key="one") for i in range(10)]
        assert len({r.address for r in results}) == 1
        assert producer.publish(topic, b"later", defer=0.1).topic == topic
        assert len(producer.publish_many(topic, [b"a", b"b", b"c"])) == 3


async def test_a_connection_dropped_while_opening_fails_retriably(
    vanilla_cluster: VanillaCluster,
) -> None:
    address = vanilla_cluster.nodes[0].tcp_address
    pool = ConnectionPool(ConnectionConfig(), {"connections": 0})  # a producer's connections
    key = (address, "", -1)
    conns: dict[int, NsqdConnection] = {}  # a topic's (vanilla ones are the pool's)
    opening = asyncio.create_task(pool.get(key, conns))
    await asyncio.sleep(0)  # the handshake is under way
    pool.drop(key, conns)  # as a partition-map change would
    with pytest.raises(ConnectionClosedError, match="dropped while it was opening") as info:
        await opening
    assert info.value.retriable
    assert not (await pool.get(key, conns)).closed  # the next try opens a fresh one
    await pool.close()


def test_a_forked_child_exits_without_waiting_for_the_parents_loop(
    vanilla_cluster: VanillaCluster,
) -> None:
    producer = sync.Producer(nsqd=vanilla_cluster.nodes[0].tcp_address)
    producer.publish(_topic(), b"parent")
    pid = os.fork()
    if pid == 0:  # the child: closing (here, or at exit) must not wait for a thread it lacks
        signal.alarm(10)  # a hang becomes SIGALRM, a non-zero exit the parent sees
        producer.close()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    producer.close()


async def test_linger_gathers_publishes_that_arrive_apart(vanilla_cluster: VanillaCluster) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address

    async def spread(producer: Producer) -> list[PublishResult]:
        async def one(i: int) -> PublishResult:
            await asyncio.sleep(0.01 * i)
            return await producer.publish(topic, b"m%d" % i)

        return await asyncio.gather(*(one(i) for i in range(10)))

    async with Producer(nsqd=address) as eager:
        await spread(eager)
        assert eager.stats["commands"] > 1  # without linger each arrival goes when it can
    async with Producer(nsqd=address, linger=0.3) as patient:
        results = await spread(patient)
        assert patient.stats["commands"] == 1  # one MPUB for all ten
    assert len(results) == 10
    assert all(r.address == address for r in results)


async def test_a_warm_publish_passes_through_the_producer_the_session_and_the_wire_only(
    vanilla_cluster: VanillaCluster,
) -> None:
    """From ``publish()`` until it returns, a warm publish calls into the producer's core,
    topic, sender and batch, the publish command and the session, and the connection and
    transport: the topic's name was checked when its Topic was made, not again on every publish,
    and the batch goes to the session as a typed command, never as bytes parsed again."""
    entered: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            path = Path(frame.f_code.co_filename).resolve()
            if path.is_relative_to(PACKAGE):
                entered.add(str(path.relative_to(PACKAGE)))

    topic = _topic()
    async with Producer(nsqd=vanilla_cluster.nodes[0].tcp_address) as producer:
        for _ in range(3):  # warm: connected, the topic known
            await producer.publish(topic, b"warm")
        sys.setprofile(profile)
        try:
            await producer.publish(topic, b"journey")
        finally:
            sys.setprofile(None)
    producer_modules = {f"producer/{m}.py" for m in ("core", "topic", "sender", "batch")}
    protocol_modules = {"protocol/publish.py", "protocol/session.py"}
    wire = {"connection/core.py", "connection/reader.py", "transport.py"}
    assert entered == running_as_python(producer_modules | protocol_modules | wire)
