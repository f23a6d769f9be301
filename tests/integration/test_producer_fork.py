"""Producer against a fork cluster: routing, traces, ext headers, refusals, close.

Every test runs twice through the ``backend`` fixture: on the embedded broker and on the real
fork (the ``fork``-marked half).  Every check reads back what nsqd stored with a raw
subscription per partition (our NsqdConnection, one per partition leader), subscribed before
publishing (a new channel starts at the topic's end).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from nsq_ha import sync
from nsq_ha.admin import TopicSpec
from nsq_ha.connection import ConnectionConfig
from nsq_ha.errors import (
    ConfigError,
    ExtNotSupportedError,
    ProducerClosedError,
    PublishError,
    TopicNotFoundError,
    UnsupportedByServerError,
)
from nsq_ha.producer import Producer, PublishResult, RetryPolicy
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.routing import STRATEGIES, get_strategy

from .backend import TOPIC4, Backend
from .helpers import Subscriber, drain_all

T4 = TOPIC4.name  # 4 partitions, shared with other fork tests on the real fork
EXT = TopicSpec("nsqha_prod_ext", partitions=2, ext=True)


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    """The backend with this module's topics created and writable."""
    backend.ensure_topics([TOPIC4, EXT])
    return backend


async def subscribe_all(
    cluster: Backend,
    topic: str,
    channel: str,
    partitions: int,
    *,
    advanced: bool = False,
    ext: bool = False,
) -> dict[int, Subscriber]:
    conns: dict[int, Subscriber] = {}
    for p in range(partitions):
        conn = Subscriber(cluster.leader(topic, p), config=ConnectionConfig(extend_support=ext))
        await conn.connect()
        await conn.subscribe(topic, channel, p, advanced=advanced)
        conns[p] = conn
    return conns


async def read_all(
    conns: dict[int, Subscriber], tag: str, expect: int
) -> dict[int, list[DecodedMessage]]:
    """Every message on ``conns`` (by partition): read until the ``expect`` ones whose body
    starts with ``tag`` came, plus a short grace for strays; then close them."""
    out = await drain_all(conns, expect=expect, prefix=tag.encode())
    await asyncio.gather(*(c.close() for c in conns.values()))
    return out


@pytest.fixture
async def producer(cluster: Backend) -> AsyncIterator[Producer]:
    async with Producer(lookupd=cluster.lookupd_http) as p:
        yield p


async def test_keys_land_on_the_partition_each_strategy_names(cluster: Backend) -> None:
    tag = uuid.uuid4().hex[:8]
    conns = await subscribe_all(cluster, T4, f"strategies{tag}", 4)
    keys: list[str | bytes | int] = [f"user-{i}" for i in range(30)]
    keys += ["publish_test_case", "order-12345", "中文", 12345, -7, 123456789012345]
    keys += [b"\x00\x00\x00\x00\x00\x0009", b"raw-bytes"]
    expected: dict[tuple[str, str], int] = {}
    published = 0
    for name in sorted(STRATEGIES):
        strategy = get_strategy(name)
        async with Producer(lookupd=cluster.lookupd_http, strategy=name) as producer:
            for key in keys:
                if name == "java" and isinstance(key, bytes):
                    continue  # the Java SDK has no stable hash for byte arrays
                label = f"{tag}|{name}|{key!r}"
                want = strategy.partition(key, 4)
                for n in range(2):
                    result = await producer.publish(T4, f"{label}|{n}".encode(), sharding_key=key)
                    assert result.partition == want
                    published += 1
                expected[(name, repr(key))] = want
    seen: dict[tuple[str, str], set[int]] = {}
    for partition, messages in (await read_all(conns, tag, published)).items():
        for message in messages:
            got_tag, name, key, _n = message.body.decode().split("|")
            if got_tag == tag:
                seen.setdefault((name, key), set()).add(partition)
    assert seen == {k: {p} for k, p in expected.items()}
    # the vectors of PROTOCOL.md §6.2, checked end to end on the server
    assert expected[("murmur3", repr("publish_test_case"))] == 0
    assert expected[("java", repr("publish_test_case"))] == 1
    assert expected[("java", repr(123456789012345))] == 3


