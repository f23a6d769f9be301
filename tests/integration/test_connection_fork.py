"""NsqdConnection against the real fork cluster (etcd + nsqlookupd + 3 nsqd 0.3.7-HA.1.13.0).

Topics are created once for the module (a new fork topic takes seconds to become writable).
Expected outcomes follow tests/golden/fork_errors.json (error text, closed or still open).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest

from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.errors import (
    BadPartitionError,
    BrokerError,
    ConnectionClosedError,
    FinFailedError,
    NotLeaderError,
    SubOrderRequiredError,
    TopicNotExistError,
)
from nsq_ha.protocol.broker import join_fork_id
from nsq_ha.protocol.message import EXT_VERSION_JSON, DecodedMessage
from nsq_ha.protocol.session import ConnState
from nsq_ha.testing.servers import ForkCluster

from .helpers import Subscriber, connect, take
from .publishes import publish

pytestmark = pytest.mark.fork

PLAIN = "cf_conn_plain"  # 1 partition, 3 replicas: two nodes are non-leader replicas
ORDERED = "cf_conn_ordered"
EXT = "cf_conn_ext"


@dataclass(frozen=True)
class Topics:
    cluster: ForkCluster

    def leader(self, topic: str, partition: int = 0) -> str:
        entry = self.cluster.lookup(topic, "w")["partitions"][str(partition)]
        return f"{entry['broadcast_address']}:{entry['tcp_port']}"

    def replica(self, topic: str, partition: int = 0) -> str:
        leader = self.leader(topic, partition)
        return next(n.tcp_address for n in self.cluster.nodes if n.tcp_address != leader)


@pytest.fixture(scope="module")
def topics(fork_cluster: ForkCluster) -> Topics:
    specs = [(PLAIN, 1, 3, False, False), (ORDERED, 1, 1, True, False), (EXT, 1, 1, False, True)]
    for name, partitions, replicas, ordered, ext in specs:
        fork_cluster.create_topic(name, partitions, replicas, ordered, ext, wait=False)
    for name, *_ in specs:
        fork_cluster.wait_writable(name)
    return Topics(fork_cluster)


async def test_identify_detects_the_fork(topics: Topics) -> None:
    """The fork answers IDENTIFY with version 0.3.7-HA.1.13.0 and its own defaults."""
    async with NsqdConnection(topics.leader(PLAIN)) as conn:
        negotiated = conn.negotiated
        assert negotiated.version == "0.3.7-HA.1.13.0"
        assert conn.is_fork is True
        assert negotiated.max_rdy_count == 2500
        assert negotiated.output_buffer_size == 100
        assert negotiated.output_buffer_timeout == 0.05
        assert "fork=0.3.7-HA.1.13.0" in repr(conn)


async def test_pub_sub_fin_with_binary_ids(topics: Topics) -> None:
    """PUB to the partition leader, SUB with the partition: ids are binary u64+u64, FIN works,
    CLS answers CLOSE_WAIT and the connection closes cleanly."""
    address = topics.leader(PLAIN)
    async with Subscriber(address) as sub, NsqdConnection(address) as pub:
        await sub.subscribe(PLAIN, "plain_ch", 0)
        sub.rdy(10)
        await asyncio.gather(*(publish(pub, PLAIN, b"f%d" % i, 0) for i in range(5)))
        messages = await take(sub, 5)
        assert [m.body for m in messages] == [b"f%d" % i for i in range(5)]
        ids = [m.internal_id for m in messages]
        assert ids == sorted(ids)
        assert all(m.id == join_fork_id(m.internal_id or 0, 0) for m in messages)
        assert all(m.offset is None and m.ext_version is None for m in messages)
        for message in messages:
            sub.fin(message.id)
        await sub.stop_delivery()  # CLS, answered by CLOSE_WAIT
        assert sub.state is ConnState.CLOSE_WAIT
        await sub.close()


async def test_traced_publish_matches_the_delivered_message(topics: Topics) -> None:
    """PUB_TRACE answers the 30-byte traced response; a SUB_ADVANCED consumer sees the same
    16-byte id (trace id echoed) and the detail part equals the reported offset/raw size."""
    address = topics.leader(PLAIN)
    async with Subscriber(address) as sub, NsqdConnection(address) as pub:
        await sub.subscribe(PLAIN, "traced_ch", 0, advanced=True)
        sub.rdy(1)
        traced = await publish(pub, PLAIN, b"traced-body", 0, trace_id=0x1122334455667788)
        assert traced is not None
        assert traced.trace_id == 0x1122334455667788
        assert traced.raw_size == 4 + 26 + len(b"traced-body")
        (message,) = await take(sub, 1)
        assert message.id == traced.message_id
        assert message.trace_id == 0x1122334455667788
        assert (message.offset, message.raw_size) == (traced.offset, traced.raw_size)
        assert message.body == b"traced-body"
        sub.fin(message.id)


async def test_ordered_subscription_carries_the_detail_part(topics: Topics) -> None:
    """SUB_ORDERED on an ordered topic: each message has offset/raw size and the next offset
    is the previous offset + raw size (§4.4)."""
    address = topics.leader(ORDERED)
    async with Subscriber(address) as sub, NsqdConnection(address) as pub:
        await sub.subscribe(ORDERED, "ord_ch", 0, ordered=True)
        sub.rdy(1)
        for i in range(3):
            await publish(pub, ORDERED, b"o%d" % i, 0)
        bodies = []
        previous: DecodedMessage | None = None
        for _ in range(3):
            (message,) = await take(sub, 1)
            assert message.offset is not None
            assert message.raw_size == 4 + 26 + 2
            if previous is not None:
                assert message.offset == (previous.offset or 0) + (previous.raw_size or 0)
            bodies.append(message.body)
            sub.fin(message.id)  # ordered channel: one in flight, next comes after FIN
            previous = message
        assert bodies == [b"o0", b"o1", b"o2"]


async def test_ext_topic_delivers_the_json_header(topics: Topics) -> None:
    """With extend_support, PUB_EXT with ##trace_id is traced and the consumer's frames carry
    ext version 4 with the header exactly as published."""
    address = topics.leader(EXT)
    config = ConnectionConfig(extend_support=True)
    header = {"##trace_id": "999", "k": "v"}
    async with (
        Subscriber(address, config=config) as sub,
        NsqdConnection(address, config=config) as pub,
    ):
        assert sub.negotiated.extend_support is True
        await sub.subscribe(EXT, "ext_ch", 0)
        sub.rdy(2)
        traced = await publish(pub, EXT, b"with-header", 0, header=header)
        assert traced is not None
        assert traced.trace_id == 999
        assert await publish(pub, EXT, b"plain", 0) is None
        first, second = await take(sub, 2)
        assert first.ext_version == EXT_VERSION_JSON
        assert first.json_header() == header
        assert json.loads(first.ext_data or b"") == header
        assert first.body == b"with-header"
        assert (second.ext_version, second.body) == (0, b"plain")
        for message in (first, second):
            sub.fin(message.id)


async def test_pub_to_a_replica_is_not_leader_and_keeps_the_connection(topics: Topics) -> None:
    """PUB to a non-leader replica: E_FAILED_ON_NOT_LEADER, non-fatal after PUB — the same
    connection answers the next PUB too (again NotLeaderError, not a closed connection)."""
    async with NsqdConnection(topics.replica(PLAIN)) as conn:
        for _ in range(2):
            with pytest.raises(NotLeaderError) as info:
                await publish(conn, PLAIN, b"x", 0)
            assert info.value.fatal is False
            assert info.value.refresh_lookup is True
        assert conn.state is ConnState.READY


async def test_sub_on_a_replica_is_fatal(topics: Topics) -> None:
    """SUB to a non-leader: the same code is fatal after SUB and nsqd closes the socket."""
    conn = await connect(topics.replica(PLAIN))
    with pytest.raises(NotLeaderError) as info:
        await conn.subscribe(PLAIN, "ch", 0)
    assert info.value.fatal is True
    await asyncio.wait_for(conn.wait_closed(), 5)
    assert conn.close_reason is not None
    assert conn.close_reason.__cause__ is info.value
    await conn.close()


async def test_unknown_topic_is_fatal_and_fails_pipelined_waiters(topics: Topics) -> None:
    """PUB to a topic that does not exist: E_TOPIC_NOT_EXIST (fatal); the PUB pipelined behind
    it fails with ConnectionClosedError chained to that error."""
    conn = await connect(topics.leader(PLAIN))
    first = asyncio.create_task(publish(conn, "cf_conn_missing_topic", b"x"))
    second = asyncio.create_task(publish(conn, PLAIN, b"y", 0))
    results = await asyncio.gather(first, second, return_exceptions=True)
    assert isinstance(results[0], TopicNotExistError)
    assert results[0].fatal is True
    assert isinstance(results[1], ConnectionClosedError)
    assert results[1].__cause__ is results[0]
    assert conn.closed
    await conn.close()


async def test_ordered_topic_refuses_partitionless_pub_and_plain_sub(topics: Topics) -> None:
    """Ordered topics: PUB without a partition is a fatal E_BAD_PARTITION; plain SUB is a
    fatal E_SUB_ORDER_IS_MUST."""
    address = topics.leader(ORDERED)
    conn = await connect(address)
    with pytest.raises(BadPartitionError, match="multi partition"):
        await publish(conn, ORDERED, b"x")
    await asyncio.wait_for(conn.wait_closed(), 5)
    conn = await connect(address)
    with pytest.raises(SubOrderRequiredError):
        await conn.subscribe(ORDERED, "plain_sub", 0)
    await asyncio.wait_for(conn.wait_closed(), 5)
    await conn.close()


async def test_fin_failed_is_routed_by_id(topics: Topics) -> None:
    """An E_FIN_FAILED (fork text: Go byte array id) reaches on_error with the id parsed,
    while a PUB pipelined after the FIN gets its own OK."""
    errors: list[BrokerError] = []
    arrived = asyncio.Event()

    def on_error(error: BrokerError) -> None:
        errors.append(error)
        arrived.set()

    address = topics.leader(PLAIN)
    async with Subscriber(address, on_error=on_error) as conn:
        await conn.subscribe(PLAIN, "fin_ch", 0)
        bogus = join_fork_id(999, 0)
        conn.fin(bogus)
        assert await publish(conn, PLAIN, b"after", 0) is None
        await asyncio.wait_for(arrived.wait(), 5)
        (error,) = errors
        assert isinstance(error, FinFailedError)
        assert error.message_id == bogus
        assert conn.state is ConnState.SUBSCRIBED


async def test_heartbeats_answered_on_the_fork(topics: Topics) -> None:
    """The fork closes a client silent for 3 heartbeat intervals; with 1 s heartbeats our
    NOP answers keep an idle producer connection open for 3.5 s and it still publishes."""
    config = ConnectionConfig(heartbeat_interval=1.0)
    async with NsqdConnection(topics.leader(PLAIN), config=config) as conn:
        writes = conn.writes
        await asyncio.sleep(3.5)  # the idle period under test, not a synchronisation
        assert conn.writes - writes >= 3
        assert await publish(conn, PLAIN, b"alive", 0) is None


async def test_sync_is_a_round_trip_while_subscribed_and_after_cls(topics: Topics) -> None:
    """The fork answers sync()'s TOUCH of internal id 2**63-1 with a non-fatal E_TOUCH_FAILED,
    in SUBSCRIBED and in CLOSE_WAIT."""
    address = topics.leader(PLAIN)
    errors: list[object] = []
    conn = Subscriber(address, on_error=errors.append)
    await conn.connect()
    await conn.subscribe(PLAIN, "sync_ch", 0)
    conn.rdy(1)
    await conn.sync(timeout=5)
    await conn.stop_delivery()
    assert conn.state is ConnState.CLOSE_WAIT
    await conn.sync(timeout=5)
    assert errors == []
    await conn.close()
    assert conn.close_reason is None