async def test_publish_results_match_what_consumers_see(cluster: Backend) -> None:
    tag = uuid.uuid4().hex[:8]
    conns = await subscribe_all(cluster, T4, f"trace{tag}", 4, advanced=True)
    results: dict[bytes, PublishResult] = {}
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        # one at a time: PUB_TRACE
        for i in range(5):
            body = f"{tag}-single-{i}".encode()
            results[body] = await producer.publish(T4, body, partition=1, trace_id=1000 + i)
        # concurrently on one key: coalesced into MPUB_TRACE, receipts derived per message
        bodies = [f"{tag}-burst-{i}".encode() + b"x" * i for i in range(200)]
        burst = await asyncio.gather(
            *(
                producer.publish(T4, b, sharding_key="burst", trace_id=5000 + i)
                for i, b in enumerate(bodies)
            )
        )
        results.update(zip(bodies, burst, strict=True))
        assert producer.stats["commands"] < 5 + 200, "the burst was not batched"
    async with Producer(lookupd=cluster.lookupd_http, trace=True) as tracing:
        # trace=True: untraced publishes still report id and offset (trace id 0)
        for i in range(5):
            body = f"{tag}-plain-{i}".encode()
            results[body] = await tracing.publish(T4, body, sharding_key=i)
        many = [f"{tag}-many-{i}".encode() for i in range(50)]
        results.update(zip(many, await tracing.publish_many(T4, many), strict=True))
    consumed = {
        m.body: (p, m)
        for p, messages in (await read_all(conns, tag, len(results))).items()
        for m in messages
        if m.body.startswith(tag.encode())
    }
    assert set(consumed) == set(results)
    for body, result in results.items():
        partition, message = consumed[body]
        assert (result.partition, result.message_id) == (partition, message.id), body
        assert (result.offset, result.raw_size) == (message.offset, message.raw_size), body
        assert result.trace_id == message.trace_id, body


async def test_ext_headers_round_trip_and_a_plain_topic_refuses_them(
    cluster: Backend, producer: Producer
) -> None:
    tag = uuid.uuid4().hex[:8]
    conns = await subscribe_all(cluster, EXT.name, f"ext{tag}", 2, ext=True)
    sent: dict[bytes, dict[str, object]] = {}
    body = f"{tag}-one".encode()
    await producer.publish(EXT.name, body, partition=0, ext={"k": "v", "n": "1"})
    sent[body] = {"k": "v", "n": "1"}
    body = f"{tag}-traced".encode()
    result = await producer.publish(EXT.name, body, partition=1, ext={"k": "t"}, trace_id=77)
    assert result.trace_id == 77
    assert result.offset is not None  # a ##trace_id header is answered with the traced form
    sent[body] = {"k": "t", "##trace_id": "77"}
    bodies = [f"{tag}-many-{i}".encode() for i in range(20)]
    headers: list[dict[str, object] | None] = [{"i": str(i)} if i % 2 else None for i in range(20)]
    await producer.publish_many(EXT.name, bodies, exts=headers)
    sent.update({b: h or {} for b, h in zip(bodies, headers, strict=True)})
    got = {
        m.body: m.json_header()
        for messages in (await read_all(conns, tag, len(sent))).values()
        for m in messages
        if m.body.startswith(tag.encode())
    }
    assert got == sent
    # a topic lookup describes as not ext: refused before sending, typed; the producer goes on
    commands = producer.stats["commands"]
    with pytest.raises(UnsupportedByServerError, match="not an ext topic"):
        await producer.publish(T4, b"header", sharding_key="x", ext={"k": "v"})
    assert producer.stats["commands"] == commands
    assert (await producer.publish(T4, b"after", sharding_key="x")).partition is not None
    # nsqd's own refusal (E_EXT_NOT_SUPPORT) is typed too: through an nsqd= address the
    # producer has no lookup meta and leaves the decision to nsqd
    async with Producer(nsqd=cluster.leader(T4, 0)) as direct:
        with pytest.raises(ExtNotSupportedError, match="E_EXT_NOT_SUPPORT"):
            await direct.publish(T4, b"header", ext={"k": "v"})


async def test_refusals_before_sending(producer: Producer) -> None:
    await producer.publish(T4, b"warm-up")
    commands = producer.stats["commands"]
    with pytest.raises(UnsupportedByServerError, match="DPUB"):
        await producer.publish(T4, b"later", defer=1.0)
    with pytest.raises(ConfigError, match=r"partitions 0\.\.3"):
        await producer.publish(T4, b"x", partition=4)
    assert producer.stats["commands"] == commands  # nothing was sent
    # an unknown topic is an operator's job: a typed error at once, not a minute of retries
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TopicNotFoundError, match="created by an operator"):
        await producer.publish("nsqha_no_such_topic", b"x")
    assert loop.time() - started < 5


async def test_close_waits_for_in_flight_publishes(producer: Producer) -> None:
    tasks = [
        asyncio.create_task(producer.publish(T4, b"drain-%d" % i, sharding_key=i % 7))
        for i in range(3000)
    ]
    await asyncio.sleep(0)
    await producer.close()
    results = await asyncio.gather(*tasks)
    assert all(r.partition is not None for r in results)
    assert producer.stats["published"] == 3000


async def test_close_fails_what_a_stalled_leader_never_acknowledged(cluster: Backend) -> None:
    config = ConnectionConfig(close_timeout=1.0)
    retry = RetryPolicy(attempt_timeout=30.0)
    producer = Producer(lookupd=cluster.lookupd_http, connection=config, retry=retry)
    await producer.publish(T4, b"warm-up", partition=2)
    with cluster.paused(cluster.leader(T4, 2)):
        tasks = [
            asyncio.create_task(producer.publish(T4, b"stalled", partition=2)) for _ in range(10)
        ]
        await asyncio.sleep(0.3)
        await producer.close(timeout=0.5)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(o, PublishError) for o in outcomes), outcomes
    assert all("closed before nsqd acknowledged" in str(o) for o in outcomes)


def test_sync_producer_from_plain_threads(cluster: Backend) -> None:
    with sync.Producer(lookupd=cluster.lookupd_http) as producer:
        first = producer.publish(T4, b"sync", sharding_key="s", trace_id=1)
        futures = [
            producer.publish_async(T4, b"sync-%d" % i, sharding_key="s", trace_id=2 + i)
            for i in range(100)
        ]
        results = [f.result(30) for f in futures]
        many = producer.publish_many(T4, [b"a", b"b"], sharding_key="s")
    assert {r.partition for r in [first, *results, *many]} == {first.partition}
    offsets = [first.offset, *(r.offset for r in results)]
    assert offsets == sorted(offsets)  # one key: written in call order
    with pytest.raises(ProducerClosedError, match="closed"):
        producer.publish(T4, b"late")


async def test_publish_many_with_a_key_per_message(cluster: Backend) -> None:
    """``sharding_keys=``: each message on its key's partition, each partition's messages
    stored in the order given, one result per body in body order; bad keys refused first."""
    tag = uuid.uuid4().hex[:8]
    conns = await subscribe_all(cluster, T4, f"bykey{tag}", 4)
    strategy = get_strategy("murmur3")
    keys = [f"k{i % 37}" for i in range(600)]
    bodies = [f"{tag}|{key}|{i:04d}".encode() for i, key in enumerate(keys)]
    async with Producer(lookupd=cluster.lookupd_http) as producer:
        with pytest.raises(ConfigError, match="sharding_keys"):
            await producer.publish_many(T4, bodies[:2], sharding_keys=keys[:1])
        with pytest.raises(ConfigError, match="sharding_keys"):
            await producer.publish_many(T4, bodies[:1], sharding_keys=keys[:1], sharding_key="x")
        with pytest.raises(ConfigError):
            await producer.publish_many(T4, bodies[:1], sharding_keys=[1.5])  # type: ignore[list-item]
        results = await producer.publish_many(T4, bodies, sharding_keys=keys)
    assert [r.partition for r in results] == [strategy.partition(k, 4) for k in keys]
    stored = await read_all(conns, tag, len(bodies))
    for partition, messages in stored.items():
        mine = [m.body for m in messages if m.body.startswith(tag.encode())]
        assert mine == [
            b for b, k in zip(bodies, keys, strict=True) if strategy.partition(k, 4) == partition
        ]


@pytest.mark.parametrize("how", ["publish", "publish_many"])
async def test_keyed_calls_keep_call_order_while_the_first_waits_for_routes(
    cluster: Backend, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keyed calls reach the partitions in the order they were made, even when a later call
    finds the routes cached while an earlier one is still on its way back from the lookup.

    The first lookup is made to finish slowly (its routes are cached at once, its caller
    resumes 0.2 s later: what a retry's backoff or a busy loop does), and later calls start in
    that window."""
    tag = uuid.uuid4().hex[:8]
    conns = await subscribe_all(cluster, T4, f"order{tag}", 4)
    strategy = get_strategy("murmur3")
    keys = [f"k{i % 5}" for i in range(40)]
    bodies = [f"{tag}|{key}|{i:04d}".encode() for i, key in enumerate(keys)]
    look_up = Producer._look_up
    slow = [True]

    async def slow_first(self: Producer, *args: object) -> object:
        routes = await look_up(self, *args)  # type: ignore[arg-type]
        if slow.pop() if slow else False:
            await asyncio.sleep(0.2)
        return routes

    monkeypatch.setattr(Producer, "_look_up", slow_first)
    async with Producer(lookupd=cluster.lookupd_http) as producer:

        async def send(chunk: range) -> None:
            if how == "publish_many":
                await producer.publish_many(
                    T4, [bodies[i] for i in chunk], sharding_keys=[keys[i] for i in chunk]
                )
            else:  # the calls are made in index order (gather starts them in order)
                await asyncio.gather(
                    *(producer.publish(T4, bodies[i], sharding_key=keys[i]) for i in chunk)
                )

        first = asyncio.create_task(send(range(0, 10)))
        await asyncio.sleep(0.1)  # the lookup is done, the first call is still held
        rest = [asyncio.create_task(send(range(start, start + 10))) for start in (10, 20, 30)]
        await asyncio.gather(first, *rest)
    stored = await read_all(conns, tag, len(bodies))
    for partition, messages in stored.items():
        mine = [m.body for m in messages if m.body.startswith(tag.encode())]
        assert mine == [
            b for b, k in zip(bodies, keys, strict=True) if strategy.partition(k, 4) == partition
        ]


async def test_close_waits_for_a_keyed_call_waiting_for_its_turn(
    cluster: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed call queued behind another one's lookup is still the producer's work: close()
    returns only once it has settled (here: published), even if the first call failed."""
    look_up = Producer._look_up
    calls = [0]

    async def first_fails_slowly(self: Producer, *args: object) -> object:
        calls[0] += 1
        if calls[0] == 1:
            await asyncio.sleep(0.3)
            raise TopicNotFoundError("the first lookup failed (made up by the test)")
        return await look_up(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Producer, "_look_up", first_fails_slowly)
    producer = Producer(lookupd=cluster.lookupd_http)
    first = asyncio.create_task(producer.publish(T4, b"first", sharding_key="k"))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(producer.publish(T4, b"second", sharding_key="k"))
    await asyncio.sleep(0.05)  # the second waits for the first's turn
    await producer.close(timeout=30)
    assert second.done(), "close() returned while a publish was still waiting"
    with pytest.raises(TopicNotFoundError):
        await first
    assert isinstance(second.result(), PublishResult)
